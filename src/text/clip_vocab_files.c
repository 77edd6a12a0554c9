// transformers' tokenizer files from OpenAI's BPE file. vocab.json maps each
// token to its id in simple_tokenizer.py's order: the 256 byte symbols, the
// same with </w>, each merge's product, <|startoftext|>, <|endoftext|>.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/json.h"
#include "text/clip_vocab_files.h"

#define CLIP_MERGES (49152 - 256 - 2)  // the merges simple_tokenizer.py uses

// bytes_to_unicode(): each byte's printable stand-in, in OpenAI's order
// (printable bytes as themselves, then the rest from U+0100 on), as UTF-8.
static void byte_symbols(char sym[256][4]) {
    int order[256], n = 0, extra = 0;
    bool printable[256] = {false};
    for (int b = 0; b < 256; b++)
        if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae) printable[b] = true, order[n++] = b;
    for (int b = 0; b < 256; b++)
        if (!printable[b]) order[n++] = b;
    for (int i = 0; i < 256; i++) {
        int b = order[i];
        unsigned cp = printable[b] ? (unsigned)b : 256u + (unsigned)extra++;
        char *s = sym[i];
        if (cp < 0x80) s[0] = (char)cp, s[1] = 0;
        else s[0] = (char)(0xc0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3f)), s[2] = 0;
    }
}

// The whole decompressed BPE file (NUL-terminated) into *text.
static int read_bpe(const char *bpe, char **text) {
    gzFile gz = gzopen(bpe, "rb");
    if (!gz) return dc_fail("%s: cannot open the CLIP vocabulary", bpe);
    size_t cap = 1 << 22, len = 0;
    char *t = malloc(cap);
    int got;
    while (t && (got = gzread(gz, t + len, (unsigned)(cap - len - 1))) > 0)
        if ((len += (size_t)got) == cap - 1) {
            char *bigger = realloc(t, cap *= 2);
            if (!bigger) free(t);
            t = bigger;
        }
    gzclose(gz);
    if (!t) return dc_fail("out of memory");
    t[len] = 0;
    *text = t;
    return 0;
}

static int write_vocab(const char *path, char *const *merges, int n) {
    char sym[256][4];
    byte_symbols(sym);
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    FILE *f = dc_atomic_stream(af);
    int id = 0, rc = 0;
    fputc('{', f);
    for (int i = 0; i < 256 && !rc; i++) rc = dc_json_write_string(f, sym[i]), fprintf(f, ": %d, ", id++);
    for (int i = 0; i < 256 && !rc; i++) {
        char end[16];
        snprintf(end, sizeof end, "%.3s</w>", sym[i]);
        rc = dc_json_write_string(f, end), fprintf(f, ": %d, ", id++);
    }
    for (int i = 0; i < n && !rc; i++) {
        char joined[256];
        size_t a = strcspn(merges[i], " ");
        snprintf(joined, sizeof joined, "%.*s%s", (int)a, merges[i], merges[i] + a + 1);
        rc = dc_json_write_string(f, joined), fprintf(f, ": %d, ", id++);
    }
    fprintf(f, "\"<|startoftext|>\": %d, \"<|endoftext|>\": %d}\n", id, id + 1);
    return dc_atomic_end(af, rc == 0);
}

static int write_merges(const char *path, char *const *merges, int n) {
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    FILE *f = dc_atomic_stream(af);
    fputs("#version: 0.2\n", f);
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", merges[i]);
    return dc_atomic_end(af, 1);
}

int dc_clip_vocab_write_files(const char *bpe, const char *dir, bool pad_excl) {
    char *text = NULL;
    DC_TRY(read_bpe(bpe, &text));
    char **merges = malloc(sizeof *merges * CLIP_MERGES);
    if (!merges) return free(text), dc_fail("out of memory");
    char *line = strchr(text, '\n');  // the first line is a header
    int n = 0;
    while (line && n < CLIP_MERGES) {
        char *next = strchr(++line, '\n');
        if (next) *next = 0;
        if (!strchr(line, ' ')) break;
        merges[n++] = line;
        line = next;
    }
    char path[4200], t[512];
    int rc = n < CLIP_MERGES ? dc_fail("%s: %d merges, not OpenAI's vocabulary", bpe, n) : dc_mkdir_p(dir);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    if (!rc) rc = write_vocab(path, merges, n);
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    if (!rc) rc = write_merges(path, merges, n);
    free(merges), free(text);
    const char *pad = pad_excl ? "!" : "<|endoftext|>";
    snprintf(t, sizeof t,
             "{\n  \"bos_token\": \"<|startoftext|>\",\n  \"eos_token\": \"<|endoftext|>\",\n"
             "  \"pad_token\": \"%s\",\n  \"unk_token\": \"<|endoftext|>\"\n}\n", pad);
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    if (!rc) rc = dc_write_text_file(path, t);
    snprintf(t, sizeof t,
             "{\n  \"tokenizer_class\": \"CLIPTokenizer\",\n  \"model_max_length\": 77,\n"
             "  \"do_lower_case\": true,\n  \"errors\": \"replace\",\n  \"pad_token\": \"%s\"\n}\n", pad);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!rc) rc = dc_write_text_file(path, t);
    return rc;
}
