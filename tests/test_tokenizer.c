// The CLIP tokenizer: ids against golden files from an independent Python
// implementation of OpenAI's tokenizer (tools/clip_tokenizer_golden.py), the
// framing (BOS, 75 tokens, EOS, padding), each clean-up step through texts
// that must tokenize alike, the heap-based merges against the literal
// algorithm on random pieces, the vocab.json + merges.txt format against
// OpenAI's file, a diffusers folder's pad token, and bad files and text.
// Reads the shipped vocabulary, data/bpe_simple_vocab_16e6.txt.gz.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/error.h"
#include "io/json.h"
#include "text/clip_tokenizer.h"
#include "text/clip_vocab.h"

#include "check.h"
#include "tmpdir.h"

#define VOCAB "data/bpe_simple_vocab_16e6.txt.gz"
#define GOLDEN "tests/golden/clip_tokens.txt"

static dc_clip_tokenizer g_tok;

// The BPE ids of text; an empty list (n = -1) when encoding failed.
typedef struct {
    int32_t *ids;
    int n;
} ids_t;

static ids_t enc(const dc_clip_tokenizer *t, const char *text) {
    ids_t r = {NULL, -1};
    if (dc_clip_encode(t, text, &r.ids, &r.n)) printf("encode '%s': %s\n", text, dc_error());
    return r;
}

static bool same_ids(ids_t a, ids_t b) {
    return a.n >= 0 && a.n == b.n && (a.n == 0 || !memcmp(a.ids, b.ids, (size_t)a.n * sizeof *a.ids));
}

// Two texts that OpenAI's clean-up and regex make identical.
static void check_alike(const char *a, const char *b, const char *why) {
    ids_t x = enc(&g_tok, a), y = enc(&g_tok, b);
    CHECK(same_ids(x, y), "%s: '%s' gives %d ids, '%s' %d, or different ones", why, a, x.n, b, y.n);
    free(x.ids), free(y.ids);
}

static void check_count(const char *text, int want, const char *why) {
    ids_t x = enc(&g_tok, text);
    CHECK(x.n == want, "%s: '%s' gives %d ids, expected %d", why, text, x.n, want);
    free(x.ids);
}

// ---- the reference example and the framing -------------------------------------

static void test_reference(void) {
    CHECK(g_tok.n_vocab == 49408 && g_tok.n_merges == 48894, "vocabulary %d tokens, %d merges", g_tok.n_vocab, g_tok.n_merges);
    CHECK(g_tok.bos == 49406 && g_tok.eos == 49407 && g_tok.pad == 49407, "specials %d %d pad %d", g_tok.bos, g_tok.eos, g_tok.pad);
    static const int32_t want[12] = {49406, 320, 1125, 539, 550, 18376, 6765, 320, 4558, 525, 7496, 49407};
    int32_t ids[DC_CLIP_CONTEXT];
    int n = -1;
    CHECK(!dc_clip_tokenize(&g_tok, "a photo of an astronaut riding a horse on mars", ids, &n), "%s", dc_error());
    bool ok = n == 10 && !memcmp(ids, want, sizeof want);
    for (int i = 12; i < DC_CLIP_CONTEXT; i++) ok &= ids[i] == 49407;
    CHECK(ok, "the reference prompt: %d tokens, ids %d %d %d ... %d", n, ids[0], ids[1], ids[2], ids[11]);

    CHECK(!dc_clip_tokenize(&g_tok, "", ids, &n) && n == 0 && ids[0] == 49406, "empty prompt");
    ok = true;
    for (int i = 1; i < DC_CLIP_CONTEXT; i++) ok &= ids[i] == 49407;
    CHECK(ok, "the empty prompt is BOS then EOS to the end");

    // 100 words: BOS, the first 75, EOS; the count says 100.
    char text[400] = "";
    for (int i = 0; i < 100; i++) strcat(text, i ? " a" : "a");
    CHECK(!dc_clip_tokenize(&g_tok, text, ids, &n) && n == 100, "100 words counted %d", n);
    ok = ids[0] == 49406 && ids[76] == 49407;
    for (int i = 1; i <= 75; i++) ok &= ids[i] == 320;
    CHECK(ok, "100 words are cut to 75 between BOS and EOS");
    // 75 exactly fits with no padding; 76 loses one.
    text[2 * 75 - 1] = 0;
    CHECK(!dc_clip_tokenize(&g_tok, text, ids, &n) && n == 75 && ids[75] == 320 && ids[76] == 49407, "75 words fit");
}

// ---- golden ids from the Python implementation --------------------------------

