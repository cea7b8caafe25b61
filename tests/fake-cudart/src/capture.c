/*
 * capture.c — stream capture: which streams capture, in which mode, and the calls a capture
 * forbids (the rules are in cuda_runtime_api.h). No graph is built: a capture only decides
 * whether its cudaStreamEndCapture succeeds.
 */
#include "state.h"

/* The calling thread's capture interaction mode (cudaThreadExchangeStreamCaptureMode). */
static __thread enum cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

/* What cudaStreamEndCapture hands out: a handle that holds nothing. */
struct CUgraph_st {
    int unused;
};
static struct CUgraph_st graph_handle;

static int is_created_stream_locked(cudaStream_t h) {
    if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread)
        return 0;
    return resolve_stream_locked(h) != NULL;
}

/* Whether the calling thread's call of kind `hazard` endangers capture `s`. */
static int endangers(const struct CUstream_st *s, enum fake_capture_hazard hazard) {
    if (hazard == CAPTURE_SYNC)
        return 1;
    if (thread_mode == cudaStreamCaptureModeRelaxed)
        return 0;
    if (s->capture_mode == cudaStreamCaptureModeGlobal)
        return 1;
    return s->capture_mode == cudaStreamCaptureModeThreadLocal &&
           pthread_equal(s->capture_thread, pthread_self());
}

cudaError_t capture_check_locked(enum fake_capture_hazard hazard) {
    int refused = 0;
    for (struct CUstream_st *s = fake.streams; s != NULL; s = s->next) {
        if (s->capture == cudaStreamCaptureStatusActive && endangers(s, hazard)) {
            s->capture = cudaStreamCaptureStatusInvalidated;
            fake.counters.captures_invalidated++;
            refused = 1;
        }
    }
    if (!refused)
        return cudaSuccess;
    fake.counters.capture_refusals++;
    return cudaErrorStreamCaptureUnsupported;
}

cudaError_t capture_legacy_use_locked(int device) {
    int capturing = 0;
    for (struct CUstream_st *s = fake.streams; s != NULL; s = s->next) {
        if (s->device != device || (s->flags & cudaStreamNonBlocking) != 0 ||
            s->capture == cudaStreamCaptureStatusNone)
            continue;
        capturing = 1;
        if (s->capture == cudaStreamCaptureStatusActive) {
            s->capture = cudaStreamCaptureStatusInvalidated;
            fake.counters.captures_invalidated++;
        }
    }
    if (!capturing)
        return cudaSuccess;
    fake.counters.capture_refusals++;
    return cudaErrorStreamCaptureImplicit;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    ENTER();
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return record(cudaErrorInvalidValue);
    lock();
    cudaError_t rc = cudaSuccess;
    if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
        rc = cudaErrorStreamCaptureUnsupported;
    } else if (!is_created_stream_locked(stream)) {
        rc = cudaErrorInvalidResourceHandle;
    } else if (stream->capture != cudaStreamCaptureStatusNone) {
        rc = cudaErrorIllegalState;
    } else {
        stream->capture = cudaStreamCaptureStatusActive;
        stream->capture_mode = mode;
        stream->capture_thread = pthread_self();
        fake.counters.captures_begun++;
    }
    unlock();
    return record(rc);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    ENTER();
    if (pGraph == NULL)
        return record(cudaErrorInvalidValue);
    lock();
    cudaError_t rc = cudaSuccess;
    if (!is_created_stream_locked(stream)) {
        rc = cudaErrorInvalidResourceHandle;
    } else if (stream->capture == cudaStreamCaptureStatusNone) {
        rc = cudaErrorIllegalState;
    } else if (stream->capture_mode != cudaStreamCaptureModeRelaxed &&
               !pthread_equal(stream->capture_thread, pthread_self())) {
        rc = cudaErrorStreamCaptureWrongThread;
    } else {
        int invalidated = stream->capture == cudaStreamCaptureStatusInvalidated;
        stream->capture = cudaStreamCaptureStatusNone;
        *pGraph = invalidated ? NULL : &graph_handle;
        rc = invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    }
    unlock();
    return record(rc);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus *pCaptureStatus) {
    ENTER();
    if (pCaptureStatus == NULL)
        return record(cudaErrorInvalidValue);
    lock();
    fake.counters.capture_queries++;
    cudaError_t rc = take_call_failure_locked(&fake.injected_is_capturing);
    if (rc != cudaSuccess) {
        /* injected: nothing answered */
    } else if (stream == NULL || stream == cudaStreamLegacy) {
        /* The legacy stream never captures; it answers 906 while a blocking stream of the
         * device does (an action on it would join that capture). */
        *pCaptureStatus = cudaStreamCaptureStatusNone;
        for (struct CUstream_st *s = fake.streams; s != NULL; s = s->next)
            if (s->device == fake_current_device && (s->flags & cudaStreamNonBlocking) == 0 &&
                s->capture != cudaStreamCaptureStatusNone)
                rc = cudaErrorStreamCaptureImplicit;
    } else if (stream == cudaStreamPerThread) {
        *pCaptureStatus = cudaStreamCaptureStatusNone;
    } else if (!is_created_stream_locked(stream)) {
        rc = cudaErrorInvalidResourceHandle;
    } else {
        *pCaptureStatus = stream->capture;
    }
    unlock();
    return record(rc);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    ENTER();
    if (mode == NULL || (*mode != cudaStreamCaptureModeGlobal &&
                         *mode != cudaStreamCaptureModeThreadLocal &&
                         *mode != cudaStreamCaptureModeRelaxed))
        return record(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode previous = thread_mode;
    thread_mode = *mode;
    *mode = previous;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    ENTER();
    return record(graph == &graph_handle ? cudaSuccess : cudaErrorInvalidValue);
}
