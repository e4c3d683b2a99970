/* Send/save pairing on the producer's PP head (docs/design.md §8): a finished
 * send whose request has a save in flight is held until that save
 * completes, in either arrival order, because the save still reads the
 * request's blocks. Saves are never held. A released SEND is the signal
 * that the blocks may be freed. */
#include <stdlib.h>
#include <string.h>

#include "book.h"

typedef enum { SAVE_DECLARED = 1, SAVE_EARLY = 2 } save_state_t;

/* One save of a request: declared and not finished, or finished before
 * anyone declared it (so a late declaration matches it). */
typedef struct save_ref {
    uint64_t gen;
    bool is_op;
    uint8_t state;
} save_ref_t;

typedef struct record {
    kvr__key_t *key;  /* the bare request id */
    kvr__key_t *send; /* held send id, or NULL */
    kvr_status_t send_status;
    uint32_t nsaves;
    save_ref_t saves[KVR_PAIRING_MAX_SAVES];
} record_t;

struct kvr_pairing {
    kvr_pairing_params_t prm;
    uint8_t hkey[KVR__HKEY_BYTES];
    kvr__table_t reqs;     /* request key -> record_t */
    kvr__tombs_t released; /* requests whose send was released */
    kvr_release_t *events; /* FIFO ring */
    size_t ev_alloc, ev_head, ev_count;
};

static kvr_status_t check_params(const kvr_pairing_params_t *p,
                                 kvr_error_t *err)
{
    if (p == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "pairing params are NULL");
    kvr_status_t s = kvr__check_size("max_requests", p->max_requests, err);
    if (s == KVR_OK)
        s = kvr__check_size("max_events", p->max_events, err);
    if (s == KVR_OK)
        s = kvr__check_size("tombstones", p->tombstones, err);
    if (s == KVR_OK && p->max_events < 2)
        s = kvr_error_set(err, KVR_ERR_INVALID,
                          "max_events %zu < 2 (a save can release two)",
                          p->max_events);
    return s;
}

kvr_status_t kvr_pairing_create(const kvr_pairing_params_t *params,
                                kvr_pairing_t **out, kvr_error_t *err)
{
    kvr_status_t s = check_params(params, err);
    if (s != KVR_OK)
        return s;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    kvr_pairing_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for pairing");
    if ((s = kvr__hkey_init(p->hkey, err)) != KVR_OK) {
        free(p);
        return s;
    }
    p->prm = *params;
    kvr__table_init(&p->reqs, params->max_requests);
    kvr__tombs_init(&p->released, params->tombstones);
    *out = p;
    return KVR_OK;
}

static void record_free(record_t *r)
{
    if (r == NULL)
        return;
    free(r->key);
    free(r->send);
    free(r);
}

void kvr_pairing_destroy(kvr_pairing_t *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->reqs.nslots; i++)
        record_free(p->reqs.slots[i].val);
    kvr__table_fini(&p->reqs);
    kvr__tombs_fini(&p->released);
    free(p->events);
    free(p);
}

/* ---- event queue ---- */

static kvr_status_t events_reserve(kvr_pairing_t *p, size_t n,
                                   const kvr__view_t *v, kvr_error_t *err)
{
    if (p->ev_count + n > p->prm.max_events)
        return kvr__fail_full(err, "releasing", v, "max_events unpolled",
                              p->prm.max_events);
    if (p->ev_count + n <= p->ev_alloc)
        return KVR_OK;
    size_t cap = p->ev_alloc ? 2 * p->ev_alloc : 16;
    cap = cap < p->prm.max_events ? cap : p->prm.max_events;
    kvr_release_t *ev = malloc(cap * sizeof(*ev));
    if (ev == NULL)
        return kvr__fail_nomem(err, "releasing", v);
    for (size_t i = 0; i < p->ev_count; i++)
        ev[i] = p->events[(p->ev_head + i) % p->ev_alloc];
    free(p->events);
    p->events = ev;
    p->ev_alloc = cap;
    p->ev_head = 0;
    return KVR_OK;
}

