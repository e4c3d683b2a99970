/* The single source of truth for DCP layout math (docs/design.md §2-3).
 * static inline, usable from host C and CUDA device code. Callers guarantee
 * the layout was validated (I >= 1, W >= 1, bs % I == 0). */
#ifndef KVRELAY_LAYOUT_MATH_H
#define KVRELAY_LAYOUT_MATH_H

#include <stdint.h>

#if defined(__CUDACC__)
#define KVR_HD __host__ __device__ __forceinline__
#else
#define KVR_HD static inline
#endif

KVR_HD uint32_t kvr__owner(uint64_t g, uint64_t I, uint64_t W)
{
    return (uint32_t)((g / I) % W);
}

KVR_HD uint64_t kvr__local(uint64_t g, uint64_t I, uint64_t W)
{
    return (g / (I * W)) * I + g % I;
}

KVR_HD uint64_t kvr__global(uint64_t j, uint64_t r, uint64_t I, uint64_t W)
{
    return ((j / I) * W + r) * I + j % I;
}

/* Consumer slot of g on its owner (sharded): table[g / V] * bs + local % bs. */
KVR_HD uint64_t kvr__dst_slot(const uint32_t *table, uint64_t g, uint64_t bs,
                              uint64_t I, uint64_t W)
{
    return (uint64_t)table[g / (bs * W)] * bs + kvr__local(g, I, W) % bs;
}

/* Consumer slot of g on every rank (replicated, page of V tokens). */
KVR_HD uint64_t kvr__dst_slot_repl(const uint32_t *table, uint64_t g,
                                   uint64_t bs, uint64_t W)
{
    uint64_t V = bs * W;
    return (uint64_t)table[g / V] * V + g % V;
}

KVR_HD uint64_t kvr__src_slot(const uint32_t *table, uint64_t g, uint64_t bs)
{
    return (uint64_t)table[g / bs] * bs + g % bs;
}

KVR_HD uint64_t kvr__local_len(uint64_t L, uint64_t r, uint64_t I, uint64_t W)
{
    uint64_t full = L / (I * W);
    uint64_t base = full * I;
    uint64_t rest = L - base * W;
    uint64_t skip = r * I;
    uint64_t extra = rest > skip ? rest - skip : 0;
    return base + (extra < I ? extra : I);
}

KVR_HD uint64_t kvr__ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

KVR_HD uint64_t kvr__index_stride(uint64_t D)
{
    return (D + 4 + 15) / 16 * 16;
}

/* Key byte d of token t in a page of P tokens. */
KVR_HD uint64_t kvr__index_key_off(uint64_t t, uint64_t d, uint64_t D,
                                   int preshuffle)
{
    if (!preshuffle)
        return t * D + d;
    return (t / 16) * (16 * D) + (d / 16) * 256 + (t % 16) * 16 + d % 16;
}

/* First byte of token t's scale(s) in a page of P tokens (D/Q == 1). */
KVR_HD uint64_t kvr__index_scale_off(uint64_t t, uint64_t P, uint64_t D)
{
    return P * D + 4 * t;
}

#endif
