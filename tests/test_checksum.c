// Integrity of files: xxHash64 and SHA-256 against the published test
// vectors (SHA-256: FIPS 180-4's examples, NIST's one-million-'a' message), the
// checksums the safetensors writer adds (every single-bit flip of a file is
// refused, naming the tensor or the metadata; the documented canonical form
// of the header), files without checksums, --no-verify, and inputs that are
// not regular files (refused at once, never waited on).
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "io/safetensors.h"

#include "check.h"
#include "tmpdir.h"

// ---- xxHash64 ----------------------------------------------------------------

// The digest three ways: at once, in one update, and one byte at a time.
static void check_xxh64(const void *data, size_t n, uint64_t seed, uint64_t want, const char *what) {
    dc_xxh64_state s, b;
    dc_xxh64_init(&s, seed), dc_xxh64_init(&b, seed);
    dc_xxh64_update(&s, data, n);
    for (size_t i = 0; i < n; i++) dc_xxh64_update(&b, (const uint8_t *)data + i, 1);
    uint64_t a = dc_xxh64(data, n, seed), c = dc_xxh64_digest(&s), d = dc_xxh64_digest(&b);
    CHECK(a == want && c == want && d == want, "xxh64 %s (len %zu, seed %llu): %016llx %016llx %016llx, want %016llx",
          what, n, (unsigned long long)seed, (unsigned long long)a, (unsigned long long)c, (unsigned long long)d,
          (unsigned long long)want);
}

static void test_xxh64(void) {
    // Published values: xxhsum's sanity check (the reference's bench.c) over
    // its generated buffer, and the canonical strings.
    enum { SANITY = 101 };
    const uint32_t prime = 2654435761u;
    uint8_t buf[SANITY];
    uint32_t gen = prime;
    for (int i = 0; i < SANITY; i++) buf[i] = (uint8_t)(gen >> 24), gen *= gen;
    check_xxh64(NULL, 0, 0, 0xEF46DB3751D8E999ull, "sanity");
    check_xxh64(NULL, 0, prime, 0xAC75FDA2929B17EFull, "sanity");
    check_xxh64(buf, 1, 0, 0x4FCE394CC88952D8ull, "sanity");
    check_xxh64(buf, 1, prime, 0x739840CB819FA723ull, "sanity");
    check_xxh64(buf, 14, 0, 0xCFFA8DB881BC3A3Dull, "sanity");
    check_xxh64(buf, 14, prime, 0x5B9611585EFCC9CBull, "sanity");
    check_xxh64(buf, SANITY, 0, 0x0EAB543384F878ADull, "sanity");
    check_xxh64(buf, SANITY, prime, 0xCAA65939306F1E21ull, "sanity");
    check_xxh64("a", 1, 0, 0xD24EC4F1A98C6E5Bull, "'a'");
    check_xxh64("abc", 3, 0, 0x44BC2CF5AD770999ull, "'abc'");
    const char *s = "Nobody inspects the spammish repetition";
    check_xxh64(s, strlen(s), 0, 0xFBCEA83C8A378BF1ull, "sentence");
    // pieces of every size give the one-shot digest
    uint8_t big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (uint8_t)(i * 131 + 7);
    uint64_t want = dc_xxh64(big, sizeof big, 5);
    int bad = 0;
    for (size_t piece = 1; piece <= 70; piece++) {
        dc_xxh64_state st;
        dc_xxh64_init(&st, 5);
        for (size_t at = 0; at < sizeof big; at += piece)
            dc_xxh64_update(&st, big + at, sizeof big - at < piece ? sizeof big - at : piece);
        bad += dc_xxh64_digest(&st) != want;
    }
    CHECK(bad == 0, "streaming in pieces of 1..70 bytes: %d digests differ", bad);
}

// ---- checksums in files ----------------------------------------------------------

static float g_a[6] = {1, 2, 3, 4, 5, 6};
static int64_t g_b[3] = {7, -8, 9};
static uint16_t g_c[2] = {0x3c00, 0x4000};
static const dc_st_entry g_entries[] = {
    {"a", DC_F32, 2, {2, 3}, g_a}, {"b", DC_I64, 1, {3}, g_b}, {"c", DC_BF16, 1, {2}, g_c}, {"z", DC_F32, 1, {0}, NULL},
};
static const char *g_mk[] = {"format", "num_heads"}, *g_mv[] = {"pt", "2"};

