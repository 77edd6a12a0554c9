// Writes a random LoRA for a Stable Diffusion model, for tests and golden
// files: rank-R factors (normal draws of --seed, times --scale) on every
// attention projection of the UNet (to_q, to_k, to_v, to_out.0) and of the
// text encoder (q_proj, k_proj, v_proj, out_proj), with alpha A, in kohya's
// names (lora_unet_..., lora_te_text_model_...) or PEFT's (unet.<path>.lora_A
// / lora_B, text_encoder.text_model.<path>...); kohya's with its
// ss_network_dim and ss_network_alpha metadata. --format loha or lokr writes
// LyCORIS's deltas under kohya's names instead: LoHa's hada_w1_a/_b and
// hada_w2_a/_b of rank R; LoKr's whole lokr_w1 [2, 2] beside lokr_w2_a/_b of
// rank R (models/lycoris.h).
//
//   lora_random --model PATH --out FILE [--rank R] [--alpha A] [--seed N]
//               [--scale X] [--format kohya|peft|loha|lokr] [--vocab PATH]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "pipelines/sd.h"

typedef struct {
    dc_st_entry *e;
    char (*names)[200];
    float **bufs, *alphas;
    int n, cap, nbuf;
} entries;

static bool is_target(const char *name) {
    static const char *const leaves[] = {".to_q.weight",    ".to_k.weight",    ".to_v.weight",     ".to_out.0.weight",
                                         ".q_proj.weight",  ".k_proj.weight",  ".v_proj.weight",   ".out_proj.weight"};
    for (size_t i = 0; i < sizeof leaves / sizeof *leaves; i++) {
        const size_t n = strlen(name), m = strlen(leaves[i]);
        if (n > m && !strcmp(name + n - m, leaves[i])) return true;
    }
    return false;
}

static float *draws(int64_t n, uint64_t seed, uint32_t key, float scale) {
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t j = 0; h && j < n; j++) h[j] = scale * dc_randn_at(seed, key, 0, 0, (uint32_t)j);
    return h;
}

// A tensor of normal draws named stem + suffix, [r, c].
static int put(entries *t, const char *stem, const char *suffix, int64_t r, int64_t c, uint64_t seed, float scale) {
    float *h = draws(r * c, seed, (uint32_t)t->nbuf, scale);
    if (!h) return dc_fail("out of memory");
    t->bufs[t->nbuf++] = h;
    snprintf(t->names[t->n], 200, "%s%s", stem, suffix);
    t->e[t->n] = (dc_st_entry){t->names[t->n], DC_F32, 2, {r, c}, h}, t->n++;
    return 0;
}

