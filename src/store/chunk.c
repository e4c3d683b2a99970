/* Chunk files (docs/store.md): an 80-byte header naming the chunk, the
 * payload, and the chunk's BLAKE2b checksum. */
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The checksum is a BLAKE2b tree of depth one: BLAKE2b-256 of the header
 * and of the BLAKE2b-256 of every 4 MiB leaf of the payload, so the leaves
 * are hashed on several cores (one BLAKE2b stream runs at about 0.8 GB/s,
 * below a disk's sequential rate). The result does not depend on how many
 * threads computed it. */
typedef struct leaves {
    const uint8_t *data;
    uint64_t len, count;
    uint8_t *out; /* count * KVR_STORE_SUM_BYTES */
    unsigned stride;
} leaves_t;

static void hash_leaves(const leaves_t *l, unsigned first)
{
    for (uint64_t i = first; i < l->count; i += l->stride) {
        uint64_t at = i * KVR__LEAF;
        uint64_t n = l->len - at < KVR__LEAF ? l->len - at : KVR__LEAF;
        crypto_generichash(l->out + i * KVR_STORE_SUM_BYTES,
                           KVR_STORE_SUM_BYTES, l->data + at, n, NULL, 0);
    }
}

typedef struct worker {
    const leaves_t *l;
    unsigned first;
} worker_t;

static void *leaf_worker(void *arg)
{
    const worker_t *w = arg;
    hash_leaves(w->l, w->first);
    return NULL;
}

static unsigned hash_threads(uint64_t count)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t t = cpus < 1 ? 1 : (uint64_t)cpus;
    t = t > KVR__HASH_THREADS ? KVR__HASH_THREADS : t;
    return (unsigned)(t < count ? t : count);
}

void kvr__chunk_sum(const uint8_t header[KVR__CHUNK_HEADER], const void *data,
                    uint64_t len, uint8_t out[KVR_STORE_SUM_BYTES])
{
    uint64_t count = len == 0 ? 1 : (len + KVR__LEAF - 1) / KVR__LEAF;
    uint8_t one[KVR_STORE_SUM_BYTES];
    uint8_t *digests = count == 1 ? one : malloc(count * KVR_STORE_SUM_BYTES);
    unsigned threads = hash_threads(count);
    crypto_generichash_state s;
    crypto_generichash_init(&s, NULL, 0, KVR_STORE_SUM_BYTES);
    crypto_generichash_update(&s, header, KVR__CHUNK_HEADER);
    if (digests == NULL) {
        /* no memory for the leaf list: the same result, leaf by leaf */
        for (uint64_t i = 0; i < count; i++) {
            uint64_t at = i * KVR__LEAF;
            uint64_t n = len - at < KVR__LEAF ? len - at : KVR__LEAF;
            crypto_generichash(one, sizeof one, (const uint8_t *)data + at, n,
                               NULL, 0);
            crypto_generichash_update(&s, one, sizeof one);
        }
    } else {
        leaves_t l = {.data = data,
                      .len = len,
                      .count = count,
                      .out = digests,
                      .stride = threads};
        pthread_t tid[KVR__HASH_THREADS];
        worker_t w[KVR__HASH_THREADS];
        unsigned started = 0;
        for (unsigned t = 1; t < threads; t++) {
            w[t] = (worker_t){.l = &l, .first = t};
            if (pthread_create(&tid[t], NULL, leaf_worker, &w[t]) != 0)
                break;
            started = t;
        }
        hash_leaves(&l, 0);
        for (unsigned t = 1; t <= started; t++)
            pthread_join(tid[t], NULL);
        for (unsigned t = started + 1; t < threads; t++)
            hash_leaves(&l, t); /* threads that did not start */
        crypto_generichash_update(&s, digests, count * KVR_STORE_SUM_BYTES);
    }
    crypto_generichash_final(&s, out, KVR_STORE_SUM_BYTES);
    if (digests != one)
        free(digests);
}
