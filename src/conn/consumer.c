/* Consumer (one DCP rank): WRITE_REQUEST to every producer stage, complete
 * only on WRITE_DONE with our nonce from every stage and the planned bytes,
 * fail on WRITE_FAILED, a lost stage or the deadline, quarantine the
 * destination blocks until every stage answered or was closed, RELEASE. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_internal.h"

void kvr__creq_free(kvr__creq_t *r)
{
    for (uint32_t s = 0; s < r->num_stages; s++) {
        kvr_plan_set_destroy(r->stages[s].plans);
        free(r->stages[s].segs);
    }
    free(r->src);
    free(r->dst);
    memset(r, 0, sizeof(*r));
}

static kvr__creq_t *find_creq(kvr_conn_t *c, const kvr_wire_id_t *id,
                              uint64_t transfer)
{
    for (uint32_t i = 0; i < c->p.max_requests; i++) {
        kvr__creq_t *r = &c->creqs[i];
        if (r->phase != CREQ_FREE && r->transfer_id == transfer &&
            kvr_wire_id_equal(&r->id, id))
            return r;
    }
    return NULL;
}

/* The producer-side description of our region's twin (same class). */
static kvr_region_desc_t twin_source(const kvr_conn_t *c,
                                     const kvr_region_desc_t *d,
                                     const kvr__creq_t *r)
{
    kvr_region_desc_t s = *d;
    s.bytes = 0;
    if (d->role == KVR_ROLE_INDEX)
        s.page_bytes = c->p.layout.block_size * kvr_index_stride(d->index_dim);
    uint32_t max = 0;
    for (size_t i = 0; i < r->nsrc; i++)
        max = r->src[i] > max ? r->src[i] : max;
    s.num_blocks = (uint64_t)max + 1;
    return s;
}

/* Plans this stage's layers for our rank: the same plan the producer makes,
 * so sizes match and staged streams unpack in the producer's order. */
static kvr_status_t plan_stage(kvr_conn_t *c, kvr__creq_t *r, kvr__cstage_t *s,
                               kvr_error_t *err)
{
    const kvr_wire_topo_t *t = &s->peer->link->peer.topo;
    kvr_region_pair_t pairs[KVR_CONN_MAX_REGIONS];
    uint32_t idx[KVR_CONN_MAX_REGIONS];
    size_t n = 0;
    for (uint32_t i = 0; i < c->num_regions; i++) {
        const kvr_region_desc_t *d = &c->regions[i].desc;
        if (d->role == KVR_ROLE_STAGING || d->layer < t->layer_start ||
            d->layer >= t->layer_end)
            continue;
        pairs[n] = (kvr_region_pair_t){twin_source(c, d, r), *d};
        idx[n++] = i;
    }
    kvr_request_t req = {r->src, r->nsrc, r->dst, r->ndst, r->num_tokens,
                         r->num_computed};
    kvr_status_t st = kvr_plan_set_create(&c->p.layout, c->p.topo.dcp_rank, pairs,
                                          n, &req, &s->plans, err);
    s->segs = calloc(n + 1, sizeof(*s->segs));
    if (st == KVR_OK && s->segs == NULL)
        st = kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (size_t i = 0; st == KVR_OK && i < n; i++)
        s->segs[i] = (kvr__dseg_t){kvr_plan_set_plan_of(s->plans, i), NULL, 0,
                                   c->regions[idx[i]].base};
    s->num_segs = n;
    s->expect_bytes = kvr_plan_set_total_bytes(s->plans);
    return st;
}

static uint32_t grant_slots(kvr_conn_t *c, kvr__cstage_t *s)
{
    if (c->staging_idx < 0 || c->p.executor == KVR_CONN_EXEC_DIRECT ||
        c->p.cuda_device >= 0)
        return 0;
    const kvr_region_desc_t *d = &c->regions[c->staging_idx].desc;
    uint64_t chunks = s->expect_bytes / d->page_bytes +
                      (s->expect_bytes % d->page_bytes != 0);
    /* a fair share, so every stage can stage at once */
    uint64_t share = (d->num_blocks - 1) / c->p.producer_stages;
    uint64_t want = chunks < share ? chunks : share ? share : 1;
    for (uint32_t i = 0; i + 1 < d->num_blocks && s->num_slots < want &&
                         s->num_slots < KVR_CONN_MAX_SLOTS_PER_WRITE; i++)
        if (!c->slot_busy[i]) {
            c->slot_busy[i] = 1;
            s->slots[s->num_slots++] = i;
        }
    return s->num_slots;
}

