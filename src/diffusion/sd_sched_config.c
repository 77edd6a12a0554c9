#include "diffusion/sd_sched_config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/error.h"

// ---- typed reads: absent leaves *out as it is; a wrong type or value is refused ----------

static const char *type_name(const dc_json *v) {
    static const char *const names[] = {"null", "false", "true", "a number", "a string", "an array", "an object"};
    return names[v->type];
}

static int get_bool(const dc_json *root, const char *path, const char *key, bool *out) {
    const dc_json *v = dc_json_get(root, key);
    if (!v) return 0;
    if (v->type == DC_JSON_NULL || v->type == DC_JSON_FALSE) return *out = false, 0;  // None is falsy
    if (v->type == DC_JSON_TRUE) return *out = true, 0;
    return dc_fail("%s: '%s' is %s (%s): it must be true or false", path, key, type_name(v), v->str ? v->str : "");
}

// An integer in [lo, hi].
static int get_int(const dc_json *root, const char *path, const char *key, int lo, int hi, int *out) {
    const dc_json *v = dc_json_get(root, key);
    if (!v) return 0;
    int64_t x;
    if (v->type != DC_JSON_NUMBER || dc_json_get_i64(v, &x))
        return dc_fail("%s: '%s' is %s%s%s: it must be an integer", path, key, type_name(v),
                       v->type == DC_JSON_NUMBER || v->type == DC_JSON_STRING ? " " : "",
                       v->type == DC_JSON_NUMBER || v->type == DC_JSON_STRING ? v->str : "");
    if (x < lo || x > hi) return dc_fail("%s: '%s' is %lld, outside [%d, %d]", path, key, (long long)x, lo, hi);
    return *out = (int)x, 0;
}

// A number (null allowed when null_ok: *out = NAN, "not given").
static int get_num(const dc_json *root, const char *path, const char *key, bool null_ok, double *out) {
    const dc_json *v = dc_json_get(root, key);
    if (!v) return 0;
    if (null_ok && v->type == DC_JSON_NULL) return *out = NAN, 0;
    if (v->type != DC_JSON_NUMBER)
        return dc_fail("%s: '%s' is %s%s%s: it must be a number", path, key, type_name(v),
                       v->type == DC_JSON_STRING ? " " : "", v->type == DC_JSON_STRING ? v->str : "");
    return *out = v->num, 0;
}

// One of the names in `names` (NULL-terminated): its index, or -1 when absent
// (and null when null_ok).
static int get_name(const dc_json *root, const char *path, const char *key, const char *const *names, bool null_ok,
                    int *out) {
    *out = -1;
    const dc_json *v = dc_json_get(root, key);
    if (!v || (null_ok && v->type == DC_JSON_NULL)) return 0;
    char list[256] = "";
    for (int i = 0; names[i]; i++) {
        if (dc_json_is_cstr(v) && !strcmp(v->str, names[i])) return *out = i, 0;
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s\"%s\"", i ? ", " : "", names[i]);
    }
    if (!dc_json_is_cstr(v))
        return dc_fail("%s: '%s' is %s%s%s: it must be a string (%s)", path, key, type_name(v),
                       v->type == DC_JSON_NUMBER ? " " : "", v->type == DC_JSON_NUMBER ? v->str : "", list);
    return dc_fail("%s: '%s' is \"%.100s\": not one of %s", path, key, v->str, list);
}

