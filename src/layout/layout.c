/* The layout layer's public face: layout and region validation, and
 * wrappers of the math in layout_math.h for callers that cannot inline it
 * (tools, Python through libkvrelay.so). docs/design.md §2-3. */
#include "kvrelay/layout.h"

#include <string.h>

#include "layout_math.h"

/* Indexed by kvr_role_t; the same names the CLI parses ("mla:576x78"). */
static const char *const role_names[] = {
    [KVR_ROLE_MLA] = "mla",         [KVR_ROLE_INDEX] = "index",
    [KVR_ROLE_DENSE] = "dense",     [KVR_ROLE_STATE] = "state",
    [KVR_ROLE_STAGING] = "staging", [KVR_ROLE_OTHER] = "other",
};

const char *kvr_role_name(kvr_role_t role)
{
    if (role < KVR_ROLE_MLA || role > KVR_ROLE_OTHER)
        return "unknown";
    return role_names[role];
}

kvr_status_t kvr_role_parse(const char *text, kvr_role_t *out)
{
    for (int r = KVR_ROLE_MLA; r <= KVR_ROLE_OTHER; r++) {
        if (text != NULL && strcmp(text, role_names[r]) == 0) {
            *out = (kvr_role_t)r;
            return KVR_OK;
        }
    }
    return KVR_ERR_INVALID;
}

uint32_t kvr_producer_dcp(const kvr_layout_t *lay)
{
    return lay->producer_dcp ? lay->producer_dcp : 1;
}

uint32_t kvr_producer_interleave(const kvr_layout_t *lay)
{
    return lay->producer_interleave ? lay->producer_interleave : 1;
}

uint32_t kvr_producer_block_size(const kvr_layout_t *lay)
{
    return lay->producer_block_size ? lay->producer_block_size
                                    : lay->block_size;
}

bool kvr_layout_producer_plain(const kvr_layout_t *lay)
{
    return kvr_producer_dcp(lay) == 1 &&
           kvr_producer_block_size(lay) == lay->block_size;
}

/* The producer's DCP obeys the consumer's rules (docs/design.md §18): I_p
 * divides bs_p, and its W_p ranks subdivide its TP group. Same status
 * codes as the consumer's checks, messages naming the producer. */
static kvr_status_t check_producer(const kvr_layout_t *lay, kvr_error_t *err)
{
    uint32_t bs = kvr_producer_block_size(lay);
    uint32_t I = kvr_producer_interleave(lay), W = kvr_producer_dcp(lay);
    if (I > bs)
        return kvr_error_set(err, KVR_ERR_INTERLEAVE_GT_BS,
                             "producer interleave %u > producer block size %u",
                             I, bs);
    if (bs % I != 0)
        return kvr_error_set(err, KVR_ERR_INTERLEAVE_NOT_DIVISOR,
                             "producer block size %u is not a multiple of "
                             "producer interleave %u",
                             bs, I);
    if (lay->producer_tp % W != 0)
        return kvr_error_set(err, KVR_ERR_TP_NOT_DIVISIBLE,
                             "producer TP size %u is not a multiple of "
                             "producer DCP size %u",
                             lay->producer_tp, W);
    return KVR_OK;
}

/* Each check has its own status code so that a caller (or a peer reading
 * WRITE_FAILED) can tell them apart. bs comes first because the I checks use
 * it. tp % W == 0 because DCP adds no GPUs: the W DCP ranks subdivide the
 * consumer's TP group, as the engine requires. */
