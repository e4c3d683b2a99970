/* The producer side of the agent: a request opened by send_open is pulled
 * by consumer ranks (one WRITE_REQUEST each, a "pull"), served from this
 * stage's own source table in bounded slices once its layers are ready,
 * and ends when every group released it (SENT), its lease ran out
 * (SEND_EXPIRED) or it was aborted or a group failed (SEND_FAILED).
 *
 * preq_step is the one transition function; docs/agent.md has the table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"
#include "base_internal.h"

static uint64_t ms_ns(uint64_t ms)
{
    return ms * 1000000ull;
}

/* ---- answers to the consumer ---- */

static void answer(kvr_agent_t *a, kvr__pull_t *p, kvr_status_t st,
                   const char *text)
{
    kvr_msg_t m;
    kvr_msg_init(&m, st == KVR_OK ? KVR_MSG_WRITE_DONE : KVR_MSG_WRITE_FAILED);
    int copies = 1;
    if (st == KVR_OK) {
        kvr_msg_write_done_t *d = &m.u.write_done;
        d->request_id = p->request;
        d->pp_rank = a->p.topo.pp_rank;
        d->tp_rank = a->p.topo.tp_rank;
        d->write_nonce = p->nonce;
        /* failpoints (docs/failpoints.md): a forged and a doubled answer */
        if (kvr__failpoint(KVR__FP_WRONG_NONCE, p->request.bytes,
                           p->request.len))
            d->write_nonce = p->nonce + 1;
        if (kvr__failpoint(KVR__FP_DUP_DONE, p->request.bytes, p->request.len))
            copies = 2;
        d->bytes = p->bytes;
        d->chunks = p->chunks;
    } else {
        kvr_msg_write_failed_t *f = &m.u.write_failed;
        f->request_id = p->request;
        f->pp_rank = a->p.topo.pp_rank;
        f->tp_rank = a->p.topo.tp_rank;
        f->write_nonce = p->nonce;
        f->status = st;
        snprintf(f->text, sizeof(f->text), "%s", text);
        kvr__agent_log(a, "pull of '%.*s' from %s refused: %s",
                       (int)p->request.len, p->request.bytes,
                       p->link ? p->link->address : "?", text);
    }
    p->state = KVR__PULL_ANSWERED;
    p->ok = st == KVR_OK;
    p->status = st;
    if (text != p->text)
        snprintf(p->text, sizeof(p->text), "%s", text);
    p->release_by_ns = p->deadline_ns + ms_ns(a->p.grace_ms);
    for (int i = 0; i < copies && p->link != NULL; i++)
        if (a->corking)
            kvr__alink_send_corked(a, p->link, &m);
        else
            kvr__alink_send(a, p->link, &m);
}

static void unlist_active(kvr_agent_t *a, kvr__pull_t *p)
{
    for (kvr__pull_t **pp = &a->active; *pp != NULL; pp = &(*pp)->work_next)
        if (*pp == p) {
            *pp = p->work_next;
            break;
        }
    p->work_next = NULL;
}

/* How long a cut waits for the pull's posted puts: past its deadline (a
 * stalled or partitioned peer) a short while, else up to the grace; a
 * flush not done by then closes the link and force-closes its endpoint
 * (kvr__alink_close), so the loop never waits on a silent peer. */
static uint64_t cut_flush_by(const kvr_agent_t *a, const kvr__pull_t *p)
{
    uint64_t now = kvr_now_ns();
    uint64_t grace = ms_ns(a->p.grace_ms),
             brief = ms_ns(KVR_AGENT_CUT_FLUSH_MS);
    if (now >= p->deadline_ns)
        return now + (grace < brief ? grace : brief);
    return now + grace < p->deadline_ns ? p->deadline_ns : now + grace;
}

/* Stops a pull that may have puts posted: after the flush no byte of it
 * can land, so its WRITE_FAILED tells the consumer the truth. */
static void cut(kvr_agent_t *a, kvr__pull_t *p, kvr_status_t st,
                const char *text)
{
    if (p->state == KVR__PULL_MOVING) {
        unlist_active(a, p);
        kvr__gpu_job_free(p->job); /* its kernels end first */
        p->job = NULL;
        kvr_error_t err = {0};
        if (p->link && p->link->data && p->link->state != KVR__LINK_CLOSED &&
            kvr__data_flush(p->link->data, cut_flush_by(a, p), &err) != KVR_OK)
            kvr__alink_close(a, p->link, KVR_ERR_TIMEOUT, "cut off: %s",
                             err.msg);
    }
    if (p->state == KVR__PULL_HELD || p->state == KVR__PULL_MOVING)
        answer(a, p, st, text);
}

static void pull_free(kvr__pull_t *p)
{
    kvr__gpu_job_free(p->job);
    kvr__gpu_runs_free(p->runs); /* stream-ordered after the job */
    kvr__gpu_tables_free(p->tables);
    if (p->link != NULL)
        p->link->users--;
    kvr__pcache_release(p->plans);
    free(p->segs);
    free(p->dst);
    free(p->slots);
    free(p);
}

static void list_active(kvr_agent_t *a, kvr__pull_t *p)
{
    kvr__pull_t **tail = &a->active;
    while (*tail != NULL)
        tail = &(*tail)->work_next;
    *tail = p;
}

/* ---- planning a pull from our own tables ---- */

static kvr_status_t check_counts(const kvr_agent_t *a, const kvr__preq_t *r,
                                 const kvr__pull_t *p, kvr_error_t *err)
{
    uint64_t v = kvr_virtual_block(&a->p.layout), cap;
    if (p->num_tokens > r->num_tokens)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "pull of %llu tokens, the "
                             "request was opened with %llu",
                             (unsigned long long)p->num_tokens,
                             (unsigned long long)r->num_tokens);
    if (__builtin_mul_overflow((uint64_t)p->ndst, v, &cap) ||
        p->num_tokens > cap || p->num_computed > p->ndst)
        return kvr_error_set(err, KVR_ERR_DST_TABLE_SHORT,
                             "%zu destination blocks of %llu tokens cannot "
                             "hold %llu tokens (%llu computed blocks)",
                             p->ndst, (unsigned long long)v,
                             (unsigned long long)p->num_tokens,
                             (unsigned long long)p->num_computed);
    if (p->dcp_rank != p->link->link->peer.topo.dcp_rank)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "WRITE_REQUEST names DCP "
                             "rank %u, the link is rank %u",
                             p->dcp_rank, p->link->link->peer.topo.dcp_rank);
    return KVR_OK;
}