static int read_betas(dc_sd_sched_cfg *c, const dc_json *root, const char *path) {
    const dc_json *v = dc_json_get(root, "trained_betas");
    if (!v || v->type == DC_JSON_NULL) return 0;
    if (v->type != DC_JSON_ARRAY) return dc_fail("%s: 'trained_betas' is %s: it must be an array or null", path, type_name(v));
    if (v->nkids != c->T)
        return dc_fail("%s: 'trained_betas' holds %d values for num_train_timesteps %d", path, v->nkids, c->T);
    if (!(c->trained_betas = malloc(sizeof(double) * (size_t)c->T))) return dc_fail("%s: out of memory", path);
    for (int i = 0; i < c->T; i++) {
        const dc_json *b = &v->kids[i];
        if (b->type != DC_JSON_NUMBER || !(b->num > 0 && b->num < 1))
            return dc_fail("%s: 'trained_betas'[%d] is %s%s%s: each must be a number in (0, 1)", path, i, type_name(b),
                           b->str ? " " : "", b->str ? b->str : "");
        c->trained_betas[i] = b->num;
    }
    return 0;
}

static int from_json(dc_sd_sched_cfg *c, const dc_json *root, const char *path) {
    if (!root || root->type != DC_JSON_OBJECT) return dc_fail("%s: not a JSON object", path);
    const dc_json *cls = dc_json_get(root, "_class_name");
    if (cls && !dc_json_is_cstr(cls)) return dc_fail("%s: '_class_name' is %s: it must be a string", path, type_name(cls));
    // diffusers' class defaults for what the file leaves out
    c->T = 1000, c->beta_start = 0.0001, c->beta_end = 0.02, c->beta_schedule = DC_BETAS_LINEAR;
    c->prediction = -1, c->spacing = DC_SPACING_CLASS, c->steps_offset = 0;
    c->set_alpha_to_one = true, c->lower_order_final = true, c->lambda_min_clipped = -INFINITY;
    c->solver_order = 2, c->dpmsolver_pp = c->midpoint = true;

    DC_TRY(get_int(root, path, "num_train_timesteps", 2, 100000, &c->T));
    DC_TRY(get_num(root, path, "beta_start", false, &c->beta_start));
    DC_TRY(get_num(root, path, "beta_end", false, &c->beta_end));
    static const char *const schedules[] = {"linear", "scaled_linear", "squaredcos_cap_v2", NULL};
    int k;
    DC_TRY(get_name(root, path, "beta_schedule", schedules, false, &k));
    if (k >= 0) c->beta_schedule = (dc_beta_schedule)k;
    c->schedule_given = k >= 0;
    DC_TRY(read_betas(c, root, path));
    if (c->trained_betas) c->schedule_given = true;
    if (!c->trained_betas && c->beta_schedule != DC_BETAS_SQUAREDCOS) {
        if (!(c->beta_start > 0 && c->beta_start < 1))
            return dc_fail("%s: 'beta_start' is %g: it must be in (0, 1)", path, c->beta_start);
        if (!(c->beta_end > 0 && c->beta_end < 1))
            return dc_fail("%s: 'beta_end' is %g: it must be in (0, 1)", path, c->beta_end);
        if (c->beta_start > c->beta_end)
            return dc_fail("%s: 'beta_start' %g is above 'beta_end' %g", path, c->beta_start, c->beta_end);
    }
    DC_TRY(get_bool(root, path, "rescale_betas_zero_snr", &c->rescale_zero_snr));

    static const char *const preds[] = {"epsilon", "v_prediction", "sample", "flow_prediction", NULL};
    DC_TRY(get_name(root, path, "prediction_type", preds, false, &k));
    if (k == 3)
        return dc_fail("%s: 'prediction_type' \"%s\" belongs to a flow-matching scheduler (epsilon, v_prediction or "
                       "sample)", path, preds[k]);
    c->prediction = k < 0 ? -1 : k == 0 ? DC_PRED_EPS : k == 1 ? DC_PRED_V : DC_PRED_SAMPLE;
    static const char *const spacings[] = {"leading", "trailing", "linspace", NULL};
    DC_TRY(get_name(root, path, "timestep_spacing", spacings, false, &k));
    if (k >= 0) c->spacing = (dc_spacing)k;
    DC_TRY(get_int(root, path, "steps_offset", 0, c->T - 1, &c->steps_offset));

    static const char *const interps[] = {"linear", "log_linear", NULL};
    DC_TRY(get_name(root, path, "interpolation_type", interps, false, &k));
    c->log_linear = k == 1;
    static const char *const ttypes[] = {"discrete", "continuous", NULL};
    DC_TRY(get_name(root, path, "timestep_type", ttypes, false, &k));
    c->continuous_t = k == 1;
    double smin = NAN, smax = NAN;
    DC_TRY(get_num(root, path, "sigma_min", true, &smin));
    DC_TRY(get_num(root, path, "sigma_max", true, &smax));
    if (!isnan(smin) && !(smin > 0 && isfinite(smin)))
        return dc_fail("%s: 'sigma_min' is %g: it must be above 0 (or null)", path, smin);
    if (!isnan(smax) && !(smax > 0 && isfinite(smax)))
        return dc_fail("%s: 'sigma_max' is %g: it must be above 0 (or null)", path, smax);
    if (!isnan(smin) && !isnan(smax) && smin >= smax)
        return dc_fail("%s: 'sigma_min' %g is not below 'sigma_max' %g", path, smin, smax);
    c->sigma_min = isnan(smin) ? 0 : smin, c->sigma_max = isnan(smax) ? 0 : smax;
    static const char *const finals[] = {"zero", "sigma_min", NULL};
    DC_TRY(get_name(root, path, "final_sigmas_type", finals, false, &k));
    c->final_sigma_min = k == 1;

    DC_TRY(get_bool(root, path, "set_alpha_to_one", &c->set_alpha_to_one));
    DC_TRY(get_bool(root, path, "clip_sample", &c->clip_sample));
    DC_TRY(get_bool(root, path, "thresholding", &c->thresholding));
    double unused = 0;
    DC_TRY(get_num(root, path, "clip_sample_range", false, &unused));
    DC_TRY(get_num(root, path, "dynamic_thresholding_ratio", false, &unused));
    DC_TRY(get_num(root, path, "sample_max_value", false, &unused));

    DC_TRY(get_bool(root, path, "lower_order_final", &c->lower_order_final));
    DC_TRY(get_bool(root, path, "euler_at_final", &c->euler_at_final));
    DC_TRY(get_num(root, path, "lambda_min_clipped", false, &c->lambda_min_clipped));
    if (isnan(c->lambda_min_clipped)) return dc_fail("%s: 'lambda_min_clipped' is NaN", path);
    DC_TRY(get_int(root, path, "solver_order", 1, 3, &c->solver_order));
    // "deis" and the UniPC solver types are taken as their DPM-Solver++ twins, as
    // DPMSolverMultistepScheduler's __init__ does
    static const char *const algos[] = {"dpmsolver++", "deis", "dpmsolver", "sde-dpmsolver", "sde-dpmsolver++", NULL};
    DC_TRY(get_name(root, path, "algorithm_type", algos, false, &k));
    c->dpmsolver_pp = k <= 1;
    static const char *const solvers[] = {"midpoint", "logrho", "bh1", "bh2", "heun", NULL};
    DC_TRY(get_name(root, path, "solver_type", solvers, false, &k));
    c->midpoint = k <= 3;
    static const char *const variances[] = {"learned", "learned_range", NULL};
    DC_TRY(get_name(root, path, "variance_type", variances, true, &k));
    c->learned_variance = k >= 0;

    const char *methods[] = {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "use_lu_lambdas",
                             "use_flow_sigmas"};
    bool *flags[] = {&c->use_karras_sigmas, &c->use_exponential_sigmas, &c->use_beta_sigmas, &c->use_lu_lambdas,
                     &c->use_flow_sigmas};
    for (int i = 0; i < 5; i++) DC_TRY(get_bool(root, path, methods[i], flags[i]));
    if (c->use_karras_sigmas + c->use_exponential_sigmas + c->use_beta_sigmas > 1)
        return dc_fail("%s: only one of use_karras_sigmas, use_exponential_sigmas and use_beta_sigmas can be true",
                       path);
    return 0;
}

