// Writes a test picture in any of the formats img2img reads, for the shell
// tests: smooth colour ramps with a disc, and (for the kinds with alpha) a
// transparent band on the left.
//
//   make_picture KIND WIDTH HEIGHT OUT
//   KIND: png, png-rgba, jpeg, jpeg-gray, jpeg-cmyk, jpeg-progressive,
//         webp, webp-lossless, webp-rgba
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/pictures.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: make_picture KIND WIDTH HEIGHT OUT (see the source for the kinds)\n");
        return 2;
    }
    const char *kind = argv[1], *out = argv[4];
    const int w = atoi(argv[2]), h = atoi(argv[3]);
    if (w < 1 || h < 1 || w > 16384 || h > 16384) return fprintf(stderr, "make_picture: bad size\n"), 2;
    uint8_t *px = malloc((size_t)w * h * 4);
    if (!px) return fprintf(stderr, "make_picture: out of memory\n"), 1;
    const int gray = !strcmp(kind, "jpeg-gray"), cmyk = !strcmp(kind, "jpeg-cmyk");
    const int alpha = !strcmp(kind, "png-rgba") || !strcmp(kind, "webp-rgba");
    const int ch = gray ? 1 : cmyk || alpha ? 4 : 3;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = px + ((size_t)y * w + x) * ch;
            const int dx = 2 * x - w, dy = 2 * y - h, disc = dx * dx + dy * dy < (w < h ? w * w : h * h) / 4;
            const uint8_t v[4] = {(uint8_t)(255 * x / w), (uint8_t)(255 * y / h), (uint8_t)(disc ? 230 : 40),
                                  (uint8_t)(x < w / 4 ? 0 : 255)};
            for (int k = 0; k < ch; k++)
                p[k] = gray ? (uint8_t)((v[0] + v[1] + v[2]) / 3) : cmyk ? (uint8_t)(255 - v[k % 3] / 2) : v[k];
        }
    int rc = -1;
    pic_jpeg_opts jo = {.quality = 90, .subsample = 1};
    if (!strcmp(kind, "png") || !strcmp(kind, "png-rgba")) rc = pic_write_png(out, px, w, h, ch, NULL, 0);
    else if (!strcmp(kind, "jpeg") || gray) rc = pic_write_jpeg(out, px, w, h, ch, jo);
    else if (cmyk) jo.adobe = 1, rc = pic_write_jpeg(out, px, w, h, 4, jo);
    else if (!strcmp(kind, "jpeg-progressive")) jo.progressive = 1, rc = pic_write_jpeg(out, px, w, h, 3, jo);
    else if (!strcmp(kind, "webp")) rc = pic_write_webp(out, px, w, h, 3, 90);
    else if (!strcmp(kind, "webp-lossless")) rc = pic_write_webp(out, px, w, h, 3, -1);
    else if (!strcmp(kind, "webp-rgba")) rc = pic_write_webp(out, px, w, h, 4, -1);
    else fprintf(stderr, "make_picture: unknown kind %s\n", kind);
    free(px);
    return rc ? 1 : 0;
}