/* Our regions of the pull's layers in (layer, role) order, each with the
 * consumer's twin: the order the consumer unpacks a staged stream in. */
static kvr_status_t plan_pull(kvr_agent_t *a, const kvr__preq_t *r,
                              kvr__pull_t *p, kvr_error_t *err)
{
    uint32_t n = 0;
    kvr_region_pair_t *pairs = calloc(a->num_order + 1, sizeof(*pairs));
    p->segs = calloc(a->num_order + 1, sizeof(*p->segs));
    if (pairs == NULL || p->segs == NULL) {
        free(pairs);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    }
    kvr_status_t st = check_counts(a, r, p, err);
    for (uint32_t i = 0; st == KVR_OK && i < a->num_order; i++) {
        const kvr__aregion_t *g = &a->regions[a->order[i]];
        if (g->desc.layer < p->layer_lo || g->desc.layer >= p->layer_hi)
            continue;
        int j = kvr__twin_index(p->link, &g->desc);
        if (j < 0) { /* REGIONS checked every twin; defensive */
            st = kvr_error_set(err, KVR_ERR_NOT_FOUND, "layer %u has no twin",
                               g->desc.layer);
            break;
        }
        pairs[n] = (kvr_region_pair_t){g->desc, p->link->maps[j].desc};
        p->segs[n++] = (kvr__dseg_t){NULL, g->base, p->link->maps[j].mapping,
                                     NULL, g->desc.layer, 0};
    }
    kvr_request_t req = {r->src,  r->nsrc,       p->dst,
                         p->ndst, p->num_tokens, p->num_computed};
    /* the pair plan of (our rank, its rank) on our regions' axis: with an
     * unsharded producer, the plan of its DCP rank (docs/design.md §18) */
    bool tp = a->axis == KVR_AXIS_TP;
    uint64_t bytes = 0;
    p->planless = st == KVR_OK && kvr__agpu_planless(a, p);
    if (st == KVR_OK && !p->planless) /* else bytes from its tables */
        st = kvr__agent_plan(a, tp ? a->p.topo.tp_rank : a->p.topo.dcp_rank,
                             tp ? p->consumer_tp : p->dcp_rank, pairs, n, &req,
                             p->segs, &bytes, &p->plans, err);
    p->nsegs = st == KVR_OK ? n : 0;
    free(pairs);
    return st;
}

static void start_pull(kvr_agent_t *a, const kvr__preq_t *r, kvr__pull_t *p)
{
    kvr_error_t err = {0};
    uint64_t t0 = kvr__ph_start(a);
    kvr_status_t st = plan_pull(a, r, p, &err);
    kvr__ph_add(a, KVR__PH_PLAN, t0);
    if (st == KVR_OK &&
        kvr__failpoint(KVR__FP_REFUSE, p->request.bytes, p->request.len))
        st = kvr_error_set(&err, KVR_ERR_REFUSED,
                           "pull of '%.*s' refused "
                           "(failpoint refuse)",
                           (int)p->request.len, p->request.bytes);
    if (st == KVR_OK) {
        p->bytes = kvr__dseg_bytes(p->segs, p->nsegs);
        t0 = kvr__ph_start(a);
        st = kvr__staged_choose(a, p, &err);
        kvr__ph_add(a, KVR__PH_CHOOSE, t0);
    }
    t0 = kvr__ph_start(a);
    if (st == KVR_OK)
        st = kvr__agpu_prepare(a, r, p, &err);
    kvr__ph_add(a, KVR__PH_TABLES, t0);
    if (st == KVR_OK && p->planless) {
        p->bytes = kvr__dseg_bytes(p->segs, p->nsegs);
        a->planless_pulls++;
    }
    if (st != KVR_OK) {
        answer(a, p, err.code, err.msg);
        return;
    }
    p->state = KVR__PULL_MOVING;
    p->wait_layers = !kvr__stream_next(a, r, p);
    if (!p->wait_layers)
        list_active(a, p);
}

/* send_ready covered more layers: streamed pulls whose next group is now
 * ready move again, all of them at once. */
static void serve_streams(kvr_agent_t *a, kvr__preq_t *r)
{
    for (kvr__pull_t *p = r->pulls; p != NULL; p = p->next)
        if (p->state == KVR__PULL_MOVING && p->wait_layers &&
            kvr__stream_next(a, r, p)) {
            p->wait_layers = false;
            list_active(a, p);
        }
}

/* ---- the request ---- */

static kvr__preq_t *preq_find(kvr_agent_t *a, const kvr_wire_id_t *id)
{
    kvr__key_t k;
    kvr__key_make(&k, KVR__SIDE_SEND, &a->instance, id);
    return kvr__map_get(&a->preq_map, k.b, k.len);
}

static void publish(kvr_agent_t *a, const kvr__preq_t *r)
{
    kvr__agent_snap(a, KVR__SIDE_SEND, &a->instance, &r->id, (int)r->state,
                    r->status, r->message);
}

static void preq_free(kvr_agent_t *a, kvr__preq_t *r)
{
    kvr__key_t k;
    kvr__key_make(&k, KVR__SIDE_SEND, &a->instance, &r->id);
    kvr__map_del(&a->preq_map, k.b, k.len);
    if (r->prev)
        r->prev->next = r->next;
    else
        a->preqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    for (kvr__pull_t *p = r->pulls, *n; p != NULL; p = n) {
        n = p->next;
        if (p->state == KVR__PULL_MOVING)
            unlist_active(a, p);
        pull_free(p);
    }
    free(r->src);
    free(r->layer_ready);
    free(r);
}

/* The terminal transition: exactly one outcome event, then the request
 * leaves (pulls still holding bytes were cut before). */
