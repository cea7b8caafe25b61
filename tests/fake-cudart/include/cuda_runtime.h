/* cuda_runtime.h — programs that include the usual umbrella header get the fake's subset. */
#ifndef FAKECUDART_CUDA_RUNTIME_H
#define FAKECUDART_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#endif
