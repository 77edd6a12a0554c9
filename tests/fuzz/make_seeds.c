// Writes small valid inputs for each fuzz harness into <dir>/<harness>/,
// from which libFuzzer starts: IDX files (plain and gzipped), data sets
// (hand-made as other tools write them, and written by the engine with
// checksums), the tensor shapes of a tiny DiT, its training checkpoints
// (fresh and after two steps) and its plain state dict under official keys,
// PNGs of each colour type, depth and text chunk kind, JPEGs and WebPs of
// each kind the picture reader takes, MDS data sets (plain and zstd), and
// webdataset tars (ustar, and pax with a long name).
//   make_seeds DIR
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/mds.h"
#include "io/png.h"
#include "io/png_params.h"
#include "io/safetensors.h"
#include "file_bytes.h"
#include "pictures.h"
#include "models/dit_io.h"
#include "models/unet.h"
#include "train/trainer.h"

static const char *g_root;

static void die(const char *what) {
    fprintf(stderr, "make_seeds: %s: %s\n", what, dc_error());
    exit(1);
}

static void put(const char *harness, const char *name, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_root, harness);
    mkdir(path, 0777);
    snprintf(path, sizeof path, "%s/%s/%s", g_root, harness, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "make_seeds: cannot write %s\n", path);
        exit(1);
    }
}

// Copies a file the engine wrote into the harnesses' folders.
static void put_file(const char *src, const char *const *harnesses, int nh, const char *name) {
    FILE *f = fopen(src, "rb");
    if (!f) die(src);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) die(src);
    fclose(f);
    for (int i = 0; i < nh; i++) put(harnesses[i], name, buf, (size_t)n);
    free(buf);
}

// MDS data sets of one shard, written by the engine (uncompressed and zstd),
// in fuzz_mds's layout: u16 index length | index.json | the shard.
static void mds_seeds(const char *tmp) {
    const dc_mds_spec cols[] = {{"bytes", "bytes"}, {"caption", "str"}, {"id", "int"}, {"lat", "ndarray:float16:2,3"},
                                {"any", "ndarray"}, {"sizes", "ndarray:uint16"}, {"f", "float32"}};
    for (int zip = 0; zip < 2; zip++) {
        char dir[4200], path[4300];
        snprintf(dir, sizeof dir, "%s/mds%d", tmp, zip);
        dc_mds_writer *w;
        dc_mds_write_opts o = {zip ? 3 : 0, 0};
        if (dc_mds_writer_open(&w, dir, cols, 7, &o) != 0) die("mds writer");
        for (int i = 0; i < 5; i++) {
            uint16_t lat[6] = {0x3c00, 0xbc00, (uint16_t)i, 0x7bff, 0x0001, 0x4000};
            int64_t id = i * 1000 - 7, shape[2] = {2, i + 1}, dims[1] = {3};
            double any[10] = {1.5, -2, 3};
            uint16_t sizes[3] = {512, 768, (uint16_t)i};
            float f = 0.5f * (float)i;
            dc_mds_value v[7] = {{"\x01\x02\x03", (size_t)i % 4, 0, 0, NULL}, {"a photo of a bag", 4 + (size_t)i, 0, 0, NULL},
                                 {&id, 8, 0, 0, NULL}, {lat, sizeof lat, 0, 0, NULL},
                                 {any, 16 * ((size_t)i + 1), DC_MDS_F64, 2, shape}, {sizes, 6, 0, 1, dims},
                                 {&f, 4, 0, 0, NULL}};
            if (dc_mds_write(w, v) != 0) die("mds write");
        }
        if (dc_mds_writer_finish(w) != 0) die("mds finish");
        size_t ni, ns;
        snprintf(path, sizeof path, "%s/index.json", dir);
        uint8_t *index = slurp(path, &ni);
        snprintf(path, sizeof path, "%s/shard.00000.mds%s", dir, zip ? ".zstd" : "");
        uint8_t *shard = slurp(path, &ns);
        if (!index || !shard) die("mds read back");
        uint8_t *seed = malloc(2 + ni + ns);
        if (!seed) die("mds seed");
        seed[0] = (uint8_t)ni, seed[1] = (uint8_t)(ni >> 8);
        memcpy(seed + 2, index, ni);
        memcpy(seed + 2 + ni, shard, ns);
        put("fuzz_mds", zip ? "zstd" : "plain", seed, 2 + ni + ns);
        free(seed);
        free(index);
        free(shard);
        snprintf(path, sizeof path, "rm -r '%s'", dir);
        if (system(path) != 0) die("mds cleanup");
    }
}