kvr_status_t kvr_layout_check(const kvr_layout_t *lay, kvr_error_t *err)
{
    if (lay == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "layout is NULL");
    uint32_t bs = lay->block_size, I = lay->interleave, W = lay->dcp_size;
    if (bs < 1)
        return kvr_error_set(err, KVR_ERR_BLOCK_SIZE, "block size %u < 1", bs);
    if (I < 1)
        return kvr_error_set(err, KVR_ERR_INTERLEAVE_LT1, "interleave %u < 1",
                             I);
    if (I > bs)
        return kvr_error_set(err, KVR_ERR_INTERLEAVE_GT_BS,
                             "interleave %u > block size %u", I, bs);
    if (bs % I != 0)
        return kvr_error_set(err, KVR_ERR_INTERLEAVE_NOT_DIVISOR,
                             "block size %u is not a multiple of interleave %u",
                             bs, I);
    if (W < 1)
        return kvr_error_set(err, KVR_ERR_DCP_LT1, "DCP size %u < 1", W);
    if (lay->tp < 1 || lay->tp % W != 0)
        return kvr_error_set(err, KVR_ERR_TP_NOT_DIVISIBLE,
                             "TP size %u is not a multiple of DCP size %u",
                             lay->tp, W);
    if (lay->producer_tp < 1)
        return kvr_error_set(err, KVR_ERR_INVALID, "producer TP size %u < 1",
                             lay->producer_tp);
    return check_producer(lay, err);
}

kvr_status_t kvr_layout_check_rank(const kvr_layout_t *lay, uint32_t rank,
                                   kvr_error_t *err)
{
    kvr_status_t st = kvr_layout_check(lay, err);
    if (st != KVR_OK)
        return st;
    if (rank >= lay->dcp_size)
        return kvr_error_set(err, KVR_ERR_RANK_RANGE,
                             "DCP rank %u out of range [0, %u)", rank,
                             lay->dcp_size);
    return KVR_OK;
}

/* V = bs * W: the tokens one consumer block-table entry covers. */
uint64_t kvr_virtual_block(const kvr_layout_t *lay)
{
    return (uint64_t)lay->block_size * lay->dcp_size;
}

/* Public wrappers of layout_math.h; the formulas and why they hold are
 * there. */
uint32_t kvr_owner(const kvr_layout_t *lay, uint64_t g)
{
    return kvr__owner(g, lay->interleave, lay->dcp_size);
}

uint64_t kvr_local_index(const kvr_layout_t *lay, uint64_t g)
{
    return kvr__local(g, lay->interleave, lay->dcp_size);
}

uint64_t kvr_global_index(const kvr_layout_t *lay, uint64_t j, uint32_t rank)
{
    return kvr__global(j, rank, lay->interleave, lay->dcp_size);
}

uint64_t kvr_local_len(const kvr_layout_t *lay, uint64_t len, uint32_t rank)
{
    return kvr__local_len(len, rank, lay->interleave, lay->dcp_size);
}

/* Table entries, not pages: the W ranks share one table of ceil(N / V). */
uint64_t kvr_num_dst_blocks(const kvr_layout_t *lay, uint64_t num_tokens)
{
    return kvr__ceil_div(num_tokens, kvr_virtual_block(lay));
}

uint64_t kvr_num_src_blocks(const kvr_layout_t *lay, uint64_t num_tokens)
{
    return kvr__ceil_div(num_tokens, lay->block_size);
}

uint64_t kvr_index_stride(uint32_t index_dim)
{
    return kvr__index_stride(index_dim);
}

/* P of an index page: bs, except on a consumer with a replicated index,
 * where every rank holds all V tokens of a table entry in one page (W times
 * wider than the producer's). */
uint64_t kvr_index_page_tokens(const kvr_layout_t *lay, bool consumer)
{
    if (consumer && lay->replicate_index)
        return kvr_virtual_block(lay);
    if (!consumer && lay->producer_replicate_index)
        return (uint64_t)kvr_producer_block_size(lay) * kvr_producer_dcp(lay);
    return consumer ? lay->block_size : kvr_producer_block_size(lay);
}

uint64_t kvr_index_key_offset(const kvr_layout_t *lay, uint32_t index_dim,
                              uint64_t t, uint32_t d)
{
    return kvr__index_key_off(t, d, index_dim, lay->preshuffle);
}

uint64_t kvr_index_scale_offset(uint64_t page_tokens, uint32_t index_dim,
                                uint64_t t)
{
    return kvr__index_scale_off(t, page_tokens, index_dim);
}

