/* Devices, peer access, CUDA IPC, and the conversion of CUDA errors. */
#include <cuda.h>
#include <pthread.h>
#include <string.h>

#include "cuda_util.cuh"

kvr_status_t kvr__cuda_status(cudaError_t e, const char *what, kvr_error_t *err)
{
    if (e == cudaSuccess)
        return KVR_OK;
    /* a failed call's error stays CUDA's last error until someone reads
     * it: the next launch's check (kvr__launch_status) would report it as
     * its own and fail a good launch. Read, it is gone (a sticky error,
     * which the context keeps, is reported again by the next call). */
    (void)cudaGetLastError();
    return kvr_error_set(err, KVR_ERR_CUDA, "%s: %s (%s)", what,
                         cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Blocks that fit on a device at once, per kernel: asked of CUDA once
 * (the occupancy query costs microseconds, and every launch sizes). */
typedef struct grid_fit {
    const void *kernel;
    int dev, threads;
    size_t smem;
    uint64_t fit;
} grid_fit_t;

#define GRID_FITS 32
static grid_fit_t grid_fits[GRID_FITS];
static int grid_nfits;
static pthread_mutex_t grid_lock = PTHREAD_MUTEX_INITIALIZER;

static bool cached_fit(const void *kernel, int dev, int threads, size_t smem,
                       uint64_t *fit)
{
    bool hit = false;
    pthread_mutex_lock(&grid_lock);
    for (int i = 0; i < grid_nfits && !hit; i++) {
        const grid_fit_t *g = &grid_fits[i];
        hit = g->kernel == kernel && g->dev == dev && g->threads == threads &&
              g->smem == smem;
        if (hit)
            *fit = g->fit;
    }
    pthread_mutex_unlock(&grid_lock);
    return hit;
}

static void remember_fit(const void *kernel, int dev, int threads, size_t smem,
                         uint64_t fit)
{
    pthread_mutex_lock(&grid_lock);
    if (grid_nfits < GRID_FITS)
        grid_fits[grid_nfits++] = grid_fit_t{kernel, dev, threads, smem, fit};
    pthread_mutex_unlock(&grid_lock);
}

kvr_status_t kvr__grid_size(const void *kernel, int threads, size_t smem,
                            uint64_t work, unsigned *blocks, kvr_error_t *err)
{
    int dev = 0, sms = 0, per_sm = 0;
    uint64_t fit = 0;
    KVR__CUDA_TRY(cudaGetDevice(&dev), err);
    if (!cached_fit(kernel, dev, threads, smem, &fit)) {
        KVR__CUDA_TRY(
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
            err);
        KVR__CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                          &per_sm, kernel, threads, smem),
                      err);
        fit = (uint64_t)sms * (per_sm > 0 ? per_sm : 1);
        remember_fit(kernel, dev, threads, smem, fit);
    }
    uint64_t need = (work + threads - 1) / threads;
    *blocks = (unsigned)(need < fit ? (need ? need : 1) : fit);
    return KVR_OK;
}

kvr_status_t kvr_gpu_device_count(int *count, kvr_error_t *err)
{
    if (count == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "count is NULL");
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error here */
        n = 0;
    }
    *count = n;
    return KVR_OK;
}

kvr_status_t kvr_gpu_enable_peer(int device, int peer, kvr_error_t *err)
{
    int can = 0, prev = 0;
    KVR__CUDA_TRY(cudaDeviceCanAccessPeer(&can, device, peer), err);
    if (!can)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "device %d cannot access device %d's memory",
                             device, peer);
    KVR__CUDA_TRY(cudaGetDevice(&prev), err);
    KVR__CUDA_TRY(cudaSetDevice(device), err);
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
        e = cudaSuccess;
    }
    cudaError_t back = cudaSetDevice(prev);
    if (e != cudaSuccess)
        return kvr__cuda_status(e, "cudaDeviceEnablePeerAccess", err);
    return kvr__cuda_status(back, "cudaSetDevice", err);
}

typedef CUresult (*get_range_fn)(CUdeviceptr *base, size_t *size,
                                 CUdeviceptr ptr);

/* Start of the allocation holding ptr, through the driver entry point so
 * that nothing links libcuda (tests must start, and skip, without it). */
static kvr_status_t allocation_base(const void *ptr, uintptr_t *base,
                                    kvr_error_t *err)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    KVR__CUDA_TRY(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn,
                                                   12000, cudaEnableDefault,
                                                   &found),
                  err);
    if (fn == NULL || found != cudaDriverEntryPointSuccess)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "driver has no cuMemGetAddressRange");
    CUdeviceptr start = 0;
    size_t size = 0;
    CUresult r = ((get_range_fn)fn)(&start, &size, (CUdeviceptr)ptr);
    if (r != CUDA_SUCCESS)
        return kvr_error_set(err, KVR_ERR_CUDA,
                             "cuMemGetAddressRange(%p) failed: %d", ptr,
                             (int)r);
    *base = (uintptr_t)start;
    return KVR_OK;
}

kvr_status_t kvr_gpu_ipc_export(const void *ptr, kvr_gpu_ipc_handle_t *out,
                                kvr_error_t *err)
{
    if (ptr == NULL || out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "pointer or out is NULL");
    uintptr_t base = 0;
    kvr_status_t st = allocation_base(ptr, &base, err);
    if (st != KVR_OK)
        return st;
    cudaIpcMemHandle_t h;
    KVR__CUDA_TRY(cudaIpcGetMemHandle(&h, (void *)base), err);
    static_assert(sizeof(h) <= sizeof(out->handle), "IPC handle size");
    memset(out, 0, sizeof(*out));
    memcpy(out->handle, &h, sizeof(h));
    out->offset = (uint64_t)((uintptr_t)ptr - base);
    return KVR_OK;
}

kvr_status_t kvr_gpu_ipc_open(const kvr_gpu_ipc_handle_t *h, void **ptr,
                              kvr_error_t *err)
{
    if (h == NULL || ptr == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "handle or out is NULL");
    cudaIpcMemHandle_t ch;
    memcpy(&ch, h->handle, sizeof(ch));
    void *base = NULL;
    KVR__CUDA_TRY(
        cudaIpcOpenMemHandle(&base, ch, cudaIpcMemLazyEnablePeerAccess), err);
    *ptr = (unsigned char *)base + h->offset;
    return KVR_OK;
}

void kvr_gpu_ipc_close(const kvr_gpu_ipc_handle_t *h, void *ptr)
{
    if (h != NULL && ptr != NULL)
        cudaIpcCloseMemHandle((unsigned char *)ptr - h->offset);
}