static void finish(kvr_agent_t *a, kvr__preq_t *r, kvr_agent_send_state_t to,
                   kvr_status_t st, const char *msg)
{
    static const kvr_agent_event_kind_t ev[] = {
        [KVR_SEND_SENT] = KVR_AGENT_SENT,
        [KVR_SEND_EXPIRED] = KVR_AGENT_SEND_EXPIRED,
        [KVR_SEND_FAILED] = KVR_AGENT_SEND_FAILED,
    };
    r->state = to;
    r->status = st;
    if (msg != r->message) /* snprintf onto its own source is undefined */
        snprintf(r->message, sizeof(r->message), "%s", msg);
    publish(a, r);
    kvr__agent_log(a, "send '%.*s': %s %s", (int)r->id.len, r->id.bytes,
                   kvr_agent_send_state_name(to), msg);
    kvr__agent_event(a, ev[to], &a->instance, &r->id, st, msg, r->bytes);
    preq_free(a, r);
}

static bool pulls_busy(const kvr__preq_t *r)
{
    for (const kvr__pull_t *p = r->pulls; p != NULL; p = p->next)
        if (p->state != KVR__PULL_RELEASED)
            return true;
    return false;
}

static kvr__group_t *group_of(kvr__preq_t *r, const kvr_wire_id_t *instance)
{
    for (uint32_t g = 0; g < r->num_groups; g++)
        if (kvr_wire_id_equal(&r->groups[g].instance, instance))
            return &r->groups[g];
    return NULL;
}

/* A pull joins its consumer group (the consumer's instance). */
static kvr_status_t join_group(kvr_agent_t *a, kvr__preq_t *r, kvr__pull_t *p,
                               char *why, size_t cap)
{
    kvr__group_t *g = group_of(r, &p->link->peer_instance);
    if (g == NULL && r->num_groups >= r->groups_expected) {
        snprintf(why, cap,
                 "request already pulled by %u group(s), opened "
                 "for %u",
                 r->num_groups, r->groups_expected);
        return KVR_ERR_REFUSED;
    }
    if (g == NULL) {
        g = &r->groups[r->num_groups++];
        g->instance = p->link->peer_instance;
    }
    if (g->done || (g->released >> p->consumer_tp & 1)) {
        snprintf(why, cap, "consumer tp %u of '%.*s' already released it",
                 p->consumer_tp, (int)g->instance.len, g->instance.bytes);
        return KVR_ERR_EXISTS;
    }
    p->group = (uint32_t)(g - r->groups);
    uint64_t by = p->deadline_ns + ms_ns(a->p.grace_ms);
    g->give_up_ns = by > g->give_up_ns ? by : g->give_up_ns;
    return KVR_OK;
}

/* A group is done once every consumer rank we serve released. */
static void count_release(kvr_agent_t *a, kvr__preq_t *r, kvr__pull_t *p,
                          kvr_status_t outcome)
{
    kvr__group_t *g = &r->groups[p->group];
    p->state = KVR__PULL_RELEASED;
    if (p->consumer_tp < 64)
        g->released |= 1ull << p->consumer_tp;
    if (outcome != KVR_OK && !g->failed) {
        g->failed = true;
        snprintf(r->message, sizeof(r->message), "consumer '%.*s' tp %u: %s",
                 (int)g->instance.len, g->instance.bytes, p->consumer_tp,
                 kvr_status_name(outcome));
        r->status = outcome;
    }
    g->done = (uint32_t)__builtin_popcountll(g->released) >= a->served;
}

static uint32_t groups_done(const kvr__preq_t *r, bool *failed)
{
    uint32_t n = 0;
    for (uint32_t g = 0; g < r->num_groups; g++) {
        n += r->groups[g].done;
        *failed = *failed || (r->groups[g].done && r->groups[g].failed);
    }
    return n;
}

static void mark_ready(kvr_agent_t *a, kvr__preq_t *r, uint32_t lo, uint32_t hi)
{
    uint32_t s = a->p.topo.layer_start, e = a->p.topo.layer_end;
    for (uint32_t l = lo > s ? lo : s; l < hi && l < e; l++)
        if (!r->layer_ready[l - s]) {
            r->layer_ready[l - s] = 1;
            r->layers_missing--;
        }
}

static void serve_held(kvr_agent_t *a, kvr__preq_t *r)
{
    for (kvr__pull_t *p = r->pulls; p != NULL; p = p->next)
        if (p->state == KVR__PULL_HELD)
            start_pull(a, r, p);
}

static bool group_busy(const kvr__preq_t *r, uint32_t g)
{
    for (const kvr__pull_t *p = r->pulls; p != NULL; p = p->next)
        if (p->group == g && p->state != KVR__PULL_RELEASED)
            return true;
    return false;
}

/* A consumer rank of a group that never pulled by its peers' deadline
 * plus grace is stalled or gone (its group's router assigned every rank
 * at once): the group failed, rather than holding the sources until the
 * lease (docs/agent.md Partitions and stalls). */
static void give_up_groups(kvr__preq_t *r, uint32_t served, uint64_t now)
{
    for (uint32_t g = 0; g < r->num_groups; g++) {
        kvr__group_t *grp = &r->groups[g];
        if (grp->done || now < grp->give_up_ns || group_busy(r, g))
            continue;
        grp->done = true;
        if (!grp->failed)
            snprintf(r->message, sizeof(r->message),
                     "consumer '%.*s': %u of %u rank(s) never pulled by "
                     "their peers' deadline plus grace",
                     (int)grp->instance.len, grp->instance.bytes,
                     served - (uint32_t)__builtin_popcountll(grp->released),
                     served);
        grp->failed = true;
        r->status = KVR_ERR_TIMEOUT;
    }
}

/* Timers of a live request: held and moving pulls past their deadline,
 * answered ones never released, ranks that never pulled, the lease. */
