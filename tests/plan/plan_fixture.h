/* Shared builders for planner tests and the planner fuzz target. */
#ifndef KVR_TEST_PLAN_FIXTURE_H
#define KVR_TEST_PLAN_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>

#include "kvrelay/plan.h"

static inline kvr_layout_t fx_layout(uint32_t bs, uint32_t W, uint32_t I,
                                     int repl, int preshuffle)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = bs;
    lay.dcp_size = W;
    lay.interleave = I;
    lay.tp = W;
    lay.producer_tp = W;
    lay.replicate_index = repl != 0;
    lay.preshuffle = preshuffle != 0;
    return lay;
}

static inline kvr_region_pair_t fx_mla(const kvr_layout_t *lay, uint64_t tb,
                                       uint64_t src_blocks, uint64_t dst_blocks)
{
    kvr_region_pair_t p = {
        .src = {.role = KVR_ROLE_MLA,
                .layer = 0,
                .num_blocks = src_blocks,
                .page_bytes = lay->block_size * tb},
        .dst = {.role = KVR_ROLE_MLA,
                .layer = 0,
                .num_blocks = dst_blocks,
                .page_bytes = lay->block_size * tb},
    };
    return p;
}

static inline kvr_region_pair_t fx_index(const kvr_layout_t *lay, uint32_t D,
                                         uint64_t src_blocks,
                                         uint64_t dst_blocks)
{
    uint64_t C = kvr_index_stride(D);
    kvr_region_pair_t p = {
        .src = {.role = KVR_ROLE_INDEX,
                .layer = 1,
                .num_blocks = src_blocks,
                .page_bytes = lay->block_size * C,
                .index_dim = D,
                .quant_block = D},
        .dst = {.role = KVR_ROLE_INDEX,
                .layer = 1,
                .num_blocks = dst_blocks,
                .page_bytes = kvr_index_page_tokens(lay, true) * C,
                .index_dim = D,
                .quant_block = D},
    };
    return p;
}

/* A random injective table of n ids drawn from [0, pool). */
static inline void fx_table(uint32_t *ids, size_t n, uint32_t pool,
                            unsigned *seed)
{
    uint32_t *perm = malloc(pool * sizeof(*perm));
    for (uint32_t i = 0; i < pool; i++)
        perm[i] = i;
    for (uint32_t i = pool; i > 1; i--) {
        uint32_t j = (uint32_t)rand_r(seed) % i;
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        ids[i] = perm[i];
    free(perm);
}

static inline void fx_fill(unsigned char *buf, size_t n, unsigned *seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)rand_r(seed);
}

#endif
