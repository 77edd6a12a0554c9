// Optimizer offload (as Colossal-AI's HybridAdam): the fp32 master weights
// and the AdamW moments live in pinned host memory and AdamW runs on the CPU
// (dc_cpu_adamw, the CPU backend's kernel, without its EMA), so the device
// holds the weights the model reads, the EMA and the activations. Per
// parameter and step the host's memory moves 36 bytes (AdamW reads and
// writes 28, the copies down and up 8): the EMA, which would add 8 more,
// stays on the device.
//
// Gradients never fill a full device buffer: backward hands over each unit
// of the parameters (nn/params.h: a transformer block, say) as it finishes,
// its gradients land in one of two unit-sized device buckets (the
// parameters' gradient window, as ZeRO-2 uses it), and the bucket is copied
// into a pinned fp32 gradient buffer on the host beside the next unit's
// backward. With gradient accumulation each micro-batch after the first
// first copies the unit's running sum back into its bucket, so backward adds
// to it exactly as it adds to a full gradient buffer: the sums are the
// non-offloaded run's on a GPU, where micro-batches accumulate in place, at
// the price of one more copy of the gradients per accumulated micro-batch
// (up and down: 8 bytes a parameter). Folding (the CPU backend, whose
// trainer computes each micro-batch's gradients from zero and adds them to
// the step's sum, train/trainer.h) zeroes the bucket instead and adds the
// host's running sum to it after the unit's backward: T + g, the plain
// step's addition, with no copy up.
// The full gradient buffer the buckets replace becomes the device EMA.
//
// Without clipping, in the step's last micro-batch a worker thread runs
// AdamW for each unit as soon as its gradients are on the host, while the
// device goes on with the backward of the units before it, and the unit's
// new fp32 weights go up into a unit-sized staging buffer on the device.
// When the next unit comes up (or at the step's end) the device's queue
// waits for that copy and one pass over the unit's runs of trainable tensors
// updates the EMA from the staged weights and writes them into the compute
// copy: the backend's adamw with lr 0 on zero moments, which leaves the
// weights as they are and runs exactly the plain step's EMA and cast. Fixed
// tensors (a fixed positional embedding) are in no run: their compute copy and EMA keep
// their values. With clipping the global norm is needed first: the update
// waits for the whole backward (no overlap).
//
// The host queues a backward far ahead of the device, and an update can go
// up only after the ops queued before it (copy_async), its landing only
// after them too: units the worker updated while the device was still in
// the backward would all go up and land after it, holding up the next
// forward. So in a step's last micro-batch the host waits, as a unit's
// backward is queued, until the unit before it has its gradients out, and
// stages what the worker has done meanwhile: each update goes up beside
// the next unit's backward and lands between two units. Pace off (the
// settings below) lets the host run ahead, for comparison.
//
// The step does not wait for the last units either: its finish returns with the units still queued re-ordered into forward order (the
// backward hands them over last to first, the forward reads them first to
// last), and the next forward, before it reads each unit (the model's
// dc_params_unit_use), waits for the worker to update it and lands it. The
// CPU's update thus also runs beside the next forward, and a step takes
// about the longer of the CPU's update and the device's work instead of
// their sum less the backward. The worker would idle from its last unit
// until the next backward's first gradients, while the device runs the
// forward past the units it waited for: so a few units the forward reads
// near its end (before its last unit, eight widest units' worth: the last
// eight blocks of a 28-block transformer) are taken only when no other unit is queued. In
// backward the others queue up ahead of them, so they are left for the end
// of the update, which they fill while the device runs the forward up to
// them; the worker then waits only for the forward's last unit, the loss
// and the first units' backward. Hold n holds n widest units' worth
// instead (0: none, for comparison). Whatever else reads the weights,
// the master or the EMA (a checkpoint, the end of training, a model whose
// forward does not announce its units) drains the update first. Defer off
// finishes every update within its step instead, for comparison.
//
// The CPU's update is bound by the host's memory (36 bytes a parameter a
// step), while the PCIe link and the device have room. So, without
// clipping, the first units (device_share x: about that share of the
// parameters; none by default) can be updated on the device instead: as
// such a unit's backward starts, its master and moments go up into three unit-sized
// device buffers (two sets of them when every unit is updated there, so one
// unit's state goes up while the last one's goes down), and when it ends the
// plain step's AdamW, EMA and cast run
// there on its gradients in the bucket, and the master and moments go back
// down. That moves 24 bytes a parameter over PCIe instead of 8 through the
// CPU's 36, and they are the units the next forward reads first, updated
// before the CPU's last ones. The host reads them only after their copies
// down (draining waits for them). The streamed state still passes
// through the host's memory (24 bytes a parameter against the CPU's 36),
// and on the H100 machines measured no share beat none once the host was
// paced (docs/PERFORMANCE.md); it stays for hosts whose CPU is the slower
// side.
//
// The device keeps no full fp32 copy of the weights where a compute copy
// exists (bf16 on a GPU): the master is on the host and every reader has
// its own source (checkpoints: the master and the device EMA; the forward:
// the compute copy). Only the fixed tensors, which a forward may read in
// fp32 (a fixed positional embedding read from the parameters' data), stay in that
// data: it shrinks to the prefix of the flat layout that holds them, and
// dc_offload_free gives the model its full fp32 weights back (the master's).
// The weights must therefore be loaded before dc_offload_create and not be
// written while it lasts (the trainer refuses a step after they were). On
// the CPU backend, and wherever the compute dtype is fp32, the parameters'
// data is the compute copy and keeps its size.
//
// Results equal the non-offloaded run's: bit for bit on the CPU backend (the
// same kernels on the same sums), to fp32 rounding of the update on a GPU
// (host AdamW against the device's; the EMA is the device's own arithmetic).
// The gradient norm a step without clipping reports is combined from each
// unit's norm, taken on the device from its bucket (a pass over the host's
// gradients would follow the last update): equal to the plain run's to fp32
// rounding.
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "nn/params.h"
#include "train/optimizer.h"