static void tick_pulls(kvr_agent_t *a, kvr__preq_t *r, uint64_t now)
{
    bool lease_over = now >= r->lease_end_ns;
    for (kvr__pull_t *p = r->pulls; p != NULL; p = p->next) {
        bool live = p->state == KVR__PULL_HELD || p->state == KVR__PULL_MOVING;
        bool unready = p->state == KVR__PULL_HELD ||
                       (p->state == KVR__PULL_MOVING && p->wait_layers);
        if ((live && now >= p->deadline_ns) || (unready && lease_over))
            cut(a, p, KVR_ERR_TIMEOUT,
                unready && lease_over
                    ? "the lease ended before the stage's layers were ready"
                    : "deadline passed on the producer");
        if (p->state == KVR__PULL_ANSWERED && now >= p->release_by_ns)
            count_release(a, r, p, p->ok ? KVR_OK : KVR_ERR_TIMEOUT);
    }
    give_up_groups(r, a->served, now);
}

/* The one transition function of a producer request. */
static void preq_step(kvr_agent_t *a, kvr__preq_t *r, kvr__send_in_t in,
                      kvr__pull_t *p, kvr_status_t st)
{
    char why[KVR_ERROR_MSG_MAX];
    switch (in) {
    case KVR__SIN_OPEN:
        r->state = r->layers_missing ? KVR_SEND_OPEN : KVR_SEND_READY;
        break;
    case KVR__SIN_READY:
        serve_streams(a, r);
        if (r->state == KVR_SEND_OPEN && r->layers_missing == 0) {
            r->state = KVR_SEND_READY;
            serve_held(a, r);
        }
        break;
    case KVR__SIN_PULL:
        st = join_group(a, r, p, why, sizeof(why));
        if (st != KVR_OK)
            answer(a, p, st, why);
        else if (kvr_now_ns() >= r->lease_end_ns)
            answer(a, p, KVR_ERR_TIMEOUT, "the lease ended");
        else if (r->state == KVR_SEND_READY || p->stream) {
            start_pull(a, r, p); /* streamed: served group by group */
            kvr__agpu_launch_now(a, r, p);
        }
        if (st != KVR_OK)        /* not in any group: nothing to release */
            p->state = KVR__PULL_RELEASED;
        break;
    case KVR__SIN_ANSWERED:
        break;
    case KVR__SIN_RELEASE:
        /* a failed consumer may have missed our answer: repeat it, so its
         * quarantine ends now rather than at deadline plus grace */
        if (p->state == KVR__PULL_ANSWERED && st != KVR_OK)
            answer(a, p, p->ok ? KVR_OK : p->status, p->ok ? "" : p->text);
        cut(a, p, KVR_ERR_CANCELED, "released by the consumer");
        count_release(a, r, p, st);
        break;
    case KVR__SIN_ABORT: {
        bool asked = st == KVR_OK; /* else a gate failed: r->message */
        kvr_status_t code = asked ? KVR_ERR_CANCELED : st;
        for (kvr__pull_t *q = r->pulls; q != NULL; q = q->next)
            cut(a, q, code, asked ? "aborted by the producer" : r->message);
        finish(a, r, KVR_SEND_FAILED, code, asked ? "aborted" : r->message);
        return;
    }
    case KVR__SIN_TICK:
        r->lease_seen = kvr_now_ns() >= r->lease_end_ns;
        tick_pulls(a, r, kvr_now_ns());
        break;
    }
    bool failed = false;
    uint32_t done = groups_done(r, &failed);
    if (done >= r->groups_expected && !pulls_busy(r)) {
        if (failed)
            finish(a, r, KVR_SEND_FAILED, r->status, r->message);
        else
            finish(a, r, KVR_SEND_SENT, KVR_OK, "");
        return;
    }
    if (kvr_now_ns() >= r->lease_end_ns && !pulls_busy(r)) {
        snprintf(why, sizeof(why),
                 "lease of the sources ended with %u of %u "
                 "group(s) done",
                 done, r->groups_expected);
        finish(a, r, KVR_SEND_EXPIRED, KVR_ERR_TIMEOUT, why);
        return;
    }
    publish(a, r);
}

/* ---- commands ---- */

static void on_release_unasked(kvr_agent_t *a, kvr__preq_t *r, kvr__alink_t *l,
                               kvr_status_t outcome);

/* Takes an orphan of request r off the list: a held pull, or (released)
 * the record of a rank's RELEASE that came before the open. */
static kvr__pull_t *take_orphan(kvr_agent_t *a, const kvr__preq_t *r,
                                bool released)
{
    for (kvr__pull_t **pp = &a->orphans; *pp != NULL; pp = &(*pp)->next) {
        kvr__pull_t *p = *pp;
        if (kvr_wire_id_equal(&p->request, &r->id) &&
            (p->state == KVR__PULL_RELEASED) == released) {
            *pp = p->next;
            p->next = NULL;
            return p;
        }
    }
    return NULL;
}

/* Releases first: each ended a pull sent before any still held. */
static void adopt_orphans(kvr_agent_t *a, kvr__preq_t *r)
{
    kvr__pull_t *p;
    while (preq_find(a, &r->id) == r && (p = take_orphan(a, r, true))) {
        on_release_unasked(a, r, p->link, p->status);
        pull_free(p);
    }
    while (preq_find(a, &r->id) == r && (p = take_orphan(a, r, false))) {
        p->next = r->pulls;
        r->pulls = p;
        preq_step(a, r, KVR__SIN_PULL, p, KVR_OK);
    }
}

static void open_request(kvr_agent_t *a, const kvr__cmd_t *c)
{
    kvr__preq_t *r = calloc(1, sizeof(*r));
    uint32_t layers = a->p.topo.layer_end - a->p.topo.layer_start;
    kvr__key_t k;
    kvr__key_make(&k, KVR__SIDE_SEND, &a->instance, &c->request);
    if (r != NULL) {
        r->layer_ready = calloc(layers, 1);
        r->src = malloc((c->num_blocks + 1) * sizeof(*r->src));
    }
    if (r == NULL || r->layer_ready == NULL || r->src == NULL ||
        kvr__map_put(&a->preq_map, k.b, k.len, r) != KVR_OK) {
        kvr__agent_event(a, KVR_AGENT_SEND_FAILED, &a->instance, &c->request,
                         KVR_ERR_NO_MEMORY, "no memory", 0);
        if (r)
            free(r->layer_ready), free(r->src);
        free(r);
        return;
    }
    r->id = c->request;
    r->serial = ++a->preq_serial;
    memcpy(r->src, c->blocks, c->num_blocks * sizeof(*r->src));
    r->nsrc = c->num_blocks;
    r->num_tokens = c->num_tokens;
    r->lease_end_ns = kvr_now_ns() + ms_ns(c->ms);
    r->groups_expected = c->groups;
    r->layers_missing = layers;
    r->next = a->preqs;
    if (a->preqs)
        a->preqs->prev = r;
    a->preqs = r;
    preq_step(a, r, KVR__SIN_OPEN, NULL, KVR_OK);
    adopt_orphans(a, r);
}

