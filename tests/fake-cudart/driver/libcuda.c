/*
 * libcuda.c — the fake CUDA driver library, libcuda.so.1: each exported cu* function of cuda.h
 * calls its implementation in the fake runtime, fakecudart_driver_<name> (src/driver.c,
 * src/vmm.c), so that the driver and the runtime share one state (devices, capacity, bytes in
 * use, counters, the simulated clock).
 *
 * Linked with NEEDED libcudart.so.12 and RUNPATH $ORIGIN (both are built into one directory), so
 * it loads whether the runtime dlopens it at its start (the usual way, as the real runtime loads
 * the real driver) or a program links it directly (-l:libcuda.so.1). The version script
 * libcuda.map exports the cu* names only, unversioned like the real driver's.
 */
#include "cuda.h"
#include "driver.h"

#define FAKECUDART_DRIVER_FORWARD(name, params, args) \
    CUresult name params { return fakecudart_driver_##name args; }
FAKECUDART_DRIVER_FUNCTIONS(FAKECUDART_DRIVER_FORWARD)