int dc_sd_sched_cfg_from_json(dc_sd_sched_cfg *c, const dc_json *root, const char *path) {
    dc_sd_sched_cfg_default(c);
    snprintf(c->source, sizeof c->source, "%s", path);
    int rc = from_json(c, root, path);
    if (rc) dc_sd_sched_cfg_free(c);
    return rc;
}

int dc_sd_sched_cfg_read(dc_sd_sched_cfg *c, const char *path) {
    dc_sd_sched_cfg_default(c);
    dc_json_doc doc;
    DC_TRY(dc_json_read_file_opts(&doc, path, DC_JSON_NONFINITE));
    int rc = dc_sd_sched_cfg_from_json(c, doc.root, path);
    dc_json_free(&doc);
    return rc;
}

// ---- what a sampler does not follow ------------------------------------------------------

typedef struct {
    char *buf;
    size_t cap, used;
    int count;
} lines;

static void line(lines *l, const char *fmt, ...) DC_PRINTF(2, 3);
static void line(lines *l, const char *fmt, ...) {
    l->count++;
    if (!l->buf || l->used >= l->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->buf + l->used, l->cap - l->used, fmt, ap);
    va_end(ap);
    if (n > 0) l->used += (size_t)n < l->cap - l->used ? (size_t)n : l->cap - l->used - 1;
    if (l->used + 1 < l->cap) l->buf[l->used++] = '\n', l->buf[l->used] = 0;
}