static void free_slots(kvr_conn_t *c, kvr__cstage_t *s)
{
    for (uint32_t i = 0; i < s->num_slots; i++)
        c->slot_busy[s->slots[i]] = 0;
    s->num_slots = 0;
}

static void send_write_request(kvr_conn_t *c, kvr__creq_t *r, kvr__cstage_t *s)
{
    bool staged = c->p.executor == KVR_CONN_EXEC_STAGED && c->p.cuda_device < 0;
    if (s->expect_bytes > 0 && grant_slots(c, s) == 0 && staged)
        return; /* back-pressure: retried each tick until the deadline */
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_WRITE_REQUEST);
    kvr_msg_write_request_t *w = &m.u.write_request;
    w->request_id = r->id;
    w->transfer_id = r->transfer_id;
    w->src_blocks = r->src;
    w->num_src_blocks = (uint32_t)r->nsrc;
    w->dst_blocks = r->dst;
    w->num_dst_blocks = (uint32_t)r->ndst;
    w->num_tokens = r->num_tokens;
    w->num_computed_blocks = r->num_computed;
    w->dcp_rank = c->p.topo.dcp_rank;
    w->executor = c->p.cuda_device >= 0 ? KVR_WIRE_EXEC_GPU_DIRECT
                                          : (kvr_wire_exec_t)c->p.executor;
    w->staging_slots = s->slots;
    w->num_staging_slots = s->num_slots;
    w->write_nonce = r->nonce;
    uint64_t now = kvr_now_ns();
    w->deadline_ms = r->deadline_ns > now
                         ? (uint32_t)((r->deadline_ns - now) / 1000000u) + 1 : 1;
    s->sent = kvr__peer_send(s->peer, &m) == KVR_OK;
}

static kvr_status_t copy_tables(kvr__creq_t *r, const kvr_conn_load_t *l)
{
    r->src = malloc((l->num_src_blocks + 1) * sizeof(*r->src));
    r->dst = malloc((l->num_dst_blocks + 1) * sizeof(*r->dst));
    if (r->src == NULL || r->dst == NULL)
        return KVR_ERR_NO_MEMORY;
    if (l->num_src_blocks > 0) /* an empty table may be NULL */
        memcpy(r->src, l->src_blocks, l->num_src_blocks * sizeof(*r->src));
    if (l->num_dst_blocks > 0)
        memcpy(r->dst, l->dst_blocks, l->num_dst_blocks * sizeof(*r->dst));
    r->nsrc = l->num_src_blocks;
    r->ndst = l->num_dst_blocks;
    return KVR_OK;
}

static uint32_t producers_ready(const kvr_conn_t *c)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->num_peers; i++)
        n += c->peers[i]->link->ready && !c->peers[i]->link->closed &&
             kvr__serves_us(c, c->peers[i]);
    return n;
}

static void send_all(kvr_conn_t *c, kvr__creq_t *r)
{
    /* failpoint: planned right, asked wrong; producers must refuse */
    if (r->ndst > 0 &&
        kvr__failpoint(KVR__FP_BAD_BLOCKS, r->id.bytes, r->id.len))
        r->dst[r->ndst - 1] = 0x7fffffffu;
    r->started_ns = kvr_now_ns();
    for (uint32_t s = 0; s < r->num_stages; s++)
        send_write_request(c, r, &r->stages[s]);
}

/* A layer no stage serves would stay empty: never report such a request
 * loaded (the gap is named once every stage joined). */
static kvr_status_t check_gaps(const kvr_conn_t *c, const kvr__creq_t *r,
                               kvr_error_t *err)
{
    for (uint32_t i = 0; i < c->num_regions; i++) {
        const kvr_region_desc_t *d = &c->regions[i].desc;
        bool served = d->role == KVR_ROLE_STAGING;
        for (uint32_t s = 0; s < r->num_stages && !served; s++) {
            const kvr_wire_topo_t *t = &r->stages[s].peer->link->peer.topo;
            served = d->layer >= t->layer_start && d->layer < t->layer_end;
        }
        if (!served)
            return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                                 "%s layer %u is served by none of the %u "
                                 "producer stages", kvr_role_name(d->role),
                                 d->layer, r->num_stages);
    }
    return KVR_OK;
}

