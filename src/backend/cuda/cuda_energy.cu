// The GPU's energy counter and power limit, from NVML (the driver's
// management library, opened at run time: the build links nothing of it).
// A sustained SD step on an H100 runs at the board's power limit, so its
// speed follows the energy it spends; `bench --sd` reports joules a step
// beside milliseconds. Opened on the first call (not safe for first calls
// from several threads at once).
#include <dlfcn.h>
#include <stdint.h>

#include "backend/cuda/cuda_ops.h"

namespace {

// The few entry points used, as the NVML headers declare them (return 0:
// NVML_SUCCESS; a device is an opaque handle).
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_bus_fn)(const char *bus_id, void **device);
typedef int (*nvml_energy_fn)(void *device, unsigned long long *millijoules);
typedef int (*nvml_limit_fn)(void *device, unsigned int *milliwatts);

struct nvml_lib {
    bool tried, ok;
    nvml_by_bus_fn by_bus;
    nvml_energy_fn energy;
    nvml_limit_fn limit;
    void *dev[64];  // per CUDA device, found on first use
};
nvml_lib nml;

bool nvml_open(void) {
    if (nml.tried) return nml.ok;
    nml.tried = true;
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    nvml_init_fn init = (nvml_init_fn)dlsym(h, "nvmlInit_v2");
    nml.by_bus = (nvml_by_bus_fn)dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    nml.energy = (nvml_energy_fn)dlsym(h, "nvmlDeviceGetTotalEnergyConsumption");
    nml.limit = (nvml_limit_fn)dlsym(h, "nvmlDeviceGetEnforcedPowerLimit");
    nml.ok = init && nml.by_bus && nml.energy && nml.limit && init() == 0;
    return nml.ok;
}

}  // namespace

// Joules the current device has used since the driver loaded, and its
// enforced power limit in watts; false where NVML or the counter is missing
// (the counter needs a Volta or newer board).
extern "C" bool dc_cuda_energy(dc_backend *be, double *joules, double *limit_w) {
    (void)be;
    int dev = 0;
    if (!nvml_open() || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
    if (!nml.dev[dev]) {
        char bus[32];
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess || nml.by_bus(bus, &nml.dev[dev]) != 0) {
            cudaGetLastError();
            nml.dev[dev] = NULL;
            return false;
        }
    }
    unsigned long long mj = 0;
    unsigned int mw = 0;
    if (nml.energy(nml.dev[dev], &mj) != 0 || nml.limit(nml.dev[dev], &mw) != 0) return false;
    *joules = mj * 1e-3, *limit_w = mw * 1e-3;
    return true;
}
