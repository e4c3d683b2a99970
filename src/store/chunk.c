/* Chunk files (docs/store.md): an 80-byte header naming the chunk (zero
 * padded to 4096 bytes in format 2), the payload, and the chunk's BLAKE2b
 * checksum tree. */
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef KVR_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

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

/* magic 8 | version 4 | checksum kind 4 | payload length 8 | part 4 |
 * 0 4 | ns 16 | chain 32. The kind is the default; kvr__chunk_set_kind
 * changes it. */
void kvr__chunk_header(const kvr_chunk_key_t *key, uint64_t len,
                       uint8_t out[KVR__CHUNK_HEADER])
{
    memset(out, 0, KVR__CHUNK_HEADER);
    memcpy(out, KVR__CHUNK_MAGIC, 8);
    kvr__put_le(out + 8, KVR__CHUNK_VERSION, 4);
    kvr__put_le(out + 12, KVR__SUM_DEFAULT, 4);
    kvr__put_le(out + 16, len, 8);
    kvr__put_le(out + 24, key->part, 4);
    memcpy(out + 32, key->ns, KVR_STORE_NS_BYTES);
    memcpy(out + 48, key->chain.bytes, KVR_BLOCK_HASH_BYTES);
}

void kvr__chunk_set_kind(uint8_t header[KVR__CHUNK_HEADER], unsigned kind)
{
    kvr__put_le(header + 12, kind, 4);
}

uint64_t kvr__chunk_data_at(const uint8_t header[KVR__CHUNK_HEADER])
{
    return kvr__get_le(header + 8, 4) == 1u ? KVR__CHUNK_HEADER
                                            : KVR__CHUNK_DATA;
}

kvr_status_t kvr__chunk_parse(const uint8_t h[KVR__CHUNK_HEADER],
                              kvr_chunk_key_t *key, uint64_t *len,
                              kvr_error_t *err)
{
    if (memcmp(h, KVR__CHUNK_MAGIC, 8) != 0)
        return kvr_error_set(err, KVR_ERR_VERIFY, "bad chunk magic");
    uint32_t v = (uint32_t)kvr__get_le(h + 8, 4);
    if (v != 1u && v != KVR__CHUNK_VERSION)
        return kvr_error_set(err, KVR_ERR_VERSION,
                             "chunk format version %u, expected 1 or %u", v,
                             KVR__CHUNK_VERSION);
    uint32_t kind = (uint32_t)kvr__get_le(h + 12, 4);
    if (kind >= KVR__SUM_KINDS)
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "chunk checksum kind %u unknown (0 BLAKE2b-256 "
                             "leaves, 1 Poly1305 leaves, 2 BLAKE2b-512 leaves)",
                             kind);
    *len = kvr__get_le(h + 16, 8);
    memset(key, 0, sizeof *key);
    key->part = (uint32_t)kvr__get_le(h + 24, 4);
    memcpy(key->ns, h + 32, KVR_STORE_NS_BYTES);
    memcpy(key->chain.bytes, h + 48, KVR_BLOCK_HASH_BYTES);
    return KVR_OK;
}

/* The checksum is a tree of depth one: BLAKE2b-256 of the header and of
 * the digest of every 4 MiB leaf of the payload, so the leaves are hashed
 * on several cores and while the rest of the chunk is still being read or
 * written. The header names the leaf digest (docs/store.md): BLAKE2b-512
 * (kind 2, the default; OpenSSL's implementation where the build has it,
 * about twice as fast as libsodium's on the project's machines, the same
 * digest either way), BLAKE2b-256 (kind 0, what files written before kind
 * 2 carry) or Poly1305 under the fixed public key below (kind 1,
 * fast_checksum: a universal hash, which catches accidental corruption,
 * not bytes crafted to collide). The result does not depend on how many
 * threads computed it, nor in which order. */
static const uint8_t leaf_key[crypto_onetimeauth_KEYBYTES] =
    "kvrelay store leaf checksum key!";

static unsigned digest_bytes(unsigned kind)
{
    if (kind == KVR__SUM_POLY1305)
        return crypto_onetimeauth_BYTES;
    return kind == KVR__SUM_BLAKE2B512 ? 64u : KVR_STORE_SUM_BYTES;
}

static void blake2b512(const uint8_t *p, uint64_t n, uint8_t *out)
{
#ifdef KVR_HAVE_OPENSSL
    unsigned int len = 0;
    if (EVP_Digest(p, n, out, &len, EVP_blake2b512(), NULL) == 1 && len == 64)
        return;
#endif
    crypto_generichash(out, 64, p, n, NULL, 0);
}

static void leaf_sum(unsigned kind, const uint8_t *p, uint64_t n, uint8_t *out)
{
    if (kind == KVR__SUM_POLY1305)
        crypto_onetimeauth(out, p, n, leaf_key);
    else if (kind == KVR__SUM_BLAKE2B512)
        blake2b512(p, n, out);
    else
        crypto_generichash(out, KVR_STORE_SUM_BYTES, p, n, NULL, 0);
}

struct kvr__sum {
    uint8_t header[KVR__CHUNK_HEADER];
    const uint8_t *data;
    uint64_t len, count;
    unsigned kind, dlen;
    uint8_t *digests; /* count * dlen */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t ready, next; /* leaves present; next leaf to hash */
    bool stop;
    unsigned helpers;
    pthread_t tid[KVR__HASH_THREADS];
};

static unsigned sum_kind(const uint8_t header[KVR__CHUNK_HEADER])
{
    return (unsigned)kvr__get_le(header + 12, 4);
}

