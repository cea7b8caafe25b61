/*
 * errors.c — names and descriptions of error codes, with the texts of the real runtime.
 */
#include "state.h"

struct error_text {
    cudaError_t code;
    const char *name;
    const char *text;
};

static const struct error_text error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const struct error_text *lookup(cudaError_t error) {
    for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++)
        if (error_texts[i].code == error)
            return &error_texts[i];
    return NULL;
}

const char *cudaGetErrorString(cudaError_t error) {
    const struct error_text *e = lookup(error);
    return e != NULL ? e->text : "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error) {
    const struct error_text *e = lookup(error);
    return e != NULL ? e->name : "unrecognized error code";
}
