// Fashion-MNIST as captioned pictures, the form `diffusion prepare` reads:
// one PNG (28x28, gray) and one same-stem .txt caption per picture, for the
// text-to-image demo (tools/t2i_demo.sh). Each caption is a template with
// its "{}" replaced by the class name in lower case (t-shirt, trouser,
// pullover, dress, coat, sandal, shirt, sneaker, bag, ankle boot), the
// template picked by the picture's index, so every class meets every
// template.
//
//   fmnist_pictures --data IDX_DIR --templates FILE --classes 0-8 --out DIR
//                   [--split train|test] [--per-class N]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/png.h"
#include "train/data.h"

static const char *const k_names[10] = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                        "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};

static int usage(void) {
    fprintf(stderr, "usage: fmnist_pictures --data IDX_DIR --templates FILE --classes A-B --out DIR "
                    "[--split train|test] [--per-class N]\n");
    return 2;
}

// The templates file: one per line, each holding "{}" once; blank lines skipped.
static int read_templates(const char *path, char t[][256], int cap, int *n) {
    FILE *f = fopen(path, "r");
    if (!f) return dc_fail("%s: cannot open", path);
    char line[256];
    *n = 0;
    while (fgets(line, sizeof line, f) && *n < cap) {
        line[strcspn(line, "\r\n")] = 0;
        if (!*line) continue;
        const char *at = strstr(line, "{}");
        if (!at || strstr(at + 2, "{}")) return fclose(f), dc_fail("%s: '%s' must hold {} once", path, line);
        snprintf(t[(*n)++], 256, "%s", line);
    }
    fclose(f);
    return *n ? 0 : dc_fail("%s: no templates", path);
}

int main(int argc, char **argv) {
    const char *data = NULL, *templates = NULL, *out = NULL, *split = "train";
    int lo = 0, hi = 9, per_class = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--data")) data = argv[i + 1];
        else if (!strcmp(argv[i], "--templates")) templates = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--split")) split = argv[i + 1];
        else if (!strcmp(argv[i], "--per-class")) per_class = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--classes")) {
            if (sscanf(argv[i + 1], "%d-%d", &lo, &hi) != 2 || lo < 0 || hi > 9 || lo > hi) return usage();
        } else return usage();
    }
    if (argc % 2 == 0 || !data || !templates || !out || (strcmp(split, "train") && strcmp(split, "test")))
        return usage();
    static char t[64][256];
    int nt = 0;
    dc_dataset ds = {0};
    if (read_templates(templates, t, 64, &nt) || dc_mkdir_p(out) ||
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
        char path[4200], caption[512];
        const char *tp = t[count[c] % nt], *at = strstr(tp, "{}");
        snprintf(caption, sizeof caption, "%.*s%s%s\n", (int)(at - tp), tp, k_names[c], at + 2);
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