static void be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// fuzz_idx inputs: a flags byte, then an IDX file (see fuzz_idx.c).
static void idx_seeds(void) {
    uint8_t img[1 + 16 + 3 * 4 * 4], lab[1 + 8 + 3];
    be32(img + 1, 0x803), be32(img + 5, 3), be32(img + 9, 4), be32(img + 13, 4);
    for (int i = 0; i < 48; i++) img[17 + i] = (uint8_t)(i * 5);
    be32(lab + 1, 0x801), be32(lab + 5, 3);
    lab[9] = 0, lab[10] = 9, lab[11] = 4;
    const struct { uint8_t flags; int labels; const char *name; } s[] = {
        {0x00, 0, "images"}, {0x02, 0, "images_gz"}, {0x0a, 0, "images_gz_both"},
        {0x10, 0, "images_padded"}, {0x01, 1, "labels"}, {0x03, 1, "labels_gz"},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        uint8_t *b = s[i].labels ? lab : img;
        b[0] = s[i].flags;
        put("fuzz_idx", s[i].name, b, s[i].labels ? sizeof lab : sizeof img);
    }
}

// A safetensors file made by hand, as numpy or another tool writes one
// (no checksums): header JSON padded with spaces to 8 bytes, then the data.
static void hand_file(const char *harness, const char *name, const char *json, const void *data,
                      size_t n) {
    size_t h = strlen(json), hp = (h + 7) / 8 * 8;
    uint8_t *b = calloc(8 + hp + n, 1);
    if (!b) exit(1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memcpy(b + 8, json, h);
    memset(b + 8 + h, ' ', hp - h);
    memcpy(b + 8 + hp, data, n);
    put(harness, name, b, 8 + hp + n);
    free(b);
}

static void dataset_seeds(const char *tmp) {
    // U8 images [3, 1, 4, 4] and I64 labels [3]
    uint8_t d1[48 + 24] = {0};
    for (int i = 0; i < 48; i++) d1[i] = (uint8_t)(i * 5);
    d1[48] = 0, d1[56] = 2, d1[64] = 1;
    const char *h1 = "{\"images\":{\"dtype\":\"U8\",\"shape\":[3,1,4,4],\"data_offsets\":[0,48]},"
                     "\"labels\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[48,72]}}";
    // F32 images [2, 3, 2, 2] in [-1, 1], I32 labels [2], num_classes 5
    float px[24];
    for (int i = 0; i < 24; i++) px[i] = (float)i / 12.0f - 1.0f;
    int32_t lb[2] = {4, 0};
    uint8_t d2[96 + 8];
    memcpy(d2, px, 96), memcpy(d2 + 96, lb, 8);
    const char *h2 = "{\"__metadata__\":{\"num_classes\":\"5\"},"
                     "\"images\":{\"dtype\":\"F32\",\"shape\":[2,3,2,2],\"data_offsets\":[0,96]},"
                     "\"labels\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[96,104]}}";
    const char *const hs[] = {"fuzz_dataset", "fuzz_safetensors"};
    for (int i = 0; i < 2; i++) {
        hand_file(hs[i], "u8_i64", h1, d1, sizeof d1);
        hand_file(hs[i], "f32_i32_classes", h2, d2, sizeof d2);
    }
    // the same U8 set written by the engine (with checksums)
    int64_t l64[3] = {0, 2, 1};
    dc_st_entry e[2] = {
        {.name = "images", .dtype = DC_U8, .ndim = 4, .shape = {3, 1, 4, 4}, .data = d1},
        {.name = "labels", .dtype = DC_I64, .ndim = 1, .shape = {3}, .data = l64},
    };
    char path[4096];
    snprintf(path, sizeof path, "%s/set.safetensors", tmp);
    if (dc_st_write(path, e, 2, NULL, NULL, 0) != 0) die("data set");
    put_file(path, hs, 2, "u8_i64_checksums");
}

// A tiny DiT: 8 x 8 x 1 images, patch 4 (4 tokens), width 8, one block, 2 heads.
static void model_seeds(const char *tmp) {
    dc_dit_config mc = {.input_size = 8, .patch = 4, .in_channels = 1, .hidden = 8, .depth = 1,
                        .heads = 2, .mlp_hidden = 16, .num_classes = 2, .learn_sigma = true};
    dc_train_config tc = dc_train_config_default();
    tc.steps = 10, tc.batch = 2, tc.micro_batch = 1, tc.lr = 1e-3f, tc.warmup = 2, tc.grad_clip = 1;
    dc_backend *be = dc_backend_cpu_create();
    if (!be) die("CPU backend");
    dc_dataset ds = {.n = 3, .channels = 1, .height = 8, .width = 8, .num_classes = 2};
    float images[3 * 64];
    int32_t labels[3] = {0, 1, 1};
    for (int i = 0; i < 3 * 64; i++) images[i] = (float)(i % 9) / 4.0f - 1.0f;
    ds.images = images, ds.labels = labels;
    const char *const ck[] = {"fuzz_checkpoint", "fuzz_model", "fuzz_safetensors"};
    const char *const plain[] = {"fuzz_model", "fuzz_safetensors"};
    char path[4096];
    for (int sigma = 1; sigma >= 0; sigma--) {
        mc.learn_sigma = sigma;
        dc_dit m;
        dc_trainer tr;
        if (dc_dit_create(&m, &mc, be, true) || dc_dit_init_weights(&m, 1) ||
            dc_trainer_init(&tr, &m.base, &ds, &tc))
            die("tiny model");
        for (int step = 0; step <= 2; step += 2) {
            snprintf(path, sizeof path, "%s/ck.safetensors", tmp);
            if (dc_trainer_save(&tr, path, NULL)) die("checkpoint");
            char name[64];
            snprintf(name, sizeof name, "checkpoint_%s_step%d", sigma ? "sigma" : "eps", step);
            put_file(path, ck, 3, name);
            dc_step_stats st;
            for (int k = 0; k < 2; k++)
                if (dc_trainer_step(&tr, &st)) die("training step");
        }
        // the plain state dict `diffusion export` writes: official keys, no config
        int n = m.params.count;
        float *host = malloc((size_t)m.params.numel * sizeof *host);
        dc_st_entry *e = calloc((size_t)n, sizeof *e);
        char (*names)[128] = calloc((size_t)n, sizeof *names);
        if (!host || !e || !names) die("out of memory");
        dc_dit_weight_entries(&m, m.params.data, "", host, e, names);
        snprintf(path, sizeof path, "%s/plain.safetensors", tmp);
        if (dc_st_write(path, e, n, NULL, NULL, 0)) die("state dict");
        put_file(path, plain, 2, sigma ? "state_dict_sigma" : "state_dict_eps");
        free(host), free(e), free(names);
        dc_trainer_free(&tr);
        dc_dit_free(&m);
    }
    dc_backend_destroy(be);
}

// fuzz_dit_config inputs: flags, blocks, heads, then the dimensions of
// x_embedder [8, 1, 4, 4], pos_embed [1, 4, 8], fc1 [16, 8], the label table
// [3, 8], the final layer [32 or 16, 8] and each block's qkv [24, 8].
static void shape_seeds(void) {
    static const uint8_t sigma[] = {0, 1, 2, 8, 1, 4, 4, 1, 4, 8, 16, 8, 3, 8, 32, 8, 24, 8};
    static const uint8_t eps_ema[] = {1, 2, 0, 8, 1, 4, 4, 1, 4, 8, 16, 8, 3, 8, 16, 8, 24, 8, 24, 8};
    put("fuzz_dit_config", "tiny_sigma", sigma, sizeof sigma);
    put("fuzz_dit_config", "tiny_eps_ema_2_blocks", eps_ema, sizeof eps_ema);
}

// fuzz_sd_config inputs: byte 0 even, then (name, rank 4, 32 32 3 3) for
// the first names of its table (convolutions of every component); byte 0
// odd, then each golden config.json (diffusers and transformers wrote them).
static void sd_config_seeds(void) {
    uint8_t shapes[1 + 48 * 6];
    shapes[0] = 0;
    for (int i = 0; i < 48; i++) {
        uint8_t *e = shapes + 1 + 6 * i;
        e[0] = (uint8_t)(i * 5), e[1] = 4, e[2] = 32, e[3] = 32, e[4] = 3, e[5] = 3;
    }
    put("fuzz_sd_config", "convolutions", shapes, sizeof shapes);
    const char *files[] = {"unet", "vae", "text_encoder"};
    for (int i = 0; i < 3; i++) {
        char path[256], name[64];
        snprintf(path, sizeof path, "tests/golden/sd/sd1/diffusers/%s/config.json", files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) continue;  // run from elsewhere: the shapes seed still works
        static uint8_t buf[1 << 16];
        buf[0] = 1;
        size_t n = fread(buf + 1, 1, sizeof buf - 1, f);
        fclose(f);
        snprintf(name, sizeof name, "json_%s", files[i]);
        put("fuzz_sd_config", name, buf, n + 1);
    }
    // scheduler configs: SD 1.5's, and one with most keys a class reads
    static const char *const scheds[] = {
        ("\x01{\"_class_name\": \"PNDMScheduler\", \"beta_end\": 0.012, \"beta_schedule\": \"scaled_linear\","
        " \"beta_start\": 0.00085, \"num_train_timesteps\": 1000, \"set_alpha_to_one\": false,"
        " \"skip_prk_steps\": true, \"steps_offset\": 1, \"trained_betas\": null, \"clip_sample\": false}"),
        ("\x15{\"beta_schedule\": \"squaredcos_cap_v2\", \"num_train_timesteps\": 300, \"prediction_type\":"
        " \"v_prediction\", \"rescale_betas_zero_snr\": true, \"timestep_spacing\": \"trailing\","
        " \"interpolation_type\": \"log_linear\", \"timestep_type\": \"continuous\", \"sigma_min\": 0.1,"
        " \"final_sigmas_type\": \"sigma_min\", \"lambda_min_clipped\": -Infinity, \"euler_at_final\": true}"),
        ("\x0b{\"num_train_timesteps\": 4, \"trained_betas\": [0.1, 0.2, 0.3, 0.4], \"steps_offset\": 3,"
        " \"timestep_spacing\": \"leading\", \"lambda_min_clipped\": -1.5}"),
    };
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "json_scheduler_%d", i);
        put("fuzz_sd_config", name, (const uint8_t *)scheds[i], strlen(scheds[i]));
    }
}

