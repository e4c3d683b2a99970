/* TP/PP quorum (docs/design.md §8): a key completes once every member reported;
 * any failure wins; finished keys are tombstoned so late duplicates are
 * ignored. The same object serves TP workers and PP stages: a PP load
 * failure is therefore emitted only once every stage answered. */
#include <stdlib.h>
#include <string.h>

#include "book.h"

typedef struct entry {
    kvr__key_t *key;
    kvr_status_t status; /* first failure, or KVR_OK */
    uint32_t reported;
    uint64_t seen[]; /* one bit per member */
} entry_t;

struct kvr_quorum {
    kvr_quorum_params_t prm;
    size_t words; /* of entry_t.seen */
    uint8_t hkey[KVR__HKEY_BYTES];
    kvr__table_t pending; /* key -> entry_t */
    kvr__tombs_t tombs;
};

static kvr_status_t check_params(const kvr_quorum_params_t *p, kvr_error_t *err)
{
    if (p == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "quorum params are NULL");
    if (p->members < 1 || p->members > KVR_QUORUM_MAX_MEMBERS)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "quorum members %u outside 1..%u", p->members,
                             KVR_QUORUM_MAX_MEMBERS);
    kvr_status_t s = kvr__check_size("max_pending", p->max_pending, err);
    if (s != KVR_OK)
        return s;
    return kvr__check_size("tombstones", p->tombstones, err);
}

kvr_status_t kvr_quorum_create(const kvr_quorum_params_t *params,
                               kvr_quorum_t **out, kvr_error_t *err)
{
    kvr_status_t s = check_params(params, err);
    if (s != KVR_OK)
        return s;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    kvr_quorum_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for quorum");
    s = kvr__hkey_init(q->hkey, err);
    if (s != KVR_OK) {
        free(q);
        return s;
    }
    q->prm = *params;
    q->words = (params->members + 63) / 64;
    kvr__table_init(&q->pending, params->max_pending);
    kvr__tombs_init(&q->tombs, params->tombstones);
    *out = q;
    return KVR_OK;
}

static void entry_free(entry_t *e)
{
    if (e != NULL)
        free(e->key);
    free(e);
}

void kvr_quorum_destroy(kvr_quorum_t *q)
{
    if (q == NULL)
        return;
    for (size_t i = 0; i < q->pending.nslots; i++)
        entry_free(q->pending.slots[i].val);
    kvr__table_fini(&q->pending);
    kvr__tombs_fini(&q->tombs);
    free(q);
}

static bool tombstoned_kind(const kvr_quorum_t *q, const kvr__view_t *v)
{
    return v->is_op || q->prm.tombstone_requests;
}

/* Tracks a new key with no reports yet; nothing changes on failure. */
static kvr_status_t entry_new(kvr_quorum_t *q, const kvr__view_t *v,
                              entry_t **out, kvr_error_t *err)
{
    kvr_status_t s = kvr__table_reserve(&q->pending);
    if (s == KVR_ERR_TABLE_FULL)
        return kvr__fail_full(err, "tracking", v, "max_pending",
                              q->prm.max_pending);
    entry_t *e = NULL;
    if (s == KVR_OK)
        e = calloc(1, sizeof(*e) + q->words * sizeof(uint64_t));
    kvr__key_t *key = e != NULL ? kvr__key_new(v) : NULL;
    if (key == NULL) {
        free(e);
        return kvr__fail_nomem(err, "tracking", v);
    }
    e->key = key;
    kvr__table_insert(&q->pending, key, e);
    *out = e;
    return KVR_OK;
}

static void fill(kvr_quorum_result_t *res, kvr_quorum_outcome_t outcome,
                 kvr_status_t status, uint32_t reported)
{
    if (res == NULL)
        return;
    res->outcome = outcome;
    res->status = status;
    res->reported = reported;
}

static bool seen(const entry_t *e, uint32_t member)
{
    return e != NULL && (e->seen[member / 64] & (1ull << (member % 64)));
}

/* The report that completes v (slot: its pending entry, if any). All
 * allocation comes first, so a failure leaves every table as it was. */