/* What the transport can reach. A region may register less than
 * num_blocks * page_bytes; the planner refuses runs past it. */
uint64_t kvr_region_bytes(const kvr_region_desc_t *r)
{
    return r->bytes ? r->bytes : r->num_blocks * r->page_bytes;
}

uint64_t kvr_region_token_bytes(const kvr_layout_t *lay,
                                const kvr_region_desc_t *r)
{
    return r->page_bytes / lay->block_size;
}

static uint32_t side_block_size(const kvr_layout_t *lay, bool consumer)
{
    return consumer ? lay->block_size : kvr_producer_block_size(lay);
}

uint64_t kvr_region_token_bytes_side(const kvr_layout_t *lay,
                                     const kvr_region_desc_t *r, bool consumer)
{
    return r->page_bytes / side_block_size(lay, consumer);
}

static uint32_t side_tp(const kvr_layout_t *lay, bool consumer)
{
    return consumer ? lay->tp : lay->producer_tp;
}

uint32_t kvr_dense_local_heads(const kvr_layout_t *lay,
                               const kvr_region_desc_t *r, bool consumer)
{
    if (r->heads == 0)
        return 0;
    return (uint32_t)kvr__heads_local(r->heads, side_tp(lay, consumer));
}

uint32_t kvr_dense_first_head(const kvr_layout_t *lay,
                              const kvr_region_desc_t *r, bool consumer,
                              uint32_t tp_rank)
{
    if (r->heads == 0)
        return 0;
    return (uint32_t)kvr__head_first(tp_rank, r->heads, side_tp(lay, consumer));
}

/* 0 kv_planes means K and V, the common paged layout. */
uint64_t kvr_dense_page_bytes(const kvr_layout_t *lay,
                              const kvr_region_desc_t *r, bool consumer)
{
    uint64_t planes = r->kv_planes ? r->kv_planes : 2;
    return planes * side_block_size(lay, consumer) *
           kvr_dense_local_heads(lay, r, consumer) * r->head_dim *
           r->elem_bytes;
}

/* Token bytes are page_bytes / bs; a remainder would shift every slot. */
static kvr_status_t check_token_region(const kvr_layout_t *lay,
                                       const kvr_region_desc_t *r,
                                       bool consumer, kvr_error_t *err)
{
    uint32_t bs = side_block_size(lay, consumer);
    if (r->page_bytes == 0 || r->page_bytes % bs != 0)
        return kvr_error_set(err, KVR_ERR_PAGE_NOT_TOKENS,
                             "%s %s region layer %u: page bytes %llu is not a "
                             "positive multiple of block size %u",
                             consumer ? "consumer" : "producer",
                             kvr_role_name(r->role), r->layer,
                             (unsigned long long)r->page_bytes, bs);
    return KVR_OK;
}

/* Head-sharded DENSE (docs/design.md §18): H and the side's TP must divide
 * one another, or heads would straddle ranks; the page must be exactly its
 * planes, since plane k starts at k * bs * local heads * D * E. */
static kvr_status_t check_dense_region(const kvr_layout_t *lay,
                                       const kvr_region_desc_t *r,
                                       bool consumer, kvr_error_t *err)
{
    const char *side = consumer ? "consumer" : "producer";
    uint32_t H = r->heads, TP = side_tp(lay, consumer);
    if (r->head_dim == 0 || r->elem_bytes == 0 || r->kv_planes > 2)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s dense region layer %u: head dim %u, element "
                             "bytes %u, planes %u (need D, E > 0, planes 1 "
                             "or 2)",
                             side, r->layer, r->head_dim, r->elem_bytes,
                             r->kv_planes);
    if ((TP <= H && H % TP != 0) || (TP > H && TP % H != 0))
        return kvr_error_set(err, KVR_ERR_DENSE_HEADS,
                             "%s dense region layer %u: %u kv heads over TP "
                             "%u: one must divide the other",
                             side, r->layer, H, TP);
    uint64_t need = kvr_dense_page_bytes(lay, r, consumer);
    if (r->page_bytes != need)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s dense region layer %u: page bytes %llu, the "
                             "geometry (%u heads / TP %u, D=%u, E=%u) needs "
                             "%llu",
                             side, r->layer, (unsigned long long)r->page_bytes,
                             H, TP, r->head_dim, r->elem_bytes,
                             (unsigned long long)need);
    return KVR_OK;
}