static void events_push(kvr_pairing_t *p, kvr_release_kind_t kind,
                        kvr_status_t status, const kvr__view_t *v)
{
    kvr_release_t *e = &p->events[(p->ev_head + p->ev_count) % p->ev_alloc];
    e->kind = kind;
    e->status = status;
    e->is_op = v->is_op;
    e->generation = (int64_t)v->gen;
    e->req_id_len = v->len;
    memcpy(e->req_id, v->bytes, v->len);
    p->ev_count++;
}

kvr_status_t kvr_pairing_poll(kvr_pairing_t *p, kvr_release_t *out, size_t cap,
                              size_t *num, kvr_error_t *err)
{
    if (p == NULL || num == NULL || (cap > 0 && out == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "pairing, out (cap %zu) or num is NULL", cap);
    size_t n = p->ev_count < cap ? p->ev_count : cap;
    for (size_t i = 0; i < n; i++)
        out[i] = p->events[(p->ev_head + i) % p->ev_alloc];
    if (n > 0)
        p->ev_head = (p->ev_head + n) % p->ev_alloc;
    p->ev_count -= n;
    *num = n;
    return KVR_OK;
}

/* ---- request records ---- */

static save_ref_t *save_find(record_t *r, const kvr__view_t *v)
{
    for (uint32_t i = 0; r != NULL && i < r->nsaves; i++)
        if (r->saves[i].is_op == v->is_op && r->saves[i].gen == v->gen)
            return &r->saves[i];
    return NULL;
}

static void save_remove(record_t *r, save_ref_t *ref)
{
    *ref = r->saves[--r->nsaves];
}

static uint32_t declared(const record_t *r)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->nsaves; i++)
        n += r->saves[i].state == SAVE_DECLARED;
    return n;
}

static kvr_status_t save_add(record_t *r, const kvr__view_t *v,
                             save_state_t state, kvr_error_t *err)
{
    if (r->nsaves == KVR_PAIRING_MAX_SAVES)
        return kvr__fail_full(err, "save", v, "saves per request",
                              (size_t)KVR_PAIRING_MAX_SAVES);
    r->saves[r->nsaves++] = (save_ref_t){v->gen, v->is_op, (uint8_t)state};
    return KVR_OK;
}

static record_t *record_find(const kvr_pairing_t *p, const kvr__view_t *rv)
{
    kvr__slot_t *slot = kvr__table_find(&p->reqs, rv);
    return slot != NULL ? slot->val : NULL;
}

/* Finds or creates rv's record; nothing changes on failure. */
static kvr_status_t record_get(kvr_pairing_t *p, const kvr__view_t *rv,
                               record_t **out, kvr_error_t *err)
{
    if ((*out = record_find(p, rv)) != NULL)
        return KVR_OK;
    kvr_status_t s = kvr__table_reserve(&p->reqs);
    if (s == KVR_ERR_TABLE_FULL)
        return kvr__fail_full(err, "tracking request", rv, "max_requests",
                              p->prm.max_requests);
    record_t *r = s == KVR_OK ? calloc(1, sizeof(*r)) : NULL;
    if (r == NULL || (r->key = kvr__key_new(rv)) == NULL) {
        free(r);
        return kvr__fail_nomem(err, "tracking request", rv);
    }
    kvr__table_insert(&p->reqs, r->key, r);
    *out = r;
    return KVR_OK;
}

/* Removes r from the table; returns its key (for the tombstones). */
static kvr__key_t *record_drop(kvr_pairing_t *p, record_t *r)
{
    kvr__view_t rv = kvr__view_of_key(r->key);
    kvr__key_t *key = r->key;
    kvr__table_remove(&p->reqs, kvr__table_find(&p->reqs, &rv));
    r->key = NULL;
    record_free(r);
    return key;
}

static void record_drop_if_idle(kvr_pairing_t *p, record_t *r)
{
    if (r->nsaves == 0 && r->send == NULL)
        free(record_drop(p, r));
}

