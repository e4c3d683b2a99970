/* Prefix hashes at hash_block_size and the cached-prefix arithmetic
 * (docs/design.md §2, §9). */
#include <sodium.h>
#include <string.h>

#include "base_internal.h"
#include "kvrelay/completion.h"

kvr_status_t kvr_hash_block_size(const kvr_layout_t *lay, uint64_t *out,
                                 kvr_error_t *err)
{
    kvr_status_t s = kvr_layout_check(lay, err);
    if (s != KVR_OK)
        return s;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    *out = (uint64_t)lay->block_size * lay->dcp_size;
    return KVR_OK;
}

/* Feeds n token ids as u32 little-endian, whatever the host's byte order. */
static void update_tokens(crypto_hash_sha256_state *st, const uint32_t *tok,
                          uint64_t n)
{
    uint8_t buf[4 * 256];
    while (n > 0) {
        size_t k = n < 256 ? (size_t)n : 256;
        for (size_t i = 0; i < k; i++)
            kvr__put_le(buf + 4 * i, tok[i], 4);
        crypto_hash_sha256_update(st, buf, 4 * k);
        tok += k;
        n -= k;
    }
}

static kvr_status_t check_hash_args(const uint32_t *tokens, size_t num_tokens,
                                    uint64_t hash_block_size, size_t *num,
                                    kvr_error_t *err)
{
    if (hash_block_size < 1)
        return kvr_error_set(err, KVR_ERR_INVALID, "hash_block_size 0 < 1");
    if (num == NULL || (tokens == NULL && num_tokens > 0))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "num or tokens (%zu of them) is NULL", num_tokens);
    if (kvr_init(err) != KVR_OK)
        return KVR_ERR_INIT;
    return KVR_OK;
}

kvr_status_t kvr_prefix_hashes(const kvr_block_hash_t *parent,
                               const uint32_t *tokens, size_t num_tokens,
                               uint64_t hash_block_size, kvr_block_hash_t *out,
                               size_t out_cap, size_t *num, kvr_error_t *err)
{
    kvr_status_t s = check_hash_args(tokens, num_tokens, hash_block_size, num,
                                     err);
    if (s != KVR_OK)
        return s;
    size_t blocks = (size_t)(num_tokens / hash_block_size);
    if (out != NULL && out_cap < blocks)
        return kvr_error_set(err, KVR_ERR_BUFFER_SMALL,
                             "out holds %zu hashes; %zu tokens make %zu full "
                             "blocks of %llu",
                             out_cap, num_tokens, blocks,
                             (unsigned long long)hash_block_size);
    kvr_block_hash_t prev = {{0}};
    if (parent != NULL)
        prev = *parent;
    for (size_t i = 0; out != NULL && i < blocks; i++) {
        crypto_hash_sha256_state st;
        crypto_hash_sha256_init(&st);
        crypto_hash_sha256_update(&st, prev.bytes, sizeof(prev.bytes));
        update_tokens(&st, tokens + i * hash_block_size, hash_block_size);
        crypto_hash_sha256_final(&st, prev.bytes);
        out[i] = prev;
    }
    *num = blocks;
    return KVR_OK;
}

kvr_status_t kvr_prefix_cached(const kvr_layout_t *lay, uint64_t num_tokens,
                               uint64_t hit_blocks, uint64_t *num_cached_tokens,
                               uint64_t *num_computed_blocks, kvr_error_t *err)
{
    uint64_t hbs;
    kvr_status_t s = kvr_hash_block_size(lay, &hbs, err);
    if (s != KVR_OK)
        return s;
    if (hit_blocks > num_tokens / hbs)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "hit of %llu blocks exceeds the %llu full blocks "
                             "of %llu tokens in a %llu-token prompt",
                             (unsigned long long)hit_blocks,
                             (unsigned long long)(num_tokens / hbs),
                             (unsigned long long)hbs,
                             (unsigned long long)num_tokens);
    uint64_t cached = hit_blocks * hbs; /* <= num_tokens: no overflow */
    if (num_cached_tokens != NULL)
        *num_cached_tokens = cached;
    /* VIRTUAL blocks: one consumer block-table entry covers bs * W tokens */
    if (num_computed_blocks != NULL)
        *num_computed_blocks = cached /
                               ((uint64_t)lay->block_size * lay->dcp_size);
    return KVR_OK;
}
