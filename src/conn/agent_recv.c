/* The consumer side of the agent: a recv waits for links to the producer
 * instance's serving stages (DIALING), asks each for its layers with one
 * WRITE_REQUEST (PULLING), and ends LOADED when every stage's WRITE_DONE
 * carried the planned bytes. Any failure quarantines the destination
 * blocks until every stage asked answered that nonce or its link closed
 * (bounded by deadline plus grace, when silent links are cut), then
 * RELEASED. creq_step is the one transition function; docs/agent.md has
 * the table. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "agent_internal.h"
#include "base_internal.h"

static uint64_t ms_ns(uint64_t ms)
{
    return ms * 1000000ull;
}

static void creq_key(kvr__key_t *k, const kvr__creq_t *r)
{
    kvr__key_make(k, KVR__SIDE_RECV, &r->producer, &r->id);
}

static kvr__creq_t *creq_find(kvr_agent_t *a, const kvr_wire_id_t *producer,
                              const kvr_wire_id_t *id)
{
    kvr__key_t k;
    kvr__key_make(&k, KVR__SIDE_RECV, producer, id);
    return kvr__map_get(&a->creq_map, k.b, k.len);
}

static void publish(kvr_agent_t *a, const kvr__creq_t *r)
{
    kvr__agent_snap(a, KVR__SIDE_RECV, &r->producer, &r->id, (int)r->state,
                    r->status, r->message);
}

static void creq_free(kvr_agent_t *a, kvr__creq_t *r)
{
    kvr__key_t k;
    creq_key(&k, r);
    kvr__map_del(&a->creq_map, k.b, k.len);
    if (r->prev)
        r->prev->next = r->next;
    else
        a->creqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        a->creqs_tail = r->prev;
    for (uint32_t s = 0; s < r->num_stages; s++) {
        kvr__cstage_t *st = &r->stages[s];
        if (st->link != NULL)
            st->link->users--;
        kvr__staged_free(a, st);
        kvr__gpu_runs_free(st->gruns);
        kvr__pcache_release(st->plans);
        free(st->segs);
    }
    free(r->dst);
    free(r);
}

static void event(kvr_agent_t *a, const kvr__creq_t *r,
                  kvr_agent_event_kind_t kind)
{
    kvr__agent_event(a, kind, &r->producer, &r->id, r->status, r->message,
                     kind == KVR_AGENT_LOADED ? r->bytes : 0);
}

/* RELEASE of r over l, with r's nonce and outcome. */
static void release_on(kvr_agent_t *a, const kvr__creq_t *r, kvr__alink_t *l)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_RELEASE);
    m.u.release.request_id = r->id;
    m.u.release.consumer_rank = a->p.topo.tp_rank;
    m.u.release.write_nonce = r->nonce;
    m.u.release.outcome = r->status;
    kvr__alink_send(a, l, &m);
}

static void send_release(kvr_agent_t *a, kvr__creq_t *r, kvr__cstage_t *s)
{
    if (!s->sent || s->released || s->link == NULL)
        return;
    s->released = true;
    release_on(a, r, s->link);
}

/* A request that ends before its pull went out tells the stages it
 * already has links to (RELEASE with the nonce no WRITE_REQUEST carried):
 * otherwise they would hold its sources to the lease. */
static void release_unasked(kvr_agent_t *a, const kvr__creq_t *r)
{
    const kvr__pdir_t *d = r->dir;
    for (uint32_t i = 0; d != NULL && d->serving != NULL && i < d->num_serving;
         i++) {
        kvr__alink_t *l = d->serving[i];
        if (l != NULL && l->state == KVR__LINK_READY && l->regions_sent)
            release_on(a, r, l);
    }
}

static bool all_answered(const kvr__creq_t *r)
{
    for (uint32_t s = 0; s < r->num_stages; s++)
        if (r->stages[s].sent && !r->stages[s].answered)
            return false;
    return true;
}

