/* Chunk files (docs/store.md): an 80-byte header naming the chunk, the
 * payload, and a BLAKE2b-256 of header and payload. */
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "base_internal.h"
#include "store_internal.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

void kvr__chunk_name(const kvr_chunk_key_t *key, char out[KVR_STORE_NAME_MAX])
{
    char ns[2 * KVR_STORE_NS_BYTES + 1], ch[2 * KVR_BLOCK_HASH_BYTES + 1];
    hex(key->ns, sizeof key->ns, ns);
    hex(key->chain.bytes, sizeof key->chain.bytes, ch);
    snprintf(out, KVR_STORE_NAME_MAX, "%s-%s-p%u.kvc", ns, ch, key->part);
}

/* magic 8 | version 4 | flags 4 | payload length 8 | part 4 | 0 4 |
 * ns 16 | chain 32 */
void kvr__chunk_header(const kvr_chunk_key_t *key, uint64_t len,
                       uint8_t out[KVR__CHUNK_HEADER])
{
    memset(out, 0, KVR__CHUNK_HEADER);
    memcpy(out, KVR__CHUNK_MAGIC, 8);
    kvr__put_le(out + 8, KVR__CHUNK_VERSION, 4);
    kvr__put_le(out + 16, len, 8);
    kvr__put_le(out + 24, key->part, 4);
    memcpy(out + 32, key->ns, KVR_STORE_NS_BYTES);
    memcpy(out + 48, key->chain.bytes, KVR_BLOCK_HASH_BYTES);
}

kvr_status_t kvr__chunk_parse(const uint8_t h[KVR__CHUNK_HEADER],
                              kvr_chunk_key_t *key, uint64_t *len,
                              kvr_error_t *err)
{
    if (memcmp(h, KVR__CHUNK_MAGIC, 8) != 0)
        return kvr_error_set(err, KVR_ERR_VERIFY, "bad chunk magic");
    uint32_t v = (uint32_t)kvr__get_le(h + 8, 4);
    if (v != KVR__CHUNK_VERSION)
        return kvr_error_set(err, KVR_ERR_VERSION,
                             "chunk format version %u, expected %u", v,
                             KVR__CHUNK_VERSION);
    *len = kvr__get_le(h + 16, 8);
    memset(key, 0, sizeof *key);
    key->part = (uint32_t)kvr__get_le(h + 24, 4);
    memcpy(key->ns, h + 32, KVR_STORE_NS_BYTES);
    memcpy(key->chain.bytes, h + 48, KVR_BLOCK_HASH_BYTES);
    return KVR_OK;
}

void kvr__chunk_sum(const uint8_t header[KVR__CHUNK_HEADER],
                    const void *data, uint64_t len,
                    uint8_t out[KVR_STORE_SUM_BYTES])
{
    crypto_generichash_state s;
    crypto_generichash_init(&s, NULL, 0, KVR_STORE_SUM_BYTES);
    crypto_generichash_update(&s, header, KVR__CHUNK_HEADER);
    crypto_generichash_update(&s, data, len);
    crypto_generichash_final(&s, out, KVR_STORE_SUM_BYTES);
}
