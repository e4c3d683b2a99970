/* Layout digest (docs/design.md §4): BLAKE2b-128 via libsodium, first 8 bytes. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_internal.h"

/* A region class as the digest sees it: role plus widths. */
typedef struct {
    uint32_t role;
    uint64_t w1; /* token bytes (token roles), D (index), page bytes (others) */
    uint64_t w2; /* Q (index), else 0 */
} class_key_t;

static int cmp_key(const void *a, const void *b)
{
    const class_key_t *x = a, *y = b;
    if (x->role != y->role)
        return x->role < y->role ? -1 : 1;
    if (x->w1 != y->w1)
        return x->w1 < y->w1 ? -1 : 1;
    return (x->w2 > y->w2) - (x->w2 < y->w2);
}

static class_key_t key_of(const kvr_layout_t *lay, const kvr_region_desc_t *r)
{
    class_key_t k = {(uint32_t)r->role, r->page_bytes, 0};
    if (r->role == KVR_ROLE_MLA || r->role == KVR_ROLE_DENSE)
        k.w1 = r->page_bytes / lay->block_size;
    else if (r->role == KVR_ROLE_INDEX) {
        k.w1 = r->index_dim;
        k.w2 = r->quant_block ? r->quant_block : r->index_dim;
    }
    return k;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void hash_classes(crypto_generichash_state *st, const class_key_t *keys,
                         size_t n)
{
    unsigned char buf[20];
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++)
        distinct += (i == 0 || cmp_key(&keys[i - 1], &keys[i]) != 0);
    put_u32(buf, (uint32_t)distinct);
    crypto_generichash_update(st, buf, 4);
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && cmp_key(&keys[i - 1], &keys[i]) == 0)
            continue;
        put_u32(buf, keys[i].role);
        put_u64(buf + 4, keys[i].w1);
        put_u64(buf + 12, keys[i].w2);
        crypto_generichash_update(st, buf, 20);
    }
}

kvr_status_t kvr_layout_digest(const kvr_layout_t *lay,
                               const kvr_region_desc_t *regions,
                               size_t num_regions, uint64_t *out,
                               kvr_error_t *err)
{
    kvr_status_t s = kvr_layout_check(lay, err);
    if (s != KVR_OK)
        return s;
    if (out == NULL || (num_regions && regions == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "regions or out is NULL");
    if (sodium_init() < 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "libsodium init failed");
    class_key_t *keys = calloc(num_regions + 1, sizeof(*keys));
    if (keys == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    size_t n = 0;
    for (size_t i = 0; i < num_regions; i++)
        if (regions[i].role != KVR_ROLE_STAGING)
            keys[n++] = key_of(lay, &regions[i]);
    qsort(keys, n, sizeof(*keys), cmp_key);

    unsigned char head[18], hash[16];
    put_u32(head, KVR_LAYOUT_VERSION);
    put_u32(head + 4, lay->block_size);
    put_u32(head + 8, lay->dcp_size);
    put_u32(head + 12, lay->interleave);
    head[16] = lay->replicate_index ? 1 : 0;
    head[17] = lay->preshuffle ? 1 : 0;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof(hash));
    crypto_generichash_update(&st, head, sizeof(head));
    hash_classes(&st, keys, n);
    crypto_generichash_final(&st, hash, sizeof(hash));
    free(keys);
    uint64_t d = 0;
    for (int i = 0; i < 8; i++)
        d |= (uint64_t)hash[i] << (8 * i);
    *out = d;
    return KVR_OK;
}

void kvr_digest_hex(uint64_t digest, char out[17])
{
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", (unsigned)(digest >> (8 * i)) & 0xffu);
}
