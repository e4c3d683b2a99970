/* Bounded tables for the bookkeeping: an open-addressing map from ids to
 * values and a FIFO tombstone set on top of it. Every allocation happens in
 * a reserve step so that the mutation after it cannot fail. */
#include <stdlib.h>
#include <string.h>

#include "book.h"

void kvr__table_init(kvr__table_t *t, size_t max_count)
{
    memset(t, 0, sizeof(*t));
    t->max_count = max_count;
}

void kvr__table_fini(kvr__table_t *t)
{
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static void place(kvr__slot_t *slots, size_t nslots, kvr__key_t *key, void *val)
{
    size_t i = (size_t)key->hash & (nslots - 1);
    while (slots[i].key != NULL)
        i = (i + 1) & (nslots - 1);
    slots[i].key = key;
    slots[i].val = val;
}

kvr_status_t kvr__table_reserve(kvr__table_t *t)
{
    if (t->count >= t->max_count)
        return KVR_ERR_TABLE_FULL;
    /* keep the load factor at or under 1/2 so probes stay short */
    if (2 * (t->count + 1) <= t->nslots)
        return KVR_OK;
    size_t n = t->nslots ? 2 * t->nslots : 16;
    kvr__slot_t *slots = calloc(n, sizeof(*slots));
    if (slots == NULL)
        return KVR_ERR_NO_MEMORY;
    for (size_t i = 0; i < t->nslots; i++)
        if (t->slots[i].key != NULL)
            place(slots, n, t->slots[i].key, t->slots[i].val);
    free(t->slots);
    t->slots = slots;
    t->nslots = n;
    return KVR_OK;
}

void kvr__table_insert(kvr__table_t *t, kvr__key_t *key, void *val)
{
    place(t->slots, t->nslots, key, val);
    t->count++;
}

kvr__slot_t *kvr__table_find(const kvr__table_t *t, const kvr__view_t *v)
{
    if (t->count == 0)
        return NULL;
    size_t mask = t->nslots - 1;
    for (size_t i = (size_t)v->hash & mask;; i = (i + 1) & mask) {
        kvr__slot_t *s = &t->slots[i];
        if (s->key == NULL)
            return NULL;
        if (kvr__key_eq(s->key, v))
            return s;
    }
}

/* Whether home position h lies cyclically in (gap, j]: then the entry at j
 * must stay behind the gap. */
static bool stays(size_t h, size_t gap, size_t j)
{
    return gap <= j ? (gap < h && h <= j) : (gap < h || h <= j);
}

void kvr__table_remove(kvr__table_t *t, kvr__slot_t *slot)
{
    size_t mask = t->nslots - 1;
    size_t gap = (size_t)(slot - t->slots);
    for (size_t j = (gap + 1) & mask; t->slots[j].key != NULL;
         j = (j + 1) & mask) {
        if (stays((size_t)t->slots[j].key->hash & mask, gap, j))
            continue;
        t->slots[gap] = t->slots[j];
        gap = j;
    }
    t->slots[gap].key = NULL;
    t->slots[gap].val = NULL;
    t->count--;
}

void kvr__tombs_init(kvr__tombs_t *t, size_t cap)
{
    memset(t, 0, sizeof(*t));
    kvr__table_init(&t->set, cap);
    t->cap = cap;
}

void kvr__tombs_fini(kvr__tombs_t *t)
{
    for (size_t i = 0; i < t->used; i++)
        free(t->ring[(t->head + i) % t->cap]);
    free(t->ring);
    kvr__table_fini(&t->set);
    memset(t, 0, sizeof(*t));
}

bool kvr__tombs_has(const kvr__tombs_t *t, const kvr__view_t *v)
{
    return kvr__table_find(&t->set, v) != NULL;
}

kvr_status_t kvr__tombs_reserve(kvr__tombs_t *t)
{
    /* The ring only grows before it first fills, so head is still 0 and
     * realloc keeps the FIFO order. */
    if (t->used == t->ring_alloc && t->ring_alloc < t->cap) {
        size_t n = t->ring_alloc ? 2 * t->ring_alloc : 16;
        n = n < t->cap ? n : t->cap;
        kvr__key_t **ring = realloc(t->ring, n * sizeof(*ring));
        if (ring == NULL)
            return KVR_ERR_NO_MEMORY;
        t->ring = ring;
        t->ring_alloc = n;
    }
    /* at cap, add evicts before inserting, so the set does not grow */
    if (t->set.count < t->cap)
        return kvr__table_reserve(&t->set);
    return KVR_OK;
}

static void evict_oldest(kvr__tombs_t *t)
{
    kvr__key_t *old = t->ring[t->head];
    if (old != NULL) {
        kvr__view_t v = kvr__view_of_key(old);
        kvr__table_remove(&t->set, kvr__table_find(&t->set, &v));
        free(old);
    }
    t->head = (t->head + 1) % t->cap;
    t->used--;
}

void kvr__tombs_add(kvr__tombs_t *t, kvr__key_t *key)
{
    if (t->used == t->cap)
        evict_oldest(t);
    size_t pos = (t->head + t->used) % t->cap;
    t->ring[pos] = key;
    t->used++;
    kvr__table_insert(&t->set, key, (void *)(uintptr_t)pos);
}

bool kvr__tombs_remove(kvr__tombs_t *t, const kvr__view_t *v)
{
    kvr__slot_t *s = kvr__table_find(&t->set, v);
    if (s == NULL)
        return false;
    size_t pos = (size_t)(uintptr_t)s->val;
    free(t->ring[pos]);
    t->ring[pos] = NULL;
    kvr__table_remove(&t->set, s);
    return true;
}
