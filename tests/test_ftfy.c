// ftfy's mojibake repair (text/ftfy_encoding.h) and the whole ftfy.fix_text
// (text/clip_clean.h) against outputs of the real ftfy, made by
// tools/ftfy_golden.py into tests/golden/ftfy/cases.txt: fix_text and
// fix_encoding of hand-picked texts (UTF-8 read in each encoding ftfy tries,
// mojibake of mojibake, lost bytes, CESU-8, C1 controls, mojibake inside good
// text, and text to leave alone) and of random garbled ones; the badness
// heuristic on strings drawn from each alternative of ftfy's pattern and on
// near misses; and the CLIP ids of mojibake prompts, with the shipped
// vocabulary (data/bpe_simple_vocab_16e6.txt.gz).
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/json.h"
#include "text/clip_clean.h"
#include "text/clip_tokenizer.h"
#include "text/ftfy_encoding.h"

#include "check.h"

#define GOLDEN "tests/golden/ftfy/cases.txt"
#define VOCAB "data/bpe_simple_vocab_16e6.txt.gz"

static dc_clip_tokenizer g_tok;

// Decodes one JSON string field into s; false when it is not one.
static bool json_ustr(const char *field, size_t len, dc_ustr *s) {
    dc_json_doc doc;
    if (dc_json_parse(&doc, field, len, 0)) return false;
    bool ok = doc.root->type == DC_JSON_STRING && !dc_utf8_decode(doc.root->str, doc.root->len, "golden text", s);
    dc_json_free(&doc);
    return ok;
}

static bool ustr_equal(const dc_ustr *a, const dc_ustr *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->cp, b->cp, a->n * sizeof *a->cp));
}

static void print_ustr(const char *label, const dc_ustr *s) {
    printf("  %s:", label);
    for (size_t i = 0; i < s->n && i < 80; i++) printf(" %04x", s->cp[i]);
    printf("%s\n", s->n > 80 ? " ..." : "");
}

typedef struct {
    int fix_text, fix_encoding, bad, good, tokens, malformed;
} counts;

static void check_fix(bool text_fix, const dc_ustr *in, const dc_ustr *want, int line, counts *c) {
    dc_ustr got = {0};
    int rc = text_fix ? dc_ftfy_fix_text(in, &got) : dc_ftfy_fix_encoding(in, &got);
    bool ok = !rc && ustr_equal(&got, want);
    CHECK(ok, "%s line %d: %s differs from ftfy (%s)", GOLDEN, line, text_fix ? "fix_text" : "fix_encoding",
          rc ? dc_error() : "see below");
    if (!ok) {
        print_ustr("input", in), print_ustr("ftfy ", want), print_ustr("ours ", &got);
    }
    *(text_fix ? &c->fix_text : &c->fix_encoding) += 1;
    dc_ustr_free(&got);
}

static void check_tokens(const char *field, size_t len, const char *rest, int line, counts *c) {
    dc_json_doc doc;
    if (dc_json_parse(&doc, field, len, 0) || !dc_json_is_cstr(doc.root)) {
        c->malformed++;
        return;
    }
    char *end;
    long count = strtol(rest, &end, 10);
    int32_t want[DC_CLIP_CONTEXT], got[DC_CLIP_CONTEXT];
    for (int i = 0; i < DC_CLIP_CONTEXT; i++) want[i] = (int32_t)strtol(end, &end, 10);
    int n = -1, first = -1;
    int rc = dc_clip_tokenize(&g_tok, doc.root->str, got, &n);
    for (int i = 0; i < DC_CLIP_CONTEXT && first < 0 && !rc; i++)
        if (got[i] != want[i]) first = i;
    CHECK(!rc && n == count && first < 0, "%s line %d: ids of %.60s: %s; %d tokens (want %ld); first differing id at %d",
          GOLDEN, line, field, rc ? dc_error() : "ok", n, count, first);
    c->tokens++;
    dc_json_free(&doc);
}

// One golden line: kind <TAB> input <TAB> expected.
static void check_line(char *line, int lineno, counts *c) {
    char *f[3] = {line, NULL, NULL};
    for (int k = 1; k < 3; k++) {
        f[k] = f[k - 1] ? strchr(f[k - 1], '\t') : NULL;
        if (f[k]) *f[k]++ = 0;
    }
    if (!f[1] || !f[2]) {
        c->malformed++;
        return;
    }
    size_t len1 = strlen(f[1]);
    if (!strcmp(f[0], "tokens")) {
        char *tab = strchr(f[2], '\t');
        if (!tab) c->malformed++;
        else check_tokens(f[1], len1, f[2], lineno, c);
        return;
    }
    dc_ustr in = {0}, want = {0};
    if (!json_ustr(f[1], len1, &in)) {
        c->malformed++;
    } else if (!strcmp(f[0], "is_bad")) {
        int want_bad = atoi(f[2]);
        bool got = dc_ftfy_is_bad(in.cp, in.n);
        CHECK(got == (want_bad != 0), "%s line %d: is_bad(%s) = %d, ftfy says %d", GOLDEN, lineno, f[1], got, want_bad);
        *(want_bad ? &c->bad : &c->good) += 1;
    } else if (!json_ustr(f[2], strlen(f[2]), &want)) {
        c->malformed++;
    } else if (!strcmp(f[0], "fix_text") || !strcmp(f[0], "fix_encoding")) {
        check_fix(!strcmp(f[0], "fix_text"), &in, &want, lineno, c);
    } else {
        c->malformed++;
    }
    dc_ustr_free(&in), dc_ustr_free(&want);
}

static void test_golden(void) {
    FILE *fp = fopen(GOLDEN, "r");
    CHECK(fp != NULL, "%s: cannot open (run from the repository root)", GOLDEN);
    if (!fp) return;
    static char line[1 << 16];
    counts c = {0};
    int lineno = 0;
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        check_line(line, lineno, &c);
    }
    fclose(fp);
    CHECK(c.malformed == 0, "%s: %d malformed lines", GOLDEN, c.malformed);
    // The file's header: 121 hand-picked texts and 300 random ones, both
    // functions each; strings from all 37 alternatives of the heuristic.
    CHECK(c.fix_text >= 400 && c.fix_encoding >= 400, "%d fix_text and %d fix_encoding cases", c.fix_text, c.fix_encoding);
    CHECK(c.bad >= 37 * 12 && c.good >= 100, "%d bad and %d good strings for the heuristic", c.bad, c.good);
    CHECK(c.tokens >= 5, "%d tokenized prompts", c.tokens);
    printf("%s: %d fix_text, %d fix_encoding, %d is_bad, %d token cases\n", GOLDEN, c.fix_text, c.fix_encoding,
           c.bad + c.good, c.tokens);
}

int main(void) {
    if (dc_clip_tokenizer_load(&g_tok, VOCAB)) {  // it ships with the repository
        printf("FAIL loading %s (run from the repository's root): %s\n", VOCAB, dc_error());
        return 1;
    }
    test_golden();
    dc_clip_tokenizer_free(&g_tok);
    printf("test_ftfy: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