static void test_golden(void) {
    FILE *f = fopen(GOLDEN, "r");
    CHECK(f != NULL, "%s: cannot open", GOLDEN);
    if (!f) return;
    char line[16384];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *tab = strchr(line, '\t');
        dc_json_doc doc;
        if (!tab || dc_json_parse(&doc, line, (size_t)(tab - line), 0) || doc.root->type != DC_JSON_STRING) {
            CHECK(false, "%s: malformed line '%.60s'", GOLDEN, line);
            continue;
        }
        lines++;
        char *p = tab + 1, *end;
        long count = strtol(p, &end, 10);
        int32_t want[DC_CLIP_CONTEXT], got[DC_CLIP_CONTEXT];
        for (int i = 0; i < DC_CLIP_CONTEXT; i++) want[i] = (int32_t)strtol(end, &end, 10);
        int n = -1;
        int rc = dc_clip_tokenize(&g_tok, doc.root->str, got, &n);
        int first = -1;
        for (int i = 0; i < DC_CLIP_CONTEXT && first < 0; i++)
            if (got[i] != want[i]) first = i;
        CHECK(!rc && n == count && first < 0, "golden %.50s: %s; %d tokens (want %ld); first differing id at %d: %d, want %d",
              line, rc ? dc_error() : "ok", n, count, first, first < 0 ? 0 : got[first], first < 0 ? 0 : want[first]);
        dc_json_free(&doc);
    }
    fclose(f);
    CHECK(lines >= 40, "%s holds %d prompts", GOLDEN, lines);
}

// ---- each clean-up step ----------------------------------------------------------

static void test_cleanup(void) {
    check_alike("A PHOTO Of", "a photo of", "lower-casing");
    check_alike("  a \t photo\n\r\nof  ", "a photo of", "whitespace runs, tabs and newlines");
    check_alike("a\u00a0photo\u3000of\u2003x", "a photo of x", "Unicode spaces");
    check_count("1984", 4, "digits are single pieces");
    check_alike("1984", "1 9 8 4", "digits are single pieces");
    check_alike("we'll it's I'M they've we're he'd don't", "we 'll it 's i 'm they 've we 're he 'd don 't", "contractions");
    check_alike("rock &amp; roll", "rock & roll", "&amp;");
    check_alike("&quot;x&quot; it&#39;s &lt;3 &#x263A;", "\"x\" it's <3 \u263a", "named and numeric references");
    check_alike("&amp;lt;b&amp;gt;", "<b>", "HTML unescaped (ftfy repeats its unescaping)");
    check_alike("&ampamp x", "& x", "html.unescape twice (a name without ';', which ftfy leaves)");
    check_alike("<b> &amp;lt;", "<b> <", "html.unescape twice (a line with '<', which ftfy leaves)");
    check_alike("&ampx &notit;", "&x \u00acit;", "unterminated names, longest known prefix");
    check_alike("&EACUTE;t&eacute;", "\u00e9t\u00e9", "ftfy's upper-case names");
    check_alike("<i>&EACUTE;</i>", "<i>& EACUTE ;</i>", "no upper-case names on a line with '<'");
    check_count("!!!???...", 3, "a punctuation run is one piece");  // "!!!", "???", "..."
    check_alike("\u201cwhy\u201d it\u2019s \u2018so\u2019", "\"why\" it's 'so'", "curly quotes");
    check_alike("\ufb01ne \ufb02y", "fine fly", "Latin ligatures");
    check_alike("\uff34\uff25\uff38\uff34\uff01", "text!", "fullwidth forms");
    check_alike("cafe\u0301", "caf\u00e9", "NFC");
    check_alike("\u1100\u1161\u11a8", "\uac01", "NFC composes Hangul");
    check_alike("\u039f\u0394\u039f\u03a3 \u03a3\u0391", "\u03bf\u03b4\u03bf\u03c2 \u03c3\u03b1", "final sigma");
    check_alike("\u0130", "i\u0307", "dotted capital I lowers to two characters");
    check_alike("STRASSE Stra\u00dfe \u041f\u0420\u0418\u0412\u0415\u0422", "strasse stra\u00dfe \u043f\u0440\u0438\u0432\u0435\u0442", "non-ASCII lower-casing");
    check_alike("a\x1b[1;31mred\x1b[0m\x07", "ared", "terminal escapes and controls removed");
    check_alike("\xc2\x93q\xc2\x94 \xc2\x81", "\"q\" \xc2\x81", "C1 controls read as Windows-1252");
    check_count("<|endoftext|>", 1, "the special name is one token");
    check_alike("<|ENDOFTEXT|>", "<|endoftext|>", "special names after lower-casing");
    ids_t s = enc(&g_tok, "<|startoftext|>");
    CHECK(s.n == 1 && s.ids[0] == 49406, "<|startoftext|> is id 49406");
    free(s.ids);
    s = enc(&g_tok, "<|\u017ftartoftext|>");  // matches the special pattern (IGNORECASE) but is not the name
    CHECK(s.n > 1, "a long s in the special name makes ordinary tokens (%d)", s.n);
    free(s.ids);
    // Letters of any script form one piece; an emoji falls back to byte symbols.
    ids_t e = enc(&g_tok, "\U0001f431");
    CHECK(e.n >= 1 && e.n <= 4, "an emoji is 1 to 4 byte-level tokens (%d)", e.n);
    free(e.ids);
}

