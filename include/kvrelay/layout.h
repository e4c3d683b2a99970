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

/* The layout both sides agree on: consumer DCP topology plus page formats,
 * and the producer's own DCP sharding (docs/design.md §18). Ranks are not
 * part of it. The producer fields were appended; their zero values mean
 * today's producer (unsharded, the consumer's block size), so a layout that
 * leaves them 0 plans exactly as before. */
typedef struct kvr_layout {
    uint32_t block_size;  /* bs: tokens per consumer block (and producer
                                 block unless producer_block_size is set) */
    uint32_t dcp_size;    /* W: consumer DCP size */
    uint32_t interleave;  /* I: consumer DCP interleave */
    uint32_t tp;          /* consumer TP size; tp % W == 0 */
    uint32_t producer_tp; /* producer TP size; a multiple of W_p */
    bool replicate_index; /* INDEX replicated on every consumer DCP rank */
    bool preshuffle;      /* INDEX key plane preshuffled (16x16 tiles) */
    bool producer_replicate_index; /* INDEX replicated on every producer DCP
                                      rank (meaningful when W_p > 1) */
    uint32_t producer_dcp;         /* W_p; 0 means 1 (unsharded producer) */
    uint32_t producer_interleave;  /* I_p; 0 means 1 */
    uint32_t producer_block_size;  /* bs_p; 0 means block_size */
} kvr_layout_t;

#define KVR_LAYOUT_INIT                                                        \
    {                                                                          \
        .block_size = 64, .dcp_size = 1, .interleave = 1, .tp = 1,             \
        .producer_tp = 1, .replicate_index = false, .preshuffle = true,        \
        .producer_replicate_index = false, .producer_dcp = 0,                  \
        .producer_interleave = 0, .producer_block_size = 0                     \
    }

/* One registered KV tensor (normally one layer of one cache kind) on one side.
 * Token-addressable roles (MLA, DENSE) derive token bytes from page_bytes / P. */
typedef struct kvr_region_desc {
    kvr_role_t role;
    uint32_t layer;
    uint64_t num_blocks;
    uint64_t page_bytes;
    uint32_t index_dim;   /* INDEX: D (bytes of fp8 key per token) */
    uint32_t quant_block; /* INDEX: Q; 0 means Q == D */
    uint64_t bytes; /* registered length; 0 means num_blocks * page_bytes */
    /* DENSE head geometry (docs/design.md §18), appended; heads == 0 means
     * none: the region then moves only as identity pages. With it, a page
     * holds `kv_planes` planes (K then V), each `bs * local heads * head_dim
     * * elem_bytes` bytes, in NHD ([token][head][dim]) or HND
     * ([head][token][dim]) order; local heads are heads / TP of the region's
     * side, or 1 (replicated) when TP > heads. */
    uint32_t heads;      /* H: kv heads of the model, all TP ranks together */
    uint32_t head_dim;   /* D: elements per head */
    uint32_t elem_bytes; /* E: bytes per element */
    uint32_t kv_planes;  /* 2 (K and V in one page) or 1; 0 means 2 */
    bool hnd;            /* page order HND instead of NHD */
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

/* Effective producer DCP geometry (the 0 defaults resolved): W_p, I_p, bs_p.
 * At W_p == 1 the interleave is irrelevant. */
uint32_t kvr_producer_dcp(const kvr_layout_t *lay);
uint32_t kvr_producer_interleave(const kvr_layout_t *lay);
uint32_t kvr_producer_block_size(const kvr_layout_t *lay);
/* True when the producer is today's: W_p == 1 and bs_p == bs. */
bool kvr_layout_producer_plain(const kvr_layout_t *lay);

/* Checks bs, W, I, tp and the producer's bs_p, I_p, tp % W_p (each its own
 * status code); rank < W when rank_check. */
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

/* Head-sharded DENSE geometry of one side (docs/design.md §18): heads a TP
 * rank holds (H / TP, or 1 when TP > H), the first of them on tp rank t,
 * and the page bytes planes * bs * local heads * D * E. A region without
 * heads answers 0. */
uint32_t kvr_dense_local_heads(const kvr_layout_t *lay,
                               const kvr_region_desc_t *r, bool consumer);
uint32_t kvr_dense_first_head(const kvr_layout_t *lay,
                              const kvr_region_desc_t *r, bool consumer,
                              uint32_t tp_rank);
uint64_t kvr_dense_page_bytes(const kvr_layout_t *lay,
                              const kvr_region_desc_t *r, bool consumer);

/* Index page geometry: C = ceil16(D + 4), scale bytes per token 4 * D/Q. */
uint64_t kvr_index_stride(uint32_t index_dim);
/* Tokens per page P of an index region on one side (consumer: bs*W when
 * replicated; producer: bs_p, or bs_p*W_p when its index is replicated). */
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
/* The same for a region of one side: page_bytes / bs_p on the producer. */
uint64_t kvr_region_token_bytes_side(const kvr_layout_t *lay,
                                     const kvr_region_desc_t *r, bool consumer);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