// A PNG made with libpng directly (palette, alpha, 16 bits, interlace: what
// the engine's writer never makes). rows are packed as libpng wants them.
static void raw_png(const char *path, int w, int h, int depth, int color, int interlace, uint8_t *const *rows) {
    FILE *f = fopen(path, "wb");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!f || !info || setjmp(png_jmpbuf(png))) {
        fprintf(stderr, "make_seeds: cannot write %s\n", path);
        exit(1);
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color, interlace, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (color == PNG_COLOR_TYPE_PALETTE) {
        png_color pal[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {9, 99, 199}};
        png_byte trns[4] = {255, 0, 128, 255};
        png_set_PLTE(png, info, pal, 4);
        png_set_tRNS(png, info, trns, 4, NULL);
    }
    png_text z = {.compression = PNG_TEXT_COMPRESSION_zTXt, .key = "parameters", .text = "na\xefve"};
    png_set_text(png, info, &z, 1);
    png_write_info(png, info);
    png_write_image(png, (png_bytepp)rows);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

// fuzz_png inputs: a flags byte (bit 0: force RGB, bit 1: correct the CRCs), then a PNG.
static void put_png(const char *src, uint8_t flags, const char *name) {
    FILE *f = fopen(src, "rb");
    uint8_t b[1 << 16];
    size_t n = f ? fread(b + 1, 1, sizeof b - 1, f) : 0;
    if (!f || !n || n == sizeof b - 1) die(src);
    fclose(f);
    b[0] = flags;
    put("fuzz_png", name, b, n + 1);
}

static void png_seeds(const char *tmp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/seed.png", tmp);
    float img[3 * 4 * 5];
    for (int i = 0; i < 60; i++) img[i] = (float)(i % 17) / 8.0f - 1.0f;
    dc_gen_params g = {.prompt = "a cat", .negative_prompt = "blurry", .steps = 20, .sampler = "Euler a",
                       .cfg_scale = 7, .seed = 42, .width = 5, .height = 4, .model = "v1-5"};
    char *par = dc_gen_params_format(&g);
    dc_png_text t[2] = {{DC_PNG_PARAMETERS_KEY, par}, {"Comment", "\xe7\x8c\xab"}};  // tEXt and iTXt
    if (!par || dc_png_write_grid_text(path, img, 1, 3, 4, 5, 1, 1, t, 2)) die("PNG");
    free(par);
    put_png(path, 0, "rgb_parameters");
    if (dc_png_write_grid(path, img, 3, 1, 4, 5, 2, 2)) die("PNG");
    put_png(path, 1, "gray_grid_as_rgb");
    uint8_t px[4][16], *rows[4];
    for (int y = 0; y < 4; y++) {
        rows[y] = px[y];
        for (int i = 0; i < 16; i++) px[y][i] = (uint8_t)(y * 61 + i * 23);
    }
    const struct { int w, depth, color, interlace; const char *name; } r[] = {
        {3, 2, PNG_COLOR_TYPE_PALETTE, PNG_INTERLACE_NONE, "palette_trns"},
        {2, 16, PNG_COLOR_TYPE_RGB_ALPHA, PNG_INTERLACE_NONE, "rgba16"},
        {4, 8, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_INTERLACE_ADAM7, "gray_alpha_interlaced"},
        {9, 1, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE, "gray1"},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        raw_png(path, r[i].w, 4, r[i].depth, r[i].color, r[i].interlace, rows);
        put_png(path, 2, r[i].name);
    }
    remove(path);
}

// fuzz_jpeg and fuzz_webp inputs: a resize byte (see fuzz_picture.h), then the file.
static void put_picture(const char *harness, const char *src, uint8_t resize, const char *name) {
    FILE *f = fopen(src, "rb");
    if (!f) die(src);
    uint8_t b[1 << 16];
    b[0] = resize;
    size_t n = fread(b + 1, 1, sizeof b - 1, f);
    fclose(f);
    put(harness, name, b, n + 1);
    remove(src);
}

static void picture_seeds(const char *tmp) {
    char path[4200];
    snprintf(path, sizeof path, "%s/seed.pic", tmp);
    enum { W = 19, H = 13 };  // not whole blocks
    uint8_t px[W * H * 4];
    for (int i = 0; i < W * H * 4; i++) px[i] = (uint8_t)(i * 37 % 251 + (i / (W * 4)) * 3);
    const struct {
        const char *name;
        int comps;
        pic_jpeg_opts o;
    } j[] = {{"rgb_420", 3, {.quality = 75, .subsample = 1}},
             {"rgb_444_q95", 3, {.quality = 95}},
             {"gray", 1, {.quality = 80}},
             {"cmyk_adobe", 4, {.quality = 80, .adobe = 1}},
             {"cmyk_plain", 4, {.quality = 80}},
             {"progressive", 3, {.quality = 80, .subsample = 1, .progressive = 1}},
             {"restart", 3, {.quality = 80, .subsample = 1, .restart = 1}},
             {"gray_64_scans", 1, {.quality = 80, .many_scans = 64}},
             {"exif_orientation_6", 3, {.quality = 80, .subsample = 1, .exif = 6}}};
    for (size_t i = 0; i < sizeof j / sizeof j[0]; i++) {
        if (pic_write_jpeg(path, px, W, H, j[i].comps, j[i].o)) die("JPEG");
        put_picture("fuzz_jpeg", path, (uint8_t)(i * 9), j[i].name);
    }
    const struct {
        const char *name;
        int ch;
        float quality;
    } w[] = {{"lossy", 3, 75}, {"lossless", 3, -1}, {"lossy_alpha", 4, 75}, {"lossless_alpha", 4, -1}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        if (pic_write_webp(path, px, W, H, w[i].ch, w[i].quality)) die("WebP");
        put_picture("fuzz_webp", path, (uint8_t)(i * 9), w[i].name);
    }
    if (pic_write_webp(path, px, W, H, 3, -1) || pic_webp_add_exif(path, W, H, 8, 0)) die("WebP");
    put_picture("fuzz_webp", path, 5, "extended_exif_orientation_8");
}

// One tar member: a ustar header (typeflag `type`) and its bytes, padded to 512.
static size_t tar_member(uint8_t *out, const char *name, char type, const void *data, size_t n) {
    uint8_t *h = out;
    memset(h, 0, 512);
    snprintf((char *)h, 100, "%s", name);
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 124, 12, "%011o", (unsigned)n);
    snprintf((char *)h + 136, 12, "%011o", 0u);
    h[156] = (uint8_t)type;
    memcpy(h + 257, "ustar\0" "00", 8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    memcpy(out + 512, data, n);
    size_t padded = (n + 511) / 512 * 512;
    memset(out + 512 + n, 0, padded - n);
    return 512 + padded;
}

// fuzz_tar inputs: img2dataset's layout (key.png, key.txt, key.json), plain
// ustar and with a pax header naming a long path.
static void tar_seeds(void) {
    static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                                  0, 0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0, 0x90, 0x77, 0x53, 0xde};
    static uint8_t tar[8192];
    size_t n = 0;
    n += tar_member(tar + n, "00000/0001.png", '0', png, sizeof png);
    n += tar_member(tar + n, "00000/0001.txt", '0', "a caption", 9);
    n += tar_member(tar + n, "00000/0002.png", '0', png, sizeof png);
    n += tar_member(tar + n, "00000/0002.json", '0', "{\"caption\": \"a json caption\"}", 28);
    memset(tar + n, 0, 1024);
    put("fuzz_tar", "ustar", tar, n + 1024);
    const char *pax = "52 path=00000/a-name-longer-than-a-header-holds.png\n";
    n = tar_member(tar, "PaxHeaders/x", 'x', pax, strlen(pax));
    n += tar_member(tar + n, "short.png", '0', png, sizeof png);
    memset(tar + n, 0, 1024);
    put("fuzz_tar", "pax_long_name", tar, n + 1024);
}

