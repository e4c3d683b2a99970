/* A PP producer and consumer ranks of a small DSA model for store tests:
 * every layer has an MLA latent, every third layer an index cache. */
#ifndef KVR_TEST_STORE_FIXTURE_H
#define KVR_TEST_STORE_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrelay/store.h"
#include "kvrelay/synth.h"

#define SF_MAX_REGIONS 64

typedef struct sf_side {
    kvr_layout_t lay;
    kvr_store_region_t regions[SF_MAX_REGIONS];
    size_t num_regions;
    uint32_t *blocks;
    size_t num_blocks;
} sf_side_t;

typedef struct sf_model {
    uint32_t layers, pp, bs, tb, D;
    uint64_t pool; /* physical blocks per region */
} sf_model_t;

static inline size_t sf_layer_regions(const sf_model_t *m, uint32_t first,
                                      uint32_t end, const kvr_layout_t *lay,
                                      bool consumer, kvr_region_desc_t *out)
{
    size_t n = 0;
    uint64_t P = consumer ? kvr_index_page_tokens(lay, true) : m->bs;
    for (uint32_t l = first; l < end; l++) {
        out[n++] = (kvr_region_desc_t){.role = KVR_ROLE_MLA,
                                       .layer = l,
                                       .num_blocks = m->pool,
                                       .page_bytes = (uint64_t)m->bs * m->tb};
        if (l % 3 == 0)
            out[n++] = (kvr_region_desc_t){.role = KVR_ROLE_INDEX,
                                           .layer = l,
                                           .num_blocks = m->pool,
                                           .page_bytes = P *
                                                         kvr_index_stride(m->D),
                                           .index_dim = m->D,
                                           .quant_block = m->D};
    }
    return n;
}

/* Regions of layers [first, end) with memory, and a random table of n ids. */
static inline void sf_side_init(sf_side_t *s, const sf_model_t *m,
                                const kvr_layout_t *lay, bool consumer,
                                uint32_t first, uint32_t end, size_t n,
                                unsigned *seed)
{
    kvr_region_desc_t d[SF_MAX_REGIONS];
    memset(s, 0, sizeof *s);
    s->lay = *lay;
    s->num_regions = sf_layer_regions(m, first, end, lay, consumer, d);
    for (size_t i = 0; i < s->num_regions; i++) {
        s->regions[i].desc = d[i];
        s->regions[i].base = calloc(1, kvr_region_bytes(&d[i]));
    }
    s->blocks = malloc(n * sizeof *s->blocks);
    s->num_blocks = n;
    uint32_t *perm = malloc(m->pool * sizeof *perm);
    for (uint32_t i = 0; i < m->pool; i++)
        perm[i] = i;
    for (uint32_t i = (uint32_t)m->pool; i > 1; i--) {
        uint32_t j = (uint32_t)rand_r(seed) % i, t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    memcpy(s->blocks, perm, n * sizeof *s->blocks);
    free(perm);
}

static inline void sf_side_free(sf_side_t *s)
{
    for (size_t i = 0; i < s->num_regions; i++)
        free(s->regions[i].base);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

static inline kvr_status_t sf_fill(sf_side_t *s, uint64_t seed,
                                   const uint32_t *tokens, uint64_t n)
{
    for (size_t i = 0; i < s->num_regions; i++) {
        kvr_status_t st = kvr_synth_fill_source(
            &s->lay, &s->regions[i].desc, seed, s->blocks, s->num_blocks,
            tokens, n, s->regions[i].base, NULL);
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

/* Checks every region of consumer rank c against the producer stage holding
 * its layer (stage = layer / layers_per_stage), tokens [0, n), with the
 * plan layer's verifier; err names the layer and role. */
static inline kvr_status_t sf_verify_rank(const sf_side_t *prod,
                                          uint32_t layers_per_stage,
                                          const sf_side_t *c, uint32_t rank,
                                          uint64_t n, kvr_error_t *err)
{
    for (size_t i = 0; i < c->num_regions; i++) {
        const kvr_store_region_t *dr = &c->regions[i], *sr = NULL;
        const sf_side_t *ps = &prod[dr->desc.layer / layers_per_stage];
        for (size_t j = 0; j < ps->num_regions; j++)
            if (ps->regions[j].desc.layer == dr->desc.layer &&
                ps->regions[j].desc.role == dr->desc.role)
                sr = &ps->regions[j];
        if (sr == NULL)
            return kvr_error_set(err, KVR_ERR_INVALID, "layer %u: no source",
                                 dr->desc.layer);
        kvr_region_pair_t pair = {.src = sr->desc, .dst = dr->desc};
        kvr_request_t req = {.src_blocks = ps->blocks,
                             .num_src_blocks = ps->num_blocks,
                             .dst_blocks = c->blocks,
                             .num_dst_blocks = c->num_blocks,
                             .num_tokens = n};
        kvr_error_t e;
        if (kvr_verify_region(&c->lay, rank, &pair, &req, sr->base, dr->base,
                              &e) != KVR_OK)
            return kvr_error_set(err, KVR_ERR_VERIFY, "layer %u %s: %s",
                                 dr->desc.layer, kvr_role_name(dr->desc.role),
                                 e.msg);
    }
    return KVR_OK;
}

#endif
