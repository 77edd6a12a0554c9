// Fashion-MNIST as captioned pictures, the form `diffusion prepare` reads:
// one PNG (28x28, gray) and one same-stem .txt caption per picture, for the
// text-to-image demo (tools/t2i_demo.sh). Each caption is a template with
// its "{}" replaced by the class name in lower case (t-shirt, trouser,
// pullover, dress, coat, sandal, shirt, sneaker, bag, ankle boot), the
// template picked by the picture's index, so every class meets every
// template. With --fillers FILE (one word a line), three captions in five
// also get filler words around them, drawn from the list by a seeded hash of
// the picture's index: three in ten are "w.. <template> w..", three in ten
// "w.. <class> w..". Captions that vary this much teach a model to find the
// class name among words it has never seen together.
//
//   fmnist_pictures --data IDX_DIR --templates FILE --classes 0-8 --out DIR
//                   [--fillers FILE] [--split train|test] [--per-class N]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "io/png.h"
#include "train/data.h"

static const char *const k_names[10] = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                        "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};

static int usage(void) {
    fprintf(stderr, "usage: fmnist_pictures --data IDX_DIR --templates FILE --classes A-B --out DIR "
                    "[--fillers FILE] [--split train|test] [--per-class N]\n");
    return 2;
}

// The templates file: one per line, each holding "{}" once (fillers: any
// words, need_slot false); blank lines skipped.
static int read_lines(const char *path, char t[][256], int cap, int *n, bool need_slot) {
    FILE *f = fopen(path, "r");
    if (!f) return dc_fail("%s: cannot open", path);
    char line[256];
    *n = 0;
    while (fgets(line, sizeof line, f) && *n < cap) {
        line[strcspn(line, "\r\n")] = 0;
        if (!*line) continue;
        const char *at = strstr(line, "{}");
        if (need_slot && (!at || strstr(at + 2, "{}"))) return fclose(f), dc_fail("%s: '%s' must hold {} once", path, line);
        snprintf(t[(*n)++], 256, "%s", line);
    }
    fclose(f);
    return *n ? 0 : dc_fail("%s: no lines", path);
}

// Appends k filler words drawn by draws r[0..k) to s (cap bytes).
static void add_fillers(char *s, size_t cap, const uint32_t *r, int k, char w[][256], int nw) {
    for (int j = 0; j < k; j++) {
        size_t len = strlen(s);
        snprintf(s + len, cap - len, "%s%s", len ? " " : "", w[r[j] % (uint32_t)nw]);
    }
}

// Picture i's caption: template tp with the class name, and with fillers
// (nw > 0) words around it for three in five pictures (see the top).
static void make_caption(char *s, size_t cap, const char *tp, const char *name, int i, char w[][256], int nw) {
    const char *at = strstr(tp, "{}");
    char core[512];
    snprintf(core, sizeof core, "%.*s%s%s", (int)(at - tp), tp, name, at + 2);
    const dc_u32x4 a = dc_philox((uint32_t)i, 0, 0, 0, 0x46494c4cu), b = dc_philox((uint32_t)i, 1, 0, 0, 0x46494c4cu);
    const float u = dc_u32_to_unit(a.v[0]);
    if (!nw || u < 0.4f) {
        snprintf(s, cap, "%s", core);
        return;
    }
    // 0-3 words before and after, at least one in all
    int before = (int)(a.v[1] % 4), after = (int)(a.v[2] % 4);
    if (!before && !after) before = 1;
    *s = 0;
    add_fillers(s, cap, b.v, before, w, nw);
    size_t len = strlen(s);
    snprintf(s + len, cap - len, "%s%s", len ? " " : "", u < 0.7f ? core : name);
    const dc_u32x4 c = dc_philox((uint32_t)i, 2, 0, 0, 0x46494c4cu);
    add_fillers(s, cap, c.v, after, w, nw);
}

int main(int argc, char **argv) {
    const char *data = NULL, *templates = NULL, *fillers = NULL, *out = NULL, *split = "train";
    int lo = 0, hi = 9, per_class = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--data")) data = argv[i + 1];
        else if (!strcmp(argv[i], "--templates")) templates = argv[i + 1];
        else if (!strcmp(argv[i], "--fillers")) fillers = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--split")) split = argv[i + 1];
        else if (!strcmp(argv[i], "--per-class")) per_class = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--classes")) {
            if (sscanf(argv[i + 1], "%d-%d", &lo, &hi) != 2 || lo < 0 || hi > 9 || lo > hi) return usage();
        } else return usage();
    }
    if (argc % 2 == 0 || !data || !templates || !out || (strcmp(split, "train") && strcmp(split, "test")))
        return usage();
    static char t[64][256], w[1024][256];
    int nt = 0, nw = 0;
    dc_dataset ds = {0};
    if (read_lines(templates, t, 64, &nt, true) || (fillers && read_lines(fillers, w, 1024, &nw, false)) ||
        dc_mkdir_p(out) ||
        dc_dataset_load_fmnist(&ds, data, !strcmp(split, "train"), 0)) {
        fprintf(stderr, "fmnist_pictures: %s\n", dc_error());
        return 1;
    }
    int count[10] = {0}, written = 0;
    uint8_t px[28 * 28];
    for (int i = 0; i < ds.n; i++) {
        const int c = ds.labels[i];
        if (c < lo || c > hi || (per_class && count[c] >= per_class)) continue;
        const float *img = ds.images + (size_t)i * 28 * 28;
        for (int j = 0; j < 28 * 28; j++) px[j] = (uint8_t)((img[j] + 1) * 127.5f + 0.5f);
        char path[4200], caption[2048];
        make_caption(caption, sizeof caption - 1, t[count[c] % nt], k_names[c], i, w, nw);
        strcat(caption, "\n");
        snprintf(path, sizeof path, "%s/%05d.png", out, i);
        if (dc_png_write(path, px, 28, 28, 1)) return fprintf(stderr, "fmnist_pictures: %s\n", dc_error()), 1;
        snprintf(path, sizeof path, "%s/%05d.txt", out, i);
        FILE *f = fopen(path, "w");
        if (!f || fputs(caption, f) < 0 || fclose(f)) return fprintf(stderr, "fmnist_pictures: cannot write %s\n", path), 1;
        count[c]++, written++;
    }
    printf("wrote %d captioned pictures of classes %d-%d into %s\n", written, lo, hi, out);
    dc_dataset_free(&ds);
    return 0;
}