// The factors of every target weight of ps, named for the part (unet: true).
static int add_part(entries *t, const dc_params *ps, bool unet, const char *format, int rank, uint64_t seed,
                    float scale) {
    const bool peft = !strcmp(format, "peft");
    for (int i = 0; i < ps->count; i++) {
        const dc_param *p = &ps->items[i];
        if (p->ndim != 2 || !is_target(p->name)) continue;
        if (t->n + 6 > t->cap) return dc_fail("lora_random: too many layers");
        char mod[120], under[120];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(p->name) - strlen(".weight")), p->name);
        for (size_t j = 0; j <= strlen(mod); j++) under[j] = mod[j] == '.' ? '_' : mod[j];
        char stem[160];
        if (peft) snprintf(stem, sizeof stem, unet ? "unet.%s" : "text_encoder.text_model.%s", mod);
        else snprintf(stem, sizeof stem, unet ? "lora_unet_%s" : "lora_te_text_model_%s", under);
        const int64_t out = p->shape[0], in = p->shape[1];
        if (!strcmp(format, "loha") || !strcmp(format, "lokr")) {
            const bool loha = format[2] == 'h';
            if (!loha && (out % 2 || in % 2)) return dc_fail("lora_random: %s is not even for LoKr", p->name);
            DC_TRY(loha ? put(t, stem, ".hada_w1_a", out, rank, seed, scale) : put(t, stem, ".lokr_w1", 2, 2, seed, 1));
            DC_TRY(loha ? put(t, stem, ".hada_w1_b", rank, in, seed, 1) : put(t, stem, ".lokr_w2_a", out / 2, rank, seed, scale));
            DC_TRY(loha ? put(t, stem, ".hada_w2_a", out, rank, seed, 1) : put(t, stem, ".lokr_w2_b", rank, in / 2, seed, scale));
            if (loha) DC_TRY(put(t, stem, ".hada_w2_b", rank, in, seed, scale));
            snprintf(t->names[t->n], 200, "%s.alpha", stem);
            t->e[t->n] = (dc_st_entry){t->names[t->n], DC_F32, 0, {0}, &t->alphas[0]}, t->n++;
            continue;
        }
        float *down = draws(rank * in, seed, (uint32_t)(2 * t->nbuf), scale);
        float *up = draws(out * rank, seed, (uint32_t)(2 * t->nbuf + 1), scale);
        if (!down || !up) return free(down), free(up), dc_fail("out of memory");
        t->bufs[t->nbuf++] = down, t->bufs[t->nbuf++] = up;
        snprintf(t->names[t->n], 200, peft ? "%s.lora_A.weight" : "%s.lora_down.weight", stem);
        t->e[t->n] = (dc_st_entry){t->names[t->n], DC_F32, 2, {rank, in}, down}, t->n++;
        snprintf(t->names[t->n], 200, peft ? "%s.lora_B.weight" : "%s.lora_up.weight", stem);
        t->e[t->n] = (dc_st_entry){t->names[t->n], DC_F32, 2, {out, rank}, up}, t->n++;
        snprintf(t->names[t->n], 200, "%s.alpha", stem);
        t->e[t->n] = (dc_st_entry){t->names[t->n], DC_F32, 0, {0}, &t->alphas[0]}, t->n++;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *format = "kohya", *vocab = NULL;
    int rank = 4;
    float alpha = 4.0f, scale = 0.1f;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) model = v;
        else if (!strcmp(k, "--out")) out = v;
        else if (!strcmp(k, "--format")) format = v;
        else if (!strcmp(k, "--vocab")) vocab = v;
        else if (!strcmp(k, "--rank")) rank = atoi(v);
        else if (!strcmp(k, "--alpha")) alpha = strtof(v, NULL);
        else if (!strcmp(k, "--scale")) scale = strtof(v, NULL);
        else if (!strcmp(k, "--seed")) seed = strtoull(v, NULL, 10);
        else model = NULL, i = argc;
    }
    if (argc % 2 == 0 || !model || !out || rank < 1 ||
        (strcmp(format, "kohya") && strcmp(format, "peft") && strcmp(format, "loha") && strcmp(format, "lokr"))) {
        fprintf(stderr, "usage: lora_random --model PATH --out FILE [--rank R] [--alpha A] [--seed N] [--scale X] "
                        "[--format kohya|peft|loha|lokr] [--vocab PATH]\n");
        return 2;
    }
    dc_backend *be = dc_backend_cpu_create();
    dc_sd_pipe p = {0};
    const dc_sd_open_opts o = {.model = model, .vocab = vocab, .prediction = -1};
    enum { CAP = 3 * 4096 };
    entries t = {calloc(CAP, sizeof *t.e), calloc(CAP, sizeof *t.names), calloc(CAP, sizeof *t.bufs), &alpha, 0,
                 CAP, 0};
    int rc = t.e && t.names && t.bufs ? dc_sd_pipe_open(&p, be, &o) : dc_fail("out of memory");
    const bool peft = !strcmp(format, "peft");
    if (!rc) rc = add_part(&t, p.unet->params, true, format, rank, seed, scale);
    if (!rc) rc = add_part(&t, p.text->params, false, format, rank, seed + 1, scale);
    // kohya's files say their rank and alpha in their metadata too
    char dim[32], alp[32];
    snprintf(dim, sizeof dim, "%d", rank), snprintf(alp, sizeof alp, "%g", alpha);
    const char *const keys[] = {"ss_network_dim", "ss_network_alpha"}, *const values[] = {dim, alp};
    if (!rc) rc = dc_st_write(out, t.e, t.n, keys, values, peft ? 0 : 2);
    if (!rc) printf("wrote %s: %d tensors at rank %d, alpha %g (%s)\n", out, t.n, rank, alpha, format);
    else fprintf(stderr, "lora_random: %s\n", dc_error());
    for (int i = 0; i < t.nbuf; i++) free(t.bufs[i]);
    free(t.e), free(t.names), free(t.bufs);
    dc_sd_pipe_close(&p);
    dc_backend_destroy(be);
    return rc ? 1 : 0;
}