/* The terminal transitions. RELEASED is the request's last event. */
static void end(kvr_agent_t *a, kvr__creq_t *r, kvr_agent_recv_state_t to)
{
    r->state = to;
    publish(a, r);
    kvr__agent_log(a, "recv '%.*s' from '%.*s': %s %s", (int)r->id.len,
                   r->id.bytes, (int)r->producer.len, r->producer.bytes,
                   kvr_agent_recv_state_name(to), r->message);
    if (to == KVR_RECV_LOADED)
        event(a, r, KVR_AGENT_LOADED);
    event(a, r, KVR_AGENT_RELEASED);
    creq_free(a, r);
}

static void quarantine(kvr_agent_t *a, kvr__creq_t *r, kvr_status_t st,
                       const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* A failure: LOAD_FAILED now, RELEASE (with the failure, which stops a
 * stage still writing) to every stage asked, RELEASED once all answered. */
static void quarantine(kvr_agent_t *a, kvr__creq_t *r, kvr_status_t st,
                       const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
    va_end(ap);
    r->status = st;
    if (r->state == KVR_RECV_DIALING)
        release_unasked(a, r);
    r->state = KVR_RECV_QUARANTINE;
    event(a, r, KVR_AGENT_LOAD_FAILED);
    for (uint32_t s = 0; s < r->num_stages; s++)
        send_release(a, r, &r->stages[s]);
    if (all_answered(r))
        end(a, r, KVR_RECV_FAILED);
    else
        publish(a, r);
}

/* ---- planning what each stage owes us ---- */

/* Our rank and stage s's on the axis our regions are sharded over. */
static void pair_ranks(const kvr_agent_t *a, const kvr__cstage_t *s,
                       uint32_t *producer, uint32_t *consumer)
{
    bool tp = a->axis == KVR_AXIS_TP;
    *producer = tp ? s->tp_rank : s->tp_rank % kvr_producer_dcp(&a->p.layout);
    *consumer = tp ? a->p.topo.tp_rank : a->p.topo.dcp_rank;
}

/* What stage s (layers [lo, hi)) writes into our regions, planned as the
 * producer plans it, from a stand-in source table (bytes, destination runs
 * and the staged stream's order do not depend on where the source blocks
 * are: plans are in destination order). Kept for unpacking. */
static kvr_status_t plan_stage(kvr_agent_t *a, const kvr__creq_t *r,
                               kvr__cstage_t *s, uint32_t lo, uint32_t hi,
                               kvr_error_t *err)
{
    uint64_t bsp = kvr_producer_block_size(&a->p.layout);
    uint64_t nsrc = (r->num_tokens + bsp - 1) / bsp;
    uint32_t *src = calloc(nsrc + 1, sizeof(*src));
    kvr_region_pair_t *pairs = calloc(a->num_order + 1, sizeof(*pairs));
    s->segs = calloc(a->num_order + 1, sizeof(*s->segs));
    kvr_status_t st = src && pairs && s->segs ? KVR_OK : KVR_ERR_NO_MEMORY;
    size_t n = 0;
    for (uint64_t i = 0; src && i < nsrc; i++)
        src[i] = (uint32_t)i;
    for (uint32_t i = 0; st == KVR_OK && i < a->num_order; i++) {
        const kvr__aregion_t *g = &a->regions[a->order[i]];
        if (g->desc.layer < lo || g->desc.layer >= hi)
            continue;
        pairs[n] = (kvr_region_pair_t){
            kvr__twin_desc(&a->p.layout, &g->desc, false), g->desc};
        pairs[n].src.num_blocks = nsrc ? nsrc : 1;
        s->segs[n++] = (kvr__dseg_t){NULL, NULL, 0, g->base, g->desc.layer,
                                     0};
    }
    kvr_request_t req = {src,     nsrc,          r->dst,
                         r->ndst, r->num_tokens, r->num_computed};
    uint32_t prank, crank;
    pair_ranks(a, s, &prank, &crank);
    if (st == KVR_OK)
        st = kvr__agent_plan(a, prank, crank, pairs, n, &req, s->segs,
                             &s->expect_bytes, &s->plans, err);
    else
        kvr_error_set(err, st, "no memory");
    s->nsegs = st == KVR_OK ? n : 0;
    s->layer_lo = s->layer_next = lo; /* streaming: counted per group */
    s->layer_hi = hi;
    free(src);
    free(pairs);
    return st;
}

/* Every region that moves is covered by exactly one PP stage (the tp
 * ranks we pull from of one stage share its layers). */
static kvr_status_t check_cover(const kvr_agent_t *a, const kvr__creq_t *r,
                                kvr_error_t *err)
{
    for (uint32_t i = 0; i < a->num_regions; i++) {
        const kvr_region_desc_t *d = &a->regions[i].desc;
        uint32_t hits = 0;
        for (uint32_t s = 0; s < r->num_stages; s++) {
            const kvr_wire_topo_t *t = &r->stages[s].link->link->peer.topo;
            bool first = s == 0 || r->stages[s - 1].pp_rank != t->pp_rank;
            hits += first && d->layer >= t->layer_start &&
                    d->layer < t->layer_end;
        }
        if (!kvr__region_moves(&a->regions[i]) || hits == 1)
            continue;
        return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                             "%s layer %u is served by %u of the %u PP "
                             "stages of '%.*s' (a consumer-only layer must be "
                             "declared so)",
                             kvr_role_name(d->role), d->layer, hits,
                             r->dir->pp_size, (int)r->producer.len,
                             r->producer.bytes);
    }
    return KVR_OK;
}