/* One stage per connected producer; every expected stage must be there. */
static kvr_status_t attach_stages(kvr_conn_t *c, kvr__creq_t *r, kvr_error_t *err)
{
    for (uint32_t i = 0; i < c->num_peers; i++) {
        kvr__peer_t *p = c->peers[i];
        if (!p->link->ready || p->link->closed || !kvr__serves_us(c, p))
            continue;
        if (r->num_stages == KVR_CONN_MAX_STAGES)
            break;
        kvr__cstage_t *s = &r->stages[r->num_stages++];
        s->peer = p;
        s->pp_rank = p->link->peer.topo.pp_rank;
        kvr_status_t st = plan_stage(c, r, s, err);
        if (st != KVR_OK)
            return st;
    }
    if (r->num_stages != c->p.producer_stages)
        return kvr_error_set(err, KVR_ERR_PEER_DEAD,
                             "%u of %u producer stages connected",
                             r->num_stages, c->p.producer_stages);
    return check_gaps(c, r, err);
}

kvr_status_t kvr__consumer_load(kvr_conn_t *c, const kvr_conn_load_t *l,
                                kvr_error_t *err)
{
    kvr_wire_id_t id;
    kvr_status_t st = kvr_wire_id_set(&id, l->request_id, l->request_id_len, err);
    if (st != KVR_OK)
        return st;
    if (find_creq(c, &id, l->transfer_id) != NULL)
        return kvr_error_set(err, KVR_ERR_EXISTS, "request '%.*s' transfer %llu "
                             "is already loading", (int)id.len, id.bytes,
                             (unsigned long long)l->transfer_id);
    kvr__creq_t *r = NULL;
    for (uint32_t i = 0; i < c->p.max_requests && r == NULL; i++)
        if (c->creqs[i].phase == CREQ_FREE)
            r = &c->creqs[i];
    if (r == NULL)
        return kvr_error_set(err, KVR_ERR_NO_SPACE, "%u requests in flight",
                             c->p.max_requests);
    r->id = id;
    r->transfer_id = l->transfer_id;
    r->num_tokens = l->num_tokens;
    r->num_computed = l->num_computed_blocks;
    r->nonce = kvr_wire_random_nonce();
    uint32_t ms = l->deadline_ms ? l->deadline_ms : c->p.deadline_ms;
    r->deadline_ns = kvr_now_ns() + (uint64_t)ms * 1000000ull;
    r->hard_deadline_ns = r->deadline_ns + (uint64_t)c->p.release_grace_ms * 1000000ull;
    st = copy_tables(r, l);
    if (st != KVR_OK)
        kvr_error_set(err, st, "no memory for tables");
    else if (producers_ready(c) == c->p.producer_stages)
        st = attach_stages(c, r, err);
    else
        r->waiting = true; /* stages still connecting: attach on a tick */
    if (st != KVR_OK) {
        for (uint32_t s = 0; s < r->num_stages; s++)
            free_slots(c, &r->stages[s]);
        kvr__creq_free(r);
        return st;
    }
    r->phase = CREQ_ACTIVE;
    if (!r->waiting)
        send_all(c, r);
    return KVR_OK;
}

kvr_status_t kvr_conn_load(kvr_conn_t *conn, const kvr_conn_load_t *load)
{
    kvr_error_t err = {0};
    if (conn == NULL || load == NULL || conn->p.side != KVR_WIRE_CONSUMER)
        return KVR_ERR_INVALID;
    kvr_status_t st = KVR_OK;
    if ((load->num_src_blocks && load->src_blocks == NULL) ||
        (load->num_dst_blocks && load->dst_blocks == NULL))
        st = kvr_error_set(&err, KVR_ERR_INVALID, "block tables of %zu and %zu "
                           "ids are NULL", load->num_src_blocks,
                           load->num_dst_blocks);
    if (st == KVR_OK)
        st = kvr__consumer_load(conn, load, &err);
    if (st != KVR_OK)
        kvr__conn_fail(conn, st, "%s", err.msg);
    return st;
}

static void send_release(kvr__cstage_t *s, const kvr__creq_t *r, uint32_t rank)
{
    if (s->peer == NULL || s->peer->link->closed)
        return;
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_RELEASE);
    m.u.release.request_id = r->id;
    m.u.release.transfer_id = r->transfer_id;
    m.u.release.consumer_rank = rank;
    m.u.release.write_nonce = r->nonce;
    m.u.release.outcome = r->status;
    kvr__peer_send(s->peer, &m);
}