void kvr__send_command(kvr_agent_t *a, const kvr__cmd_t *c)
{
    if (c->kind == KVR__CMD_SEND_OPEN) {
        open_request(a, c);
        return;
    }
    kvr__preq_t *r = preq_find(a, &c->request);
    if (c->gate != NULL) /* ready once the engine's event completed */
        kvr__gate_hold(a, c->gate, r, c->layer_begin, c->layer_end);
    else if (r == NULL)
        return; /* already ended: its outcome is queued */
    else if (c->kind == KVR__CMD_SEND_READY) {
        mark_ready(a, r, c->layer_begin, c->layer_end);
        preq_step(a, r, KVR__SIN_READY, NULL, KVR_OK);
    } else {
        preq_step(a, r, KVR__SIN_ABORT, NULL, KVR_OK);
    }
}

void kvr__send_gate_opened(kvr_agent_t *a, const kvr__gate_t *g,
                           kvr_status_t st, const char *msg)
{
    kvr__preq_t *r = preq_find(a, &g->request);
    if (r == NULL || r->serial != g->serial)
        return; /* ended (its id maybe reused): its outcome is queued */
    if (st == KVR_OK) {
        mark_ready(a, r, g->begin, g->end);
        preq_step(a, r, KVR__SIN_READY, NULL, KVR_OK);
        return;
    }
    snprintf(r->message, sizeof(r->message),
             "waiting for the engine's CUDA event: %s", msg);
    preq_step(a, r, KVR__SIN_ABORT, NULL, st);
}

/* ---- messages from consumers ---- */

static kvr__pull_t *pull_of(kvr__pull_t *list, const kvr__alink_t *l,
                            uint64_t nonce)
{
    for (kvr__pull_t *p = list; p != NULL; p = p->next)
        if (p->link == l && p->nonce == nonce)
            return p;
    return NULL;
}

static kvr__pull_t *new_pull(kvr_agent_t *a, kvr__alink_t *l,
                             const kvr_msg_write_request_t *w, bool stream)
{
    kvr__pull_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->dst = malloc(((size_t)w->num_dst_blocks + 1) * sizeof(*p->dst));
    if (p->dst == NULL) {
        free(p);
        return NULL;
    }
    if (w->num_dst_blocks)
        memcpy(p->dst, w->dst_blocks,
               (size_t)w->num_dst_blocks * sizeof(*p->dst));
    p->ndst = w->num_dst_blocks;
    p->slots = malloc(((size_t)w->num_staging_slots + 1) * sizeof(*p->slots));
    if (p->slots == NULL) {
        free(p->dst);
        free(p);
        return NULL;
    }
    if (w->num_staging_slots)
        memcpy(p->slots, w->staging_slots,
               (size_t)w->num_staging_slots * sizeof(*p->slots));
    p->nslots = w->num_staging_slots;
    p->executor = w->executor;
    p->state = KVR__PULL_HELD;
    p->link = l;
    l->users++;
    p->request = w->request_id;
    p->nonce = w->write_nonce;
    p->consumer_tp = l->link->peer.topo.tp_rank;
    p->dcp_rank = w->dcp_rank;
    p->num_tokens = w->num_tokens;
    p->num_computed = w->num_computed_blocks;
    p->arrived_ns = kvr_now_ns();
    p->deadline_ns = p->arrived_ns + ms_ns(w->deadline_ms);
    /* streamed: the layers asked that this stage holds; else all of ours */
    uint32_t s = a->p.topo.layer_start, e = a->p.topo.layer_end;
    p->stream = stream;
    p->layer_lo = !stream ? 0 : w->layer_begin > s ? w->layer_begin : s;
    p->layer_hi = !stream ? UINT32_MAX : w->layer_end < e ? w->layer_end : e;
    return p;
}

/* Why a pull cannot be served at all, or NULL. */
static const char *refusal(const kvr_agent_t *a, const kvr__alink_t *l,
                           const kvr__pull_t *p, char *why, size_t cap)
{
    if (!l->regions_ready)
        return "WRITE_REQUEST before REGIONS";
    if (p->consumer_tp >= KVR_AGENT_MAX_TP || !(a->serves >> p->consumer_tp & 1))
        return "this producer tp rank does not serve that consumer tp rank";
    if (p->layer_lo >= p->layer_hi) {
        snprintf(why, cap,
                 "STREAM_REQUEST for no layer of this stage's [%u, %u)",
                 a->p.topo.layer_start, a->p.topo.layer_end);
        return why;
    }
    return NULL;
}

static void on_write_request(kvr_agent_t *a, kvr__alink_t *l,
                             const kvr_msg_write_request_t *w, bool stream)
{
    kvr__ph_activity(a);
    a->ph.pulls++;
    kvr__preq_t *r = preq_find(a, &w->request_id);
    kvr__pull_t *dup = pull_of(r ? r->pulls : a->orphans, l, w->write_nonce);
    if (dup != NULL) { /* idempotent: a done pull is confirmed again */
        if (dup->state == KVR__PULL_ANSWERED && dup->ok)
            answer(a, dup, KVR_OK, "");
        return;
    }
    kvr__pull_t *p = new_pull(a, l, w, stream);
    if (p == NULL) {
        kvr__pull_t tmp = {
            .link = l, .request = w->request_id, .nonce = w->write_nonce};
        answer(a, &tmp, KVR_ERR_NO_MEMORY, "no memory on the producer");
        return;
    }
    char why[KVR_ERROR_MSG_MAX];
    const char *refused = refusal(a, l, p, why, sizeof(why));
    if (refused != NULL) {
        answer(a, p, KVR_ERR_PROTO, refused);
        pull_free(p);
        return;
    }
    if (r == NULL) { /* not opened (yet): held for the unknown-request wait */
        p->next = a->orphans;
        a->orphans = p;
        return;
    }
    p->next = r->pulls;
    r->pulls = p;
    preq_step(a, r, KVR__SIN_PULL, p, KVR_OK);
}

