/* Layout digest (docs/design.md §4): BLAKE2b-128 via libsodium, first 8 bytes. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "base_internal.h"
#include "layout_internal.h"
#include "plan_internal.h"

/* The distinct classes: their count, then each as role (4 bytes), width
 * and quant (8 bytes each), little-endian. */
static void hash_classes(crypto_generichash_state *st,
                         const kvr_region_class_t *keys, size_t n)
{
    unsigned char buf[20];
    kvr__put_le(buf, n, 4);
    crypto_generichash_update(st, buf, 4);
    for (size_t i = 0; i < n; i++) {
        kvr__put_le(buf, (uint32_t)keys[i].role, 4);
        kvr__put_le(buf + 4, keys[i].width, 8);
        kvr__put_le(buf + 12, keys[i].quant, 8);
        crypto_generichash_update(st, buf, 20);
    }
}

/* Fields added after KVR_LAYOUT_VERSION 1 are hashed only when they leave
 * their defaults, so every digest of a layout without them is unchanged:
 * a producer of its own (W_p, and I_p and index replication when W_p > 1,
 * bs_p; docs/design.md §18) and, with a head-sharded class, both TP sizes
 * (they set which heads a page holds). */
static void hash_extensions(crypto_generichash_state *st,
                            const kvr_layout_t *lay,
                            const kvr_region_class_t *keys, size_t n)
{
    unsigned char buf[17];
    uint32_t Wp = kvr_producer_dcp(lay);
    if (!kvr_layout_producer_plain(lay)) {
        memcpy(buf, "prod", 4);
        kvr__put_le(buf + 4, Wp, 4);
        kvr__put_le(buf + 8, Wp > 1 ? kvr_producer_interleave(lay) : 1, 4);
        kvr__put_le(buf + 12, kvr_producer_block_size(lay), 4);
        buf[16] = Wp > 1 && lay->producer_replicate_index;
        crypto_generichash_update(st, buf, 17);
    }
    for (size_t i = 0; i < n; i++)
        if (keys[i].quant & KVR__CLASS_HEADS_BIT) {
            memcpy(buf, "tp\0\0", 4);
            kvr__put_le(buf + 4, lay->producer_tp, 4);
            kvr__put_le(buf + 8, lay->tp, 4);
            crypto_generichash_update(st, buf, 12);
            return;
        }
}

kvr_status_t kvr_layout_digest(const kvr_layout_t *lay,
                               const kvr_region_desc_t *regions,
                               size_t num_regions, uint64_t *out,
                               kvr_error_t *err)
{
    return kvr_layout_digest_side(lay, regions, num_regions, true, out, err);
}

kvr_status_t kvr_layout_digest_side(const kvr_layout_t *lay,
                                    const kvr_region_desc_t *regions,
                                    size_t num_regions, bool consumer,
                                    uint64_t *out, kvr_error_t *err)
{
    kvr_status_t s = kvr_layout_check(lay, err);
    if (s != KVR_OK)
        return s;
    if (out == NULL || (num_regions && regions == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "regions or out is NULL");
    if (kvr_init(err) != KVR_OK)
        return KVR_ERR_INIT;
    kvr_region_class_t *keys = calloc(num_regions + 1, sizeof(*keys));
    if (keys == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    size_t n = kvr__distinct_classes(lay, regions, num_regions, consumer, keys);

    unsigned char head[18], hash[16];
    kvr__put_le(head, KVR_LAYOUT_VERSION, 4);
    kvr__put_le(head + 4, lay->block_size, 4);
    kvr__put_le(head + 8, lay->dcp_size, 4);
    kvr__put_le(head + 12, lay->interleave, 4);
    head[16] = lay->replicate_index ? 1 : 0;
    head[17] = lay->preshuffle ? 1 : 0;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof(hash));
    crypto_generichash_update(&st, head, sizeof(head));
    hash_classes(&st, keys, n);
    hash_extensions(&st, lay, keys, n);
    crypto_generichash_final(&st, hash, sizeof(hash));
    free(keys);
    *out = kvr__get_le(hash, 8);
    return KVR_OK;
}

void kvr_digest_hex(uint64_t digest, char out[17])
{
    unsigned char bytes[8];
    kvr__put_le(bytes, digest, 8);
    sodium_bin2hex(out, 17, bytes, sizeof(bytes));
}