static kvr_status_t check_request(const kvr_agent_t *a, const kvr__creq_t *r,
                                  kvr_error_t *err)
{
    uint64_t v = kvr_virtual_block(&a->p.layout), cap;
    if (__builtin_mul_overflow((uint64_t)r->ndst, v, &cap) ||
        r->num_tokens > cap || r->num_computed > r->ndst)
        return kvr_error_set(err, KVR_ERR_DST_TABLE_SHORT,
                             "%zu destination blocks of %llu tokens cannot "
                             "hold %llu tokens (%llu computed blocks)",
                             r->ndst, (unsigned long long)v,
                             (unsigned long long)r->num_tokens,
                             (unsigned long long)r->num_computed);
    return KVR_OK;
}

static kvr_status_t attach_stages(kvr_agent_t *a, kvr__creq_t *r,
                                  kvr_error_t *err)
{
    const kvr__pdir_t *d = r->dir;
    kvr_status_t st = check_request(a, r, err);
    for (uint32_t i = 0; st == KVR_OK && i < d->num_serving; i++) {
        kvr__alink_t *l = d->serving[i];
        if (l == NULL)
            continue;
        const kvr_wire_topo_t *t = &l->link->peer.topo;
        if (!l->need_known) /* the link's peer and our regions are fixed */
            st = kvr__sources_mask(a, t->layer_start, t->layer_end,
                                   a->p.topo.tp_rank, &l->need, err);
        l->need_known = st == KVR_OK;
        if (st != KVR_OK || !(l->need >> t->tp_rank & 1))
            continue; /* holds nothing of these layers for us */
        if (r->num_stages == KVR_AGENT_MAX_STAGES)
            return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                                 "more than %u producer stages to pull from",
                                 KVR_AGENT_MAX_STAGES);
        kvr__cstage_t *s = &r->stages[r->num_stages++];
        s->link = l;
        s->link->users++;
        s->pp_rank = i / d->tp_size;
        s->tp_rank = i % d->tp_size;
    }
    if (st == KVR_OK)
        st = check_cover(a, r, err);
    for (uint32_t i = 0; st == KVR_OK && i < r->num_stages; i++) {
        const kvr_wire_topo_t *t = &r->stages[i].link->link->peer.topo;
        st = plan_stage(a, r, &r->stages[i], t->layer_start, t->layer_end, err);
    }
    return st;
}

