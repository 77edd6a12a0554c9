// Optimizer offload (as Colossal-AI's HybridAdam): the fp32 master weights,
// the AdamW moments and the EMA live in pinned host memory and AdamW + EMA
// run on the CPU (dc_cpu_adamw, the CPU backend's kernel), so the device
// holds only the weights the model reads and the activations.
//
// Gradients never fill a full device buffer: backward hands over each unit
// of the parameters (nn/params.h: a transformer block, say) as it finishes,
// its gradients land in one of two unit-sized device buckets (the
// parameters' gradient window, as ZeRO-2 uses it), and the bucket is copied
// into a pinned fp32 gradient buffer on the host beside the next unit's
// backward. With gradient accumulation each micro-batch after the first
// first copies the unit's running sum back into its bucket, so backward adds
// to it exactly as it adds to a full gradient buffer: the sums are the
// non-offloaded run's, bit for bit, at the price of one more copy of the
// gradients per accumulated micro-batch (up and down: 8 bytes a parameter).
//
// Without clipping, in the step's last micro-batch a worker thread runs
// AdamW + EMA for each unit as soon as its gradients are on the host, while
// the device goes on with the backward of the units before it, and the
// unit's new fp32 weights go back up into the parameters' data. With
// clipping the global norm is needed first: the update waits for the whole
// backward (no overlap). Either way the step ends with the device's queue
// waiting for the last copy up, then refreshing the compute copy, so the
// next forward reads the new weights; the host waits only for the CPU's work.
//
// Results equal the non-offloaded run's: bit for bit on the CPU backend (the
// same kernel on the same sums), to fp32 rounding of the update on a GPU
// (host AdamW against the device's). The gradient norm a step without
// clipping reports is combined from each unit's norm, taken on the device
// from its bucket (a pass over the host's gradients would follow the last
// update): equal to the plain run's to fp32 rounding.
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "nn/params.h"

typedef struct {
    dc_backend *be;
    dc_params *ps;
    int units;
    // pinned host state, [numel] F32 each, the parameters' flat layout
    float *master, *m, *v, *ema;
    float *grad;            // the step's gradients (running sums over its micro-batches)
    dc_buf bucket[2];       // [widest unit] F32 on the device: a unit's gradients in backward
    int64_t widest;         // elements of the largest unit
    int next;               // the bucket the next unit takes
    int64_t down[2];        // the copy of each bucket to the host (a ticket; 0: none)
    int64_t up;             // the last copy of new weights to the device
    // the step in progress
    int micro;              // micro-batch within the step (0: the first)
    bool last;              // the step's last micro-batch: the update follows the gradients
    bool overlap;           // update each unit in backward (no clipping)
    dc_adamw_step h;
    float factor;           // the clipping factor the update applies (1: none)
    int64_t *ticket;        // [units] the copy of each unit's final gradients to the host
    dc_buf unorm;           // [2 units] F32 on the device: each unit's gradient norm (grad_norm's
                            // pair), taken from its bucket when the update overlaps backward
    float *unorm_host;      // [2 units] their host copy
    // the worker: units to update, in order, and the ones it has updated
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *todo, ntodo, taken;  // [units] queued; taken: how many the worker has started
    int *done, ndone, sent;   // [units] updated, in order; sent: how many went back up
    bool stop, failed;
    char err[512];
    // where the time goes, summed over steps: the worker's updates, and the
    // main thread's wait for them after the step's backward was queued
    double busy_s, wait_s;
    int steps;
} dc_offload;

// Takes the parameters' state onto the host: master and EMA copied from the
// weights, moments zero; frees the full gradient buffer and takes the unit
// hook. Needs a backend with the pinned-copy ops and a model whose backward
// hands over its gradients unit by unit.
int dc_offload_init(dc_offload *o, dc_params *ps, dc_backend *be);
void dc_offload_free(dc_offload *o);
// Before each micro-batch's backward: its index in the step, and whether it
// is the last. With last, h is the step's AdamW (and EMA) and overlap says
// whether each unit may be updated as its gradients arrive (no clipping).
void dc_offload_micro(dc_offload *o, int micro, bool last, bool overlap, const dc_adamw_step *h);
// After the step's backward: the global norm and clipping factor into
// gstats ([2] F32 on the backend, as grad_norm writes it), the update of
// every unit not yet done, the new weights back on the device and the
// compute copy refreshed (queued; the host waits only for the CPU's work).
int dc_offload_finish(dc_offload *o, dc_buf gstats, float max_norm);
// Device bytes offload holds beyond the model's weights: the two buckets.
int64_t dc_offload_device_bytes(const dc_params *ps);