static uint64_t hdr_len(const uint8_t *b) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    return n;
}

// The header digest as safetensors.h documents it, built independently.
static void put_str(uint8_t *buf, size_t *at, const char *s) {
    uint64_t n = strlen(s);
    for (int i = 0; i < 8; i++) buf[(*at)++] = (uint8_t)(n >> (8 * i));
    memcpy(buf + *at, s, n), *at += n;
}
static void put_u64(uint8_t *buf, size_t *at, uint64_t v) {
    for (int i = 0; i < 8; i++) buf[(*at)++] = (uint8_t)(v >> (8 * i));
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_layout(void) {
    uint8_t *mem;
    size_t len;
    CHECK(dc_st_serialize(g_entries, 4, g_mk, g_mv, 2, &mem, &len) == 0, "serialize: %s", dc_error());
    dc_st_file f;
    CHECK(dc_st_parse(&f, mem, len, "sums") == 0 && f.verified, "parse: %s", dc_error());
    char want[17];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)dc_xxh64(g_a, sizeof g_a, 0));
    CHECK(dc_st_meta(&f, "checksum.a") && strcmp(dc_st_meta(&f, "checksum.a"), want) == 0, "checksum.a = xxh64");
    CHECK(dc_st_meta(&f, "checksum.z") && strcmp(dc_st_meta(&f, "checksum.z"), "ef46db3751d8e999") == 0,
          "an empty tensor's checksum is xxh64 of nothing");
    // metadata pairs but the header's own, sorted by key; then tensors sorted by name
    char *keys[16];
    int nk = 0;
    for (int i = 0; i < f.nmeta; i++)
        if (strcmp(f.meta_keys[i], "checksum.__metadata__") != 0) keys[nk++] = f.meta_keys[i];
    qsort(keys, (size_t)nk, sizeof *keys, cmp_key);
    uint8_t canon[2048];
    size_t at = 0;
    for (int i = 0; i < nk; i++)
        canon[at++] = 'M', put_str(canon, &at, keys[i]), put_str(canon, &at, dc_st_meta(&f, keys[i]));
    const char *names[] = {"a", "b", "c", "z"};  // already sorted
    for (int i = 0; i < 4; i++) {
        const dc_st_tensor *t = dc_st_find(&f, names[i]);
        canon[at++] = 'T', put_str(canon, &at, t->name), put_str(canon, &at, dc_dtype_name(t->dtype));
        put_u64(canon, &at, (uint64_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) put_u64(canon, &at, (uint64_t)t->shape[d]);
    }
    snprintf(want, sizeof want, "%016llx", (unsigned long long)dc_xxh64(canon, at, 0));
    const char *got = dc_st_meta(&f, "checksum.__metadata__");
    CHECK(got && strcmp(got, want) == 0, "header digest in the documented form: %s, want %s", got ? got : "none",
          want);
    dc_st_close(&f);

    // Every single-bit flip anywhere in the file is refused; in the data, the
    // message names the tensor whose bytes changed.
    uint64_t data0 = 8 + hdr_len(mem);
    int accepted = 0, wrong_msg = 0, flips = 0;
    for (size_t byte = 0; byte < len; byte++)
        for (int bit = 0; bit < 8; bit++) {
            mem[byte] ^= (uint8_t)(1u << bit);
            flips++;
            if (dc_st_parse(&f, mem, len, "flip") == 0) {
                accepted++;
                dc_st_close(&f);
            } else if (byte >= data0) {
                const char *name = byte < data0 + 24 ? "'a'" : byte < data0 + 48 ? "'b'" : "'c'";
                char want_msg[64];
                snprintf(want_msg, sizeof want_msg, "tensor %s does not match its checksum", name);
                if (!strstr(dc_error(), want_msg) || !strstr(dc_error(), "corrupt")) {
                    if (!wrong_msg++) printf("  data flip at %zu: %s\n", byte, dc_error());
                }
            } else if (strncmp(dc_error(), "flip: ", 6) != 0) {
                if (!wrong_msg++) printf("  header flip at %zu: %s\n", byte, dc_error());
            }
            mem[byte] ^= (uint8_t)(1u << bit);
        }
    CHECK(accepted == 0 && wrong_msg == 0, "%d single-bit flips: %d accepted, %d with a wrong message", flips,
          accepted, wrong_msg);

    // --no-verify accepts a flipped data bit, and the file reads as flipped.
    mem[data0] ^= 1;
    CHECK(dc_st_parse_opts(&f, mem, len, "flip", DC_ST_NO_VERIFY) == 0 && !f.verified &&
          f.data[0] == (uint8_t)(((const uint8_t *)g_a)[0] ^ 1), "no-verify accepts a data flip: %s", dc_error());
    dc_st_close(&f);
    mem[data0] ^= 1;

    // An edit of a metadata value that keeps the header's length.
    char *hdr = (char *)mem + 8, *v = strstr(hdr, "\"num_heads\":\"2\"");
    CHECK(v != NULL, "num_heads in the header");
    if (v) {
        v[13] = '4';
        CHECK(dc_st_parse(&f, mem, len, "edit") != 0 && strstr(dc_error(), "edit: the metadata") &&
              strstr(dc_error(), "does not match its checksum"), "edited metadata: %s", dc_error());
        v[13] = '2';
    }
    free(mem);
}

