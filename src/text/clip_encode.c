// Text to CLIP token ids: clean-up, OpenAI's pre-tokenizer regex, and the
// byte-pair merges of each piece.
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/clip_clean.h"
#include "text/clip_tokenizer.h"
#include "text/clip_vocab.h"
#include "text/text_tables.h"
#include "text/unicode.h"

typedef struct {
    int32_t *ids;
    int n, cap;
} id_list;

static int id_push(id_list *l, int32_t id) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        int32_t *p = realloc(l->ids, (size_t)cap * sizeof *p);
        if (!p) return dc_fail("out of memory for %d token ids", cap);
        l->ids = p, l->cap = cap;
    }
    l->ids[l->n++] = id;
    return 0;
}

// ---- byte-pair merges -------------------------------------------------------------

typedef struct {
    int32_t rank, pos;
} heap_item;

static bool heap_less(heap_item a, heap_item b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(heap_item *h, int *n, heap_item x) {
    int i = (*n)++;
    for (; i > 0 && heap_less(x, h[(i - 1) / 2]); i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, int *n) {
    heap_item top = h[0], x = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], x)) break;
        h[i] = h[c], i = c;
    }
    if (*n) h[i] = x;
    return top;
}

// Work space for pieces of up to `cap` bytes.
typedef struct {
    int32_t *sym, *next, *prev, *batch, *merged;  // [cap] per symbol node
    heap_item *heap;                              // [3 * cap]: the first pairs, then 2 per merge
    int cap;
} bpe_work;

static void work_free(bpe_work *w) {
    free(w->sym), free(w->next), free(w->prev), free(w->batch), free(w->merged), free(w->heap);
    *w = (bpe_work){0};
}

// Room for a piece of len bytes (grown as longer pieces come).
static int work_reserve(bpe_work *w, int len) {
    if (len <= w->cap) return 0;
    int cap = len > 2 * w->cap ? len : 2 * w->cap;
    work_free(w);
    w->cap = cap;
    w->sym = malloc((size_t)cap * sizeof(int32_t));
    w->next = malloc((size_t)cap * sizeof(int32_t));
    w->prev = malloc((size_t)cap * sizeof(int32_t));
    w->batch = malloc(3 * (size_t)cap * sizeof(int32_t));
    w->merged = malloc((size_t)cap * sizeof(int32_t));
    w->heap = malloc(3 * (size_t)cap * sizeof(heap_item));
    if (!w->sym || !w->next || !w->prev || !w->batch || !w->merged || !w->heap)
        return work_free(w), dc_fail("out of memory for a piece of text of %d bytes", len);
    return 0;
}

static void push_pair(const dc_clip_vocab *v, bpe_work *w, int *nh, int32_t pos) {
    int32_t r = dc_clip_pair_rank(v, w->sym[pos], w->sym[w->next[pos]]);
    if (r >= 0) heap_push(w->heap, nh, (heap_item){r, pos});
}

// OpenAI's bpe(): the symbols are the piece's bytes, "</w>" joined to the
// last; repeatedly, the pair of lowest rank is merged wherever it occurs,
// left to right, until no pair has a rank. A heap of (rank, position) finds
// that pair without rescanning the piece, so a long piece costs n log n, not
// n^2: all entries of the lowest rank form one pass (stale ones, whose nodes
// have changed since, are skipped), and the pairs it creates enter the heap
// after it, as the Python loop sees them on its next pass.
static int bpe_piece(const dc_clip_vocab *v, const unsigned char *b, int len, bpe_work *w, id_list *out) {
    for (int i = 0; i < len; i++) {
        w->sym[i] = i == len - 1 ? v->byte_end_id[b[i]] : v->byte_id[b[i]];
        w->next[i] = i + 1 < len ? i + 1 : -1;
        w->prev[i] = i - 1;
    }
    int nh = 0;
    for (int i = 0; i + 1 < len; i++) push_pair(v, w, &nh, i);
    while (nh > 0) {
        int32_t r = w->heap[0].rank, left = v->left[r], right = v->right[r];
        int nb = 0, nm = 0;
        // The heap yields them by position: left to right, repeats together.
        while (nh > 0 && w->heap[0].rank == r) w->batch[nb++] = heap_pop(w->heap, &nh).pos;
        for (int k = 0; k < nb; k++) {
            int32_t p = w->batch[k], q;
            if ((k && p == w->batch[k - 1]) || w->sym[p] < 0 || (q = w->next[p]) < 0) continue;
            if (w->sym[p] != left || w->sym[q] != right) continue;  // stale
            w->sym[p] = v->result[r];
            w->next[p] = w->next[q];
            if (w->next[q] >= 0) w->prev[w->next[q]] = p;
            w->sym[q] = -1;
            w->merged[nm++] = p;
        }
        for (int k = 0; k < nm; k++) {
            int32_t p = w->merged[k];
            if (w->prev[p] >= 0) push_pair(v, w, &nh, w->prev[p]);
            if (w->next[p] >= 0) push_pair(v, w, &nh, p);
        }
    }
    for (int32_t i = 0; i >= 0; i = w->next[i]) DC_TRY(id_push(out, w->sym[i]));
    return 0;
}