/* ---- feeding ---- */

static kvr_status_t views(const kvr_pairing_t *p, const kvr_completion_id_t *id,
                          kvr__view_t *v, kvr__view_t *rv, kvr_error_t *err)
{
    if (p == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "pairing is NULL");
    kvr_status_t s = kvr__view_of(id, p->hkey, v, err);
    if (s == KVR_OK)
        *rv = kvr__view_req(v, p->hkey);
    return s;
}

static void set_outcome(kvr_pair_outcome_t *out, kvr_pair_outcome_t value)
{
    if (out != NULL)
        *out = value;
}

kvr_status_t kvr_pairing_expect_save(kvr_pairing_t *p,
                                     const kvr_completion_id_t *save,
                                     kvr_error_t *err)
{
    kvr__view_t v, rv;
    record_t *r;
    kvr_status_t s = views(p, save, &v, &rv, err);
    if (s != KVR_OK)
        return s;
    if (kvr__tombs_has(&p->released, &rv)) {
        char repr[KVR__REPR_MAX];
        kvr__view_repr(&rv, repr);
        return kvr_error_set(err, KVR_ERR_EXISTS,
                             "request %s: its send was already released, "
                             "its blocks may be freed",
                             repr);
    }
    r = record_find(p, &rv);
    save_ref_t *ref = save_find(r, &v);
    if (ref != NULL && ref->state == SAVE_DECLARED)
        return KVR_OK;
    if (ref != NULL) { /* it finished first: matched, nothing to wait for */
        save_remove(r, ref);
        record_drop_if_idle(p, r);
        return KVR_OK;
    }
    if ((s = record_get(p, &rv, &r, err)) != KVR_OK)
        return s;
    if ((s = save_add(r, &v, SAVE_DECLARED, err)) != KVR_OK)
        record_drop_if_idle(p, r);
    return s;
}

/* Reserves what releasing a send takes: n events and a tombstone for the
 * request, keyed by r's key or, without a record, by *fresh. */
static kvr_status_t reserve_release(kvr_pairing_t *p, const record_t *r,
                                    const kvr__view_t *rv, size_t n,
                                    kvr__key_t **fresh, kvr_error_t *err)
{
    kvr_status_t s = events_reserve(p, n, rv, err);
    if (s != KVR_OK)
        return s;
    *fresh = NULL;
    if (kvr__tombs_reserve(&p->released) != KVR_OK ||
        (r == NULL && (*fresh = kvr__key_new(rv)) == NULL))
        return kvr__fail_nomem(err, "releasing", rv);
    return KVR_OK;
}

/* The request's send is out: forget the record, remember the request. */
static void tombstone(kvr_pairing_t *p, record_t *r, kvr__key_t *fresh)
{
    kvr__tombs_add(&p->released, r != NULL ? record_drop(p, r) : fresh);
}

kvr_status_t kvr_pairing_send_done(kvr_pairing_t *p,
                                   const kvr_completion_id_t *send,
                                   kvr_status_t status,
                                   kvr_pair_outcome_t *outcome,
                                   kvr_error_t *err)
{
    kvr__view_t v, rv;
    kvr__key_t *fresh;
    kvr_status_t s = views(p, send, &v, &rv, err);
    if (s != KVR_OK)
        return s;
    record_t *r = record_find(p, &rv);
    if (kvr__tombs_has(&p->released, &rv) || (r != NULL && r->send != NULL)) {
        set_outcome(outcome, KVR_PAIR_DUPLICATE);
        return KVR_OK;
    }
    if (r != NULL && declared(r) > 0) {
        if ((r->send = kvr__key_new(&v)) == NULL)
            return kvr__fail_nomem(err, "holding send", &v);
        r->send_status = status;
        set_outcome(outcome, KVR_PAIR_HELD);
        return KVR_OK;
    }
    if ((s = reserve_release(p, r, &rv, 1, &fresh, err)) != KVR_OK)
        return s;
    events_push(p, KVR_RELEASE_SEND, status, &v);
    tombstone(p, r, fresh);
    set_outcome(outcome, KVR_PAIR_RELEASED);
    return KVR_OK;
}