static void test_bad_text(void) {
    int32_t *ids;
    int n;
    CHECK(dc_clip_encode(&g_tok, "ab\xff", &ids, &n) && strstr(dc_error(), "not valid UTF-8") &&
              strstr(dc_error(), "offset 2"), "invalid UTF-8: '%s'", dc_error());
    CHECK(dc_clip_encode(&g_tok, "\xc3(", &ids, &n) && strstr(dc_error(), "byte 0xc3 at offset 0"), "a broken sequence: '%s'", dc_error());
    CHECK(dc_clip_encode(&g_tok, "\xed\xa0\x80", &ids, &n), "an encoded surrogate is refused");
    CHECK(dc_clip_encode(&g_tok, "\xc0\xaf", &ids, &n), "an overlong form is refused");
}

// ---- the heap-based merges against the literal algorithm -----------------------

// OpenAI's bpe() as written: find the pair of lowest rank, merge it wherever
// it occurs left to right, until no pair has a rank.
static int naive_bpe(const dc_clip_vocab *v, const char *s, int n, int32_t *out) {
    for (int i = 0; i < n; i++) out[i] = i == n - 1 ? v->byte_end_id[(unsigned char)s[i]] : v->byte_id[(unsigned char)s[i]];
    for (;;) {
        int32_t best = -1;
        for (int i = 0; i + 1 < n; i++) {
            int32_t r = dc_clip_pair_rank(v, out[i], out[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) return n;
        int m = 0;
        for (int i = 0; i < n;) {
            if (i + 1 < n && out[i] == v->left[best] && out[i + 1] == v->right[best]) out[m++] = v->result[best], i += 2;
            else out[m++] = out[i++];
        }
        n = m;
    }
}

static void test_merges_random(void) {
    static const char alphabet[] = "aeilnorstu";
    uint64_t seed = 12345;
    int bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        char s[401];
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int n = 1 + (int)(seed >> 33) % (trial < 300 ? 24 : 400);
        for (int i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            // runs of one letter now and then, for overlapping pairs ("aaa")
            s[i] = i && (seed >> 60) < 4 ? s[i - 1] : alphabet[(seed >> 33) % 10];
        }
        s[n] = 0;
        int32_t want[401];
        int nw = naive_bpe(g_tok.v, s, n, want);
        ids_t got = enc(&g_tok, s);
        if (!(got.n == nw && !memcmp(got.ids, want, (size_t)nw * sizeof *want)) && bad++ < 3)
            printf("merges differ from the literal algorithm on '%s' (%d ids, want %d)\n", s, got.n, nw);
        free(got.ids);
    }
    CHECK(bad == 0, "heap merges equal the literal algorithm on 400 random pieces (%d differ)", bad);
    // A piece of 200 KB: n log n, not n^2 (this would take minutes otherwise).
    char *big = malloc(200001);
    for (int i = 0; i < 200000; i++) big[i] = alphabet[(i * 7 + i / 3) % 10];
    big[200000] = 0;
    ids_t b = enc(&g_tok, big);
    CHECK(b.n > 10000, "a 200 KB word gives %d ids", b.n);
    free(b.ids), free(big);
}

// ---- vocab.json + merges.txt ----------------------------------------------------

// Writes a transformers tokenizer folder from OpenAI's file: vocab.json built
// as OpenAI builds its vocabulary, merges.txt its first 48894 merges.
static int write_hf_folder(const char *dir, int merges_wanted, bool skip_token) {
    gzFile gz = gzopen(VOCAB, "rb");
    if (!gz) return -1;
    static char text[4 << 20];
    int n = gzread(gz, text, sizeof text - 1);
    gzclose(gz);
    if (n <= 0) return -1;
    text[n] = 0;
    mkdir(dir, 0755);
    char path[512];
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    FILE *m = fopen(path, "w");
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    FILE *v = fopen(path, "w");
    if (!m || !v) return -1;
    // bytes_to_unicode, as the tokenizer documents it
    int order[256], k = 0, extra = 0;
    unsigned ch[256];
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            if (printable == !pass) order[k++] = b, ch[b] = printable ? (unsigned)b : 256u + (unsigned)extra++;
        }
    int id = 0;
    fputc('{', v);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 256; i++) {
            char s[16];
            unsigned c = ch[order[i]];
            int l = c < 0x80 ? (s[0] = (char)c, 1) : (s[0] = (char)(0xC0 | c >> 6), s[1] = (char)(0x80 | (c & 0x3F)), 2);
            strcpy(s + l, pass ? "</w>" : "");
            if (id) fputc(',', v);
            dc_json_write_string(v, s);
            fprintf(v, ":%d", id++);
        }
    char *line = strchr(text, '\n') + 1;
    fputs("#version: 0.2\n", m);
    for (int r = 0; r < merges_wanted; r++) {
        char *nl = strchr(line, '\n');
        *nl = 0;
        fprintf(m, "%s\n", line);
        char joined[256];
        char *sp = strchr(line, ' ');
        snprintf(joined, sizeof joined, "%.*s%s", (int)(sp - line), line, sp + 1);
        if (!(skip_token && r == 1000)) {
            fputc(',', v);
            dc_json_write_string(v, joined);
            fprintf(v, ":%d", id);
        }
        id++;
        line = nl + 1;
    }
    fprintf(v, ",\"<|startoftext|>\":%d,\"<|endoftext|>\":%d}", id, id + 1);
    fclose(m), fclose(v);
    return 0;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static void test_hf_format(void) {
    char dir[300], sub[320];
    snprintf(dir, sizeof dir, "%s/model", g_dir);
    snprintf(sub, sizeof sub, "%s/tokenizer", dir);
    mkdir(dir, 0755);
    CHECK(write_hf_folder(sub, 48894, false) == 0, "writing vocab.json and merges.txt");
    dc_clip_tokenizer hf;
    // a diffusers model folder (tokenizer/ inside), the tokenizer folder, its vocab.json
    const char *paths[3] = {dir, sub, tmp_path("model/tokenizer/vocab.json")};
    for (int p = 0; p < 3; p++) {
        int rc = dc_clip_tokenizer_load(&hf, paths[p]);
        CHECK(!rc, "loading %s: %s", paths[p], rc ? dc_error() : "");
        if (rc) continue;
        CHECK(hf.n_vocab == 49408 && hf.bos == 49406 && hf.eos == 49407 && hf.pad == 49407, "vocab.json: %d tokens", hf.n_vocab);
        if (p == 0) {  // every golden prompt alike in both formats
            FILE *f = fopen(GOLDEN, "r");
            char line[16384];
            int differ = 0, total = 0;
            while (f && fgets(line, sizeof line, f)) {
                char *tab = strchr(line, '\t');
                dc_json_doc doc;
                if (line[0] == '#' || !tab || dc_json_parse(&doc, line, (size_t)(tab - line), 0)) continue;
                ids_t a = enc(&g_tok, doc.root->str), b = enc(&hf, doc.root->str);
                differ += !same_ids(a, b), total++;
                free(a.ids), free(b.ids), dc_json_free(&doc);
            }
            if (f) fclose(f);
            CHECK(total >= 40 && differ == 0, "vocab.json + merges.txt vs OpenAI's file: %d of %d prompts differ", differ, total);
        }
        dc_clip_tokenizer_free(&hf);
    }
    // merges.txt alone reads as OpenAI's format
    CHECK(!dc_clip_tokenizer_load(&hf, tmp_path("model/tokenizer/merges.txt")) && hf.n_vocab == 49408, "merges.txt alone: %s", dc_error());
    dc_clip_tokenizer_free(&hf);

    // pad_token: special_tokens_map.json wins over tokenizer_config.json
    write_text(tmp_path("model/tokenizer/tokenizer_config.json"), "{\"pad_token\": {\"content\": \"<|endoftext|>\"}}");
    write_text(tmp_path("model/tokenizer/special_tokens_map.json"), "{\"bos_token\": \"<|startoftext|>\", \"pad_token\": \"!\"}");
    int32_t ids[DC_CLIP_CONTEXT];
    int n;
    CHECK(!dc_clip_tokenizer_load(&hf, dir) && hf.pad == 0, "pad_token '!' is id 0 (%d): %s", hf.pad, dc_error());
    CHECK(!dc_clip_tokenize(&hf, "a photo", ids, &n) && ids[3] == 49407 && ids[4] == 0 && ids[76] == 0, "padded with 0 after EOS");
    dc_clip_tokenizer_free(&hf);
    write_text(tmp_path("model/tokenizer/special_tokens_map.json"), "{\"pad_token\": null}");
    write_text(tmp_path("model/tokenizer/tokenizer_config.json"), "{\"pad_token\": {\"content\": \"!\"}}");
    CHECK(!dc_clip_tokenizer_load(&hf, dir) && hf.pad == 0, "pad_token from tokenizer_config.json: %d", hf.pad);
    dc_clip_tokenizer_free(&hf);
    write_text(tmp_path("model/tokenizer/tokenizer_config.json"), "{\"pad_token\": \"<pad>\"}");
    CHECK(dc_clip_tokenizer_load(&hf, dir) && strstr(dc_error(), "pad_token '<pad>' is not in the vocabulary"), "unknown pad: %s", dc_error());
}