static kvr_status_t complete(kvr_quorum_t *q, kvr__slot_t *slot,
                             const kvr__view_t *v, kvr_status_t status,
                             kvr_quorum_result_t *res, kvr_error_t *err)
{
    entry_t *e = slot != NULL ? slot->val : NULL;
    kvr__key_t *key = e != NULL ? e->key : NULL;
    bool tomb = tombstoned_kind(q, v);
    if (tomb && (kvr__tombs_reserve(&q->tombs) != KVR_OK ||
                 (key == NULL && (key = kvr__key_new(v)) == NULL)))
        return kvr__fail_nomem(err, "finishing", v);
    kvr_status_t final = (e != NULL && e->status != KVR_OK) ? e->status
                                                            : status;
    if (e != NULL)
        kvr__table_remove(&q->pending, slot);
    if (tomb)
        kvr__tombs_add(&q->tombs, key);
    else
        free(key);
    free(e);
    fill(res, KVR_QUORUM_DONE, final, q->prm.members);
    return KVR_OK;
}

static kvr_status_t check_report(const kvr_quorum_t *q, uint32_t member,
                                 kvr_error_t *err)
{
    if (q == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "quorum is NULL");
    if (member >= q->prm.members)
        return kvr_error_set(err, KVR_ERR_INVALID, "member %u outside 0..%u",
                             member, q->prm.members - 1);
    return KVR_OK;
}

kvr_status_t kvr_quorum_report(kvr_quorum_t *q, const kvr_completion_id_t *id,
                               uint32_t member, kvr_status_t status,
                               kvr_quorum_result_t *result, kvr_error_t *err)
{
    kvr__view_t v;
    kvr_status_t s = check_report(q, member, err);
    if (s == KVR_OK)
        s = kvr__view_of(id, q->hkey, &v, err);
    if (s != KVR_OK)
        return s;
    if (kvr__tombs_has(&q->tombs, &v)) {
        fill(result, KVR_QUORUM_IGNORED, KVR_OK, 0);
        return KVR_OK;
    }
    kvr__slot_t *slot = kvr__table_find(&q->pending, &v);
    entry_t *e = slot != NULL ? slot->val : NULL;
    uint32_t reported = (e != NULL ? e->reported : 0) + !seen(e, member);
    if (reported == q->prm.members)
        return complete(q, slot, &v, status, result, err);
    if (e == NULL && (s = entry_new(q, &v, &e, err)) != KVR_OK)
        return s;
    e->seen[member / 64] |= 1ull << (member % 64);
    e->reported = reported;
    if (status != KVR_OK && e->status == KVR_OK)
        e->status = status; /* failure dominates; the first one is kept */
    fill(result, KVR_QUORUM_PENDING, e->status, reported);
    return KVR_OK;
}

static kvr_status_t by_id(kvr_quorum_t *q, const kvr_completion_id_t *id,
                          kvr__view_t *v, kvr_error_t *err)
{
    if (q == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "quorum is NULL");
    return kvr__view_of(id, q->hkey, v, err);
}

/* Drops v's partial reports; returns the entry's key for reuse, or NULL. */
static kvr__key_t *drop_pending(kvr_quorum_t *q, const kvr__view_t *v)
{
    kvr__slot_t *slot = kvr__table_find(&q->pending, v);
    if (slot == NULL)
        return NULL;
    entry_t *e = slot->val;
    kvr__key_t *key = e->key;
    kvr__table_remove(&q->pending, slot);
    free(e);
    return key;
}

kvr_status_t kvr_quorum_cancel(kvr_quorum_t *q, const kvr_completion_id_t *id,
                               kvr_error_t *err)
{
    kvr__view_t v;
    kvr_status_t s = by_id(q, id, &v, err);
    if (s != KVR_OK)
        return s;
    bool tomb = tombstoned_kind(q, &v) && !kvr__tombs_has(&q->tombs, &v);
    kvr__key_t *fresh = NULL;
    if (tomb && (kvr__tombs_reserve(&q->tombs) != KVR_OK ||
                 (fresh = kvr__key_new(&v)) == NULL))
        return kvr__fail_nomem(err, "canceling", &v);
    free(drop_pending(q, &v));
    if (tomb)
        kvr__tombs_add(&q->tombs, fresh);
    return KVR_OK;
}

kvr_status_t kvr_quorum_forget(kvr_quorum_t *q, const kvr_completion_id_t *id,
                               kvr_error_t *err)
{
    kvr__view_t v;
    kvr_status_t s = by_id(q, id, &v, err);
    if (s != KVR_OK)
        return s;
    free(drop_pending(q, &v));
    kvr__tombs_remove(&q->tombs, &v);
    return KVR_OK;
}

size_t kvr_quorum_num_pending(const kvr_quorum_t *q)
{
    return q != NULL ? q->pending.count : 0;
}

size_t kvr_quorum_num_tombstones(const kvr_quorum_t *q)
{
    return q != NULL ? q->tombs.set.count : 0;
}
