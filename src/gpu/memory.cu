/* Device memory for callers that hold no CUDA headers (the connector, the
 * CLI): allocation on a chosen device, synchronous copies, device choice. */
#include "cuda_util.cuh"

kvr_status_t kvr_gpu_set_device(int device, kvr_error_t *err)
{
    int n = 0;
    KVR__CUDA_TRY(cudaGetDeviceCount(&n), err);
    if (device < 0 || device >= n)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "CUDA device %d out of range [0, %d)", device, n);
    KVR__CUDA_TRY(cudaSetDevice(device), err);
    return KVR_OK;
}

kvr_status_t kvr_gpu_malloc(int device, size_t len, void **ptr,
                            kvr_error_t *err)
{
    if (ptr == NULL || len == 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "ptr NULL or len 0");
    kvr_status_t st = kvr_gpu_set_device(device, err);
    if (st != KVR_OK)
        return st;
    void *p = NULL;
    KVR__CUDA_TRY(cudaMalloc(&p, len), err);
    *ptr = p;
    return KVR_OK;
}

void kvr_gpu_free(void *ptr)
{
    if (ptr != NULL)
        cudaFree(ptr);
}

kvr_status_t kvr_gpu_memcpy(void *dst, const void *src, size_t len,
                            kvr_error_t *err)
{
    if (len == 0)
        return KVR_OK;
    if (dst == NULL || src == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "NULL copy pointer");
    KVR__CUDA_TRY(cudaMemcpy(dst, src, len, cudaMemcpyDefault), err);
    return KVR_OK;
}

kvr_status_t kvr_gpu_sync(void *stream, kvr_error_t *err)
{
    KVR__CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), err);
    return KVR_OK;
}

kvr_status_t kvr_gpu_stream_create(int device, void **stream, kvr_error_t *err)
{
    if (stream == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "stream is NULL");
    kvr_status_t st = kvr_gpu_set_device(device, err);
    if (st != KVR_OK)
        return st;
    cudaStream_t s = NULL;
    KVR__CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), err);
    *stream = (void *)s;
    return KVR_OK;
}

void kvr_gpu_stream_destroy(void *stream)
{
    if (stream != NULL)
        cudaStreamDestroy((cudaStream_t)stream);
}

kvr_status_t kvr_gpu_event_create(int device, void **event, kvr_error_t *err)
{
    if (event == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "event is NULL");
    kvr_status_t st = kvr_gpu_set_device(device, err);
    if (st != KVR_OK)
        return st;
    cudaEvent_t e = NULL;
    KVR__CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), err);
    *event = (void *)e;
    return KVR_OK;
}

void kvr_gpu_event_destroy(void *event)
{
    if (event != NULL)
        cudaEventDestroy((cudaEvent_t)event);
}

kvr_status_t kvr_gpu_event_record(void *event, void *stream, kvr_error_t *err)
{
    KVR__CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream),
                  err);
    return KVR_OK;
}

kvr_status_t kvr_gpu_stream_wait(void *stream, void *event, kvr_error_t *err)
{
    if (event == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "event is NULL");
    KVR__CUDA_TRY(
        cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0), err);
    return KVR_OK;
}

kvr_status_t kvr_gpu_event_done(void *event, int *done, kvr_error_t *err)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    *done = e == cudaSuccess;
    if (e == cudaSuccess || e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* NotReady is not an error */
        return KVR_OK;
    }
    return kvr__cuda_status(e, "cudaEventQuery", err);
}

kvr_status_t kvr_gpu_event_sync(void *event, kvr_error_t *err)
{
    KVR__CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event), err);
    return KVR_OK;
}