// ---- bad files ------------------------------------------------------------------

static void expect_load_error(const char *path, const char *msg, const char *why) {
    dc_clip_tokenizer t;
    int rc = dc_clip_tokenizer_load(&t, path);
    CHECK(rc && strstr(dc_error(), msg), "%s: '%s' lacks '%s'", why, rc ? dc_error() : "loaded", msg);
    if (!rc) dc_clip_tokenizer_free(&t);
}

static void test_bad_files(void) {
    expect_load_error(tmp_path("none.txt.gz"), "none.txt.gz: cannot open", "a missing file");
    expect_load_error(g_dir, "without vocab.json", "a folder without a vocabulary");
    write_text(tmp_path("short.txt"), "#version: 0.2\ni n\nt h\n");
    expect_load_error(tmp_path("short.txt"), "2 merge rules after the header line", "a BPE file cut short");
    write_text(tmp_path("bad.txt"), "#version: 0.2\ni n\nt h e\n");
    expect_load_error(tmp_path("bad.txt"), "bad.txt line 3: a merge rule is two symbols", "a line of three symbols");
    write_text(tmp_path("bin.txt"), "#version\n\xff\xfe\n");
    expect_load_error(tmp_path("bin.txt"), "not UTF-8 text (byte 0xff at offset 9)", "binary data");
    // a gzip file cut in half
    FILE *in = fopen(VOCAB, "rb"), *out = fopen(tmp_path("cut.txt.gz"), "wb");
    static char buf[700000];
    size_t got = in ? fread(buf, 1, sizeof buf, in) : 0;
    if (out) fwrite(buf, 1, got, out), fclose(out);
    if (in) fclose(in);
    expect_load_error(tmp_path("cut.txt.gz"), "truncated", "a truncated gzip file");

    char dir[300];
    snprintf(dir, sizeof dir, "%s/hf2", g_dir);
    write_hf_folder(dir, 48894, true);  // vocab.json lacks the product of merge 1001
    expect_load_error(dir, "merges.txt line 1002: '", "a merge whose product is not in vocab.json");
    write_text(tmp_path("hf2/vocab.json"), "{\"a\": 1.5}");
    expect_load_error(tmp_path("hf2/vocab.json"), "the id of 'a' is not an integer", "a fractional id");
    write_text(tmp_path("hf2/vocab.json"), "{\"a\": 1,}");
    expect_load_error(tmp_path("hf2/vocab.json"), "hf2/vocab.json", "malformed JSON names the file");
    write_text(tmp_path("hf2/vocab.json"), "{\"a\": 0}");
    write_text(tmp_path("hf2/merges.txt"), "#version: 0.2\n");
    expect_load_error(tmp_path("hf2/vocab.json"), "lacks the symbol of byte 0x00", "a vocabulary without byte symbols");
    snprintf(dir, sizeof dir, "%s/hf3", g_dir);
    mkdir(dir, 0755);
    write_text(tmp_path("hf3/vocab.json"), "{}");
    expect_load_error(tmp_path("hf3/vocab.json"), "needs its merges.txt beside it", "vocab.json alone");
}

int main(void) {
    struct stat st;
    if (stat(VOCAB, &st) != 0) {
        printf("FAIL %s not found (it ships with the repository; run from its root)\n", VOCAB);
        return 1;
    }
    if (tmpdir_make("tok")) return 1;
    if (dc_clip_tokenizer_load(&g_tok, VOCAB)) {
        printf("FAIL loading %s: %s\n", VOCAB, dc_error());
        return 1;
    }
    test_reference();
    test_golden();
    test_cleanup();
    test_bad_text();
    test_merges_random();
    test_hf_format();
    test_bad_files();
    dc_clip_tokenizer_free(&g_tok);
    tmpdir_remove();
    printf("test_tokenizer: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
