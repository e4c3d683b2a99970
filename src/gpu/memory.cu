/* Device memory for callers that hold no CUDA headers (the connector, the
 * CLI): allocation on a chosen device, synchronous copies, device choice;
 * streams, events and host notification; the table pool. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

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

static kvr_status_t event_create(int device, unsigned flags, void **event,
                                 kvr_error_t *err)
{
    if (event == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "event is NULL");
    kvr_status_t st = kvr_gpu_set_device(device, err);
    if (st != KVR_OK)
        return st;
    cudaEvent_t e = NULL;
    KVR__CUDA_TRY(cudaEventCreateWithFlags(&e, flags), err);
    *event = (void *)e;
    return KVR_OK;
}

kvr_status_t kvr_gpu_event_create(int device, void **event, kvr_error_t *err)
{
    return event_create(device, cudaEventDisableTiming, event, err);
}

kvr_status_t kvr_gpu_event_create_timed(int device, void **event,
                                        kvr_error_t *err)
{
    return event_create(device, cudaEventDefault, event, err);
}

kvr_status_t kvr_gpu_event_elapsed(void *from, void *to, float *ms,
                                   kvr_error_t *err)
{
    cudaError_t e = cudaEventElapsedTime(ms, (cudaEvent_t)from,
                                         (cudaEvent_t)to);
    if (e == cudaSuccess)
        return KVR_OK;
    (void)cudaGetLastError(); /* a profiler's miss is not the next launch's */
    return kvr__cuda_status(e, "cudaEventElapsedTime", err);
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

/* ---- completion through a file descriptor ---- */

/* Runs on CUDA's host-function thread once the work before it is done:
 * only write(2), which is async-signal-safe, and no CUDA call (a host
 * function must make none). EAGAIN means the counter is already set. */
static void CUDART_CB notify_fd(void *arg)
{
    uint64_t one = 1;
    ssize_t n = write((int)(intptr_t)arg, &one, sizeof(one));
    (void)n;
}

kvr_status_t kvr_gpu_stream_notify(void *stream, int fd, kvr_error_t *err)
{
    if (fd < 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "notify fd %d", fd);
    KVR__CUDA_TRY(cudaLaunchHostFunc((cudaStream_t)stream, notify_fd,
                                     (void *)(intptr_t)fd),
                  err);
    return KVR_OK;
}

static void CUDART_CB nothing(void *arg)
{
    (void)arg;
}

kvr_status_t kvr_gpu_warm(void *stream, kvr_error_t *err)
{
    kvr_status_t st = kvr__relayout_warm(stream, err);
    if (st == KVR_OK)
        st = kvr__runs_warm(stream, err);
    if (st != KVR_OK)
        return st;
    /* the first host function starts CUDA's thread for them */
    KVR__CUDA_TRY(cudaLaunchHostFunc((cudaStream_t)stream, nothing, NULL), err);
    KVR__CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), err);
    return KVR_OK;
}

static __device__ uint64_t global_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __global__ void spin_kernel(uint64_t ns)
{
    uint64_t start = global_ns();
    while (global_ns() - start < ns)
        __nanosleep(1000);
}

kvr_status_t kvr_gpu_spin(void *stream, uint64_t ns, kvr_error_t *err)
{
    spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(ns);
    return kvr__launch_status("spin", err);
}

/* ---- the table pool ---- */

/* Blocks of 2^k bytes, k in [POOL_MIN_LOG, POOL_MIN_LOG + POOL_CLASSES). */
#define POOL_MIN_LOG 8
#define POOL_CLASSES 36

typedef struct pool_class {
    void **free; /* a stack of free blocks */
    size_t n, cap;
} pool_class_t;

/* Mapped pinned slots for small tables read in place by the kernels: a
 * one-block request's tables are a few dozen bytes, and their copy was
 * one more CUDA call per class and pull (docs/gpu.md, The launch). */
#define MAPPED_SLOT 128u
#define MAPPED_SLOTS 256u

struct kvr_gpu_pool {
    int device;
    void *stream;
    uint64_t bytes; /* held, in use or free */
    uint32_t in_use;
    pool_class_t cls[POOL_CLASSES];
    unsigned char *mapped;     /* MAPPED_SLOTS slots (cudaHostAlloc) */
    unsigned char *mapped_dev; /* the same, as the device sees it */
    uint16_t mfree[MAPPED_SLOTS]; /* a stack of free slot indices */
    uint32_t mn;
};

static int pool_class_of(size_t bytes)
{
    int k = 0;
    while (k < POOL_CLASSES - 1 && ((size_t)1 << (k + POOL_MIN_LOG)) < bytes)
        k++;
    return ((size_t)1 << (k + POOL_MIN_LOG)) < bytes ? -1 : k;
}

