// Reading a JPEG through libjpeg-turbo. libjpeg's default error handler
// prints and calls exit(); here errors, and the warnings that mean the file
// is cut short or its compressed data corrupt, longjmp back with the message
// instead. As with libpng, all that is allocated lives in a struct owned by
// the caller (not in locals that setjmp would leave indeterminate).
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>

#include "core/error.h"
#include "io/image_internal.h"

typedef struct {
    struct jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    struct jpeg_decompress_struct d;
    bool created;
    bool too_large;  // err says the picture is over the budget (the file may well be valid)
    uint8_t *rgb;   // [height, width, 3]
    uint8_t *row;   // [width, 4]: a CMYK row
    uint8_t exif[1 << 16];  // the first Exif block (an APP1 marker holds at most 65533 bytes)
    size_t exif_len;
    bool header_read;       // markers from here on come between scans
    char err[JMSG_LENGTH_MAX + 64];
} reader;

static void on_error(j_common_ptr c) {
    reader *r = (reader *)c->err;
    c->err->format_message(c, r->err);
    longjmp(r->jump, 1);
}

// Warnings (level -1; higher levels are trace messages). libjpeg goes on
// after these, filling the rest with gray; PIL, too, refuses a file cut
// short. Others, such as extraneous bytes before a marker (common in
// cameras' files), leave the picture whole and are ignored, as PIL does.
static void on_message(j_common_ptr c, int level) {
    if (level >= 0) return;
    switch (c->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC: on_error(c); break;
    default: c->err->num_warnings++;
    }
}

static int next_byte(j_decompress_ptr d) {
    struct jpeg_source_mgr *src = d->src;
    if (src->bytes_in_buffer == 0 && !src->fill_input_buffer(d)) {
        reader *r = (reader *)d->err;
        snprintf(r->err, sizeof r->err, "the data stopped inside a marker");
        longjmp(r->jump, 1);
    }
    src->bytes_in_buffer--;
    return *src->next_input_byte++;
}

// APP1 markers: the first that holds Exif, before the first scan, is kept
// (for its orientation; reading the header alone sees no further), the rest
// skipped. libjpeg's own saving would keep every one, and a file can hold
// thousands.
static boolean on_app1(j_decompress_ptr d) {
    reader *r = (reader *)d->err;
    long len = (long)next_byte(d) << 8;
    len += next_byte(d);
    len -= 2;  // the length counts itself
    long i = 0;
    if (!r->exif_len && !r->header_read) {
        for (; i < len; i++) r->exif[i] = (uint8_t)next_byte(d);
        if (len >= 6 && !memcmp(r->exif, "Exif\0\0", 6)) r->exif_len = (size_t)len;
    }
    if (len > i) d->src->skip_input_data(d, len - i);
    return TRUE;
}

static void on_progress(j_common_ptr c) {
    reader *r = (reader *)c->err;
    if (r->d.input_scan_number > DC_JPEG_MAX_SCANS) {
        snprintf(r->err, sizeof r->err, "more than %d scans (a progressive JPEG's scans each reread the whole "
                 "picture; encoders write about ten)", DC_JPEG_MAX_SCANS);
        longjmp(r->jump, 1);
    }
}

// 1 on success; 0 with r->err set.
static int decode(reader *r, FILE *fp, int64_t max_pixels, int header_only, dc_image *img) {
    if (setjmp(r->jump)) return 0;
    struct jpeg_decompress_struct *d = &r->d;
    d->err = jpeg_std_error(&r->mgr);
    r->mgr.error_exit = on_error;
    r->mgr.emit_message = on_message;
    jpeg_create_decompress(d);
    r->created = true;
    r->progress.progress_monitor = on_progress;
    d->progress = &r->progress;
    jpeg_stdio_src(d, fp);
    jpeg_set_marker_processor(d, JPEG_APP0 + 1, on_app1);
    jpeg_read_header(d, TRUE);
    r->header_read = true;
    const unsigned w = d->image_width, h = d->image_height;
    if (w > DC_IMAGE_MAX_SIDE || h > DC_IMAGE_MAX_SIDE || (int64_t)w * h > max_pixels) {
        snprintf(r->err, sizeof r->err, "a %ux%u JPEG picture is over the limit of %lld pixels (%d a side)", w, h,
                 (long long)max_pixels, DC_IMAGE_MAX_SIDE);
        r->too_large = true;
        return 0;
    }
    img->width = (int)w, img->height = (int)h, img->format = DC_IMAGE_JPEG;
    if (header_only) return 1;
    // The decoder's own memory (a progressive file's coefficients: 2 bytes a
    // pixel a component) is held to what the budget allows; beyond it libjpeg
    // fails rather than allocating.
    d->mem->max_memory_to_use = (long)(max_pixels * 10 + (16 << 20));
    const bool cmyk = d->jpeg_color_space == JCS_CMYK || d->jpeg_color_space == JCS_YCCK;
    d->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;  // libjpeg-turbo converts gray and YCbCr
    jpeg_start_decompress(d);
    if (d->output_width != w || d->output_height != h || d->output_components != (cmyk ? 4 : 3)) {
        snprintf(r->err, sizeof r->err, "unexpected output layout");
        return 0;
    }
    r->rgb = malloc((size_t)w * h * 3);
    r->row = cmyk ? malloc((size_t)w * 4) : NULL;
    if (!r->rgb || (cmyk && !r->row)) {
        snprintf(r->err, sizeof r->err, "out of memory for %ux%u pixels", w, h);
        return 0;
    }
    // Photoshop (the Adobe marker) stores CMYK inverted, as PIL assumes too.
    const unsigned inv = cmyk && d->saw_Adobe_marker ? 255 : 0;
    while (d->output_scanline < h) {
        uint8_t *out = r->rgb + (size_t)d->output_scanline * w * 3;
        JSAMPROW row = cmyk ? r->row : out;
        if (jpeg_read_scanlines(d, &row, 1) != 1) {
            snprintf(r->err, sizeof r->err, "no data for row %u", d->output_scanline);
            return 0;
        }
        for (unsigned x = 0; cmyk && x < w; x++) {
            const uint8_t *p = r->row + 4 * x;
            const unsigned nk = 255 - (p[3] ^ inv);
            for (int k = 0; k < 3; k++) out[3 * x + k] = (uint8_t)(nk - ((p[k] ^ inv) * nk + 127) / 255);
        }
    }
    jpeg_finish_decompress(d);  // to the end of the file: a file cut short fails here too
    return 1;
}

int dc_jpeg_read_rgb(const char *path, int fd, int64_t size, int64_t max_pixels, int header_only, dc_image *img,
                     int *orientation) {
    (void)size;
    memset(img, 0, sizeof *img);
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return dc_fail("%s: cannot read: out of memory", path);
    }
    reader *r = calloc(1, sizeof *r);
    int ok = r && decode(r, fp, max_pixels, header_only, img);
    if (r && r->created) jpeg_destroy_decompress(&r->d);
    fclose(fp);
    if (ok) {
        *orientation = dc_exif_orientation(r->exif, r->exif_len);
        img->rgb = r->rgb;
        free(r->row), free(r);
        return 0;
    }
    memset(img, 0, sizeof *img);
    if (!r) return dc_fail("%s: out of memory", path);
    int rc = dc_fail("%s: %s%s", path, r->too_large ? "" : "not a valid JPEG: ", r->err[0] ? r->err : "unknown error");
    free(r->rgb), free(r->row), free(r);
    return rc;
}
