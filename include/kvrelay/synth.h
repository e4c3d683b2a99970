/* Synthetic KV for demos, tests and `kvrelay inspect`: every byte is a pure
 * function of (seed, layer, role, position, token id), so a request that
 * reuses a cached prefix verifies against bytes an earlier request wrote.
 * Index scales are derived from the token's keys, so key/scale consistency
 * can be checked on received pages alone. Part of the plan layer. */
#ifndef KVRELAY_SYNTH_H
#define KVRELAY_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "kvrelay/plan.h"

#ifdef __cplusplus
extern "C" {
#endif
KVR_API_BEGIN

/* token_bytes bytes of one MLA latent. */
void kvr_synth_latent(uint64_t seed, uint32_t layer, uint64_t pos,
                      uint32_t token_id, uint8_t *out, size_t token_bytes);
/* D key bytes of one index token, in token order (not preshuffled). */
void kvr_synth_index_key(uint64_t seed, uint32_t layer, uint64_t pos,
                         uint32_t token_id, uint8_t *key, uint32_t index_dim);
/* The fp32 scale derived from a token's D key bytes. */
float kvr_synth_index_scale(const uint8_t *key, uint32_t index_dim);

/* Writes tokens [0, num_tokens) of a request into a producer region at base
 * (token g at its producer slot; index keys at their preshuffled position
 * and scales in the scale plane). token_ids has num_tokens entries. */
kvr_status_t
kvr_synth_fill_source(const kvr_layout_t *lay, const kvr_region_desc_t *src,
                      uint64_t seed, const uint32_t *src_blocks,
                      size_t num_src_blocks, const uint32_t *token_ids,
                      uint64_t num_tokens, void *base, kvr_error_t *err);

/* bytes of kv head `head`'s K (plane 0) or V (plane 1) vector of one
 * token of a dense region. */
void kvr_synth_dense(uint64_t seed, uint32_t layer, uint32_t plane,
                     uint32_t head, uint64_t pos, uint32_t token_id,
                     uint8_t *out, size_t bytes);

/* kvr_synth_fill_source for one rank of a sharded producer (docs/design.md
 * §18), from the global token and head identity: DCP rank `rank` writes
 * the MLA tokens it owns at its local slots (bs_p-token pages) and its
 * index pages (replicated on the producer: every token in pages of
 * bs_p * W_p; sharded, I_p == bs_p: the blocks it owns); for a dense
 * region with heads, tp rank `rank` writes its heads of every token (K and
 * V planes, NHD or HND). src_blocks is that rank's table. */
kvr_status_t kvr_synth_fill_source_rank(
    const kvr_layout_t *lay, const kvr_region_desc_t *src, uint32_t rank,
    uint64_t seed, const uint32_t *src_blocks, size_t num_src_blocks,
    const uint32_t *token_ids, uint64_t num_tokens, void *base,
    kvr_error_t *err);

/* Checks a consumer's dense region (heads set, W == 1) on tp rank `rank`:
 * every head it holds of tokens [from, num_tokens) against
 * kvr_synth_dense. KVR_ERR_VERIFY names the token, head, plane and the
 * first differing byte. */
kvr_status_t kvr_synth_check_dense(const kvr_layout_t *lay,
                                   const kvr_region_desc_t *dst, uint32_t rank,
                                   uint64_t seed, const uint32_t *dst_blocks,
                                   size_t num_dst_blocks,
                                   const uint32_t *token_ids, uint64_t from,
                                   uint64_t num_tokens, const void *base,
                                   kvr_error_t *err);

/* Reads back token g from a consumer index page (page_tokens P, slot t) and
 * checks that its scale matches its keys. Returns KVR_ERR_VERIFY naming the
 * token, expected and found scale. */
kvr_status_t kvr_synth_check_index_token(const kvr_layout_t *lay,
                                         const uint8_t *page,
                                         uint64_t page_tokens, uint64_t t,
                                         uint32_t index_dim, uint64_t g,
                                         kvr_error_t *err);

KVR_API_END
#ifdef __cplusplus
}
#endif
#endif
