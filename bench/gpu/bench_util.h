/* Helpers shared by the single-process GPU benchmarks (bench_gpu.c,
 * bench_rl_kernel.c, bench_rl_trace.c): fatal errors, a seeded generator, random block
 * tables. */
#ifndef KVRELAY_BENCH_GPU_UTIL_H
#define KVRELAY_BENCH_GPU_UTIL_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define DIE(...)                                                               \
    do {                                                                       \
        fprintf(stderr, __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                   \
        exit(1);                                                               \
    } while (0)
#define CUDA_OK(call)                                                          \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess)                                                 \
            DIE("%s:%d %s: %s", __FILE__, __LINE__, #call,                     \
                cudaGetErrorString(e_));                                       \
    } while (0)

/* splitmix64 */
static inline uint64_t bench_rng(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        DIE("malloc(%zu)", n);
    return p;
}

/* 0..n-1 in order (sorted) or shuffled: a block table of pages in
 * address order, or of scattered pages. */
static inline uint32_t *bench_pages(uint32_t n, int sorted, uint64_t *state)
{
    uint32_t *p = xmalloc(n * sizeof(*p));
    for (uint32_t i = 0; i < n; i++)
        p[i] = i;
    for (uint32_t i = n; !sorted && i > 1; i--) {
        uint32_t j = (uint32_t)(bench_rng(state) % i), t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
    return p;
}

static inline uint32_t *bench_permutation(uint32_t n, uint64_t *state)
{
    return bench_pages(n, 0, state);
}

/* x rounded up to a multiple of a (a > 0). */
static inline uint64_t bench_round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* qsort's comparison of floats, ascending. */
static inline int bench_cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, c = *(const float *)y;
    return (a > c) - (a < c);
}

#endif