/* RELEASE of a nonce no pull on the link has: the consumer rank ended
 * the request before asking (an abort, a deadline while dialling). Its
 * group will not complete, so it counts as a failed release now rather
 * than at the lease. A rank already counted is ignored. */
static void on_release_unasked(kvr_agent_t *a, kvr__preq_t *r, kvr__alink_t *l,
                               kvr_status_t outcome)
{
    /* its peers that have not pulled yet get the grace to do so */
    kvr__pull_t stand_in = {.link = l,
                            .consumer_tp = l->link->peer.topo.tp_rank,
                            .deadline_ns = kvr_now_ns(),
                            .state = KVR__PULL_RELEASED};
    char why[KVR_ERROR_MSG_MAX];
    if (stand_in.consumer_tp >= KVR_AGENT_MAX_TP ||
        !(a->serves >> stand_in.consumer_tp & 1) ||
        join_group(a, r, &stand_in, why, sizeof(why)) != KVR_OK)
        return; /* not ours, or already counted */
    count_release(a, r, &stand_in,
                  outcome == KVR_OK ? KVR_ERR_CANCELED : outcome);
    preq_step(a, r, KVR__SIN_ANSWERED, NULL, KVR_OK);
}

/* RELEASE of a pull held for a request not opened (yet): answered, and
 * kept in state RELEASED for the rest of the unknown-request wait, so that
 * a send_open within it counts the rank as released (adopt_orphans)
 * instead of waiting for it until give-up or the lease. A RELEASE of no
 * held pull is dropped: it may be a late one of a request that ended. */
static void release_unopened(kvr_agent_t *a, kvr__alink_t *l,
                             const kvr_msg_release_t *m)
{
    kvr__pull_t *o = pull_of(a->orphans, l, m->write_nonce);
    if (o == NULL || o->state == KVR__PULL_RELEASED)
        return;
    answer(a, o, KVR_ERR_CANCELED, "released by the consumer");
    o->state = KVR__PULL_RELEASED;
    o->status = m->outcome;
}

static void on_release(kvr_agent_t *a, kvr__alink_t *l,
                       const kvr_msg_release_t *m)
{
    kvr__preq_t *r = preq_find(a, &m->request_id);
    kvr__pull_t *p = r ? pull_of(r->pulls, l, m->write_nonce) : NULL;
    if (p != NULL && p->state != KVR__PULL_RELEASED) {
        preq_step(a, r, KVR__SIN_RELEASE, p, m->outcome);
        return;
    }
    if (r != NULL && p == NULL) {
        on_release_unasked(a, r, l, m->outcome);
        return;
    }
    if (r == NULL)
        release_unopened(a, l, m);
}

/* The consumer unpacked chunk m->chunk (acks come in order): its slot is
 * free again, and a pull that waited for one moves on. A late ack (the
 * pull ended) is harmless. */
static void on_chunk_ack(kvr_agent_t *a, kvr__alink_t *l,
                         const kvr_msg_chunk_done_t *m)
{
    kvr__preq_t *r = preq_find(a, &m->request_id);
    kvr__pull_t *p = r ? pull_of(r->pulls, l, m->write_nonce) : NULL;
    if (p == NULL || !p->staged || p->state != KVR__PULL_MOVING ||
        m->chunk >= p->chunks)
        return;
    if (m->chunk + 1 > p->acked)
        p->acked = m->chunk + 1;
    if (p->waiting_ack && p->chunks < p->acked + p->nslots) {
        p->waiting_ack = false;
        list_active(a, p);
    }
}

void kvr__send_msg(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *m)
{
    uint64_t t0 = kvr__ph_start(a);
    if (m->type == KVR_MSG_WRITE_REQUEST ||
        m->type == KVR_MSG_STREAM_REQUEST) {
        on_write_request(a, l, &m->u.write_request,
                         m->type == KVR_MSG_STREAM_REQUEST);
        kvr__ph_add(a, KVR__PH_PULL, t0);
    }
    else if (m->type == KVR_MSG_RELEASE)
        on_release(a, l, &m->u.release);
    else if (m->type == KVR_MSG_CHUNK_DONE)
        on_chunk_ack(a, l, &m->u.chunk_done);
}

/* A consumer link is gone: its pulls end as failed releases; pulls waiting
 * for their request are dropped. */
