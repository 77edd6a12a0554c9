// libFuzzer harness for the CLIP tokenizer: its text path (UTF-8 decoding,
// ftfy's fixes, HTML unescaping, NFC, lower-casing, the pre-tokenizer, the
// merges) and its vocabulary readers. The first input byte says what the
// rest is:
//   0..191    a prompt, tokenized with a loaded vocabulary (OpenAI's file
//             when run from the repository, else a small vocab.json made here)
//   192..223  a BPE text file (OpenAI's format)
//   224..239  a vocab.json, with a small merges.txt beside it
//   240..255  a merges.txt, beside the small vocab.json
// A prompt's 77 ids must be BOS, tokens of the vocabulary, EOS, then padding.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz/fuzz_util.h"
#include "io/json.h"
#include "text/clip_tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define OPENAI_VOCAB "data/bpe_simple_vocab_16e6.txt.gz"

static dc_clip_tokenizer g_tok;
static int32_t g_max_id;

static void cleanup(void) {
    static const char *const names[] = {"bpe.txt", "tok/vocab.json", "tok/merges.txt", "small/vocab.json", "small/merges.txt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(fuzz_path(names[i]));
    rmdir(fuzz_path("tok"));
    rmdir(fuzz_path("small"));
}

// A vocabulary of the 512 byte symbols, a few merges and the two specials.
static void write_small_vocab(const char *dir) {
    char path[400];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    FILE *v = fopen(path, "w");
    if (!v) abort();
    // bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for U+0100 on
    unsigned ch[256];
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        ch[b] = printable ? (unsigned)b : 256u + (unsigned)extra++;
    }
    int id = 0;
    fputc('{', v);
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            char s[16];
            unsigned c = ch[b];
            int l = c < 0x80 ? (s[0] = (char)c, 1) : (s[0] = (char)(0xC0 | c >> 6), s[1] = (char)(0x80 | (c & 0x3F)), 2);
            strcpy(s + l, pass ? "</w>" : "");
            if (id) fputc(',', v);
            if (dc_json_write_string(v, s)) abort();
            fprintf(v, ":%d", id++);
        }
    static const char *const merges[] = {"t h", "th e</w>", "a n", "an d</w>", "i n", "in g</w>", "e r</w>", "o n"};
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    FILE *m = fopen(path, "w");
    if (!m) abort();
    fputs("#version: 0.2\n", m);
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        char joined[32];
        const char *sp = strchr(merges[i], ' ');
        snprintf(joined, sizeof joined, "%.*s%s", (int)(sp - merges[i]), merges[i], sp + 1);
        fprintf(v, ",\"%s\":%d", joined, id++);
        fprintf(m, "%s\n", merges[i]);
    }
    fprintf(v, ",\"<|startoftext|>\":%d,\"<|endoftext|>\":%d}", id, id + 1);
    if (fclose(v) || fclose(m)) abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    atexit(cleanup);  // runs before fuzz_cleanup removes the folder
    if (mkdir(fuzz_path("small"), 0700) || mkdir(fuzz_path("tok"), 0700)) abort();
    write_small_vocab(fuzz_path("small"));
    if (access(OPENAI_VOCAB, R_OK) != 0 || dc_clip_tokenizer_load(&g_tok, OPENAI_VOCAB) != 0)
        if (dc_clip_tokenizer_load(&g_tok, fuzz_path("small")) != 0) abort();
    g_max_id = g_tok.eos > g_tok.bos ? g_tok.eos : g_tok.bos;
    return 0;
}

// Tokenizes text (size bytes, made NUL-terminated) and checks the framing.
static void tokenize(const dc_clip_tokenizer *t, int32_t max_id, const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = 0;
    int32_t ids[DC_CLIP_CONTEXT];
    int n;
    if (dc_clip_tokenize(t, text, ids, &n) == 0) {
        int keep = n < DC_CLIP_CONTEXT - 2 ? n : DC_CLIP_CONTEXT - 2;
        if (n < 0 || ids[0] != t->bos || ids[keep + 1] != t->eos) abort();
        for (int i = 1; i <= keep; i++)
            if (ids[i] < 0 || ids[i] > max_id) abort();  // not a token of the vocabulary
        for (int i = keep + 2; i < DC_CLIP_CONTEXT; i++)
            if (ids[i] != t->pad) abort();
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t mode = data[0];
    data++, size--;
    if (mode < 192) {
        tokenize(&g_tok, g_max_id, data, size);
        return 0;
    }
    const char *path;
    if (mode < 224) {
        path = fuzz_path("bpe.txt");
        fuzz_write(path, data, size, 0);
    } else if (mode < 240) {
        path = fuzz_path("tok/vocab.json");
        fuzz_write(path, data, size, 0);
        char merges[400];
        snprintf(merges, sizeof merges, "%s", fuzz_path("tok/merges.txt"));
        fuzz_write(merges, "#version: 0.2\nt h\n", 18, 0);
    } else {
        path = fuzz_path("tok/vocab.json");
        char small[400];
        snprintf(small, sizeof small, "%s", fuzz_path("small/vocab.json"));
        FILE *in = fopen(small, "rb");
        static char buf[1 << 16];
        size_t n = in ? fread(buf, 1, sizeof buf, in) : 0;
        if (!in || fclose(in)) abort();
        fuzz_write(path, buf, n, 0);
        fuzz_write(fuzz_path("tok/merges.txt"), data, size, 0);
    }
    dc_clip_tokenizer t;
    if (dc_clip_tokenizer_load(&t, path) == 0) {
        static const uint8_t prompt[] = "the fuzzed vocabulary's tokens, &amp; more: 123 \xc3\xa9";
        tokenize(&t, INT32_MAX, prompt, sizeof prompt - 1);
        dc_clip_tokenizer_free(&t);
    }
    return 0;
}
