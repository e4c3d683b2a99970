/* Producer (one PP stage): validates every WRITE_REQUEST against its own and
 * the consumer's regions before any byte moves, executes it (direct or
 * staged), answers WRITE_DONE or WRITE_FAILED, holds source blocks until
 * every consumer rank released (or deadline plus grace). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_internal.h"

static kvr__preq_t *find_preq(kvr_conn_t *c, const kvr_wire_id_t *id,
                              uint64_t transfer, bool create, uint32_t ms)
{
    kvr__preq_t *free_slot = NULL;
    for (uint32_t i = 0; i < c->p.max_requests; i++) {
        kvr__preq_t *r = &c->preqs[i];
        if (r->used && r->transfer_id == transfer && kvr_wire_id_equal(&r->id, id))
            return r;
        if (!r->used && free_slot == NULL)
            free_slot = r;
    }
    if (!create || free_slot == NULL)
        return NULL;
    memset(free_slot, 0, sizeof(*free_slot));
    free_slot->used = true;
    free_slot->id = *id;
    free_slot->transfer_id = transfer;
    free_slot->deadline_ns = kvr_now_ns() + (uint64_t)ms * 1000000ull;
    return free_slot;
}

static void send_failed(kvr_conn_t *c, kvr__peer_t *peer,
                        const kvr_msg_write_request_t *w, kvr_status_t st,
                        const char *text)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_WRITE_FAILED);
    kvr_msg_write_failed_t *f = &m.u.write_failed;
    f->request_id = w->request_id;
    f->transfer_id = w->transfer_id;
    f->pp_rank = c->p.topo.pp_rank;
    f->tp_rank = c->p.topo.tp_rank;
    f->write_nonce = w->write_nonce;
    f->status = st == KVR_OK ? KVR_ERR_INVALID : st;
    snprintf(f->text, sizeof(f->text), "%s", text);
    kvr__peer_send(peer, &m);
    kvr__conn_fail(c, st, "refused '%.*s': %s", (int)w->request_id.len,
                   w->request_id.bytes, text);
}

static void send_done(kvr_conn_t *c, kvr__peer_t *peer,
                      const kvr_msg_write_request_t *w, uint64_t bytes,
                      uint32_t chunks)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_WRITE_DONE);
    kvr_msg_write_done_t *d = &m.u.write_done;
    d->request_id = w->request_id;
    d->transfer_id = w->transfer_id;
    d->pp_rank = c->p.topo.pp_rank;
    d->tp_rank = c->p.topo.tp_rank;
    d->write_nonce = w->write_nonce;
    d->bytes = bytes;
    d->chunks = chunks;
    kvr__peer_send(peer, &m);
}

/* Our regions paired with the consumer's twins by (role, layer). */
static kvr_status_t pair_regions(kvr_conn_t *c, const kvr__peer_t *peer,
                                 kvr_region_pair_t *pairs, uint32_t *remote,
                                 void **dev, const void **bases, size_t *n,
                                 kvr_error_t *err)
{
    *n = 0;
    for (uint32_t i = 0; i < c->num_regions; i++) {
        const kvr_region_desc_t *d = &c->regions[i].desc;
        int j = kvr__twin_of(peer, d);
        if (j < 0)
            return kvr_error_set(err, KVR_ERR_NOT_FOUND,
                                 "producer %s region layer %u has no twin on "
                                 "consumer rank %u", kvr_role_name(d->role),
                                 d->layer, peer->link->peer.topo.dcp_rank);
        pairs[*n] = (kvr_region_pair_t){*d, peer->regions[j].desc};
        remote[*n] = peer->regions[j].mapping;
        dev[*n] = peer->regions[j].dev_ptr;
        bases[(*n)++] = c->regions[i].base;
    }
    return KVR_OK;
}

typedef struct {
    kvr_plan_set_t *plans;
    kvr__dseg_t segs[KVR_CONN_MAX_REGIONS];
    kvr_region_pair_t *pairs;              /* gpu-direct needs the pairs */
    void *dev[KVR_CONN_MAX_REGIONS];       /* and the consumer's mappings */
    size_t n;
} job_t;

