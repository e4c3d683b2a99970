/* kvrelay layout layer: topology, region geometry and the DCP layout math
 * (docs/design.md §2-3). Pure C, no UCX, no CUDA. */
#ifndef KVRELAY_LAYOUT_H
#define KVRELAY_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/base.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

#define KVR_LAYOUT_VERSION 1u

typedef enum kvr_role {
    KVR_ROLE_MLA = 1,
    KVR_ROLE_INDEX = 2,
    KVR_ROLE_DENSE = 3,
    KVR_ROLE_STATE = 4,
    KVR_ROLE_STAGING = 5,
    KVR_ROLE_OTHER = 6,
} kvr_role_t;

/* The layout both sides agree on: consumer DCP topology plus page formats.
 * Ranks are not part of it. */
typedef struct kvr_layout {
    uint32_t block_size;      /* bs: tokens per block (producer and consumer) */
    uint32_t dcp_size;        /* W */
    uint32_t interleave;      /* I */
    uint32_t tp;              /* consumer TP size; tp % W == 0 */
    uint32_t producer_tp;     /* producer TP size */
    bool replicate_index;     /* INDEX replicated on every DCP rank */
    bool preshuffle;          /* INDEX key plane preshuffled (16x16 tiles) */
} kvr_layout_t;

#define KVR_LAYOUT_INIT                                                        \
    {.block_size = 64, .dcp_size = 1, .interleave = 1, .tp = 1,                \
     .producer_tp = 1, .replicate_index = false, .preshuffle = true}

/* One registered KV tensor (normally one layer of one cache kind) on one side.
 * Token-addressable roles (MLA, DENSE) derive token bytes from page_bytes / P. */
typedef struct kvr_region_desc {
    kvr_role_t role;
    uint32_t layer;
    uint64_t num_blocks;
    uint64_t page_bytes;
    uint32_t index_dim;   /* INDEX: D (bytes of fp8 key per token) */
    uint32_t quant_block; /* INDEX: Q; 0 means Q == D */
    uint64_t bytes;       /* registered length; 0 means num_blocks * page_bytes */
} kvr_region_desc_t;

/* A region class: regions of one role and the same widths, which share one
 * plan and one entry in the layout digest. width is token bytes (MLA,
 * DENSE), D (INDEX) or page bytes (others); quant is Q for INDEX, else 0. */
typedef struct kvr_region_class {
    kvr_role_t role;
    uint64_t width;
    uint64_t quant;
} kvr_region_class_t;

/* Registered length of a region (bytes, or num_blocks * page_bytes). */
uint64_t kvr_region_bytes(const kvr_region_desc_t *r);

const char *kvr_role_name(kvr_role_t role);
/* Parses "mla", "index", "dense", "state", "staging", "other". */
kvr_status_t kvr_role_parse(const char *text, kvr_role_t *out);

/* Checks bs, W, I, tp (each its own status code); rank < W when rank_check. */
kvr_status_t kvr_layout_check(const kvr_layout_t *lay, kvr_error_t *err);
kvr_status_t kvr_layout_check_rank(const kvr_layout_t *lay, uint32_t rank,
                                   kvr_error_t *err);

/* Geometry (docs/design.md §2): */
uint64_t kvr_virtual_block(const kvr_layout_t *lay); /* V = bs * W */
uint32_t kvr_owner(const kvr_layout_t *lay, uint64_t g);
uint64_t kvr_local_index(const kvr_layout_t *lay, uint64_t g);
uint64_t kvr_global_index(const kvr_layout_t *lay, uint64_t j, uint32_t rank);
uint64_t kvr_local_len(const kvr_layout_t *lay, uint64_t len, uint32_t rank);
uint64_t kvr_num_dst_blocks(const kvr_layout_t *lay, uint64_t num_tokens);
uint64_t kvr_num_src_blocks(const kvr_layout_t *lay, uint64_t num_tokens);

/* Index page geometry: C = ceil16(D + 4), scale bytes per token 4 * D/Q. */
uint64_t kvr_index_stride(uint32_t index_dim);
/* Tokens per page P of an index region on one side (consumer: bs*W when
 * replicated). */
uint64_t kvr_index_page_tokens(const kvr_layout_t *lay, bool consumer);
/* Byte offset in a page of P tokens of key byte d of token t. */
uint64_t kvr_index_key_offset(const kvr_layout_t *lay, uint32_t index_dim,
                              uint64_t t, uint32_t d);
uint64_t kvr_index_scale_offset(uint64_t page_tokens, uint32_t index_dim,
                                uint64_t t);

/* Validates one region's geometry for its side (page bytes, D/Q, preshuffle;
 * num_blocks * page_bytes must fit in 64 bits, KVR_ERR_PAGE_GEOMETRY).
 * side: false = producer, true = consumer. */
kvr_status_t kvr_region_check(const kvr_layout_t *lay,
                              const kvr_region_desc_t *r, bool consumer,
                              kvr_error_t *err);
/* Token bytes of a token-addressable region (page_bytes / bs). */
uint64_t kvr_region_token_bytes(const kvr_layout_t *lay,
                                const kvr_region_desc_t *r);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