/* The executor we ask for: ours; nothing to move needs none. */
static kvr_wire_exec_t executor_of(const kvr_agent_t *a, const kvr__cstage_t *s)
{
    bool cuda = a->p.cuda_device >= 0;
    if (cuda && a->p.executor == KVR_AGENT_EXEC_GPU_DIRECT)
        return KVR_WIRE_EXEC_GPU_DIRECT;
    if (cuda && a->p.executor == KVR_AGENT_EXEC_STAGED)
        return KVR_WIRE_EXEC_GPU_STAGED;
    if (s->expect_bytes == 0 || a->p.executor == KVR_AGENT_EXEC_DIRECT)
        return KVR_WIRE_EXEC_DIRECT;
    return a->p.executor == KVR_AGENT_EXEC_STAGED ? KVR_WIRE_EXEC_STAGED
                                                  : KVR_WIRE_EXEC_AUTO;
}

/* WRITE_REQUEST to stage s, with staging slots unless we ask for direct
 * puts. STAGED with every slot taken waits (RIN_SLOTS, or the deadline). */
static void send_pull(kvr_agent_t *a, kvr__creq_t *r, kvr__cstage_t *s)
{
    kvr_wire_exec_t ex = executor_of(a, s);
    if (ex != KVR_WIRE_EXEC_DIRECT && s->nslots == 0)
        kvr__staged_grant(a, r, s);
    s->waiting_slots = (ex == KVR_WIRE_EXEC_STAGED ||
                        ex == KVR_WIRE_EXEC_GPU_STAGED) &&
                       s->nslots == 0;
    if (s->waiting_slots)
        return;
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_WRITE_REQUEST);
    kvr_msg_write_request_t *w = &m.u.write_request;
    w->request_id = r->id;
    w->dst_blocks = r->dst;
    w->num_dst_blocks = (uint32_t)r->ndst;
    /* failpoint bad-blocks (docs/failpoints.md): planned right, asked with
     * a last destination block id past every region */
    uint32_t *bad = NULL;
    if (r->ndst > 0 &&
        kvr__failpoint(KVR__FP_BAD_BLOCKS, r->id.bytes, r->id.len) &&
        (bad = malloc(r->ndst * sizeof(*bad))) != NULL) {
        memcpy(bad, r->dst, r->ndst * sizeof(*bad));
        bad[r->ndst - 1] = 0x7fffffffu;
        w->dst_blocks = bad;
    }
    w->num_tokens = r->num_tokens;
    w->num_computed_blocks = r->num_computed;
    w->dcp_rank = a->p.topo.dcp_rank;
    w->executor = ex;
    w->staging_slots = s->slots;
    w->num_staging_slots = s->nslots;
    w->write_nonce = r->nonce;
    kvr__stream_ask(r, s, &m);
    uint64_t now = kvr_now_ns();
    w->deadline_ms = r->deadline_ns > now
                         ? (uint32_t)((r->deadline_ns - now) / 1000000u) + 1
                         : 1;
    s->sent = true; /* even if the send fails: the link loss answers it */
    kvr__alink_send(a, s->link, &m);
    kvr__agent_log(a, "recv '%.*s': asked link %u", (int)r->id.len,
                   r->id.bytes, s->link->serial);
    free(bad);
}

/* ---- the state machine ---- */