// 8-byte length, then hdr (padded), then n zero bytes.
static uint8_t *craft(const char *hdr, size_t n, size_t *len) {
    size_t h = strlen(hdr), hp = (h + 7) / 8 * 8;
    *len = 8 + hp + n;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memset(b + 8, ' ', hp), memcpy(b + 8, hdr, h);
    return b;
}

static void test_without_checksums(void) {
#define W "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"
#define META(k, v) "{\"__metadata__\":{\"" k "\":\"" v "\"},"
    struct { const char *hdr; int ok; const char *msg; } cases[] = {
        // a file from elsewhere (a PyTorch export): no checksums, loads
        {"{" W, 1, NULL},
        {META("format", "pt") W, 1, NULL},
        // another tool's checksum key does not make a file ours
        {META("checksum.sha256", "abc") W, 1, NULL},
        // ours from before checksums
        {META("format", "diffusion.c checkpoint v1") W, 1, NULL},
        // ours from after: the checksums were stripped
        {META("format", "diffusion.c checkpoint v2") W, 0, "carries no checksums"},
        {META("format", "diffusion.c weights v3") W, 0, "carries no checksums"},
        // checksums of the tensors but not the header, or a malformed one
        {META("checksum.w", "0000000000000000") W, 0, "metadata checksum is missing"},
        {META("checksum.__metadata__", "00000000000000zz") W, 0, "metadata checksum is malformed"},
    };
#undef W
#undef META
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint8_t *b = craft(cases[i].hdr, 8, &len);
        dc_st_file f;
        int rc = dc_st_parse(&f, b, len, "plain");
        if (cases[i].ok) CHECK(rc == 0 && !f.verified, "case %zu loads unverified: %s", i, rc ? dc_error() : "");
        else CHECK(rc != 0 && strstr(dc_error(), cases[i].msg), "case %zu refused: %s", i, rc ? dc_error() : "loaded");
        if (rc == 0) dc_st_close(&f);
        CHECK(dc_st_parse_opts(&f, b, len, "plain", DC_ST_NO_VERIFY) == 0, "case %zu with no-verify", i);
        dc_st_close(&f);
        free(b);
    }
    // The writer keeps "checksum." keys to itself, and metadata keys unique.
    float v = 1;
    dc_st_entry e[] = {{"w", DC_F32, 1, {1}, &v}};
    const char *k1[] = {"checksum.w"}, *v1[] = {"0"}, *k2[] = {"x", "x"}, *v2[] = {"1", "2"};
    uint8_t *mem;
    size_t len;
    CHECK(dc_st_serialize(e, 1, k1, v1, 1, &mem, &len) != 0 && strstr(dc_error(), "are the writer's"),
          "reserved key refused: %s", dc_error());
    CHECK(dc_st_write(tmp_path("dup.safetensors"), e, 1, k2, v2, 2) != 0 &&
          strstr(dc_error(), "duplicate metadata key 'x'"), "duplicate key refused: %s", dc_error());
}

