/* The latest generation of each request (docs/store.md "Generations"): a
 * bounded table over the conn layer's keyed hash table, keyed by the bare
 * request id. Not thread-safe: the connector's lock guards it. */
#include <stdint.h>
#include <stdlib.h>

#include "store_internal.h"

kvr_status_t kvr__gens_init(kvr__gens_t *g, size_t max, kvr_error_t *err)
{
    kvr__table_init(&g->t, max);
    return kvr__hkey_init(g->hkey, err);
}

static void drop_slot(kvr__gens_t *g, kvr__slot_t *slot)
{
    kvr__key_t *key = slot->key;
    kvr__table_remove(&g->t, slot);
    free(key);
}

void kvr__gens_fini(kvr__gens_t *g)
{
    for (size_t i = 0; i < g->t.nslots; i++)
        free(g->t.slots[i].key);
    kvr__table_fini(&g->t);
}

static kvr__slot_t *slot_of(const kvr__gens_t *g, const void *id, size_t len,
                            kvr__view_t *v)
{
    kvr_completion_id_t req = kvr_completion_req(id, len);
    if (kvr__view_of(&req, g->hkey, v, NULL) != KVR_OK)
        return NULL;
    return kvr__table_find(&g->t, v);
}

int64_t kvr__gens_latest(const kvr__gens_t *g, const void *id, size_t len)
{
    kvr__view_t v;
    kvr__slot_t *slot = slot_of(g, id, len, &v);
    return slot != NULL ? (int64_t)(uintptr_t)slot->val : -1;
}

kvr_status_t kvr__gens_set(kvr__gens_t *g, const void *id, size_t len,
                           int64_t gen, kvr_error_t *err)
{
    kvr__view_t v;
    kvr__slot_t *slot = slot_of(g, id, len, &v);
    if (slot != NULL) {
        slot->val = (void *)(uintptr_t)gen;
        return KVR_OK;
    }
    kvr_status_t s = kvr__table_reserve(&g->t);
    if (s == KVR_ERR_TABLE_FULL)
        return kvr__fail_full(err, "generation of request", &v, "requests",
                              g->t.max_count);
    kvr__key_t *key = s == KVR_OK ? kvr__key_new(&v) : NULL;
    if (key == NULL)
        return kvr__fail_nomem(err, "generation of request", &v);
    kvr__table_insert(&g->t, key, (void *)(uintptr_t)gen);
    return KVR_OK;
}

void kvr__gens_drop(kvr__gens_t *g, const void *id, size_t len)
{
    kvr__view_t v;
    kvr__slot_t *slot = slot_of(g, id, len, &v);
    if (slot != NULL)
        drop_slot(g, slot);
}