/* An index page must hold its two planes, P * D key bytes and P scales, for
 * the P of its side. The padding up to P * C is not required: it is never
 * moved, so a page stored without it plans the same. Only D/Q == 1 (one scale
 * per token) is supported; preshuffled keys come in 16 x 16-byte tiles, hence
 * the 16s. */
static kvr_status_t check_index_region(const kvr_layout_t *lay,
                                       const kvr_region_desc_t *r,
                                       bool consumer, kvr_error_t *err)
{
    const char *side = consumer ? "consumer" : "producer";
    uint32_t D = r->index_dim, Q = r->quant_block ? r->quant_block : D;
    if (D == 0)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s index region layer %u: index dim D is 0", side,
                             r->layer);
    if (D % Q != 0 || D / Q != 1)
        return kvr_error_set(err, KVR_ERR_INDEX_QUANT,
                             "%s index region layer %u: D/Q must be 1 "
                             "(D=%u, Q=%u)",
                             side, r->layer, D, Q);
    if (lay->preshuffle && side_block_size(lay, consumer) % 16 != 0)
        return kvr_error_set(err, KVR_ERR_PRESHUFFLE_BS,
                             "preshuffled index needs bs %% 16 == 0 (%sbs=%u)",
                             consumer ? "" : "producer ",
                             side_block_size(lay, consumer));
    if (lay->preshuffle && D % 16 != 0)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "preshuffled index needs D %% 16 == 0 (D=%u)", D);
    uint64_t P = kvr_index_page_tokens(lay, consumer);
    uint64_t need;
    if (__builtin_mul_overflow(P, D + 4ull * (D / Q), &need))
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s index region layer %u: a page of %llu tokens "
                             "of D=%u plus scales exceeds 2^64 bytes",
                             side, r->layer, (unsigned long long)P, D);
    if (r->page_bytes < need)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s index region layer %u: page bytes %llu < %llu "
                             "needed for %llu tokens of D=%u plus scales",
                             side, r->layer, (unsigned long long)r->page_bytes,
                             (unsigned long long)need, (unsigned long long)P,
                             D);
    return KVR_OK;
}

/* STATE, OTHER and STAGING pages are opaque: only their size must be sane. */
kvr_status_t kvr_region_check(const kvr_layout_t *lay,
                              const kvr_region_desc_t *r, bool consumer,
                              kvr_error_t *err)
{
    if (lay == NULL || r == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "region or layout is NULL");
    const char *side = consumer ? "consumer" : "producer";
    uint64_t total;
    if (__builtin_mul_overflow(r->num_blocks, r->page_bytes, &total))
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "%s %s region layer %u: %llu blocks of %llu bytes "
                             "exceed 2^64 bytes",
                             side, kvr_role_name(r->role), r->layer,
                             (unsigned long long)r->num_blocks,
                             (unsigned long long)r->page_bytes);
    switch (r->role) {
    case KVR_ROLE_DENSE:
        if (r->heads != 0)
            return check_dense_region(lay, r, consumer, err);
        return check_token_region(lay, r, consumer, err);
    case KVR_ROLE_MLA:
        return check_token_region(lay, r, consumer, err);
    case KVR_ROLE_INDEX:
        return check_index_region(lay, r, consumer, err);
    case KVR_ROLE_STATE:
    case KVR_ROLE_OTHER:
    case KVR_ROLE_STAGING:
        if (r->page_bytes == 0)
            return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                                 "%s %s region layer %u: page bytes is 0", side,
                                 kvr_role_name(r->role), r->layer);
        return KVR_OK;
    }
    return kvr_error_set(err, KVR_ERR_INVALID, "%s region layer %u: role %d",
                         side, r->layer, (int)r->role);
}