static kvr_status_t plan_job(kvr_conn_t *c, const kvr__peer_t *peer,
                             const kvr_msg_write_request_t *w, job_t *job,
                             kvr_error_t *err)
{
    kvr_region_pair_t *pairs = calloc(KVR_CONN_MAX_REGIONS, sizeof(*pairs));
    job->pairs = pairs;
    uint32_t remote[KVR_CONN_MAX_REGIONS];
    const void *bases[KVR_CONN_MAX_REGIONS];
    if (pairs == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_status_t st = KVR_OK;
    if (w->dcp_rank != peer->link->peer.topo.dcp_rank)
        st = kvr_error_set(err, KVR_ERR_INVALID, "WRITE_REQUEST names DCP rank "
                           "%u, the link is rank %u", w->dcp_rank,
                           peer->link->peer.topo.dcp_rank);
    if (st == KVR_OK)
        st = pair_regions(c, peer, pairs, remote, job->dev, bases, &job->n, err);
    kvr_request_t req = {w->src_blocks, w->num_src_blocks, w->dst_blocks,
                         w->num_dst_blocks, w->num_tokens, w->num_computed_blocks};
    if (st == KVR_OK)
        st = kvr_plan_set_create(&c->p.layout, w->dcp_rank, pairs, job->n, &req,
                                 &job->plans, err);
    for (size_t i = 0; st == KVR_OK && i < job->n; i++)
        job->segs[i] = (kvr__dseg_t){kvr_plan_set_plan_of(job->plans, i),
                                     bases[i], remote[i], NULL};
    return st;
}

static bool is_ack(const kvr_msg_t *m, const kvr_msg_write_request_t *w)
{
    return m->type == KVR_MSG_CHUNK_DONE &&
           m->u.chunk_done.transfer_id == w->transfer_id &&
           m->u.chunk_done.write_nonce == w->write_nonce &&
           kvr_wire_id_equal(&m->u.chunk_done.request_id, &w->request_id);
}

static kvr_status_t backlog_push(kvr__peer_t *peer, kvr_msg_t *m)
{
    if (peer->backlog_len == KVR_CONN_BACKLOG_MAX)
        return KVR_ERR_NO_SPACE;
    if (peer->backlog == NULL)
        peer->backlog = calloc(KVR_CONN_BACKLOG_MAX, sizeof(*peer->backlog));
    if (peer->backlog == NULL)
        return KVR_ERR_NO_MEMORY;
    peer->backlog[peer->backlog_len++] = *m;
    return KVR_OK;
}

/* Waits for the consumer's ack of chunk `want` (acks arrive in order);
 * other frames are kept for the event loop. */
static kvr_status_t wait_ack(kvr__peer_t *peer, const kvr_msg_write_request_t *w,
                             uint32_t want, uint64_t deadline, kvr_error_t *err)
{
    while (!peer->link->closed) {
        kvr_msg_t m;
        bool have = false;
        kvr_status_t st = kvr__link_next(peer->link, &m, &have, err);
        if (st != KVR_OK)
            return st;
        if (have && is_ack(&m, w)) {
            uint32_t got = m.u.chunk_done.chunk;
            kvr_msg_free(&m);
            if (got >= want)
                return KVR_OK;
            continue;
        }
        if (have) {
            if (backlog_push(peer, &m) != KVR_OK)
                kvr_msg_free(&m);
            continue;
        }
        uint64_t now = kvr_now_ns();
        if (now > deadline)
            return kvr_error_set(err, KVR_ERR_TIMEOUT, "no ack for chunk %u "
                                 "before the deadline", want);
        struct pollfd p = {.fd = peer->link->fd, .events = POLLIN};
        poll(&p, 1, (int)((deadline - now) / 1000000u > 100 ? 100 : (deadline - now) / 1000000u + 1));
        if (kvr__link_read(peer->link) != KVR_OK && peer->link->eof &&
            peer->link->rx_len < KVR_WIRE_HEADER_BYTES)
            kvr__link_close(peer->link, KVR_ERR_PEER_DEAD, "%s", peer->link->eof_why);
    }
    return kvr_error_set(err, KVR_ERR_PEER_DEAD, "consumer lost: %s",
                         peer->link->close_why);
}

static kvr_status_t send_chunk_done(kvr_conn_t *c, kvr__peer_t *peer,
                                    const kvr_msg_write_request_t *w, uint32_t k,
                                    uint32_t slot, uint64_t off, uint64_t len)
{
    kvr_msg_t m = {.type = KVR_MSG_CHUNK_DONE};
    kvr_msg_chunk_done_t *d = &m.u.chunk_done;
    d->request_id = w->request_id;
    d->transfer_id = w->transfer_id;
    d->pp_rank = c->p.topo.pp_rank;
    d->tp_rank = c->p.topo.tp_rank;
    d->write_nonce = w->write_nonce;
    d->chunk = k;
    d->slot = slot;
    d->offset = off;
    d->bytes = len;
    return kvr__peer_send(peer, &m);
}

static kvr_status_t run_staged(kvr_conn_t *c, kvr__peer_t *peer,
                               const kvr_msg_write_request_t *w, const job_t *job,
                               uint64_t deadline, uint32_t *chunks,
                               kvr_error_t *err)
{
    const kvr_region_desc_t *sd = &peer->regions[peer->staging].desc;
    uint32_t mapping = peer->regions[peer->staging].mapping;
    uint64_t total = kvr__dseg_bytes(job->segs, job->n), slot_bytes = sd->page_bytes;
    uint32_t k = 0;
    kvr_status_t st = KVR_OK;
    for (uint64_t off = 0; off < total && st == KVR_OK; off += slot_bytes, k++) {
        uint64_t len = total - off < slot_bytes ? total - off : slot_bytes;
        uint32_t slot = w->staging_slots[k % w->num_staging_slots];
        if (k >= w->num_staging_slots)
            st = wait_ack(peer, w, k - w->num_staging_slots, deadline, err);
        if (st == KVR_OK)
            st = kvr__data_send_chunk(peer->data, job->segs, job->n, off, len,
                                      mapping, slot * slot_bytes, deadline, err);
        if (st == KVR_OK)
            st = send_chunk_done(c, peer, w, k, slot, off, len);
    }
    *chunks = k;
    return st;
}

static kvr_status_t check_slots(const kvr__peer_t *peer,
                                const kvr_msg_write_request_t *w, kvr_error_t *err)
{
    if (w->num_staging_slots == 0)
        return KVR_OK;
    if (peer->staging < 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "staging slots granted but "
                             "the consumer announced no STAGING region");
    uint64_t usable = peer->regions[peer->staging].desc.num_blocks - 1;
    for (uint32_t i = 0; i < w->num_staging_slots; i++)
        if (w->staging_slots[i] >= usable)
            return kvr_error_set(err, KVR_ERR_BLOCK_RANGE, "staging slot %u "
                                 "outside the %llu usable slots",
                                 w->staging_slots[i], (unsigned long long)usable);
    return KVR_OK;
}

/* direct = 1, staged = 2 */
static int pick_executor(kvr__peer_t *peer, const kvr_msg_write_request_t *w,
                         const job_t *job)
{
    if (w->num_staging_slots == 0)
        return 1;
    uint64_t slot = peer->regions[peer->staging].desc.page_bytes;
    int force = w->executor == KVR_WIRE_EXEC_STAGED ? 2
              : w->executor == KVR_WIRE_EXEC_DIRECT ? 1 : 0;
    return kvr__data_choose(peer->data, force, job->segs, job->n, slot);
}

/* gpu-direct: the scatter kernel writes every region's share straight into
 * the consumer's device pages; the bytes must be the plan's. */
static kvr_status_t send_gpu(kvr_conn_t *c, const kvr_msg_write_request_t *w,
                             const job_t *job, uint64_t *bytes, kvr_error_t *err)
{
    const void *src[KVR_CONN_MAX_REGIONS];
    for (size_t i = 0; i < job->n; i++)
        src[i] = job->segs[i].src;
    kvr_request_t req = {w->src_blocks, w->num_src_blocks, w->dst_blocks,
                         w->num_dst_blocks, w->num_tokens, w->num_computed_blocks};
    kvr_status_t st = kvr__gpu_send(c->p.cuda_device, &c->p.layout, w->dcp_rank,
                                    job->pairs, src, (void *const *)job->dev, job->n,
                                    &req, bytes, err);
    uint64_t planned = kvr__dseg_bytes(job->segs, job->n);
    if (st == KVR_OK && *bytes != planned)
        st = kvr_error_set(err, KVR_ERR_VERIFY, "gpu-direct moved %llu bytes, the "
                           "plan has %llu", (unsigned long long)*bytes,
                           (unsigned long long)planned);
    return st;
}

static kvr_status_t execute(kvr_conn_t *c, kvr__peer_t *peer,
                            const kvr_msg_write_request_t *w, uint64_t *bytes,
                            uint32_t *chunks, kvr_error_t *err)
{
    job_t job = {0};
    uint64_t deadline = kvr_now_ns() + (uint64_t)w->deadline_ms * 1000000ull;
    kvr_status_t st = kvr__peer_ready(c, peer) ? KVR_OK
                    : kvr_error_set(err, KVR_ERR_PROTO, "WRITE_REQUEST before REGIONS");
    if (st == KVR_OK)
        st = check_slots(peer, w, err);
    if (st == KVR_OK)
        st = plan_job(c, peer, w, &job, err);
    if (st == KVR_OK && w->executor == KVR_WIRE_EXEC_STAGED && w->num_staging_slots == 0)
        st = kvr_error_set(err, KVR_ERR_NO_SPACE, "staged executor asked without "
                           "staging slots");
    *chunks = 0;
    if (st == KVR_OK && c->p.cuda_device >= 0) {
        st = send_gpu(c, w, &job, bytes, err);
        kvr_plan_set_destroy(job.plans);
        free(job.pairs);
        return st;
    }
    if (st == KVR_OK && kvr__failpoint(KVR__FP_DIE_MID, w->request_id.bytes,
                                       w->request_id.len)) {
        kvr__data_send_direct(peer->data, job.segs, (job.n + 1) / 2, deadline, err);
        kvr__failpoint_exit(); /* a producer killed mid-transfer */
    }
    if (st == KVR_OK && pick_executor(peer, w, &job) == 2)
        st = run_staged(c, peer, w, &job, deadline, chunks, err);
    else if (st == KVR_OK)
        st = kvr__data_send_direct(peer->data, job.segs, job.n, deadline, err);
    *bytes = kvr__dseg_bytes(job.segs, job.n);
    kvr_plan_set_destroy(job.plans);
    free(job.pairs);
    return st;
}

static void on_write_request(kvr_conn_t *c, kvr__peer_t *peer,
                             const kvr_msg_write_request_t *w)
{
    uint32_t rank = peer->link->peer.topo.dcp_rank;
    kvr__preq_t *r = find_preq(c, &w->request_id, w->transfer_id, true,
                               w->deadline_ms + c->p.release_grace_ms);
    if (r == NULL) {
        send_failed(c, peer, w, KVR_ERR_NO_SPACE, "producer request table full");
        return;
    }
    if (rank < 64 && (r->served_ok >> rank & 1) && r->done_nonce[rank] == w->write_nonce) {
        /* duplicate: the bytes are there; answer again, move nothing */
        kvr_msg_write_request_t again = *w;
        send_done(c, peer, &again, r->done_bytes[rank], r->done_chunks[rank]);
        return;
    }
    uint64_t bytes = 0;
    uint32_t chunks = 0;
    kvr_error_t err = {0};
    const kvr_wire_id_t *id = &w->request_id;
    kvr_status_t st = kvr__failpoint(KVR__FP_REFUSE, id->bytes, id->len)
                          ? kvr_error_set(&err, KVR_ERR_REFUSED,
                                          "failpoint refuse: refused")
                          : execute(c, peer, w, &bytes, &chunks, &err);
    if (st != KVR_OK) {
        send_failed(c, peer, w, st, err.msg);
        r->failed = true;
        r->status = st;
        snprintf(r->message, sizeof(r->message), "%s", err.msg);
        return;
    }
    if (rank < 64) {
        r->served_ok |= 1ull << rank;
        r->done_nonce[rank] = w->write_nonce;
        r->done_bytes[rank] = bytes;
        r->done_chunks[rank] = chunks;
    }
    kvr_msg_write_request_t answer = *w;
    if (kvr__failpoint(KVR__FP_WRONG_NONCE, id->bytes, id->len))
        answer.write_nonce ^= 0x5a5a;
    send_done(c, peer, &answer, bytes, chunks);
    if (kvr__failpoint(KVR__FP_DUP_DONE, id->bytes, id->len))
        send_done(c, peer, &answer, bytes, chunks);
}

static void finish_preq(kvr_conn_t *c, kvr__preq_t *r, kvr_status_t st,
                        const char *msg)
{
    kvr__event_push(c, st == KVR_OK ? KVR_EVENT_SENT : KVR_EVENT_SEND_FAILED,
                    &r->id, r->transfer_id, st, msg);
    memset(r, 0, sizeof(*r));
}

static void on_release(kvr_conn_t *c, const kvr_msg_release_t *m)
{
    kvr__preq_t *r = find_preq(c, &m->request_id, m->transfer_id, false, 0);
    if (r == NULL || m->consumer_rank >= 64 || (r->released >> m->consumer_rank & 1))
        return; /* unknown, finished or duplicate */
    r->released |= 1ull << m->consumer_rank;
    if (m->outcome != KVR_OK && !r->failed) {
        r->failed = true;
        r->status = m->outcome;
        snprintf(r->message, sizeof(r->message), "consumer rank %u failed the "
                 "request (%s)", m->consumer_rank, kvr_status_name(m->outcome));
    }
    /* consumer_ranks: the ranks this producer tp rank serves */
    if ((uint32_t)__builtin_popcountll(r->released) >= c->p.consumer_ranks)
        finish_preq(c, r, r->failed ? r->status : KVR_OK, r->message);
}

kvr_status_t kvr__producer_msg(kvr_conn_t *c, kvr__peer_t *peer,
                               const kvr_msg_t *msg)
{
    switch (msg->type) {
    case KVR_MSG_WRITE_REQUEST:
        on_write_request(c, peer, &msg->u.write_request);
        return KVR_OK;
    case KVR_MSG_RELEASE:
        on_release(c, &msg->u.release);
        return KVR_OK;
    case KVR_MSG_CHUNK_DONE: /* a late ack of a finished transfer */
        return KVR_OK;
    default:
        kvr__link_close(peer->link, KVR_ERR_PROTO, "unexpected %s from a consumer",
                        kvr_msg_type_name(msg->type));
        return KVR_OK;
    }
}

void kvr__producer_tick(kvr_conn_t *c)
{
    uint64_t now = kvr_now_ns();
    for (uint32_t i = 0; i < c->p.max_requests; i++) {
        kvr__preq_t *r = &c->preqs[i];
        if (r->used && now > r->deadline_ns) {
            char msg[KVR_ERROR_MSG_MAX];
            snprintf(msg, sizeof(msg), "source blocks freed at deadline plus "
                     "grace; releases seen from rank mask 0x%llx",
                     (unsigned long long)r->released);
            finish_preq(c, r, KVR_ERR_TIMEOUT, msg);
        }
    }
}

/* A consumer rank that is gone will never release: its share of every
 * request counts as released with a failure. */
void kvr__producer_peer_lost(kvr_conn_t *c, kvr__peer_t *peer)
{
    uint32_t rank = peer->link->peer.topo.tp_rank;
    uint32_t size = c->p.topo.tp_size ? c->p.topo.tp_size : 1;
    if (!peer->link->ready || rank % size != c->p.topo.tp_rank)
        return; /* a rank another producer tp rank serves */
    for (uint32_t i = 0; i < c->p.max_requests; i++) {
        kvr__preq_t *r = &c->preqs[i];
        if (!r->used)
            continue;
        kvr_msg_release_t rel = {.request_id = r->id, .transfer_id = r->transfer_id,
                                 .consumer_rank = rank, .outcome = KVR_ERR_PEER_DEAD};
        on_release(c, &rel);
    }
}

kvr_status_t kvr_conn_offer(kvr_conn_t *conn, const kvr_conn_offer_t *o)
{
    kvr_error_t err = {0};
    if (conn == NULL || o == NULL || conn->p.side != KVR_WIRE_PRODUCER)
        return KVR_ERR_INVALID;
    kvr__peer_t *leader = NULL;
    for (uint32_t i = 0; i < conn->num_peers && leader == NULL; i++)
        if (kvr__peer_ready(conn, conn->peers[i]) &&
            conn->peers[i]->link->peer.topo.dcp_rank == 0)
            leader = conn->peers[i];
    if (leader == NULL) {
        kvr__conn_fail(conn, KVR_ERR_PEER_DEAD, "no link to the decode leader");
        return KVR_ERR_PEER_DEAD;
    }
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_OFFER);
    kvr_status_t st = kvr_wire_id_set(&m.u.offer.request_id, o->request_id,
                                      o->request_id_len, &err);
    m.u.offer.transfer_id = o->transfer_id;
    m.u.offer.num_tokens = o->num_tokens;
    m.u.offer.src_blocks = o->src_blocks;
    m.u.offer.num_src_blocks = (uint32_t)o->num_src_blocks;
    m.u.offer.prompt = o->prompt;
    m.u.offer.num_prompt = (uint32_t)o->num_prompt;
    if (st == KVR_OK)
        st = kvr__peer_send(leader, &m);
    if (st == KVR_OK && find_preq(conn, &m.u.offer.request_id, o->transfer_id,
                                  true, conn->p.deadline_ms + conn->p.release_grace_ms) == NULL)
        st = KVR_ERR_NO_SPACE;
    if (st != KVR_OK)
        kvr__conn_fail(conn, st, "offer: %s", err.msg[0] ? err.msg : kvr_status_str(st));
    return st;
}