// A fuzz_lora seed: byte 0 (even: a file), then the n tensors as a safetensors file.
static void put_lora_file(const char *name, const dc_st_entry *e, int n) {
    uint8_t *bytes;
    size_t size;
    if (dc_st_serialize(e, n, NULL, NULL, 0, &bytes, &size)) die("a LoRA seed");
    uint8_t *in = malloc(size + 1);
    if (!in) die("out of memory");
    in[0] = 0;
    memcpy(in + 1, bytes, size);
    put("fuzz_lora", name, in, size + 1);
    free(in), free(bytes);
}

// fuzz_lora inputs: byte 0 even, then a kohya LoRA file on an attention
// projection of the golden SD 1.x UNet and one of the text encoder (rank 2,
// one alpha), the same in PEFT's names, and a LyCORIS LoHa and LoKr of that
// projection; byte 0 odd, then prompts with tags.
static void lora_seeds(void) {
    static const char *const kohya[][2] = {
        {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q",
         "lora_te_text_model_encoder_layers_0_self_attn_q_proj"},
        {"unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
         "text_encoder.text_model.encoder.layers.0.self_attn.q_proj"}};
    dc_unet_config c;
    dc_params ps = {0};
    if (dc_unet_config_from_json_file(&c, "tests/golden/sd/sd1/diffusers/unet/config.json") ||
        dc_unet_register(&c, &ps))
        die("the golden SD 1.x UNet's config");
    const int64_t C =
        ps.items[dc_params_find(&ps, "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight")].shape[0];
    dc_params_free(&ps);
    float v[2 * 64 * 2], alpha = 1.0f;
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) v[i] = 0.01f * (float)(i % 7);
    for (int f = 0; f < 2; f++) {
        char names[5][160];
        const char *down = f ? "%s.lora_A.weight" : "%s.lora_down.weight", *up = f ? "%s.lora_B.weight" : "%s.lora_up.weight";
        snprintf(names[0], 160, down, kohya[f][0]), snprintf(names[1], 160, up, kohya[f][0]);
        snprintf(names[2], 160, "%s.alpha", kohya[f][0]);
        snprintf(names[3], 160, down, kohya[f][1]), snprintf(names[4], 160, up, kohya[f][1]);
        const dc_st_entry e[] = {{names[0], DC_F32, 2, {2, C}, v},  {names[1], DC_F32, 2, {C, 2}, v},
                                 {names[2], DC_F32, 0, {0}, &alpha}, {names[3], DC_F32, 2, {2, 32}, v},
                                 {names[4], DC_F32, 2, {32, 2}, v}};
        put_lora_file(f ? "peft" : "kohya", e, 5);
    }
    // LoHa (rank 2 twice) and LoKr (W1 [2, 2] whole, W2 [C/2, 2] @ [2, C/2]) of the projection
    const char *stem = kohya[0][0];
    char ln[6][160];
    const char *const sfx[6] = {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "lokr_w1", "lokr_w2_a"};
    for (int i = 0; i < 6; i++) snprintf(ln[i], 160, "%s.%s", stem, sfx[i]);
    char w2b[160], al[160];
    snprintf(w2b, sizeof w2b, "%s.lokr_w2_b", stem), snprintf(al, sizeof al, "%s.alpha", stem);
    const dc_st_entry loha[] = {{ln[0], DC_F32, 2, {C, 2}, v}, {ln[1], DC_F32, 2, {2, C}, v},
                                {ln[2], DC_F32, 2, {C, 2}, v}, {ln[3], DC_F32, 2, {2, C}, v},
                                {al, DC_F32, 0, {0}, &alpha}};
    const dc_st_entry lokr[] = {{ln[4], DC_F32, 2, {2, 2}, v}, {ln[5], DC_F32, 2, {C / 2, 2}, v},
                                {w2b, DC_F32, 2, {2, C / 2}, v}, {al, DC_F32, 0, {0}, &alpha}};
    const dc_st_entry *sets[2] = {loha, lokr};
    const int counts[2] = {5, 4};
    for (int k = 0; k < 2; k++) put_lora_file(k ? "lokr" : "loha", sets[k], counts[k]);
    static const char *const prompts[] = {"\x01a cat <lora:style:0.8> <lora:detail:te=1:unet=0.5>",
                                          "\x01<lora:x:1:2>plain text<lora:y>"};
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "tags%d", i);
        put("fuzz_lora", name, prompts[i], strlen(prompts[i]));
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    g_root = argv[1];
    mkdir(g_root, 0777);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/.tmp", g_root);
    mkdir(tmp, 0777);
    idx_seeds();
    shape_seeds();
    sd_config_seeds();
    dataset_seeds(tmp);
    model_seeds(tmp);
    png_seeds(tmp);
    picture_seeds(tmp);
    mds_seeds(tmp);
    tar_seeds();
    lora_seeds();
    char p[4200];
    const char *files[] = {"set.safetensors", "ck.safetensors", "plain.safetensors"};
    for (int i = 0; i < 3; i++) snprintf(p, sizeof p, "%s/%s", tmp, files[i]), remove(p);
    rmdir(tmp);
    return 0;
}