// ---- the pre-tokenizer ---------------------------------------------------------------

// The length of a case-insensitive match of an ASCII literal at s[0, n), or
// 0. After lower-casing only U+017F (long s) still matches a letter other
// than itself under the regex's IGNORECASE.
static size_t match_ci(const uint32_t *s, size_t n, const char *lit) {
    size_t k = 0;
    for (; lit[k]; k++) {
        uint32_t c = (unsigned char)lit[k];
        if (k >= n) return 0;
        if (s[k] != c && !(c >= 'a' && c <= 'z' && s[k] == c - 32) && !(c == 's' && s[k] == 0x17F)) return 0;
    }
    return k;
}

static unsigned class_of(uint32_t c) { return dc_uc_flags(c) & DC_UC_CLASS_MASK; }

// The length of the regex's match at s[0, n), or 0 where it skips a
// character (whitespace, or one that no alternative matches).
static size_t next_piece(const uint32_t *s, size_t n) {
    static const char *k_literals[] = {"<|startoftext|>", "<|endoftext|>", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t i = 0; i < sizeof k_literals / sizeof *k_literals; i++) {
        size_t len = match_ci(s, n, k_literals[i]);
        if (len) return len;
    }
    unsigned k = class_of(s[0]);
    if (k == DC_UC_NUMBER) return 1;
    if (k != DC_UC_LETTER && k != DC_UC_OTHER) return 0;
    size_t len = 1;
    while (len < n && class_of(s[len]) == k) len++;
    return len;
}

int dc_clip_encode(const dc_clip_tokenizer *t, const char *text, int32_t **ids, int *n) {
    *ids = NULL, *n = 0;
    dc_ustr raw = {0}, clean = {0};
    id_list out = {0};
    bpe_work w = {0};
    char *bytes = NULL;
    int rc = dc_utf8_decode(text, strlen(text), "the text", &raw);
    if (!rc) rc = dc_clip_clean(&raw, &clean);
    if (!rc && clean.n > (size_t)INT32_MAX / 16) rc = dc_fail("the text is too long (%zu characters)", clean.n);
    if (!rc && !(bytes = malloc(4 * clean.n + 1))) rc = dc_fail("out of memory for the prompt");
    for (size_t i = 0; i < clean.n && !rc;) {
        size_t len = next_piece(clean.cp + i, clean.n - i);
        if (!len) {
            i++;
            continue;
        }
        int nb = 0;
        for (size_t k = 0; k < len; k++) nb += (int)dc_utf8_put(clean.cp[i + k], bytes + nb);
        i += len;
        // Only the exact special names are special: "<|ſtartoftext|>" splits the
        // same way but goes through the merges like any other piece.
        if (nb == 15 && !memcmp(bytes, "<|startoftext|>", 15)) rc = id_push(&out, t->bos);
        else if (nb == 13 && !memcmp(bytes, "<|endoftext|>", 13)) rc = id_push(&out, t->eos);
        else if (!(rc = work_reserve(&w, nb))) rc = bpe_piece(t->v, (const unsigned char *)bytes, nb, &w, &out);
    }
    free(bytes);
    work_free(&w);
    dc_ustr_free(&raw), dc_ustr_free(&clean);
    if (rc) return free(out.ids), -1;
    *ids = out.ids, *n = out.n;
    return 0;
}

int dc_clip_tokenize(const dc_clip_tokenizer *t, const char *text, int32_t ids[DC_CLIP_CONTEXT], int *n_tokens) {
    int32_t *tok;
    int n;
    DC_TRY(dc_clip_encode(t, text, &tok, &n));
    int keep = n < DC_CLIP_CONTEXT - 2 ? n : DC_CLIP_CONTEXT - 2;
    ids[0] = t->bos;
    if (keep) memcpy(ids + 1, tok, (size_t)keep * sizeof *ids);
    ids[keep + 1] = t->eos;
    for (int i = keep + 2; i < DC_CLIP_CONTEXT; i++) ids[i] = t->pad;
    free(tok);
    if (n_tokens) *n_tokens = n;
    return 0;
}
