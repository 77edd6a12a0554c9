#include "text/clip_tokenizer.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/json.h"
#include "text/clip_vocab.h"
#include "text/unicode.h"

// OpenAI's file holds 262144 merges; CLIP uses the first 49152 - 256 - 2 of
// them, so that with the 512 byte symbols and 2 specials it has 49408 tokens.
#define CLIP_MERGES (49152 - 256 - 2)
#define MAX_FILE_BYTES (256u << 20)  // a vocabulary file inflated (CLIP's: 3.2 MB)

// ---- hash tables -------------------------------------------------------------

static uint64_t hash_bytes(const char *s, size_t n) {  // FNV-1a
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static size_t table_size(size_t n) {
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    return size;
}

static int vocab_init(dc_clip_vocab *v, size_t n) {
    v->nslots = table_size(n);
    v->slots = malloc(v->nslots * sizeof *v->slots);
    if (!v->slots) return dc_fail("out of memory for a vocabulary of %zu tokens", n);
    for (size_t i = 0; i < v->nslots; i++) v->slots[i].id = -1;
    return 0;
}

static vocab_slot *vocab_slot_of(const dc_clip_vocab *v, const char *s, size_t n, uint64_t h) {
    for (size_t i = h & (v->nslots - 1);; i = (i + 1) & (v->nslots - 1)) {
        vocab_slot *e = &v->slots[i];
        if (e->id < 0 || (e->hash == h && e->len == n && !memcmp(v->arena + e->off, s, n))) return e;
    }
}

// The id of a token string, or -1.
static int32_t vocab_find(const dc_clip_vocab *v, const char *s, size_t n) {
    return vocab_slot_of(v, s, n, hash_bytes(s, n))->id;
}

// Adds a token, or gives an existing one the new id (the last wins, as in a
// Python dict built from the list). The table was sized for every token.
static int vocab_put(dc_clip_vocab *v, const char *s, size_t n, int32_t id, int *count) {
    uint64_t h = hash_bytes(s, n);
    vocab_slot *e = vocab_slot_of(v, s, n, h);
    if (e->id >= 0) return e->id = id, 0;
    if (v->arena_len + n > v->arena_cap) {
        size_t cap = v->arena_cap ? v->arena_cap : 1u << 20;
        while (cap < v->arena_len + n) cap *= 2;
        char *p = realloc(v->arena, cap);
        if (!p) return dc_fail("out of memory for the vocabulary's strings");
        v->arena = p, v->arena_cap = cap;
    }
    memcpy(v->arena + v->arena_len, s, n);
    *e = (vocab_slot){h, (uint32_t)v->arena_len, (uint32_t)n, id};
    v->arena_len += n;
    (*count)++;
    return 0;
}

// ---- files -------------------------------------------------------------------

// Reads a whole file, inflating it when it is gzip-compressed; NUL-terminated.
static int read_file(const char *path, char **data, size_t *len) {
    *data = NULL, *len = 0;
    int fd = dc_open_regular(path, NULL);
    if (fd < 0) return -1;
    errno = 0;
    gzFile gz = gzdopen(fd, "rb");  // reads a plain file as it is
    if (!gz) {
        close(fd);
        return dc_fail("%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    }
    size_t cap = 1u << 20, n = 0;
    char *buf = malloc(cap + 1);
    int rc = buf ? 0 : dc_fail("%s: out of memory", path);
    while (!rc) {
        if (n == cap) {
            char *p = cap >= MAX_FILE_BYTES ? NULL : realloc(buf, 2 * cap + 1);
            if (!p) {
                rc = cap >= MAX_FILE_BYTES
                         ? dc_fail("%s: larger than %u MiB: not a tokenizer file", path, MAX_FILE_BYTES >> 20)
                         : dc_fail("%s: out of memory", path);
                break;
            }
            buf = p, cap *= 2;
        }
        int got = gzread(gz, buf + n, (unsigned)(cap - n));
        int zerr;
        const char *msg = gzerror(gz, &zerr);
        if (got < 0 || (got == 0 && zerr != Z_OK)) {
            const char *why = zerr == Z_ERRNO       ? strerror(errno)
                              : zerr == Z_BUF_ERROR ? "truncated (the gzip stream ends early)"
                                                    : msg;
            rc = dc_fail("%s: %s", path, why);
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    gzclose(gz);
    if (rc) return free(buf), -1;
    buf[n] = 0;
    *data = buf, *len = n;
    return 0;
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

// ---- merges --------------------------------------------------------------------

typedef struct {
    const char *a, *b;
    uint32_t alen, blen;
} merge_text;

static bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= 0x1F); }

// The merge rules of a BPE text: the lines after the first, each two symbols.
// OpenAI's reader (openai) takes lines 2..48895 as they are and needs them
// all; transformers' strips the text first and takes up to 48894 lines.
static int parse_merges(const char *path, char *data, size_t len, bool openai, merge_text **out, int *count) {
    int64_t bad = dc_utf8_invalid_at(data, len);
    if (bad >= 0)
        return dc_fail("%s: not UTF-8 text (byte 0x%02x at offset %lld)", path, (unsigned char)data[bad], (long long)bad);
    char *p = data, *end = data + len;
    if (!openai) {
        while (p < end && ascii_space(*p)) p++;
        while (end > p && ascii_space(end[-1])) end--;
    }
    char *nl = memchr(p, '\n', (size_t)(end - p));
    char *line = nl ? nl + 1 : end;  // past the header line ("#version: 0.2")
    merge_text *m = malloc(CLIP_MERGES * sizeof *m);
    if (!m) return dc_fail("%s: out of memory", path);
    int n = 0;
    while (n < CLIP_MERGES && line < end) {
        nl = memchr(line, '\n', (size_t)(end - line));
        char *line_end = nl ? nl : end, *q = line;
        const char *field[3] = {0};
        size_t flen[3] = {0};
        int nf = 0;
        while (q < line_end && nf < 3) {
            while (q < line_end && ascii_space(*q)) q++;
            if (q == line_end) break;
            field[nf] = q;
            while (q < line_end && !ascii_space(*q)) q++;
            flen[nf] = (size_t)(q - field[nf]);
            nf++;
        }
        if (nf != 2) {
            int shown = (int)(line_end - line < 60 ? line_end - line : 60);
            free(m);
            return dc_fail("%s line %d: a merge rule is two symbols separated by a space, not '%.*s'", path, n + 2,
                           shown, line);
        }
        m[n++] = (merge_text){field[0], field[1], (uint32_t)flen[0], (uint32_t)flen[1]};
        line = nl ? nl + 1 : end;
    }
    if (openai && n < CLIP_MERGES) {
        free(m);
        return dc_fail("%s: %d merge rules after the header line where OpenAI's vocabulary has %d: not a CLIP BPE "
                       "file, or cut short", path, n, CLIP_MERGES);
    }
    *out = m, *count = n;
    return 0;
}

// Ranks the merge rules: rule r joins left[r] and right[r] into result[r].
// Every part and product must be a token (the rule could never apply
// otherwise, which means the files do not belong together).
static int index_merges(dc_clip_tokenizer *t, const char *path, const merge_text *m, int n) {
    dc_clip_vocab *v = t->v;
    v->npairs = table_size((size_t)n);
    v->pairs = malloc(v->npairs * sizeof *v->pairs);
    v->left = malloc((size_t)(n ? n : 1) * sizeof *v->left);
    v->right = malloc((size_t)(n ? n : 1) * sizeof *v->right);
    v->result = malloc((size_t)(n ? n : 1) * sizeof *v->result);
    char *joined = malloc(1024);
    if (!v->pairs || !v->left || !v->right || !v->result || !joined)
        return free(joined), dc_fail("%s: out of memory", path);
    for (size_t i = 0; i < v->npairs; i++) v->pairs[i].key = UINT64_MAX;
    for (int r = 0; r < n; r++) {
        if (m[r].alen + m[r].blen > 1024) return free(joined), dc_fail("%s line %d: a symbol of over 1 KB", path, r + 2);
        memcpy(joined, m[r].a, m[r].alen);
        memcpy(joined + m[r].alen, m[r].b, m[r].blen);
        const char *what[3] = {m[r].a, m[r].b, joined};
        uint32_t lens[3] = {m[r].alen, m[r].blen, m[r].alen + m[r].blen};
        int32_t ids[3];
        for (int k = 0; k < 3; k++) {
            if ((ids[k] = vocab_find(v, what[k], lens[k])) < 0) {
                int rc = dc_fail("%s line %d: '%.*s' is not in the vocabulary", path, r + 2, (int)lens[k], what[k]);
                return free(joined), rc;
            }
        }
        v->left[r] = ids[0], v->right[r] = ids[1], v->result[r] = ids[2];
        pair_slot *e = dc_clip_pair_slot(v, dc_clip_pair_key(ids[0], ids[1]));
        *e = (pair_slot){dc_clip_pair_key(ids[0], ids[1]), r};  // a repeated rule keeps its last rank
    }
    free(joined);
    t->n_merges = n;
    return 0;
}

// ---- the two formats -----------------------------------------------------------

// bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the
// others (controls, space, soft hyphen...) for U+0100 onwards, in byte order.
// order[k] is the byte of vocabulary entry k, ch[b] the character of byte b.
static void bytes_to_unicode(int order[256], uint32_t ch[256]) {
    int k = 0, extra = 0;
    bool printable[256] = {0};
    for (int b = 0; b < 256; b++) printable[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    for (int b = 0; b < 256; b++)
        if (printable[b]) order[k++] = b, ch[b] = (uint32_t)b;
    for (int b = 0; b < 256; b++)
        if (!printable[b]) order[k++] = b, ch[b] = 256 + (uint32_t)extra++;
}

// OpenAI's vocabulary: byte symbols, the same with "</w>", merges, specials.
static int load_openai(dc_clip_tokenizer *t, const char *path, char *data, size_t len) {
    merge_text *m;
    int n;
    DC_TRY(parse_merges(path, data, len, true, &m, &n));
    dc_clip_vocab *v = t->v;
    int rc = vocab_init(v, 512 + (size_t)n + 2), id = 0;
    int order[256];
    uint32_t ch[256];
    bytes_to_unicode(order, ch);
    char sym[16];
    for (int pass = 0; pass < 2 && !rc; pass++) {
        for (int k = 0; k < 256 && !rc; k++) {
            size_t l = dc_utf8_put(ch[order[k]], sym);
            if (pass) memcpy(sym + l, "</w>", 4), l += 4;
            rc = vocab_put(v, sym, l, id++, &t->n_vocab);
        }
    }
    char joined[1024];
    for (int r = 0; r < n && !rc; r++) {
        if (m[r].alen + m[r].blen > sizeof joined) {
            rc = dc_fail("%s line %d: a symbol of over 1 KB", path, r + 2);
            break;
        }
        memcpy(joined, m[r].a, m[r].alen);
        memcpy(joined + m[r].alen, m[r].b, m[r].blen);
        rc = vocab_put(v, joined, m[r].alen + m[r].blen, id++, &t->n_vocab);
    }
    if (!rc) rc = vocab_put(v, "<|startoftext|>", 15, id++, &t->n_vocab);
    if (!rc) rc = vocab_put(v, "<|endoftext|>", 13, id++, &t->n_vocab);
    if (!rc) rc = index_merges(t, path, m, n);
    free(m);
    return rc;
}

// transformers' vocab.json: one object of token -> id.
static int load_vocab_json(dc_clip_tokenizer *t, const char *path, const char *data, size_t len) {
    dc_json_doc doc;
    if (dc_json_parse(&doc, data, len, 0)) return dc_fail_ctx("%s", path);
    int rc = 0;
    if (doc.root->type != DC_JSON_OBJECT) rc = dc_fail("%s: not a JSON object of token -> id", path);
    if (!rc) rc = vocab_init(t->v, (size_t)doc.root->nkids);
    for (int i = 0; i < doc.root->nkids && !rc; i++) {
        const dc_json *e = &doc.root->kids[i];
        int64_t id;
        if (e->type != DC_JSON_NUMBER || dc_json_get_i64(e, &id) || id < 0 || id > INT32_MAX)
            rc = dc_fail("%s: the id of '%s' is not an integer from 0 to 2147483647", path, e->key);
        else
            rc = vocab_put(t->v, e->key, e->key_len, (int32_t)id, &t->n_vocab);
    }
    dc_json_free(&doc);
    return rc;
}

// pad_token of a diffusers tokenizer folder: special_tokens_map.json, else
// tokenizer_config.json (the first file that names one wins, as in
// transformers); a string or {"content": ...}.
static int load_pad(dc_clip_tokenizer *t, const char *dir) {
    static const char *k_files[] = {"special_tokens_map.json", "tokenizer_config.json"};
    for (int f = 0; f < 2; f++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, k_files[f]) >= (int)sizeof path)
            return dc_fail("%s: path too long", dir);
        if (!exists(path)) continue;
        char *data;
        size_t len;
        DC_TRY(read_file(path, &data, &len));
        dc_json_doc doc;
        if (dc_json_parse(&doc, data, len, 0)) return free(data), dc_fail_ctx("%s", path);
        free(data);
        const dc_json *pad = doc.root->type == DC_JSON_OBJECT ? dc_json_get(doc.root, "pad_token") : NULL;
        if (pad && pad->type == DC_JSON_OBJECT) pad = dc_json_get(pad, "content");
        int rc = 0;
        if (pad && pad->type != DC_JSON_NULL) {
            if (pad->type != DC_JSON_STRING) rc = dc_fail("%s: pad_token is not a string", path);
            else if ((t->pad = vocab_find(t->v, pad->str, pad->len)) < 0)
                rc = dc_fail("%s: pad_token '%s' is not in the vocabulary", path, pad->str);
        }
        bool found = pad && pad->type != DC_JSON_NULL;
        dc_json_free(&doc);
        if (rc || found) return rc;
    }
    return 0;
}

// vocab.json, merges.txt beside it, and the folder's pad_token.
static int load_transformers(dc_clip_tokenizer *t, const char *vocab_path, const char *data, size_t len) {
    char dir[4096], merges[4200];
    const char *slash = strrchr(vocab_path, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - vocab_path), vocab_path);
    else snprintf(dir, sizeof dir, ".");
    if (!dir[0]) snprintf(dir, sizeof dir, "/");
    snprintf(merges, sizeof merges, "%s/merges.txt", dir);
    if (!exists(merges))
        return dc_fail("%s: a vocab.json needs its merges.txt beside it: %s is missing", vocab_path, merges);
    DC_TRY(load_vocab_json(t, vocab_path, data, len));
    char *mdata;
    size_t mlen;
    DC_TRY(read_file(merges, &mdata, &mlen));
    merge_text *m;
    int n, rc = parse_merges(merges, mdata, mlen, false, &m, &n);
    if (!rc) {
        rc = index_merges(t, merges, m, n);
        free(m);
    }
    free(mdata);
    return rc ? rc : load_pad(t, dir);
}

// The byte symbols and the specials every vocabulary must hold.
static int find_fixed_tokens(dc_clip_tokenizer *t, const char *path) {
    dc_clip_vocab *v = t->v;
    int order[256];
    uint32_t ch[256];
    bytes_to_unicode(order, ch);
    char sym[16];
    for (int b = 0; b < 256; b++) {
        size_t l = dc_utf8_put(ch[b], sym);
        memcpy(sym + l, "</w>", 4);
        if ((v->byte_id[b] = vocab_find(v, sym, l)) < 0 || (v->byte_end_id[b] = vocab_find(v, sym, l + 4)) < 0)
            return dc_fail("%s: the vocabulary lacks the symbol of byte 0x%02x ('%.*s')", path, b, (int)l, sym);
    }
    t->bos = vocab_find(v, "<|startoftext|>", 15);
    t->eos = vocab_find(v, "<|endoftext|>", 13);
    if (t->bos < 0 || t->eos < 0) return dc_fail("%s: the vocabulary lacks <|startoftext|> or <|endoftext|>", path);
    return 0;
}

int dc_clip_tokenizer_load(dc_clip_tokenizer *t, const char *path) {
    *t = (dc_clip_tokenizer){.bos = -1, .eos = -1, .pad = -1};
    char found[4200];
    const char *file = path;
    if (is_dir(path)) {  // a tokenizer folder, or a diffusers model folder above one
        snprintf(found, sizeof found, "%s/vocab.json", path);
        if (!exists(found)) snprintf(found, sizeof found, "%s/tokenizer/vocab.json", path);
        if (!exists(found))
            return dc_fail("%s: a folder without vocab.json (nor tokenizer/vocab.json, as in a diffusers model)", path);
        file = found;
    }
    if (!(t->v = calloc(1, sizeof *t->v))) return dc_fail("out of memory");
    char *data;
    size_t len;
    int rc = read_file(file, &data, &len);
    if (!rc) {
        size_t i = 0;  // JSON (vocab.json) or a BPE text, by the first character
        while (i < len && ascii_space(data[i])) i++;
        rc = i < len && data[i] == '{' ? load_transformers(t, file, data, len) : load_openai(t, file, data, len);
        free(data);
    }
    if (!rc) rc = find_fixed_tokens(t, file);
    if (rc) return dc_clip_tokenizer_free(t), -1;
    if (t->pad < 0) t->pad = t->eos;
    return 0;
}

void dc_clip_tokenizer_free(dc_clip_tokenizer *t) {
    if (t->v) {
        free(t->v->arena), free(t->v->slots), free(t->v->pairs);
        free(t->v->left), free(t->v->right), free(t->v->result);
        free(t->v);
    }
    *t = (dc_clip_tokenizer){.bos = -1, .eos = -1, .pad = -1};
}
