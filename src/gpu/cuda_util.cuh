/* CUDA helpers of the gpu layer: error conversion and launch sizing. */
#ifndef KVRELAY_GPU_CUDA_UTIL_CUH
#define KVRELAY_GPU_CUDA_UTIL_CUH

#include <cuda_runtime.h>

#include "gpu_internal.h"

/* The one place a cudaError_t becomes a kvr status (KVR_ERR_CUDA, message
 * naming the call and CUDA's text); cudaSuccess gives KVR_OK. */
kvr_status_t kvr__cuda_status(cudaError_t e, const char *what,
                              kvr_error_t *err);

#define KVR__CUDA_TRY(call, err)                                               \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess)                                                 \
            return kvr__cuda_status(e_, #call, err);                           \
    } while (0)

/* Checks the launch just made (cudaGetLastError). */
static inline kvr_status_t kvr__launch_status(const char *kernel,
                                              kvr_error_t *err)
{
    return kvr__cuda_status(cudaGetLastError(), kernel, err);
}

/* Blocks for a grid-stride kernel of `threads` threads and `smem` bytes
 * of dynamic shared memory per block: enough for `work` threads, at most
 * what fits on the current device at once. */
kvr_status_t kvr__grid_size(const void *kernel, int threads, size_t smem,
                            uint64_t work, unsigned *blocks, kvr_error_t *err);

/* Division by a run-time constant as multiply and shift, for n and d below
 * 2^31: the kernels divide per element by I, W, V or a chunk size. */
struct kvr__div {
    uint32_t d, mul, shift;
};

static inline kvr__div kvr__div_make(uint32_t d)
{
    uint32_t shift = 0;
    while (shift < 31 && (1u << shift) < d)
        shift++;
    uint64_t mul = ((1ull << 32) * ((1ull << shift) - d)) / d + 1;
    return kvr__div{d, (uint32_t)mul, shift};
}

__device__ __forceinline__ uint32_t kvr__div_by(const kvr__div &d, uint32_t n)
{
    return (__umulhi(n, d.mul) + n) >> d.shift;
}

/* n bytes from s to d (V-aligned, n a multiple of sizeof(V)) by the G
 * lanes of a team (lane in [0, G)), each keeping U vectors in flight: all
 * its loads of a round before its stores. The run copy and the relayout's
 * chunk kernel use it. */
template <typename V, int G, int U>
__device__ __forceinline__ void kvr__copy_team(const unsigned char *s,
                                               unsigned char *d, uint64_t n,
                                               uint32_t lane)
{
    const V *sv = (const V *)s;
    V *dv = (V *)d;
    uint64_t nv = n / sizeof(V);
    for (uint64_t x = lane; x < nv; x += G * U) {
        V v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (x + u * G < nv)
                v[u] = sv[x + u * G];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (x + u * G < nv)
                dv[x + u * G] = v[u];
    }
}

#endif