int dc_sd_sched_cfg_warnings(const dc_sd_sched_cfg *c, dc_sd_class k, bool karras, char *buf, size_t cap) {
    lines l = {buf, cap, 0, 0};
    if (buf && cap) buf[0] = 0;
    const char *f = c->source[0] ? c->source : "the scheduler config", *cls = dc_sd_class_name(k);
    if (!c->schedule_given)
        line(&l, "%s names no beta_schedule: diffusers' default, linear betas from %g to %g, is used (Stable "
                 "Diffusion's own is scaled_linear from 0.00085 to 0.012)", f, c->beta_start, c->beta_end);
    const bool sigmas = k == DC_SCHED_EULER || k == DC_SCHED_DPM_MULTISTEP;
    if (sigmas && c->use_karras_sigmas && !karras)
        line(&l, "%s: use_karras_sigmas is true, but this sampler runs %s without Karras sigmas (dpmpp_2m_karras "
                 "has them)", f, cls);
    if (sigmas && c->use_exponential_sigmas) line(&l, "%s: use_exponential_sigmas is not followed (no sampler has them)", f);
    if (sigmas && c->use_beta_sigmas) line(&l, "%s: use_beta_sigmas is not followed (no sampler has them)", f);
    if (k == DC_SCHED_DPM_MULTISTEP) {
        if (c->use_lu_lambdas) line(&l, "%s: use_lu_lambdas is not followed", f);
        if (c->use_flow_sigmas) line(&l, "%s: use_flow_sigmas is not followed", f);
        if (c->solver_order != 2) line(&l, "%s: solver_order %d is not followed: DPM++ 2M is of order 2", f, c->solver_order);
        if (!c->dpmsolver_pp) line(&l, "%s: algorithm_type is not followed: DPM++ 2M is \"dpmsolver++\"", f);
        if (!c->midpoint) line(&l, "%s: solver_type \"heun\" is not followed: DPM++ 2M uses \"midpoint\"", f);
        if (c->learned_variance) line(&l, "%s: variance_type is not followed (the model's output is taken whole)", f);
    }
    if ((k == DC_SCHED_DDIM || k == DC_SCHED_DPM_MULTISTEP) && c->thresholding)
        line(&l, "%s: thresholding is not followed (dynamic thresholding is for pixel-space models)", f);
    if (k == DC_SCHED_DDIM && c->clip_sample)
        line(&l, "%s: clip_sample is not followed (diffusers' StableDiffusionPipeline turns it off too)", f);
    return l.count;
}
