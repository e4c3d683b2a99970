/* Device-side compare for bench_gpu_net (bench_cmp.cu). */
#ifndef KVRELAY_BENCH_CMP_H
#define KVRELAY_BENCH_CMP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The first offset where the len bytes at device pointers a and b (both
 * 16-byte aligned) differ into *first, len when they are equal; scratch:
 * 8 bytes of device memory; waits on stream. 0, or -1 on a CUDA error
 * (cudaGetLastError says which). */
int bench_first_diff(const void *a, const void *b, uint64_t len,
                     void *scratch, void *stream, uint64_t *first);

#ifdef __cplusplus
}
#endif

#endif