static void dialing(kvr_agent_t *a, kvr__creq_t *r)
{
    kvr_error_t err = {0};
    kvr__pdir_t *d = r->dir;
    if (d->error != KVR_OK && d->error_ns >= r->started_ns) {
        quarantine(a, r, d->error, "producer '%.*s' at %s: %s",
                   (int)r->producer.len, r->producer.bytes, d->bootstrap,
                   d->error_msg);
        return;
    }
    if (!kvr__pdir_ready(a, d)) {
        kvr__pdir_kick(a, d);
        publish(a, r);
        return;
    }
    if (attach_stages(a, r, &err) != KVR_OK) {
        for (uint32_t s = 0; s < r->num_stages; s++)
            r->stages[s].sent = false; /* nothing was asked */
        quarantine(a, r, err.code, "%s", err.msg);
        return;
    }
    r->state = KVR_RECV_PULLING;
    for (uint32_t s = 0; s < r->num_stages; s++)
        send_pull(a, r, &r->stages[s]);
    publish(a, r);
}

/* Staging slots were freed: stages still waiting for some go now. */
static void send_waiting(kvr_agent_t *a, kvr__creq_t *r)
{
    for (uint32_t s = 0; s < r->num_stages; s++)
        if (r->stages[s].waiting_slots && r->stages[s].link != NULL)
            send_pull(a, r, &r->stages[s]);
}

static bool all_done(kvr__creq_t *r)
{
    uint64_t bytes = 0;
    for (uint32_t s = 0; s < r->num_stages; s++) {
        if (!r->stages[s].done)
            return false;
        bytes += r->stages[s].expect_bytes;
    }
    r->bytes = bytes;
    return true;
}

static void pulling(kvr_agent_t *a, kvr__creq_t *r, const kvr__recv_input_t *in)
{
    kvr__cstage_t *s = in->stage;
    kvr_error_t err = {0};
    switch (in->kind) {
    case KVR__RIN_DONE:
        s->answered = true;
        /* staged: LOADED only once every chunk was unpacked */
        if (in->bytes != s->expect_bytes ||
            s->unpacked != (in->chunks ? in->bytes : 0)) {
            quarantine(a, r, KVR_ERR_VERIFY,
                       "stage %u (tp %u) reported %llu bytes in "
                       "%u chunks (%llu unpacked), the plan has %llu",
                       s->pp_rank, s->tp_rank, (unsigned long long)in->bytes, in->chunks,
                       (unsigned long long)s->unpacked,
                       (unsigned long long)s->expect_bytes);
            return;
        }
        if (kvr__stream_stage_done(a, r, s, &err) != KVR_OK) {
            quarantine(a, r, err.code, "stage %u: %s", s->pp_rank, err.msg);
            return;
        }
        s->done = true;
        if (!all_done(r))
            return;
        r->status = KVR_OK;
        r->message[0] = '\0';
        for (uint32_t i = 0; i < r->num_stages; i++)
            send_release(a, r, &r->stages[i]);
        end(a, r, KVR_RECV_LOADED);
        return;
    case KVR__RIN_FAILED:
    case KVR__RIN_LOST:
        s->answered = true;
        quarantine(a, r, in->status, "stage %u (tp %u) %s: %s",
                   s->pp_rank, s->tp_rank,
                   in->kind == KVR__RIN_LOST ? "lost" : "refused", in->text);
        return;
    case KVR__RIN_CHUNK:
        if (kvr__staged_unpack(a, s, in->chunk, &err) != KVR_OK)
            quarantine(a, r, err.code, "stage %u (tp %u): %s",
                       s->pp_rank, s->tp_rank, err.msg);
        return;
    case KVR__RIN_LAYERS:
        if (kvr__stream_count(a, r, s, in->layers, &err) != KVR_OK)
            quarantine(a, r, err.code, "stage %u (tp %u): %s",
                       s->pp_rank, s->tp_rank, err.msg);
        return;
    case KVR__RIN_SLOTS:
        send_waiting(a, r);
        return;
    case KVR__RIN_ABORT:
        quarantine(a, r, KVR_ERR_CANCELED, "aborted by the consumer");
        return;
    case KVR__RIN_TICK:
        if (kvr_now_ns() >= r->deadline_ns)
            quarantine(a, r, KVR_ERR_TIMEOUT,
                       "deadline passed with %u of %u "
                       "stages done",
                       r->num_stages - !all_done(r), r->num_stages);
        return;
    default:
        return;
    }
}