// ---- files on disk ----------------------------------------------------------------

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL opening a FIFO blocked\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

static void test_files(void) {
    const char *p = tmp_path("w.safetensors");
    CHECK(dc_st_write(p, g_entries, 4, g_mk, g_mv, 2) == 0, "write: %s", dc_error());
    dc_st_file f;
    CHECK(dc_st_open(&f, p) == 0 && f.verified && f.count == 4, "open verified: %s", dc_error());
    uint64_t data0 = f.data - (uint8_t *)f.mem;
    dc_st_close(&f);
    // a flipped bit inside tensor 'b' (bytes 24..47 of the data)
    FILE *fp = fopen(p, "r+b");
    fseek(fp, (long)data0 + 30, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, (long)data0 + 30, SEEK_SET), fputc(c ^ 0x10, fp), fclose(fp);
    CHECK(dc_st_open(&f, p) != 0 && strstr(dc_error(), p) && strstr(dc_error(), "tensor 'b' does not match") &&
          strstr(dc_error(), "--no-verify"), "flipped file refused: %s", dc_error());
    CHECK(dc_st_open_opts(&f, p, DC_ST_NO_VERIFY) == 0 && !f.verified, "no-verify opens it: %s", dc_error());
    dc_st_close(&f);
    CHECK(truncate(p, (off_t)data0 + 10) == 0 && dc_st_open(&f, p) != 0 && strstr(dc_error(), "data buffer is"),
          "truncated: %s", dc_error());

    // Not regular files: refused at once, a FIFO without a writer included.
    signal(SIGALRM, on_alarm);
    alarm(10);
    const char *fifo = tmp_path("fifo.safetensors");
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
    CHECK(dc_st_open(&f, fifo) != 0 && strstr(dc_error(), "is a FIFO, not a regular file"), "FIFO: %s", dc_error());
    CHECK(dc_st_open(&f, g_dir) != 0 && strstr(dc_error(), "is a directory"), "directory: %s", dc_error());
    CHECK(dc_open_regular("/dev/null", NULL) < 0 && strstr(dc_error(), "is a character device"), "/dev/null: %s",
          dc_error());
    int64_t size = -1;
    int fd = dc_open_regular(p, &size);
    CHECK(fd >= 0 && size == (int64_t)data0 + 10 && !(fcntl(fd, F_GETFL) & O_NONBLOCK), "regular file: blocking fd");
    if (fd >= 0) close(fd);
    alarm(0);
}

// ---- SHA-256 -------------------------------------------------------------------

// The digest at once and fed in pieces of every size from 1 to 129 bytes.
static void check_sha256(const void *data, size_t n, const char *want, const char *what) {
    dc_sha256_state s;
    uint8_t d[32];
    char hex[65];
    dc_sha256_init(&s);
    dc_sha256_update(&s, data, n);
    dc_sha256_final(&s, d);
    dc_sha256_hex(d, hex);
    CHECK(strcmp(hex, want) == 0, "SHA-256 %s: %s, want %s", what, hex, want);
    int pieces_ok = 1;
    for (size_t step = 1; step <= 129 && n < 100000; step++) {
        dc_sha256_init(&s);
        for (size_t i = 0; i < n; i += step) dc_sha256_update(&s, (const uint8_t *)data + i, n - i < step ? n - i : step);
        dc_sha256_final(&s, d);
        dc_sha256_hex(d, hex);
        pieces_ok &= strcmp(hex, want) == 0;
    }
    CHECK(pieces_ok, "SHA-256 %s fed in pieces of 1..129 bytes", what);
}

static void test_sha256(void) {
    check_sha256("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    check_sha256("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "abc");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // padding takes a second block
    check_sha256(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "448 bits");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu";
    check_sha256(m896, strlen(m896), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1", "896 bits");
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    check_sha256(a, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", "a million a");
    free(a);
}

int main(void) {
    if (tmpdir_make("sum")) return 1;
    test_xxh64();
    test_sha256();
    test_layout();
    test_without_checksums();
    test_files();
    tmpdir_remove();
    printf("test_checksum: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