/* Leaves the books: RELEASE to every stage asked, the leader told. */
static void finish(kvr_conn_t *c, kvr__creq_t *r)
{
    for (uint32_t s = 0; s < r->num_stages; s++) {
        free_slots(c, &r->stages[s]);
        send_release(&r->stages[s], r, c->p.topo.tp_rank);
    }
    kvr__rank_release(c, r);
    kvr__creq_free(r);
}

static bool all_answered(const kvr__creq_t *r)
{
    for (uint32_t s = 0; s < r->num_stages; s++)
        if (!r->stages[s].answered)
            return false;
    return true;
}

static void fail_request(kvr_conn_t *c, kvr__creq_t *r, kvr_status_t st,
                         const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static void fail_request(kvr_conn_t *c, kvr__creq_t *r, kvr_status_t st,
                         const char *fmt, ...)
{
    if (r->phase != CREQ_ACTIVE)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
    va_end(ap);
    r->status = st;
    r->phase = CREQ_QUARANTINE;
    kvr_conn_event_t *e = kvr__event_push(c, KVR_EVENT_LOAD_FAILED, &r->id,
                                          r->transfer_id, st, r->message);
    e->num_tokens = r->num_tokens;
    e->num_computed_blocks = r->num_computed;
    if (all_answered(r))
        finish(c, r);
}

/* Tokens of [k*V, num_tokens) this rank holds (k*V was checked by the
 * planner before any stage was asked). */
static uint64_t rank_tokens(const kvr_conn_t *c, const kvr__creq_t *r)
{
    const kvr_layout_t *lay = &c->p.layout;
    uint32_t rank = c->p.topo.dcp_rank;
    uint64_t first = r->num_computed * kvr_virtual_block(lay);
    return kvr_local_len(lay, r->num_tokens, rank) -
           kvr_local_len(lay, first, rank);
}

static void complete_if_done(kvr_conn_t *c, kvr__creq_t *r)
{
    uint64_t bytes = 0;
    bool wraps = false;
    for (uint32_t s = 0; s < r->num_stages; s++) {
        if (!r->stages[s].done)
            return;
        wraps |= __builtin_add_overflow(bytes, r->stages[s].expect_bytes, &bytes);
    }
    /* never "loaded" short of the tokens: a plan of 0 bytes for a rank that
     * holds tokens is a planning fault, not an empty request */
    if (wraps || (bytes == 0 && rank_tokens(c, r) > 0)) {
        fail_request(c, r, KVR_ERR_VERIFY, "%llu tokens from virtual block %llu: "
                     "the stages' plans hold %llu bytes%s for this rank's %llu "
                     "tokens", (unsigned long long)r->num_tokens,
                     (unsigned long long)r->num_computed, (unsigned long long)bytes,
                     wraps ? " (wrapped)" : "",
                     (unsigned long long)rank_tokens(c, r));
        return;
    }
    r->bytes = bytes;
    r->status = KVR_OK;
    kvr_conn_event_t *e = kvr__event_push(c, KVR_EVENT_LOADED, &r->id,
                                          r->transfer_id, KVR_OK, "");
    e->bytes = bytes;
    e->started_ns = r->started_ns;
    e->num_tokens = r->num_tokens;
    e->num_computed_blocks = r->num_computed;
    kvr__event_attach(e, r->src, r->nsrc, r->dst, r->ndst);
    finish(c, r);
}

static kvr__cstage_t *stage_of(kvr__creq_t *r, const kvr__peer_t *peer)
{
    for (uint32_t s = 0; s < r->num_stages; s++)
        if (r->stages[s].peer == peer)
            return &r->stages[s];
    return NULL;
}

/* A WRITE_DONE/FAILED/CHUNK_DONE for us: our request, our nonce, from the
 * stage we asked. Anything else (late, duplicate, foreign) is ignored. */
static kvr__cstage_t *match(kvr_conn_t *c, kvr__peer_t *peer,
                            const kvr_wire_id_t *id, uint64_t transfer,
                            uint64_t nonce, uint32_t pp_rank, kvr__creq_t **out)
{
    kvr__creq_t *r = find_creq(c, id, transfer);
    kvr__cstage_t *s = r ? stage_of(r, peer) : NULL;
    if (s == NULL || r->nonce != nonce || pp_rank != s->pp_rank || s->answered) {
        kvr__conn_fail(c, KVR_ERR_PROTO, "ignored a message for '%.*s' "
                       "transfer %llu (unknown, foreign nonce or duplicate)",
                       (int)id->len, id->bytes, (unsigned long long)transfer);
        return NULL;
    }
    *out = r;
    return s;
}

static void on_write_done(kvr_conn_t *c, kvr__peer_t *peer,
                          const kvr_msg_write_done_t *m)
{
    kvr__creq_t *r = NULL;
    kvr__cstage_t *s = match(c, peer, &m->request_id, m->transfer_id,
                             m->write_nonce, m->pp_rank, &r);
    if (s == NULL)
        return;
    s->answered = true;
    if (r->phase != CREQ_ACTIVE) {
        if (all_answered(r))
            finish(c, r);
        return;
    }
    if (m->bytes != s->expect_bytes || (m->chunks > 0 && s->unpacked != m->bytes))
        fail_request(c, r, KVR_ERR_VERIFY, "stage %u reported %llu bytes (%u "
                     "chunks, %llu unpacked), the plan has %llu", s->pp_rank,
                     (unsigned long long)m->bytes, m->chunks,
                     (unsigned long long)s->unpacked,
                     (unsigned long long)s->expect_bytes);
    else {
        s->done = true;
        free_slots(c, s); /* others may be waiting for staging slots */
        complete_if_done(c, r);
    }
}

static void on_write_failed(kvr_conn_t *c, kvr__peer_t *peer,
                            const kvr_msg_write_failed_t *m)
{
    kvr__creq_t *r = NULL;
    kvr__cstage_t *s = match(c, peer, &m->request_id, m->transfer_id,
                             m->write_nonce, m->pp_rank, &r);
    if (s == NULL)
        return;
    s->answered = true;
    free_slots(c, s);
    if (r->phase == CREQ_ACTIVE)
        fail_request(c, r, m->status, "stage %u refused: %s", s->pp_rank,
                     m->text);
    else if (all_answered(r))
        finish(c, r);
}

static bool slot_granted(const kvr__cstage_t *s, uint32_t slot)
{
    for (uint32_t i = 0; i < s->num_slots; i++)
        if (s->slots[i] == slot)
            return true;
    return false;
}

/* A staged chunk landed (flushed) in our staging slot: unpack, then ack so
 * the producer may reuse the slot. */
static void on_chunk_done(kvr_conn_t *c, kvr__peer_t *peer,
                          const kvr_msg_chunk_done_t *m)
{
    kvr__creq_t *r = NULL;
    kvr__cstage_t *s = match(c, peer, &m->request_id, m->transfer_id,
                             m->write_nonce, m->pp_rank, &r);
    if (s == NULL || r->phase != CREQ_ACTIVE)
        return;
    if (c->staging_idx < 0) {
        fail_request(c, r, KVR_ERR_PROTO, "stage %u sent a chunk, but this rank "
                     "has no staging region", s->pp_rank);
        return;
    }
    const kvr__region_t *st = &c->regions[c->staging_idx];
    if (!slot_granted(s, m->slot) || m->offset != s->unpacked ||
        m->bytes > st->desc.page_bytes || m->bytes > s->expect_bytes - s->unpacked) {
        fail_request(c, r, KVR_ERR_PROTO, "stage %u: bad chunk %u (slot %u, "
                     "offset %llu, %llu bytes; expected offset %llu)", s->pp_rank,
                     m->chunk, m->slot, (unsigned long long)m->offset,
                     (unsigned long long)m->bytes, (unsigned long long)s->unpacked);
        return;
    }
    const uint8_t *buf = (const uint8_t *)st->base + (uint64_t)m->slot * st->desc.page_bytes;
    kvr__data_unpack(s->segs, s->num_segs, m->offset, buf, m->bytes);
    s->unpacked += m->bytes;
    kvr_msg_t ack = {.type = KVR_MSG_CHUNK_DONE};
    ack.u.chunk_done = *m;
    ack.u.chunk_done.pp_rank = s->pp_rank;
    kvr__peer_send(peer, &ack);
}

kvr_status_t kvr__consumer_msg(kvr_conn_t *c, kvr__peer_t *peer,
                               const kvr_msg_t *msg)
{
    bool from_producer = peer->link->peer.side == KVR_WIRE_PRODUCER;
    switch (msg->type) {
    case KVR_MSG_WRITE_DONE:
        if (from_producer)
            on_write_done(c, peer, &msg->u.write_done);
        return KVR_OK;
    case KVR_MSG_WRITE_FAILED:
        if (from_producer)
            on_write_failed(c, peer, &msg->u.write_failed);
        return KVR_OK;
    case KVR_MSG_CHUNK_DONE:
        if (from_producer)
            on_chunk_done(c, peer, &msg->u.chunk_done);
        return KVR_OK;
    case KVR_MSG_OFFER:
        if (from_producer && c->leader != NULL)
            return kvr__leader_offer(c, peer, &msg->u.offer);
        if (peer == c->leader_link)
            return kvr__rank_offer(c, &msg->u.offer);
        break;
    case KVR_MSG_ASSIGN:
        if (peer == c->leader_link)
            return kvr__rank_assign(c, &msg->u.assign);
        break;
    case KVR_MSG_RELEASE:
        if (c->leader != NULL && !from_producer) {
            kvr__leader_release(c, &msg->u.release, peer->link->peer.topo.dcp_rank);
            return KVR_OK;
        }
        break;
    default:
        break;
    }
    kvr__link_close(peer->link, KVR_ERR_PROTO, "unexpected %s from %s",
                    kvr_msg_type_name(msg->type),
                    from_producer ? "a producer" : "a decode rank");
    return KVR_OK;
}

/* A request loaded before every stage connected: attach now or at the
 * deadline fail (nothing was asked, so nothing is quarantined). */
static void attach_late(kvr_conn_t *c, kvr__creq_t *r, uint64_t now)
{
    kvr_error_t err = {0};
    if (producers_ready(c) < c->p.producer_stages) {
        if (now > r->deadline_ns)
            fail_request(c, r, KVR_ERR_PEER_DEAD, "%u of %u producer stages "
                         "connected at the deadline", producers_ready(c),
                         c->p.producer_stages);
        return;
    }
    r->waiting = false;
    kvr_status_t st = attach_stages(c, r, &err);
    if (st == KVR_OK) {
        send_all(c, r);
        return;
    }
    for (uint32_t s = 0; s < r->num_stages; s++) {
        r->stages[s].answered = true;
        free_slots(c, &r->stages[s]);
    }
    fail_request(c, r, st, "%s", err.msg);
}

static void tick_request(kvr_conn_t *c, kvr__creq_t *r, uint64_t now)
{
    if (r->phase == CREQ_ACTIVE && r->waiting) {
        attach_late(c, r, now);
        return;
    }
    if (r->phase == CREQ_ACTIVE) {
        uint32_t answered = 0;
        for (uint32_t s = 0; s < r->num_stages; s++) {
            kvr__cstage_t *st = &r->stages[s];
            answered += st->answered;
            if (!st->sent && st->peer != NULL && !st->peer->link->closed)
                send_write_request(c, r, st);
        }
        if (now > r->deadline_ns)
            fail_request(c, r, KVR_ERR_TIMEOUT, "deadline passed with %u of %u "
                         "stages answered", answered, r->num_stages);
        return;
    }
    if (r->phase == CREQ_QUARANTINE && now > r->hard_deadline_ns) {
        /* A stage that never answers is closed: its late writes cannot land
         * in blocks we are about to free. */
        for (uint32_t s = 0; s < r->num_stages; s++)
            if (!r->stages[s].answered && r->stages[s].peer != NULL)
                kvr__link_close(r->stages[s].peer->link, KVR_ERR_TIMEOUT,
                                "stage %u silent past deadline plus grace",
                                r->stages[s].pp_rank);
    }
}

void kvr__consumer_tick(kvr_conn_t *c)
{
    uint64_t now = kvr_now_ns();
    for (uint32_t i = 0; i < c->p.max_requests; i++)
        if (c->creqs[i].phase != CREQ_FREE)
            tick_request(c, &c->creqs[i], now);
}

void kvr__consumer_peer_lost(kvr_conn_t *c, kvr__peer_t *peer)
{
    if (c->leader != NULL && peer->link->ready &&
        peer->link->peer.side == KVR_WIRE_CONSUMER)
        kvr__leader_rank_lost(c, peer->link->peer.topo.dcp_rank);
    for (uint32_t i = 0; i < c->p.max_requests; i++) {
        kvr__creq_t *r = &c->creqs[i];
        kvr__cstage_t *s = r->phase != CREQ_FREE ? stage_of(r, peer) : NULL;
        if (s == NULL)
            continue;
        s->peer = NULL;
        bool was = s->answered;
        s->answered = true;
        if (!was && r->phase == CREQ_ACTIVE)
            fail_request(c, r, KVR_ERR_PEER_DEAD, "producer stage %u lost: %s",
                         s->pp_rank, peer->link->close_why);
        else if (r->phase == CREQ_QUARANTINE && all_answered(r))
            finish(c, r);
    }
}