/* Past deadline plus grace, a silent stage is cut off: closing its link is
 * what guarantees that it no longer writes into these blocks. */
static void quarantined(kvr_agent_t *a, kvr__creq_t *r,
                        const kvr__recv_input_t *in)
{
    if (in->kind == KVR__RIN_CHUNK || in->kind == KVR__RIN_LAYERS)
        return; /* not unpacked, not acked, not reported: the RELEASE stops
                   that stage */
    if (in->stage != NULL)
        in->stage->answered = true;
    if (in->kind == KVR__RIN_TICK && kvr_now_ns() >= r->hard_ns)
        for (uint32_t s = 0; s < r->num_stages; s++) {
            kvr__cstage_t *st = &r->stages[s];
            if (st->sent && !st->answered && st->link != NULL)
                kvr__alink_close(a, st->link, KVR_ERR_TIMEOUT,
                                 "stage %u (tp %u) silent past deadline "
                                 "plus grace",
                                 st->pp_rank, st->tp_rank);
        }
    if (all_answered(r))
        end(a, r, KVR_RECV_FAILED);
}

/* The one transition function of a consumer request. */
static void creq_step(kvr_agent_t *a, kvr__creq_t *r,
                      const kvr__recv_input_t *in)
{
    bool answer = in->kind == KVR__RIN_DONE || in->kind == KVR__RIN_FAILED ||
                  in->kind == KVR__RIN_LOST;
    if (answer && in->stage != NULL) /* it writes into our slots no more */
        kvr__staged_free(a, in->stage);
    switch (r->state) {
    case KVR_RECV_QUEUED:
        r->state = KVR_RECV_DIALING;
        dialing(a, r);
        return;
    case KVR_RECV_DIALING:
        if (in->kind == KVR__RIN_ABORT)
            quarantine(a, r, KVR_ERR_CANCELED, "aborted by the consumer");
        else if (in->kind == KVR__RIN_TICK && kvr_now_ns() >= r->deadline_ns)
            quarantine(a, r, KVR_ERR_TIMEOUT,
                       "producer '%.*s' at %s: its "
                       "stages were not all reachable within the deadline%s%s",
                       (int)r->producer.len, r->producer.bytes,
                       r->dir->bootstrap, r->dir->error_msg[0] ? ": " : "",
                       r->dir->error_msg);
        else
            dialing(a, r); /* links changed, or time to dial again */
        return;
    case KVR_RECV_PULLING:
        pulling(a, r, in);
        return;
    case KVR_RECV_QUARANTINE:
        quarantined(a, r, in);
        return;
    default:
        return; /* LOADED and FAILED are terminal; such a request is gone */
    }
}

/* ---- commands, messages, links, timers ---- */

/* A random nonce, never 0: a syscall per request cost 1-2 us of a
 * one-block load's CPU. */
static uint64_t next_nonce(kvr_agent_t *a)
{
    uint64_t v = 0;
    while (v == 0) {
        if (a->nonces_left == 0) {
            randombytes_buf(a->nonces, sizeof(a->nonces));
            a->nonces_left = sizeof(a->nonces) / sizeof(a->nonces[0]);
        }
        v = a->nonces[--a->nonces_left];
    }
    return v;
}

