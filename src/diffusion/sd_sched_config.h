// A diffusers scheduler_config.json, read into the settings the engine's
// ladders follow (dc_sd_sched_cfg, sd_schedule.h).
//
// Every key one of the four classes the samplers follow reads
// (EulerDiscreteScheduler, EulerAncestralDiscreteScheduler, DDIMScheduler,
// DPMSolverMultistepScheduler) is checked, whatever the sampler: a value of
// the wrong type, out of range or an unknown name is refused, naming the key
// and the file. A key the file leaves out takes the classes' default, as
// diffusers' from_config gives it (so a file without beta_schedule means
// linear betas from 0.0001 to 0.02, which dc_sd_sched_cfg_warnings points
// out). Keys of no such class (PNDMScheduler's skip_prk_steps, _class_name,
// _diffusers_version) are ignored, as diffusers' from_config ignores them.
#pragma once
#include <stddef.h>
#include "diffusion/sd_schedule.h"
#include "io/json.h"

// Reads the file at path (NaN and +-Infinity accepted, as Python writes them;
// a duplicate key refused). On failure c is left with nothing to free.
int dc_sd_sched_cfg_read(dc_sd_sched_cfg *c, const char *path);
// The same from a parsed object; path names it in messages.
int dc_sd_sched_cfg_from_json(dc_sd_sched_cfg *c, const dc_json *root, const char *path);

// What the file asks of the sampling method that a run of class k (with or
// without Karras sigmas) does not follow, one line each into buf (e.g.
// "use_karras_sigmas is true, but ..."); returns the number of lines. The
// sampler chosen decides the method: these keys describe a sampler, not the
// model.
int dc_sd_sched_cfg_warnings(const dc_sd_sched_cfg *c, dc_sd_class k, bool karras, char *buf, size_t cap);
