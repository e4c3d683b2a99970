/* The GPU network benchmark's device-side check (bench_gpu_net.c): the
 * consumer's region against the expected image, both in device memory,
 * so that verifying every rep sweeps no host memory between the timed
 * parts (docs/transport.md, the cuda_ipc cell). */
#include <stdint.h>

#include <cuda_runtime.h>

#include "bench_cmp.h"

namespace
{

/* The first differing byte of two 16-byte words, 16 when equal. */
__device__ uint32_t first_byte(uint4 x, uint4 y)
{
    uint32_t a[4] = {x.x, x.y, x.z, x.w}, b[4] = {y.x, y.y, y.z, y.w};
    for (int w = 0; w < 4; w++)
        if (a[w] != b[w])
            return 4 * w + (__ffs(a[w] ^ b[w]) - 1) / 8; /* little end */
    return 16;
}

/* Grid-stride over 16-byte words, then the tail bytes: the smallest
 * differing offset into *first (atomicMin; it starts at ~0). */
__global__ void first_diff(const unsigned char *a, const unsigned char *b,
                           uint64_t len, unsigned long long *first)
{
    uint64_t words = len / 16;
    uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = t; i < words; i += step) {
        uint32_t k = first_byte(((const uint4 *)a)[i], ((const uint4 *)b)[i]);
        if (k < 16)
            atomicMin(first, (unsigned long long)(i * 16 + k));
    }
    for (uint64_t i = words * 16 + t; i < len; i += step)
        if (a[i] != b[i])
            atomicMin(first, (unsigned long long)i);
}

} // namespace

extern "C" int bench_first_diff(const void *a, const void *b, uint64_t len,
                                void *scratch, void *stream, uint64_t *first)
{
    cudaStream_t s = (cudaStream_t)stream;
    unsigned long long found = ~0ull;
    if (((uintptr_t)a | (uintptr_t)b) % 16 != 0)
        return -1;
    if (cudaMemsetAsync(scratch, 0xff, sizeof(found), s) != cudaSuccess)
        return -1;
    if (len > 0)
        first_diff<<<132 * 8, 256, 0, s>>>((const unsigned char *)a,
                                           (const unsigned char *)b, len,
                                           (unsigned long long *)scratch);
    if (cudaGetLastError() != cudaSuccess ||
        cudaMemcpyAsync(&found, scratch, sizeof(found),
                        cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
        return -1;
    *first = found < len ? found : len;
    return 0;
}