static void start(kvr_agent_t *a, kvr__cmd_t *c)
{
    kvr__creq_t *r = calloc(1, sizeof(*r));
    kvr__key_t k;
    kvr__key_make(&k, KVR__SIDE_RECV, &c->producer, &c->request);
    if (r == NULL || kvr__map_put(&a->creq_map, k.b, k.len, r) != KVR_OK) {
        free(r);
        kvr__agent_event(a, KVR_AGENT_LOAD_FAILED, &c->producer, &c->request,
                         KVR_ERR_NO_MEMORY, "no memory", 0);
        kvr__agent_event(a, KVR_AGENT_RELEASED, &c->producer, &c->request,
                         KVR_ERR_NO_MEMORY, "no memory", 0);
        return;
    }
    r->state = KVR_RECV_QUEUED;
    r->producer = c->producer;
    r->id = c->request;
    r->dst = c->blocks;
    r->ndst = c->num_blocks;
    c->blocks = NULL; /* the request owns the table now */
    r->num_tokens = c->num_tokens;
    r->num_computed = c->num_computed;
    r->nonce = next_nonce(a);
    r->stream = c->stream;
    r->started_ns = kvr_now_ns();
    r->deadline_ns = r->started_ns + ms_ns(c->ms);
    r->hard_ns = r->deadline_ns + ms_ns(a->p.grace_ms);
    r->dir = kvr__pdir_get(a, &c->producer, c->address);
    /* appended: a request asked for earlier is granted slots first, so a
     * later one whose producer is not ready yet cannot hold every slot
     * while the earlier one, ready, waits for them */
    r->prev = a->creqs_tail;
    if (a->creqs_tail)
        a->creqs_tail->next = r;
    else
        a->creqs = r;
    a->creqs_tail = r;
    kvr__recv_input_t in = {.kind = KVR__RIN_START};
    if (r->dir == NULL) {
        r->state = KVR_RECV_DIALING;
        quarantine(a, r, KVR_ERR_NO_MEMORY, "no memory");
        return;
    }
    creq_step(a, r, &in);
}

void kvr__recv_command(kvr_agent_t *a, kvr__cmd_t *c)
{
    if (c->kind == KVR__CMD_RECV) {
        kvr__ph_activity(a);
        uint64_t t0 = kvr__ph_start(a);
        start(a, c);
        kvr__ph_add(a, KVR__PH_RECV, t0);
        return;
    }
    kvr__creq_t *r = creq_find(a, &c->producer, &c->request);
    kvr__recv_input_t in = {.kind = KVR__RIN_ABORT};
    if (r != NULL)
        creq_step(a, r, &in);
}

static kvr__cstage_t *stage_of(kvr__creq_t *r, const kvr__alink_t *l)
{
    for (uint32_t s = 0; s < r->num_stages; s++)
        if (r->stages[s].link == l)
            return &r->stages[s];
    return NULL;
}

/* WRITE_DONE / WRITE_FAILED / CHUNK_DONE / LAYERS_DONE: ours only if request, nonce
 * and stage match and the stage has not answered; anything else (late,
 * duplicate, foreign) is ignored. */
/* Every answer begins with request id, transfer id, pp rank, tp rank and
 * write nonce: a common initial sequence of the union's structs. */
#define SAME_AT(T, f) (offsetof(T, f) == offsetof(kvr_msg_write_done_t, f))
_Static_assert(SAME_AT(kvr_msg_chunk_done_t, write_nonce) &&
                   SAME_AT(kvr_msg_write_failed_t, write_nonce) &&
                   SAME_AT(kvr_msg_layers_done_t, write_nonce) &&
                   SAME_AT(kvr_msg_chunk_done_t, pp_rank) &&
                   SAME_AT(kvr_msg_write_failed_t, pp_rank) &&
                   SAME_AT(kvr_msg_layers_done_t, pp_rank),
               "answers share their head");

