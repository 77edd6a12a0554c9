// A training run's loss log, for people to look at: RUN/loss.csv, a row per
// logged step (step, loss, smoothed loss, gradient norm, learning rate,
// images a second), and RUN/loss.png, its plot, redrawn at each checkpoint.
// A resumed run keeps the rows up to the step it resumes from and drops the
// later ones (which the interrupted run logged past its last checkpoint).
#pragma once
#include <stdint.h>
#include <stdio.h>

typedef struct {
    char dir[4096];
    FILE *f;                   // loss.csv, appended to
    double *step, *loss, *avg;  // the rows so far, for the plot
    int n, cap;
} train_log;

// Opens dir/loss.csv, keeping the rows of steps up to `step` (0: a new run).
int train_log_open(train_log *l, const char *dir, int64_t step);
int train_log_row(train_log *l, int64_t step, double loss, double avg, double grad_norm, double lr, double img_s);
// dir/loss.png from the rows so far.
int train_log_plot(train_log *l);
void train_log_close(train_log *l);