// How offload schedules its work: tuning, not part of the recipe (results
// are the same whatever they are; checkpoints do not record them).
typedef struct {
    bool defer;           // leave the last units' update to the next forward (false: finish it in its step)
    bool pace;            // keep the host one unit ahead of the device in backward (false: let it run ahead)
    int hold;             // widest units' worth the worker takes last (0: none)
    double device_share;  // about this share of the parameters, the first units, updated on the device (0 to 1)
} dc_offload_settings;

// Those measured best on the machines of docs/PERFORMANCE.md: defer and
// pace on, 8 units held, none on the device.
dc_offload_settings dc_offload_settings_default(void);
int dc_offload_settings_validate(const dc_offload_settings *s);

typedef struct {
    dc_optimizer base;      // the strategy (train/optimizer.h); installs its unit and use hooks and window
    dc_offload_settings set;
    dc_backend *be;
    dc_params *ps;
    int units;
    // pinned host state, [numel] F32 each, the parameters' flat layout
    float *master, *m, *v;
    float *grad;            // the step's gradients (running sums over its micro-batches)
    dc_buf ema;             // [numel] F32 on the device (the parameters' former gradient buffer, or its
                            // own); none without an EMA (decay 0: it would equal the master)
    dc_buf bucket[2];       // [widest unit] F32 on the device: a unit's gradients in backward
    int64_t widest;         // elements of the largest unit
    bool fold;              // each micro-batch's gradients from zero, added to the host's sum (the CPU)
    int next;               // the bucket the next unit takes
    int64_t down[2];        // the copy of each bucket to the host (a ticket; 0: none)
    // a unit's new weights on the device, on their way into the EMA and the compute copy
    dc_buf stage;           // [widest unit] F32
    int staged;             // the unit it holds, or -1
    int64_t up;             // the copy up into it (a ticket)
    dc_buf zeros;           // [widest unit] F32 zeros: gradient and moments of the EMA pass
    // units [0, dev_units) are updated on the device: unit u's master and
    // moments come up into state[u % nsets] ([widest unit] F32 each) and go
    // back. Two sets where every unit is updated there (one unit's state
    // goes up while the last one's goes down), else one.
    int dev_units, nsets;
    dc_buf state[2][3];
    int64_t set_down[2];       // the last copy down out of each set (a ticket)
    int64_t dev_up, dev_down;  // the last copies up and down of such a unit (tickets)
    dc_adamw_step keep;     // that pass's step: lr 0, the EMA's decay
    bool shrunk;            // the parameters' data holds only the fixed tensors' prefix
    // the step in progress
    int micro;              // micro-batch within the step (0: the first)
    bool last;              // the step's last micro-batch: the update follows the gradients
    bool overlap;           // update each unit in backward (no clipping)
    bool armed;             // the update's settings below wait for the last one to be drained
    bool next_overlap;
    dc_adamw_step next_h;
    dc_adamw_step h;        // the update the worker runs (fixed until it is drained)
    float factor;           // the clipping factor the update applies (1: none)
    bool pending;           // units of the last update not landed yet (the next forward lands them)
    int hold_lo, hold_hi;   // the units [lo, hi) the worker takes last (see above)
    bool *landed;           // [units]
    int nlanded;
    int64_t *ticket;        // [units] the copy of each unit's gradients to the host (the last micro-batch's)
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

// The strategy: takes the parameters' state, the master copied from the
// weights onto the host, moments zero there; with ema, the device EMA starts
// as an exact copy of the weights (in the full gradient buffer, where the
// set has one; a set made with DC_GRAD_WINDOW never has: its EMA buffer is
// made once the fp32 data has shrunk). Without ema (a decay of 0, where the
// EMA is the weights) there is none on the device, and checkpoints take the
// master for it. Where a compute copy exists, the fp32 data shrinks to the
// fixed tensors. Takes the parameters'
// hooks. Needs a backend with the pinned-copy ops and a model whose backward
// hands over its gradients unit by unit. fold: accumulate micro-batches as
// the CPU's trainer does (above; the CPU backend only, whose ops read host
// memory). Freeing it gives the parameters their full fp32 data back, from
// the master.
//
// Its steps: begin_step refuses weights written since it took them;
// micro_begin, before each round's forward, hands the last round the step's
// AdamW (and EMA), each unit updated as its gradients arrive unless clipping
// needs them all first; these take effect once the last update is over (a
// model whose forward does not announce its units has it drained there).
// finish: the global norm and clipping factor, the units not yet updated
// left to the worker in forward order (above). drain: waits for every unit
// of the last update and lands it: the master, the EMA and the compute copy
// then hold the step's result.
int dc_offload_create(dc_params *ps, dc_backend *be, bool fold, bool ema, const dc_offload_settings *set,
                      dc_optimizer **out);
// Units [0, n) are updated on the device with device_share (see above); n
// is returned.
int dc_offload_device_units(const dc_params *ps, double device_share);
// Device bytes offload allocates with device_share: the two gradient
// buckets, the staging buffer, the zeros, the units' norms and, with units
// updated on the device, their master and moments. Beside them it keeps the
// EMA (4 bytes a parameter, when it has one) and, where a compute copy
// exists, only dc_offload_kept_data(ps) elements of the fp32 data.
int64_t dc_offload_device_bytes_at(const dc_params *ps, double device_share);
// The same with the default settings: what the memory planner counts.
static inline int64_t dc_offload_device_bytes(const dc_params *ps) {
    return dc_offload_device_bytes_at(ps, dc_offload_settings_default().device_share);
}
// The fp32 data's elements kept on the device beside a compute copy: the
// prefix of the flat layout up to the end of the last fixed tensor (0: none).
int64_t dc_offload_kept_data(const dc_params *ps);