void kvr__send_link_lost(kvr_agent_t *a, kvr__alink_t *l)
{
    for (kvr__pull_t **pp = &a->orphans; *pp != NULL;) {
        kvr__pull_t *o = *pp;
        if (o->link != l) {
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        pull_free(o);
    }
    for (kvr__preq_t *r = a->preqs, *n; r != NULL; r = n) {
        n = r->next;
        for (kvr__pull_t *p = r->pulls; p != NULL; p = p->next) {
            if (p->link != l)
                continue;
            l->users--;
            p->link = NULL;
            if (p->state == KVR__PULL_MOVING)
                unlist_active(a, p);
            kvr__gpu_job_free(p->job); /* before the link's IPC unmaps */
            p->job = NULL;
            if (p->state != KVR__PULL_RELEASED)
                count_release(a, r, p, KVR_ERR_PEER_DEAD);
        }
        preq_step(a, r, KVR__SIN_ANSWERED, NULL, KVR_OK);
    }
}

static void tick_orphans(kvr_agent_t *a, uint64_t now, uint64_t *next)
{
    uint64_t wait = ms_ns(a->p.unknown_wait_ms);
    for (kvr__pull_t **pp = &a->orphans; *pp != NULL;) {
        kvr__pull_t *o = *pp;
        uint64_t at = o->arrived_ns + wait;
        at = at < o->deadline_ns ? at : o->deadline_ns;
        if (now < at) {
            *next = at < *next ? at : *next;
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        char text[KVR_ERROR_MSG_MAX];
        snprintf(text, sizeof(text),
                 "request '%.*s' was never opened on "
                 "producer '%.*s' stage (pp %u, tp %u)",
                 (int)o->request.len, o->request.bytes, (int)a->instance.len,
                 a->instance.bytes, a->p.topo.pp_rank, a->p.topo.tp_rank);
        if (o->state != KVR__PULL_RELEASED) /* a release record: forgotten */
            answer(a, o, KVR_ERR_NOT_FOUND, text);
        pull_free(o);
    }
}

/* The lease counts until it passed once; afterwards the request ends with
 * its last release (each step checks it). */
static uint64_t next_timer(const kvr__preq_t *r, uint64_t now)
{
    uint64_t at = now < r->lease_end_ns ? r->lease_end_ns : UINT64_MAX;
    for (const kvr__pull_t *p = r->pulls; p != NULL; p = p->next) {
        uint64_t t = p->state == KVR__PULL_ANSWERED   ? p->release_by_ns
                     : p->state != KVR__PULL_RELEASED ? p->deadline_ns
                                                      : UINT64_MAX;
        at = t < at ? t : at;
    }
    for (uint32_t g = 0; g < r->num_groups; g++)
        if (!r->groups[g].done && r->groups[g].give_up_ns < at)
            at = r->groups[g].give_up_ns;
    return at;
}

void kvr__send_tick(kvr_agent_t *a, uint64_t now, uint64_t *next)
{
    tick_orphans(a, now, next);
    for (kvr__preq_t *r = a->preqs, *n; r != NULL; r = n) {
        n = r->next;
        if (now >= next_timer(r, now) ||
            (now >= r->lease_end_ns && !r->lease_seen))
            preq_step(a, r, KVR__SIN_TICK, NULL, KVR_OK);
    }
    for (kvr__preq_t *r = a->preqs; r != NULL; r = r->next) {
        uint64_t at = next_timer(r, now);
        *next = at < *next ? at : *next;
    }
}

/* ---- moving bytes ---- */

kvr__preq_t *kvr__pull_owner(kvr_agent_t *a, const kvr__pull_t *p)
{
    return preq_find(a, &p->request);
}

/* Failpoint die-mid (docs/failpoints.md): about half of the pull's bytes
 * are put and flushed, then the process ends as a kill would. */
static void die_mid(kvr__pull_t *p)
{
    kvr_error_t err = {0};
    bool done = false;
    uint64_t moved = 0;
    if (!p->gpu && !p->staged)
        kvr__data_put_some(p->link->data, p->segs, p->nsegs, &p->cur,
                           p->bytes / 2 + 1, p->deadline_ns, &done, &moved,
                           &err);
    if (p->link->data != NULL)
        kvr__data_flush(p->link->data, p->deadline_ns, &err);
    kvr__failpoint_exit();
}

static bool any_unanswered(const kvr__pull_t *list)
{
    for (const kvr__pull_t *q = list; q != NULL; q = q->next)
        if (q->state < KVR__PULL_ANSWERED)
            return true;
    return false;
}

/* Whether die-mid may hit now and hit r alone, however requests overlap:
 * every consumer link has asked for r (a link's earlier requests came
 * before it), every other request's pull, held ones included, was
 * answered, and the answers went out: a WRITE_DONE corked until the
 * turn's end, or waiting for room in the socket, would die with the
 * process and fail its request too (seen on a loaded CI run). Until then
 * r's pull does not move (docs/failpoints.md). */
static bool die_mid_alone(const kvr_agent_t *a, const kvr__preq_t *r)
{
    if (a->corked || any_unanswered(a->orphans))
        return false;
    for (const kvr__preq_t *o = a->preqs; o != NULL; o = o->next)
        if (o != r && any_unanswered(o->pulls))
            return false;
    for (const kvr__alink_t *l = a->links; l != NULL; l = l->next) {
        if (l->link != NULL && kvr__link_wants_write(l->link))
            return false; /* answers still queued */
        bool asked = l->data == NULL; /* not a consumer's link */
        for (const kvr__pull_t *q = r->pulls; q != NULL && !asked;
             q = q->next)
            asked = q->link == l;
        if (!asked)
            return false;
    }
    return true;
}

/* A put waits for room in the peer's window at most one turn's work,
 * never to the pull's deadline: a stalled peer must not hold the loop (and
 * every other request) with it. */
static uint64_t turn_bound(const kvr__pull_t *p)
{
    uint64_t by = kvr_now_ns() + KVR_AGENT_TURN_WORK_NS;
    return by < p->deadline_ns ? by : p->deadline_ns;
}

/* A streamed pull's group is in place: LAYERS_DONE, then its next group
 * if there is one (waiting off the active list until its layers are
 * ready). *last says the group just done was the pull's last: decided
 * before the next group is set up, since a next group that is ready at
 * once moves p->group_end on (to layer_hi when it is the last one). */
static kvr_status_t next_group(kvr_agent_t *a, const kvr__preq_t *r,
                               kvr__pull_t *p, bool *last, kvr_error_t *err)
{
    if (kvr__stream_group_done(a, p) != KVR_OK)
        return kvr_error_set(err, KVR_ERR_PEER_DEAD, "consumer link lost");
    *last = p->group_end >= p->layer_hi;
    if (*last)
        return KVR_OK;
    if (r == NULL) /* defensive: an active pull's request is live */
        return kvr_error_set(err, KVR_ERR_CANCELED, "request gone");
    p->wait_layers = !kvr__stream_next(a, r, p);
    if (p->wait_layers)
        unlist_active(a, p);
    return KVR_OK;
}

/* One slice of one pull; true when the pull left the active list (done,
 * failed, or a staged one waiting for an ack). */
static bool slice(kvr_agent_t *a, kvr__pull_t *p, uint64_t *moved)
{
    kvr_error_t err = {0};
    bool done = false;
    kvr__preq_t *r = kvr__pull_owner(a, p);
    kvr_status_t st;
    if (kvr__failpoint(KVR__FP_DIE_MID, p->request.bytes, p->request.len)) {
        if (r != NULL && !die_mid_alone(a, r))
            return false; /* the others first: sliced again next turn */
        die_mid(p);
    }
    if (p->gpu)
        st = kvr__agpu_slice(a, r, p, &done, &err);
    else if (p->staged)
        st = kvr__staged_slice(a, p, moved, &done, &err);
    else if ((st = kvr__agpu_direct_ready(a, p, &err)) == KVR_OK)
        st = kvr__data_put_some(p->link->data, p->segs, p->group_segs, &p->cur,
                                KVR_AGENT_SLICE_BYTES, turn_bound(p), &done,
                                moved, &err);
    if (st == KVR_ERR_TIMEOUT && kvr_now_ns() < p->deadline_ns)
        return false; /* the peer's window is full: next turn */
    if (st == KVR_OK && !done && p->waiting_ack)
        unlist_active(a, p); /* back on an ack */
    if (st == KVR_OK && !done)
        return p->waiting_ack;
    if (st == KVR_OK && !p->staged && !p->gpu) /* staged: flushed by chunk */
        st = kvr__data_flush(p->link->data, turn_bound(p), &err);
    if (st == KVR_ERR_TIMEOUT && kvr_now_ns() < p->deadline_ns)
        return false; /* flushed again next turn */
    bool last = true; /* not streamed: the one group is the whole pull */
    if (st == KVR_OK && p->stream)
        st = next_group(a, r, p, &last, &err);
    if (st == KVR_OK && !last)
        return p->wait_layers; /* on with the next group, or off the list */
    unlist_active(a, p);
    answer(a, p, st, err.msg);
    if (r != NULL)
        preq_step(a, r, KVR__SIN_ANSWERED, p, st);
    return true;
}

/* Every pull whose kernels completed, answered (or on to its next group)
 * in this turn: one wake may stand for many host functions. Each event is
 * queried once; the done ones are then handled one by one, the list
 * walked afresh each time, since answering one may end others. */
static void reap_gpu(kvr_agent_t *a, uint64_t *moved)
{
    uint64_t t0 = kvr__ph_start(a);
    bool any = false;
    for (kvr__pull_t *p = a->active; p != NULL; p = p->work_next) {
        bool done = false;
        kvr_error_t err = {0};
        p->job_done = p->gpu && p->job != NULL &&
                      (kvr__gpu_job_done(p->job, &done, &err) != KVR_OK ||
                       done);
    }
    for (bool again = true; again;) {
        again = false;
        for (kvr__pull_t *p = a->active; p != NULL && !again;
             p = p->work_next)
            if (p->job_done && p->job != NULL) {
                p->job_done = false;
                slice(a, p, moved);
                again = any = true;
            }
    }
    if (any)
        kvr__ph_add(a, KVR__PH_REAP, t0);
}

static bool is_active(const kvr_agent_t *a, const kvr__pull_t *p)
{
    for (const kvr__pull_t *q = a->active; q != NULL; q = q->work_next)
        if (q == p)
            return true;
    return false;
}

/* The head pull and the other active pulls of its request (the consumer
 * ranks that pulled it), in list order: at most cap. */
static uint32_t request_pulls(kvr_agent_t *a, kvr__pull_t **out, uint32_t cap)
{
    uint32_t n = 0;
    const kvr_wire_id_t *id = &a->active->request;
    for (kvr__pull_t *q = a->active; q != NULL && n < cap; q = q->work_next)
        if (kvr_wire_id_equal(&q->request, id))
            out[n++] = q;
    return n;
}

/* The head request's pulls (its consumer ranks) a slice each in turn,
 * again while the turn lasts and they move bytes, then those still moving
 * go to the back: round robin over requests, about a turn each. The
 * ranks' tokens interleave in one stretch of our source pages (and each
 * rank reads all of a replicated index), so a request served on its own
 * walks one stretch at a time; one slice per pull in turn over twelve
 * requests walked twelve, and moved the same bytes for 1.2-1.5x the CPU
 * of one large transfer (docs/performance.md). */
static void serve_request(kvr_agent_t *a, uint64_t end_ns, uint64_t *moved)
{
    kvr__pull_t *group[KVR_AGENT_MAX_TP * 4];
    uint32_t n = request_pulls(a, group, sizeof(group) / sizeof(group[0]));
    bool again = true;
    while (again) {
        uint64_t before = *moved;
        for (uint32_t i = 0; i < n; i++)
            if (is_active(a, group[i]))
                slice(a, group[i], moved);
        again = *moved > before && *moved < KVR_AGENT_TURN_BYTES &&
                kvr_now_ns() < end_ns;
    }
    for (uint32_t i = 0; i < n; i++)
        if (is_active(a, group[i])) {
            unlist_active(a, group[i]);
            list_active(a, group[i]);
        }
}

/* The WRITE_DONEs of a turn go out together at its end: each wakes its
 * consumer's thread, which on a busy host takes this core from us before
 * the next pull's copy (300 us between two 20 us copies, measured on the
 * 2-core VM of docs/performance.md); bytes are in place before either. */
void kvr__send_work(kvr_agent_t *a, uint64_t end_ns)
{
    uint64_t moved = 0;
    bool first = true;
    a->corking = true;
    reap_gpu(a, &moved);
    /* slices while a pull has CPU work: one whose kernels run is seen
     * again when its host function wakes the loop, not by spinning */
    while (a->active != NULL && kvr__agpu_cpu_work(a) &&
           (first || (kvr_now_ns() < end_ns && moved < KVR_AGENT_TURN_BYTES))) {
        first = false;
        serve_request(a, end_ns, &moved);
    }
    a->corking = false;
    kvr__alink_uncork_all(a);
    if (moved > 0)
        a->moving_turns++;
    if (moved > a->moved_turn_max)
        a->moved_turn_max = moved;
}

void kvr__send_free_all(kvr_agent_t *a)
{
    while (a->preqs != NULL)
        preq_free(a, a->preqs);
    for (kvr__pull_t *o = a->orphans, *n; o != NULL; o = n) {
        n = o->next;
        pull_free(o);
    }
    a->orphans = NULL;
    a->active = NULL;
}
