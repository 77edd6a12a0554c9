#include "cli/train_log.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"
#include "io/plot.h"

#define HEADER "step,loss,loss_smoothed,grad_norm,lr,img_per_s\n"

static int keep(train_log *l, double step, double loss, double avg) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        double *s = realloc(l->step, sizeof(double) * cap), *o = s ? realloc(l->loss, sizeof(double) * cap) : NULL,
               *a = o ? realloc(l->avg, sizeof(double) * cap) : NULL;
        if (s) l->step = s;
        if (o) l->loss = o;
        if (!a) return dc_fail("out of memory");
        l->avg = a, l->cap = cap;
    }
    l->step[l->n] = step, l->loss[l->n] = loss, l->avg[l->n] = avg, l->n++;
    return 0;
}

int train_log_open(train_log *l, const char *dir, int64_t step) {
    memset(l, 0, sizeof *l);
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/loss.csv", dir);
    // the earlier run's rows up to `step`, rewritten whole (atomically)
    dc_atomic_file *af = dc_atomic_begin(path);
    if (!af) return -1;
    FILE *out = dc_atomic_stream(af);
    fputs(HEADER, out);
    FILE *in = step > 0 ? fopen(path, "r") : NULL;
    char row[512];
    int rc = 0;
    while (in && !rc && fgets(row, sizeof row, in)) {
        double s, loss, avg;
        if (sscanf(row, "%lf,%lf,%lf", &s, &loss, &avg) == 3 && s <= (double)step && strchr(row, '\n')) {
            fputs(row, out);
            rc = keep(l, s, loss, avg);
        }
    }
    if (in) fclose(in);
    DC_TRY(dc_atomic_end(af, rc == 0));
    if (rc) return -1;
    l->f = fopen(path, "a");
    return l->f ? 0 : dc_fail("%s: cannot append", path);
}

int train_log_row(train_log *l, int64_t step, double loss, double avg, double grad_norm, double lr, double img_s) {
    if (!l->f) return 0;
    fprintf(l->f, "%lld,%.6g,%.6g,%.6g,%.6g,%.4g\n", (long long)step, loss, avg, grad_norm, lr, img_s);
    fflush(l->f);  // a kill loses no logged row
    return keep(l, (double)step, loss, avg);
}

int train_log_plot(train_log *l) {
    if (!l->f) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/loss.png", l->dir);
    const dc_plot_series s[2] = {{l->step, l->loss, l->n, {160, 190, 230}, "loss"},
                                 {l->step, l->avg, l->n, {20, 60, 160}, "smoothed"}};
    return dc_plot_write(path, 720, 400, s, 2, "step");
}

void train_log_close(train_log *l) {
    if (l->f) fclose(l->f);
    free(l->step), free(l->loss), free(l->avg);
    memset(l, 0, sizeof *l);
}