kvr_status_t kvr_gpu_pool_create(int device, void *stream, kvr_gpu_pool_t **out,
                                 kvr_error_t *err)
{
    if (out == NULL || stream == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "a pool needs a stream (not the legacy one)");
    kvr_status_t st = kvr_gpu_set_device(device, err);
    if (st != KVR_OK)
        return st;
    kvr_gpu_pool_t *p = (kvr_gpu_pool_t *)calloc(1, sizeof(*p));
    if (p == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    p->device = device;
    p->stream = stream;
    /* the mapped slots now, not at a request (pinning takes a while);
     * without them every table is copied */
    void *h = NULL, *d = NULL;
    cudaError_t e = cudaHostAlloc(&h, MAPPED_SLOT * MAPPED_SLOTS,
                                  cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess && cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess)
        cudaFreeHost(h);
    else if (e == cudaSuccess) {
        p->mapped = (unsigned char *)h;
        p->mapped_dev = (unsigned char *)d;
        for (uint32_t i = 0; i < MAPPED_SLOTS; i++)
            p->mfree[p->mn++] = (uint16_t)(MAPPED_SLOTS - 1 - i);
    }
    (void)cudaGetLastError(); /* a failure here is not the next call's */
    *out = p;
    return KVR_OK;
}

void kvr_gpu_pool_destroy(kvr_gpu_pool_t *pool)
{
    if (pool == NULL)
        return;
    cudaStreamSynchronize((cudaStream_t)pool->stream);
    for (int k = 0; k < POOL_CLASSES; k++) {
        for (size_t i = 0; i < pool->cls[k].n; i++)
            cudaFree(pool->cls[k].free[i]);
        free(pool->cls[k].free);
    }
    if (pool->mapped != NULL)
        cudaFreeHost(pool->mapped);
    free(pool);
}

uint64_t kvr_gpu_pool_bytes(const kvr_gpu_pool_t *pool)
{
    return pool ? pool->bytes : 0;
}

kvr_status_t kvr__pool_get(kvr_gpu_pool_t *pool, size_t bytes, void **ptr,
                           kvr_error_t *err)
{
    int dev = -1;
    KVR__CUDA_TRY(cudaGetDevice(&dev), err);
    int k = pool_class_of(bytes);
    if (dev != pool->device || k < 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "pool of device %d: a table of %zu bytes on "
                             "device %d",
                             pool->device, bytes, dev);
    pool_class_t *c = &pool->cls[k];
    if (c->n > 0) { /* stream-ordered: its last readers were queued before */
        *ptr = c->free[--c->n];
        pool->in_use++;
        return KVR_OK;
    }
    size_t len = (size_t)1 << (k + POOL_MIN_LOG);
    KVR__CUDA_TRY(cudaMalloc(ptr, len), err);
    pool->bytes += len;
    pool->in_use++;
    return KVR_OK;
}

void kvr__cuda_free_on(void *ptr, size_t bytes, void *stream)
{
    (void)bytes;
    if (stream != NULL)
        cudaFreeAsync(ptr, (cudaStream_t)stream);
    else
        cudaFree(ptr);
}

void kvr__pool_put(void *ptr, size_t bytes, void *owner)
{
    kvr_gpu_pool_t *pool = (kvr_gpu_pool_t *)owner;
    pool_class_t *c = &pool->cls[pool_class_of(bytes)];
    pool->in_use--;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        void **f = (void **)realloc(c->free, cap * sizeof(*f));
        if (f == NULL) { /* no room to keep it: freed once unused */
            cudaStreamSynchronize((cudaStream_t)pool->stream);
            cudaFree(ptr);
            pool->bytes -= (size_t)1 << (pool_class_of(bytes) + POOL_MIN_LOG);
            return;
        }
        c->free = f;
        c->cap = cap;
    }
    c->free[c->n++] = ptr;
}

void *kvr__pool_stream(const kvr_gpu_pool_t *pool)
{
    return pool->stream;
}

kvr_status_t kvr__pool_mapped_get(kvr_gpu_pool_t *pool, size_t bytes,
                                  void **host, void **dev)
{
    if (bytes > MAPPED_SLOT || pool->mn == 0)
        return KVR_ERR_NO_MEMORY;
    size_t off = (size_t)pool->mfree[--pool->mn] * MAPPED_SLOT;
    *host = pool->mapped + off;
    *dev = pool->mapped_dev + off;
    return KVR_OK;
}

void kvr__pool_mapped_put(void *dev, size_t bytes, void *owner)
{
    (void)bytes;
    kvr_gpu_pool_t *pool = (kvr_gpu_pool_t *)owner;
    size_t off = (size_t)((unsigned char *)dev - pool->mapped_dev);
    pool->mfree[pool->mn++] = (uint16_t)(off / MAPPED_SLOT);
}