/* The last declared save of a request whose send is held: both go out. */
static kvr_status_t release_pair(kvr_pairing_t *p, record_t *r, save_ref_t *ref,
                                 const kvr__view_t *v, kvr_status_t status,
                                 kvr_error_t *err)
{
    kvr__key_t *fresh;
    kvr__view_t rv = kvr__view_of_key(r->key);
    kvr_status_t s = reserve_release(p, r, &rv, 2, &fresh, err);
    if (s != KVR_OK)
        return s;
    kvr__view_t send = kvr__view_of_key(r->send);
    events_push(p, KVR_RELEASE_SAVE, status, v);
    events_push(p, KVR_RELEASE_SEND, r->send_status, &send);
    save_remove(r, ref);
    tombstone(p, r, fresh);
    return KVR_OK;
}

/* A save nobody declared yet: remembered so a late declaration matches. */
static kvr_status_t save_early(kvr_pairing_t *p, const kvr__view_t *v,
                               const kvr__view_t *rv, kvr_error_t *err)
{
    record_t *r;
    kvr_status_t s = record_get(p, rv, &r, err);
    if (s == KVR_OK && (s = save_add(r, v, SAVE_EARLY, err)) != KVR_OK)
        record_drop_if_idle(p, r);
    return s;
}

/* Queues a SAVE alone: no held send waits on it (or others still do). */
static kvr_status_t release_save(kvr_pairing_t *p, record_t *r, save_ref_t *ref,
                                 const kvr__view_t *v, const kvr__view_t *rv,
                                 kvr_status_t status, kvr_error_t *err)
{
    kvr_status_t s = events_reserve(p, 1, v, err);
    if (s != KVR_OK)
        return s;
    if (ref != NULL) {
        save_remove(r, ref);
        record_drop_if_idle(p, r);
    } else if (!kvr__tombs_has(&p->released, rv) &&
               (s = save_early(p, v, rv, err)) != KVR_OK) {
        return s;
    }
    events_push(p, KVR_RELEASE_SAVE, status, v);
    return KVR_OK;
}

kvr_status_t kvr_pairing_save_done(kvr_pairing_t *p,
                                   const kvr_completion_id_t *save,
                                   kvr_status_t status,
                                   kvr_pair_outcome_t *outcome,
                                   kvr_error_t *err)
{
    kvr__view_t v, rv;
    kvr_status_t s = views(p, save, &v, &rv, err);
    if (s != KVR_OK)
        return s;
    record_t *r = record_find(p, &rv);
    save_ref_t *ref = save_find(r, &v);
    if (ref != NULL && ref->state == SAVE_EARLY) {
        set_outcome(outcome, KVR_PAIR_DUPLICATE);
        return KVR_OK;
    }
    if (ref != NULL && r->send != NULL && declared(r) == 1)
        s = release_pair(p, r, ref, &v, status, err);
    else
        s = release_save(p, r, ref, &v, &rv, status, err);
    if (s == KVR_OK)
        set_outcome(outcome, KVR_PAIR_RELEASED);
    return s;
}

kvr_status_t kvr_pairing_forget(kvr_pairing_t *p, const kvr_completion_id_t *id,
                                kvr_error_t *err)
{
    kvr__view_t v, rv;
    kvr_status_t s = views(p, id, &v, &rv, err);
    if (s != KVR_OK)
        return s;
    record_t *r = record_find(p, &rv);
    if (r != NULL)
        free(record_drop(p, r));
    kvr__tombs_remove(&p->released, &rv);
    return KVR_OK;
}

size_t kvr_pairing_num_requests(const kvr_pairing_t *p)
{
    return p != NULL ? p->reqs.count : 0;
}

size_t kvr_pairing_num_events(const kvr_pairing_t *p)
{
    return p != NULL ? p->ev_count : 0;
}