static void hash_leaf(kvr__sum_t *s, uint64_t i)
{
    uint64_t at = i * KVR__LEAF;
    uint64_t n = s->len - at < KVR__LEAF ? s->len - at : KVR__LEAF;
    leaf_sum(s->kind, s->data + at, n, s->digests + i * s->dlen);
}

/* The next leaf to hash, or count when none: with wait, sleeps until one
 * is present (kvr__sum_ready, kvr__sum_finish and kvr__sum_abort wake it). */
static uint64_t claim(kvr__sum_t *s, bool wait)
{
    pthread_mutex_lock(&s->mu);
    while (wait && !s->stop && s->next >= s->ready && s->next < s->count)
        pthread_cond_wait(&s->cv, &s->mu);
    uint64_t i = s->count;
    if (!s->stop && s->next < s->ready)
        i = s->next++;
    pthread_mutex_unlock(&s->mu);
    return i;
}

static void *helper(void *arg)
{
    kvr__sum_t *s = arg;
    for (uint64_t i; (i = claim(s, true)) < s->count;)
        hash_leaf(s, i);
    return NULL;
}

static unsigned hash_threads(uint64_t count)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t t = cpus < 1 ? 1 : (uint64_t)cpus;
    t = t > KVR__HASH_THREADS ? KVR__HASH_THREADS : t;
    return (unsigned)(t < count ? t : count);
}

static kvr__sum_t *sum_new(const uint8_t header[KVR__CHUNK_HEADER],
                           const void *data, uint64_t len, bool present,
                           unsigned callers, unsigned most)
{
    uint64_t count = len == 0 ? 1 : (len + KVR__LEAF - 1) / KVR__LEAF;
    unsigned kind = sum_kind(header), dlen = digest_bytes(kind);
    kvr__sum_t *s = calloc(1, sizeof *s + count * dlen);
    if (s == NULL)
        return NULL;
    memcpy(s->header, header, KVR__CHUNK_HEADER);
    s->data = data;
    s->len = len;
    s->count = count;
    s->kind = kind;
    s->dlen = dlen;
    s->digests = (uint8_t *)(s + 1);
    s->ready = present ? count : 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (unsigned t = callers; t < hash_threads(count) && s->helpers < most;
         t++) {
        if (pthread_create(&s->tid[s->helpers], NULL, helper, s) != 0)
            break; /* fewer threads: the same result, later */
        s->helpers++;
    }
    return s;
}

kvr__sum_t *kvr__sum_start(const uint8_t header[KVR__CHUNK_HEADER],
                           const void *data, uint64_t len, bool present)
{
    /* the calling thread hashes too (kvr__sum_step, kvr__sum_finish) */
    return sum_new(header, data, len, present, 1, KVR__HASH_THREADS);
}

kvr__sum_t *kvr__sum_start_apart(const uint8_t header[KVR__CHUNK_HEADER],
                                 const void *data, uint64_t len)
{
    /* a load's small chunks are read ahead and hashed several at once
     * (store.c): one helper each keeps the hash threads near the number of
     * cores, so that the chunk the load waits for is not slowed by the
     * leaves of chunks queued after it (two per chunk measured slower:
     * docs/store.md); a large chunk gets one per CPU */
    return sum_new(header, data, len, false, 0,
                   len <= KVR__AHEAD_SMALL ? 1 : KVR__HASH_THREADS);
}

void kvr__sum_ready(kvr__sum_t *s, uint64_t bytes)
{
    uint64_t leaves = bytes >= s->len ? s->count : bytes / KVR__LEAF;
    pthread_mutex_lock(&s->mu);
    if (leaves > s->ready) {
        s->ready = leaves;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

bool kvr__sum_step(kvr__sum_t *s)
{
    uint64_t i = claim(s, false);
    if (i >= s->count)
        return false;
    hash_leaf(s, i);
    return true;
}

static void sum_end(kvr__sum_t *s)
{
    for (unsigned t = 0; t < s->helpers; t++)
        pthread_join(s->tid[t], NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

void kvr__sum_finish(kvr__sum_t *s, uint8_t out[KVR_STORE_SUM_BYTES])
{
    kvr__sum_ready(s, s->len);
    while (kvr__sum_step(s))
        ;
    sum_end(s);
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, KVR_STORE_SUM_BYTES);
    crypto_generichash_update(&h, s->header, KVR__CHUNK_HEADER);
    crypto_generichash_update(&h, s->digests, s->count * s->dlen);
    crypto_generichash_final(&h, out, KVR_STORE_SUM_BYTES);
    free(s);
}

void kvr__sum_abort(kvr__sum_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    sum_end(s);
    free(s);
}

void kvr__chunk_sum(const uint8_t header[KVR__CHUNK_HEADER], const void *data,
                    uint64_t len, uint8_t out[KVR_STORE_SUM_BYTES])
{
    kvr__sum_t *s = kvr__sum_start(header, data, len, true);
    if (s != NULL) {
        kvr__sum_finish(s, out);
        return;
    }
    /* no memory for the leaf list: the same result, leaf by leaf */
    unsigned kind = sum_kind(header);
    uint64_t count = len == 0 ? 1 : (len + KVR__LEAF - 1) / KVR__LEAF;
    uint8_t one[64];
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, KVR_STORE_SUM_BYTES);
    crypto_generichash_update(&h, header, KVR__CHUNK_HEADER);
    for (uint64_t i = 0; i < count; i++) {
        uint64_t at = i * KVR__LEAF;
        uint64_t n = len - at < KVR__LEAF ? len - at : KVR__LEAF;
        leaf_sum(kind, (const uint8_t *)data + at, n, one);
        crypto_generichash_update(&h, one, digest_bytes(kind));
    }
    crypto_generichash_final(&h, out, KVR_STORE_SUM_BYTES);
}
