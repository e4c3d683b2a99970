/* Run copies on the device (include/kvrelay/gpu.h, Run copies): the pieces
 * of a run table, each clipped to the stream range asked, copied by a team
 * of lanes with the widest access (16, 8, 4 or 1 bytes) its addresses and
 * length allow. */
#include "cuda_util.cuh"

namespace {

constexpr int THREADS = 256;

struct RunJob {
    const kvr__run_item_t *items; /* device copy, from the first piece */
    uint32_t n;
    uint64_t lo, hi; /* stream range */
    const unsigned char *src_buf;
    unsigned char *dst_buf;
};

/* A piece copied by a team of G lanes, each keeping U vectors in flight
 * (kvr__copy_team). On an H200 a team of 8 with 8 vectors moved one
 * rank's 576-byte MLA runs at 0.84 of a device copy, the earlier warp a
 * piece with one vector a lane at 0.82, and small copies no slower
 * (docs/gpu.md, Run copy speed). */
template <int G, int U>
__global__ void __launch_bounds__(THREADS) runs_kernel(const RunJob j)
{
    uint32_t lane = threadIdx.x % G;
    uint32_t team = (blockIdx.x * blockDim.x + threadIdx.x) / G;
    uint32_t teams = (gridDim.x * blockDim.x) / G;
    for (uint32_t i = team; i < j.n; i += teams) {
        kvr__run_item_t it = j.items[i];
        uint64_t lo = it.off > j.lo ? it.off : j.lo;
        uint64_t end = it.off + it.len;
        uint64_t hi = end < j.hi ? end : j.hi;
        if (lo >= hi)
            continue;
        const unsigned char *s =
            j.src_buf ? j.src_buf + (lo - j.lo)
                      : (const unsigned char *)it.src + (lo - it.off);
        unsigned char *d = j.dst_buf
                               ? j.dst_buf + (lo - j.lo)
                               : (unsigned char *)it.dst + (lo - it.off);
        uint64_t n = hi - lo;
        uint64_t bits = (uintptr_t)s | (uintptr_t)d | n;
        if ((bits & 15) == 0)
            kvr__copy_team<uint4, G, U>(s, d, n, lane);
        else if ((bits & 7) == 0)
            kvr__copy_team<uint2, G, U>(s, d, n, lane);
        else if ((bits & 3) == 0)
            kvr__copy_team<uint32_t, G, U>(s, d, n, lane);
        else
            kvr__copy_team<unsigned char, G, U>(s, d, n, lane);
    }
}

template <int G, int U>
kvr_status_t launch_runs(const RunJob &j, cudaStream_t stream,
                         kvr_error_t *err)
{
    unsigned blocks = 0;
    kvr_status_t st = kvr__grid_size((const void *)runs_kernel<G, U>, THREADS,
                                     0, (uint64_t)j.n * G, &blocks, err);
    if (st != KVR_OK)
        return st;
    runs_kernel<G, U><<<blocks, THREADS, 0, stream>>>(j);
    return kvr__launch_status("runs_kernel", err);
}

/* A team of 8 lanes a piece, 8 vectors a lane in flight; the knob's 1 is
 * the earlier warp a piece, one vector a lane at a time. */
kvr_status_t launch(const RunJob &j, cudaStream_t stream, kvr_error_t *err)
{
    if (kvr__runs_tune_unroll == 1)
        return launch_runs<32, 1>(j, stream, err);
    return launch_runs<8, 8>(j, stream, err);
}

} // namespace

int kvr__runs_tune_unroll = 0;

extern "C" kvr_status_t kvr_gpu_runs_upload(kvr_gpu_runs_t *rt, void *stream,
                                            kvr_error_t *err)
{
    if (rt == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "run table is NULL");
    if (rt->device != NULL || rt->n == 0)
        return KVR_OK;
    cudaStream_t s = (cudaStream_t)stream;
    size_t bytes = rt->n * sizeof(*rt->items);
    void *p = NULL;
    KVR__CUDA_TRY(s ? cudaMallocAsync(&p, bytes, s) : cudaMalloc(&p, bytes),
                  err);
    /* pageable source: staged at once, the host may reuse it on return */
    cudaError_t e =
        s ? cudaMemcpyAsync(p, rt->items, bytes, cudaMemcpyHostToDevice, s)
          : cudaMemcpy(p, rt->items, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        kvr__cuda_free_on(p, bytes, stream);
        return kvr__cuda_status(e, "cudaMemcpy(run table)", err);
    }
    rt->device = p;
    rt->device_owner = stream;
    rt->free_device = kvr__cuda_free_on;
    return KVR_OK;
}

extern "C" kvr_status_t kvr_gpu_runs_upload_pool(kvr_gpu_runs_t *rt,
                                                 kvr_gpu_pool_t *pool,
                                                 kvr_error_t *err)
{
    if (rt == NULL || pool == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "run table or pool is NULL");
    if (rt->device != NULL || rt->n == 0)
        return KVR_OK;
    size_t bytes = rt->n * sizeof(*rt->items);
    void *p = NULL;
    kvr_status_t st = kvr__pool_get(pool, bytes, &p, err);
    if (st != KVR_OK)
        return st;
    /* stream-ordered after the block's last readers (see kvr_gpu_pool_t) */
    cudaError_t e = cudaMemcpyAsync(p, rt->items, bytes, cudaMemcpyHostToDevice,
                                    (cudaStream_t)kvr__pool_stream(pool));
    if (e != cudaSuccess) {
        kvr__pool_put(p, bytes, pool);
        return kvr__cuda_status(e, "cudaMemcpyAsync(run table)", err);
    }
    rt->device = p;
    rt->device_owner = pool;
    rt->free_device = kvr__pool_put;
    return KVR_OK;
}

kvr_status_t kvr__runs_warm(void *stream, kvr_error_t *err)
{
    RunJob j = {NULL, 0, 0, 0, NULL, NULL};
    runs_kernel<8, 8><<<1, THREADS, 0, (cudaStream_t)stream>>>(j);
    return kvr__launch_status("runs_kernel (warm-up)", err);
}

extern "C" kvr_status_t kvr_gpu_runs_copy(const kvr_gpu_runs_t *rt,
                                          uint64_t pos, uint64_t len,
                                          const void *src_buf, void *dst_buf,
                                          void *stream, kvr_error_t *err)
{
    size_t first = 0, last = 0;
    kvr_status_t st =
        kvr__runs_span(rt, pos, len, src_buf, dst_buf, &first, &last, err);
    if (st != KVR_OK || first == last)
        return st;
    if (rt->device == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "run table not uploaded (kvr_gpu_runs_upload)");
    RunJob j = {(const kvr__run_item_t *)rt->device + first,
                (uint32_t)(last - first),
                pos,
                pos + len,
                (const unsigned char *)src_buf,
                (unsigned char *)dst_buf};
    if (last - first > UINT32_MAX)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "%zu run pieces in one copy", last - first);
    return launch(j, (cudaStream_t)stream, err);
}
