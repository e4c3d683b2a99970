/* The single source of truth for DCP layout math (docs/design.md §2-3).
 * static inline, usable from host C and CUDA device code. Callers guarantee
 * the layout was validated (I >= 1, W >= 1, bs % I == 0).
 *
 * The picture behind every formula: cut the sequence into chunks of I tokens
 * and deal them round-robin to the W ranks; each rank stacks its chunks, in
 * order, into its own local sequence. g is a global position, V = bs * W.
 * Example, bs 4, W 2, I 2: tokens 0-1 go to rank 0, 2-3 to rank 1, 4-5 to
 * rank 0 (its local 2-3), and so on (the full table is docs/design.md §2). */
#ifndef KVRELAY_LAYOUT_MATH_H
#define KVRELAY_LAYOUT_MATH_H

#include <stdint.h>

#if defined(__CUDACC__)
#define KVR_HD __host__ __device__ __forceinline__
#else
#define KVR_HD static inline
#endif

/* Chunk g / I of the sequence was dealt to rank (g / I) % W. */
KVR_HD uint32_t kvr__owner(uint64_t g, uint64_t I, uint64_t W)
{
    return (uint32_t)((g / I) % W);
}

/* Position of g in its owner's local sequence: g / (I*W) full rounds of
 * dealing gave the owner I tokens each, then g % I inside g's own chunk.
 * Why local(g) / bs == g / V: write g = k*V + x with x < V. I divides bs, so
 * I*W divides V and local(g) = k*bs + (x / (I*W))*I + x % I, whose tail is at
 * most bs - 1. The tokens of virtual block k therefore land, on every rank,
 * inside that rank's physical block k: one block table serves all W ranks
 * (docs/design.md §2). */
KVR_HD uint64_t kvr__local(uint64_t g, uint64_t I, uint64_t W)
{
    return (g / (I * W)) * I + g % I;
}

/* Inverse of (owner, local): local index j on rank r is in that rank's
 * chunk j / I, which was chunk (j / I) * W + r of the sequence. */
KVR_HD uint64_t kvr__global(uint64_t j, uint64_t r, uint64_t I, uint64_t W)
{
    return ((j / I) * W + r) * I + j % I;
}

/* Consumer slot of g on its owner (sharded): table[g / V] * bs + local % bs.
 * Entry g / V names the block; local % bs is the row inside it, since
 * local / bs == g / V (see kvr__local). */
KVR_HD uint64_t kvr__dst_slot(const uint32_t *table, uint64_t g, uint64_t bs,
                              uint64_t I, uint64_t W)
{
    return (uint64_t)table[g / (bs * W)] * bs + kvr__local(g, I, W) % bs;
}

/* Consumer slot of g on every rank (replicated, page of V tokens). A
 * replicated index holds every token on every rank, and one block-table entry
 * covers V tokens, so its page is V = bs * W tokens wide (W times the
 * producer's) and a token's row is simply g % V. */
KVR_HD uint64_t kvr__dst_slot_repl(const uint32_t *table, uint64_t g,
                                   uint64_t bs, uint64_t W)
{
    uint64_t V = bs * W;
    return (uint64_t)table[g / V] * V + g % V;
}

/* Producer slot of g: the producer has no DCP, so its blocks are bs tokens. */
KVR_HD uint64_t kvr__src_slot(const uint32_t *table, uint64_t g, uint64_t bs)
{
    return (uint64_t)table[g / bs] * bs + g % bs;
}

/* Tokens rank r holds of an L-token sequence. After L / (I*W) full rounds
 * every rank holds base tokens; the rest (< I*W) is dealt in chunks of I, so
 * rank r gets what is left of its chunk, clamped to [0, I]. The W lengths sum
 * to L. Example, I 2, W 2, L 11: base 4, 3 left: rank 0 holds 6, rank 1 5. */
KVR_HD uint64_t kvr__local_len(uint64_t L, uint64_t r, uint64_t I, uint64_t W)
{
    uint64_t full = L / (I * W);
    uint64_t base = full * I;
    uint64_t rest = L - base * W;
    uint64_t skip = r * I;
    uint64_t extra = rest > skip ? rest - skip : 0;
    return base + (extra < I ? extra : I);
}

/* Never overflows: (a + b - 1) / b wraps to 0 blocks for a near 2^64. */
KVR_HD uint64_t kvr__ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/* Bytes per token of an index page including padding: C = ceil16(D + 4),
 * D key bytes plus one fp32 scale (D/Q == 1), rounded to 16. 144 for D 128.
 * It sizes pages (P * C); the planner never uses it as a token stride: the
 * padding is never moved, and a window of C bytes is not a token (keys and
 * scales live in separate planes). */
KVR_HD uint64_t kvr__index_stride(uint64_t D)
{
    return (D + 4 + 15) / 16 * 16;
}

/* Key byte d of token t in a page of P tokens. Preshuffled pages store
 * 16-token groups of 16 x 16-byte tiles: a group takes 16 * D bytes, and
 * inside it byte column d / 16 of all 16 tokens is one 256-byte tile. Every
 * offset depends on t only through t / 16 and t % 16, so with bs % 16 == 0 a
 * source page's key plane moves whole into sub-page s of a replicated page:
 * every offset shifts by the same s * bs * D (docs/design.md §4). */
KVR_HD uint64_t kvr__index_key_off(uint64_t t, uint64_t d, uint64_t D,
                                   int preshuffle)
{
    if (!preshuffle)
        return t * D + d;
    return (t / 16) * (16 * D) + (d / 16) * 256 + (t % 16) * 16 + d % 16;
}

/* First byte of token t's scale(s) in a page of P tokens (D/Q == 1): the
 * scale plane starts after the P * D key bytes, so it moves with P. */
KVR_HD uint64_t kvr__index_scale_off(uint64_t t, uint64_t P, uint64_t D)
{
    return P * D + 4 * t;
}

/* Head-sharded KV (docs/design.md §18). A TP group of size TP shards H kv
 * heads: when TP <= H (TP dividing H) tp rank t holds the H / TP heads from
 * t * H / TP; when TP > H (H dividing TP) every head is replicated TP / H
 * times and rank t holds the single head t / (TP / H). */
KVR_HD uint64_t kvr__heads_local(uint64_t H, uint64_t TP)
{
    return TP <= H ? H / TP : 1;
}

KVR_HD uint64_t kvr__head_first(uint64_t t, uint64_t H, uint64_t TP)
{
    return TP <= H ? t * (H / TP) : t / (TP / H);
}

/* The producer tp rank that consumer tp rank t pulls head h from: its only
 * holder when TP_p <= H; else one of the TP_p / H replicas of h, replica
 * t % (TP_p / H), so that the consumers of one head spread over its
 * replicas. */
KVR_HD uint64_t kvr__head_source(uint64_t h, uint64_t t, uint64_t H,
                                 uint64_t TP_p)
{
    if (TP_p <= H)
        return h / (H / TP_p);
    return h * (TP_p / H) + t % (TP_p / H);
}

/* Byte offset of element 0 of local head j of row s inside one plane of a
 * dense page of bs rows and Hl local heads, elements of DE = D * E bytes:
 * NHD rows are [head][dim], HND heads are [row][dim]. */
KVR_HD uint64_t kvr__dense_off(uint64_t s, uint64_t j, uint64_t bs, uint64_t Hl,
                               uint64_t DE, int hnd)
{
    return hnd ? (j * bs + s) * DE : (s * Hl + j) * DE;
}

#endif