void kvr__recv_msg(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *m)
{
    bool done = m->type == KVR_MSG_WRITE_DONE;
    bool chunk = m->type == KVR_MSG_CHUNK_DONE;
    bool layers = m->type == KVR_MSG_LAYERS_DONE;
    const kvr_wire_id_t *id = &m->u.write_done.request_id;
    uint64_t nonce = m->u.write_done.write_nonce;
    uint32_t pp = m->u.write_done.pp_rank;
    kvr__creq_t *r = l->dir ? creq_find(a, &l->dir->instance, id) : NULL;
    kvr__cstage_t *s = r ? stage_of(r, l) : NULL;
    if (s == NULL || r->nonce != nonce || s->pp_rank != pp || s->answered ||
        !s->sent) {
        kvr__agent_log(a,
                       "ignored %s for '%.*s' from %s (unknown, foreign "
                       "nonce or duplicate)",
                       kvr_msg_type_name(m->type), (int)id->len, id->bytes,
                       l->address);
        return;
    }
    kvr__recv_input_t in = {.kind = done     ? KVR__RIN_DONE
                                    : chunk  ? KVR__RIN_CHUNK
                                    : layers ? KVR__RIN_LAYERS
                                             : KVR__RIN_FAILED,
                            .stage = s};
    if (layers) {
        in.layers = &m->u.layers_done;
    } else if (done) {
        in.bytes = m->u.write_done.bytes;
        in.chunks = m->u.write_done.chunks;
    } else if (chunk) {
        in.chunk = &m->u.chunk_done;
    } else {
        in.status = m->u.write_failed.status;
        in.text = m->u.write_failed.text;
    }
    creq_step(a, r, &in);
}

void kvr__recv_link_lost(kvr_agent_t *a, kvr__alink_t *l)
{
    for (kvr__creq_t *r = a->creqs, *n; r != NULL; r = n) {
        n = r->next;
        kvr__cstage_t *s = stage_of(r, l);
        if (s == NULL)
            continue;
        l->users--;
        s->link = NULL;
        if ((!s->sent && !s->waiting_slots) || s->answered)
            continue;
        kvr__recv_input_t in = {.kind = KVR__RIN_LOST,
                                .stage = s,
                                .status = l->close_status,
                                .text = l->close_why};
        creq_step(a, r, &in);
    }
}

void kvr__recv_dir_changed(kvr_agent_t *a, kvr__pdir_t *d)
{
    for (kvr__creq_t *r = a->creqs, *n; r != NULL; r = n) {
        n = r->next;
        if (r->dir == d && r->state == KVR_RECV_DIALING) {
            kvr__recv_input_t in = {.kind = KVR__RIN_DIR};
            creq_step(a, r, &in);
        }
    }
}

static uint64_t next_timer(const kvr__creq_t *r, uint64_t now)
{
    if (r->state == KVR_RECV_DIALING && r->dir->next_dial_ns > now &&
        r->dir->next_dial_ns < r->deadline_ns)
        return r->dir->next_dial_ns;
    if (r->state != KVR_RECV_QUARANTINE)
        return r->deadline_ns;
    return r->cut_done ? UINT64_MAX : r->hard_ns;
}

void kvr__recv_tick(kvr_agent_t *a, uint64_t now, uint64_t *next)
{
    for (kvr__creq_t *r = a->creqs, *n; a->slots_freed && r != NULL; r = n) {
        n = r->next;
        kvr__recv_input_t in = {.kind = KVR__RIN_SLOTS};
        if (r->state == KVR_RECV_PULLING)
            creq_step(a, r, &in);
    }
    a->slots_freed = false;
    for (kvr__creq_t *r = a->creqs, *n; r != NULL; r = n) {
        n = r->next;
        /* a redial time that passed is due once: next_timer no longer
         * names it (it lies in the past), so it is checked here */
        bool redial = r->state == KVR_RECV_DIALING &&
                      r->dir->next_dial_ns != 0 && now >= r->dir->next_dial_ns;
        if (now < next_timer(r, now) && !redial)
            continue;
        if (r->state == KVR_RECV_QUARANTINE)
            r->cut_done = true;
        kvr__recv_input_t in = {.kind = KVR__RIN_TICK};
        creq_step(a, r, &in);
    }
    for (kvr__creq_t *r = a->creqs; r != NULL; r = r->next) {
        uint64_t at = next_timer(r, now);
        *next = at < *next ? at : *next;
    }
}

void kvr__recv_free_all(kvr_agent_t *a)
{
    while (a->creqs != NULL)
        creq_free(a, a->creqs);
}
