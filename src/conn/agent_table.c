/* A small chained hash map over byte keys (requests by key, the status
 * snapshot), and the flattened request key. */
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "agent_internal.h"

void kvr__key_make(kvr__key_t *k, uint8_t side, const kvr_wire_id_t *producer,
                   const kvr_wire_id_t *request)
{
    uint16_t pl = producer ? producer->len : 0;
    k->b[0] = side;
    k->b[1] = (uint8_t)pl;
    memcpy(k->b + 2, producer ? producer->bytes : k->b, pl);
    size_t at = 2u + pl;
    k->b[at] = (uint8_t)request->len;
    k->b[at + 1] = (uint8_t)(request->len >> 8);
    memcpy(k->b + at + 2, request->bytes, request->len);
    k->len = (uint16_t)(at + 2 + request->len);
}

static uint64_t hash_of(const void *key, size_t klen)
{
    static const uint8_t salt[crypto_shorthash_KEYBYTES] = {0x6b, 0x76, 0x72};
    uint8_t out[crypto_shorthash_BYTES];
    crypto_shorthash(out, key, klen, salt);
    uint64_t h;
    memcpy(&h, out, sizeof(h));
    return h;
}

kvr_status_t kvr__map_init(kvr__map_t *m, size_t nbuckets)
{
    memset(m, 0, sizeof(*m));
    m->buckets = calloc(nbuckets, sizeof(*m->buckets));
    if (m->buckets == NULL)
        return KVR_ERR_NO_MEMORY;
    m->nbuckets = nbuckets;
    return KVR_OK;
}

void kvr__map_free(kvr__map_t *m, void (*free_val)(void *))
{
    for (size_t i = 0; m->buckets && i < m->nbuckets; i++)
        for (kvr__mapent_t *e = m->buckets[i], *n; e != NULL; e = n) {
            n = e->next;
            if (free_val)
                free_val(e->val);
            free(e);
        }
    free(m->buckets);
    memset(m, 0, sizeof(*m));
}

static kvr__mapent_t **slot_of(const kvr__map_t *m, const void *key,
                               size_t klen, uint64_t h)
{
    kvr__mapent_t **pp = &m->buckets[h % m->nbuckets];
    for (; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->hash == h && (*pp)->klen == klen &&
            memcmp((*pp)->key, key, klen) == 0)
            break;
    return pp;
}

void *kvr__map_get(const kvr__map_t *m, const void *key, size_t klen)
{
    kvr__mapent_t *e = *slot_of(m, key, klen, hash_of(key, klen));
    return e ? e->val : NULL;
}

kvr_status_t kvr__map_put(kvr__map_t *m, const void *key, size_t klen,
                          void *val)
{
    uint64_t h = hash_of(key, klen);
    kvr__mapent_t **pp = slot_of(m, key, klen, h);
    if (*pp != NULL) {
        (*pp)->val = val;
        return KVR_OK;
    }
    kvr__mapent_t *e = malloc(sizeof(*e) + klen);
    if (e == NULL)
        return KVR_ERR_NO_MEMORY;
    e->next = NULL;
    e->hash = h;
    e->val = val;
    e->klen = (uint16_t)klen;
    memcpy(e->key, key, klen);
    *pp = e;
    m->count++;
    return KVR_OK;
}

void *kvr__map_del(kvr__map_t *m, const void *key, size_t klen)
{
    kvr__mapent_t **pp = slot_of(m, key, klen, hash_of(key, klen));
    kvr__mapent_t *e = *pp;
    if (e == NULL)
        return NULL;
    void *val = e->val;
    *pp = e->next;
    free(e);
    m->count--;
    return val;
}
