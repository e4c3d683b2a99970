/* Connector object: regions, links, the event loop and the event queue. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sodium.h>
#include <unistd.h>

#include "conn_internal.h"

void kvr__conn_fail(kvr_conn_t *c, kvr_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
    va_end(ap);
    (void)st;
}

const char *kvr_conn_last_error(const kvr_conn_t *conn)
{
    return conn ? conn->last_error : "";
}

static void free_peer(kvr__peer_t *peer);

static kvr_status_t check_params(const kvr_conn_params_t *p, kvr_error_t *err)
{
    kvr_status_t st = kvr_layout_check(&p->layout, err);
    if (st != KVR_OK)
        return st;
    if (p->side != KVR_WIRE_PRODUCER && p->side != KVR_WIRE_CONSUMER)
        return kvr_error_set(err, KVR_ERR_INVALID, "side %d", (int)p->side);
    if (p->producer_stages < 1 || p->producer_stages > KVR_CONN_MAX_STAGES)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "producer stages %u not in [1, %u]",
                             p->producer_stages, KVR_CONN_MAX_STAGES);
    if (p->consumer_ranks < 1 || p->consumer_ranks > 64)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "consumer ranks %u not in [1, 64]",
                             p->consumer_ranks);
    if (p->deadline_ms < 1 || p->deadline_ms > KVR_WIRE_DEADLINE_MAX_MS)
        return kvr_error_set(err, KVR_ERR_INVALID, "deadline %u ms",
                             p->deadline_ms);
    if (p->max_requests < 1 || p->max_requests > 65536)
        return kvr_error_set(err, KVR_ERR_INVALID, "max requests %u",
                             p->max_requests);
    if (p->cuda_device >= kvr__gpu_device_count())
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "CUDA device %d asked for, %d usable here",
                             p->cuda_device, kvr__gpu_device_count());
    if (p->side == KVR_WIRE_CONSUMER && p->topo.dcp_rank >= p->layout.dcp_size)
        return kvr_error_set(err, KVR_ERR_RANK_RANGE,
                             "DCP rank %u out of range [0, %u)",
                             p->topo.dcp_rank, p->layout.dcp_size);
    return KVR_OK;
}

static void event_free(kvr_conn_event_t *e);

static kvr_status_t alloc_tables(kvr_conn_t *c, kvr_error_t *err)
{
    c->ev_cap = 64;
    c->events = calloc(c->ev_cap, sizeof(*c->events));
    c->creqs = calloc(c->p.max_requests, sizeof(*c->creqs));
    c->preqs = calloc(c->p.max_requests, sizeof(*c->preqs));
    if (c->events == NULL || c->creqs == NULL || c->preqs == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for tables");
    return KVR_OK;
}

kvr_status_t kvr_conn_create(const kvr_conn_params_t *params,
                             kvr_conn_t **out, kvr_error_t *err)
{
    if (params == NULL || out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "params or out is NULL");
    kvr_status_t st = check_params(params, err);
    if (st == KVR_OK) /* nonces and keys come from libsodium */
        st = kvr_init(err);
    if (st != KVR_OK)
        return st;
    kvr_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    c->p = *params;
    c->listen_fd = -1;
    c->staging_idx = -1;
    if (params->key != NULL) {
        memcpy(c->key, params->key, sizeof(c->key));
        c->has_key = true;
        c->p.key = c->key;
    }
    st = alloc_tables(c, err);
    if (st == KVR_OK)
        st = kvr__data_create((int)params->tl,
                              params->side == KVR_WIRE_CONSUMER, &c->data, err);
    bool leads = params->side == KVR_WIRE_CONSUMER && params->topo.dcp_rank == 0;
    if (st == KVR_OK && leads)
        st = kvr__leader_create(c, err);
    if (st != KVR_OK) {
        kvr_conn_destroy(c);
        return st;
    }
    *out = c;
    return KVR_OK;
}

static void free_peer(kvr__peer_t *peer)
{
    for (uint32_t i = 0; peer->regions != NULL && i < peer->num_regions; i++)
        kvr__gpu_close(peer->regions[i].rkey, peer->regions[i].rkey_len,
                       peer->regions[i].dev_ptr);
    for (uint32_t i = 0; i < peer->backlog_len; i++)
        kvr_msg_free(&peer->backlog[i]);
    free(peer->backlog);
    kvr__dpeer_close(peer->data);
    free(peer->regions);
    kvr__link_destroy(peer->link);
    free(peer);
}

void kvr_conn_destroy(kvr_conn_t *c)
{
    if (c == NULL)
        return;
    for (uint32_t i = 0; i < c->num_peers; i++)
        free_peer(c->peers[i]);
    for (uint32_t i = 0; c->creqs && i < c->p.max_requests; i++)
        kvr__creq_free(&c->creqs[i]);
    for (uint32_t i = 0; i < c->num_regions; i++) {
        kvr__dmem_destroy(c->regions[i].mem);
        if (c->regions[i].owned)
            kvr__gpu_free(c->regions[i].base);
    }
    if (c->listen_fd >= 0)
        close(c->listen_fd);
    kvr__leader_destroy(c->leader);
    kvr__data_destroy(c->data);
    free(c->slot_busy);
    kvr__rank_offers_free(c);
    free(c->creqs);
    free(c->preqs);
    for (uint32_t i = 0; c->events && i < c->ev_count; i++)
        event_free(&c->events[(c->ev_head + i) % c->ev_cap]);
    event_free(&c->polled);
    free(c->events);
    sodium_memzero(c->key, sizeof(c->key));
    free(c);
}

kvr_status_t kvr__region_valid(const kvr_conn_t *c, const kvr_region_desc_t *d,
                               bool consumer, kvr_error_t *err)
{
    kvr_status_t st = kvr_region_check(&c->p.layout, d, consumer, err);
    if (st == KVR_OK && d->num_blocks == 0)
        st = kvr_error_set(err, KVR_ERR_INVALID, "%s region layer %u has 0 blocks",
                           kvr_role_name(d->role), d->layer);
    return st;
}

/* Why desc cannot be added now, or KVR_OK. */
static kvr_status_t check_region(const kvr_conn_t *c,
                                 const kvr_region_desc_t *desc,
                                 kvr_error_t *err)
{
    bool consumer = c->p.side == KVR_WIRE_CONSUMER;
    if (c->num_regions == KVR_CONN_MAX_REGIONS)
        return kvr_error_set(err, KVR_ERR_NO_SPACE, "more than %u regions",
                             KVR_CONN_MAX_REGIONS);
    if (c->num_peers > 0 || c->listen_fd >= 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "regions must be added before listen/connect");
    return kvr__region_valid(c, desc, consumer, err);
}

/* Allocates or registers r's memory (device memory needs no registration:
 * it is shared by IPC); sets r->base and r->mem. */
static kvr_status_t place_region(kvr_conn_t *c, kvr__region_t *r, void *base,
                                 bool alloc, kvr_error_t *err)
{
    uint64_t len = kvr_region_bytes(&r->desc);
    kvr_status_t st = KVR_OK;
    if (r->device && alloc)
        st = kvr__gpu_alloc(c->p.cuda_device, len, &base, err);
    else if (alloc)
        st = kvr__dmem_alloc(c->data, len, &base, &r->mem, err);
    else if (!r->device)
        st = kvr__dmem_register(c->data, base, len, &r->mem, err);
    r->base = base;
    return st;
}

/* Everything that can fail happens before regions[] or the staging state
 * change, so a failed add leaves the connector as it was. */
static kvr_status_t add_region(kvr_conn_t *c, const kvr_region_desc_t *desc,
                               void *base, bool alloc, void **base_out)
{
    kvr_error_t err = {0};
    kvr_status_t st = check_region(c, desc, &err);
    bool staging = desc->role == KVR_ROLE_STAGING && c->staging_idx < 0 &&
                   c->p.side == KVR_WIRE_CONSUMER;
    uint8_t *busy = NULL; /* the consumer's per-slot busy flags */
    if (st == KVR_OK && staging && (busy = calloc(desc->num_blocks, 1)) == NULL)
        st = kvr_error_set(&err, KVR_ERR_NO_MEMORY,
                           "no memory for %llu staging slots",
                           (unsigned long long)desc->num_blocks);
    bool device = c->p.cuda_device >= 0 && desc->role != KVR_ROLE_STAGING;
    kvr__region_t r = {
        .desc = *desc, .device = device, .owned = device && alloc};
    if (st == KVR_OK)
        st = place_region(c, &r, base, alloc, &err);
    if (st != KVR_OK) {
        free(busy);
        kvr__conn_fail(c, st, "%s", err.msg);
        return st;
    }
    if (staging) {
        c->staging_idx = (int)c->num_regions;
        c->slot_busy = busy;
    }
    c->regions[c->num_regions++] = r;
    if (base_out != NULL)
        *base_out = r.base;
    return KVR_OK;
}

kvr_status_t kvr_conn_add_region(kvr_conn_t *conn,
                                 const kvr_region_desc_t *desc, void *base)
{
    if (conn == NULL || desc == NULL || base == NULL)
        return KVR_ERR_INVALID;
    return add_region(conn, desc, base, false, NULL);
}

kvr_status_t kvr_conn_alloc_region(kvr_conn_t *conn,
                                   const kvr_region_desc_t *desc, void **base)
{
    if (conn == NULL || desc == NULL || base == NULL)
        return KVR_ERR_INVALID;
    return add_region(conn, desc, NULL, true, base);
}

static kvr_status_t add_peer(kvr_conn_t *c, int fd, bool initiator,
                             kvr__peer_t **out)
{
    kvr_error_t err = {0};
    if (c->num_peers == KVR_CONN_MAX_LINKS) {
        close(fd);
        kvr__conn_fail(c, KVR_ERR_NO_SPACE, "more than %u links",
                       KVR_CONN_MAX_LINKS);
        return KVR_ERR_NO_SPACE;
    }
    kvr__peer_t *peer = calloc(1, sizeof(*peer));
    kvr_status_t st = peer ? kvr__link_create(fd, initiator, c->p.key,
                                              &peer->link, &err)
                           : KVR_ERR_NO_MEMORY;
    if (st != KVR_OK) {
        close(fd);
        free(peer);
        kvr__conn_fail(c, st, "link: %s", err.msg);
        return st;
    }
    peer->staging = -1;
    peer->link->owner_data = peer;
    c->peers[c->num_peers++] = peer;
    *out = peer;
    return KVR_OK;
}

int kvr_conn_cuda_devices(void)
{
    return kvr__gpu_device_count();
}

kvr_status_t kvr_conn_copy(kvr_conn_t *conn, void *dst, const void *src,
                           size_t len)
{
    kvr_error_t err = {0};
    if (conn == NULL || (len && (dst == NULL || src == NULL)))
        return KVR_ERR_INVALID;
    if (conn->p.cuda_device < 0) {
        memcpy(dst, src, len);
        return KVR_OK;
    }
    kvr_status_t st = kvr__gpu_copy(dst, src, len, &err);
    if (st != KVR_OK)
        kvr__conn_fail(conn, st, "%s", err.msg);
    return st;
}

kvr_status_t kvr_conn_listen(kvr_conn_t *conn, const char *host,
                             uint16_t port, uint16_t *bound)
{
    kvr_error_t err = {0};
    if (conn == NULL || host == NULL || conn->listen_fd >= 0)
        return KVR_ERR_INVALID;
    kvr_status_t st = kvr__tcp_listen(host, port, &conn->listen_fd, bound, &err);
    if (st != KVR_OK)
        kvr__conn_fail(conn, st, "%s", err.msg);
    return st;
}

kvr_status_t kvr_conn_connect(kvr_conn_t *conn, const char *host,
                              uint16_t port, uint32_t timeout_ms)
{
    kvr_error_t err = {0};
    int fd = -1;
    if (conn == NULL || host == NULL)
        return KVR_ERR_INVALID;
    kvr_status_t st = kvr__tcp_connect(host, port, timeout_ms, &fd, &err);
    if (st != KVR_OK) {
        kvr__conn_fail(conn, st, "%s", err.msg);
        return st;
    }
    kvr__peer_t *peer = NULL;
    st = add_peer(conn, fd, true, &peer);
    if (st != KVR_OK)
        return st;
    peer->pinned = true;
    /* rkeys are unpacked only from authenticated or loopback peers */
    if (!conn->has_key && !conn->p.insecure && !peer->link->loopback_peer)
        kvr__link_close(peer->link, KVR_ERR_AUTH,
                        "refused to talk to a non-loopback peer without a key "
                        "(use a key file, or --insecure)");
    else
        st = kvr__handshake_start(conn, peer);
    uint64_t deadline = kvr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (st == KVR_OK && !kvr__peer_ready(conn, peer) && !peer->link->closed) {
        if (kvr_now_ns() > deadline) {
            kvr__link_close(peer->link, KVR_ERR_TIMEOUT,
                            "handshake with %s:%u took over %u ms", host, port,
                            timeout_ms);
            break;
        }
        st = kvr_conn_progress(conn, 10);
    }
    if (st == KVR_OK && peer->link->closed) {
        st = peer->link->close_status ? peer->link->close_status
                                      : KVR_ERR_PEER_DEAD;
        kvr__conn_fail(conn, st, "%s:%u: %s", host, port, peer->link->close_why);
    }
    peer->pinned = false;
    return st;
}

uint32_t kvr_conn_num_ready(const kvr_conn_t *conn)
{
    uint32_t n = 0;
    for (uint32_t i = 0; conn && i < conn->num_peers; i++)
        n += kvr__peer_ready(conn, conn->peers[i]) && !conn->peers[i]->link->closed;
    return n;
}

kvr_status_t kvr__peer_send(kvr__peer_t *peer, const kvr_msg_t *msg)
{
    return kvr__link_send(peer->link, msg);
}

static uint32_t *copy_ids(const uint32_t *ids, size_t n)
{
    uint32_t *out = n ? malloc(n * sizeof(*out)) : NULL;
    if (out != NULL)
        memcpy(out, ids, n * sizeof(*out));
    return out;
}

/* Events own copies of their tables until the poll after theirs. */
void kvr__event_attach(kvr_conn_event_t *e, const uint32_t *src, size_t nsrc,
                       const uint32_t *dst, size_t ndst)
{
    e->src_blocks = copy_ids(src, nsrc);
    e->num_src_blocks = e->src_blocks ? nsrc : 0;
    e->dst_blocks = copy_ids(dst, ndst);
    e->num_dst_blocks = e->dst_blocks ? ndst : 0;
}

static void event_free(kvr_conn_event_t *e)
{
    free((void *)e->src_blocks);
    free((void *)e->dst_blocks);
    e->src_blocks = e->dst_blocks = NULL;
}

/* Doubles the event ring (up to KVR_CONN_EVENTS_MAX), keeping order. */
static void grow_events(kvr_conn_t *c)
{
    if (c->ev_cap >= KVR_CONN_EVENTS_MAX)
        return;
    kvr_conn_event_t *e = calloc(c->ev_cap * 2, sizeof(*e));
    if (e == NULL)
        return;
    for (uint32_t i = 0; i < c->ev_count; i++)
        e[i] = c->events[(c->ev_head + i) % c->ev_cap];
    free(c->events);
    c->events = e;
    c->ev_head = 0;
    c->ev_cap *= 2;
}

kvr_conn_event_t *kvr__event_push(kvr_conn_t *c, kvr_conn_event_kind_t kind,
                                  const kvr_wire_id_t *id, uint64_t transfer,
                                  kvr_status_t st, const char *msg)
{
    if (c->ev_count == c->ev_cap)
        grow_events(c);
    if (c->ev_count == c->ev_cap) { /* at the cap: oldest dropped, never blocks */
        event_free(&c->events[c->ev_head]);
        c->ev_head = (c->ev_head + 1) % c->ev_cap;
        c->ev_count--;
    }
    kvr_conn_event_t *e = &c->events[(c->ev_head + c->ev_count++) % c->ev_cap];
    memset(e, 0, sizeof(*e));
    e->kind = kind;
    if (id != NULL)
        e->request_id = *id;
    e->transfer_id = transfer;
    e->status = st;
    snprintf(e->message, sizeof(e->message), "%s", msg ? msg : "");
    return e;
}

bool kvr_conn_poll_event(kvr_conn_t *conn, kvr_conn_event_t *out)
{
    if (conn == NULL || out == NULL)
        return false;
    event_free(&conn->polled);
    if (conn->ev_count == 0)
        return false;
    conn->polled = conn->events[conn->ev_head];
    conn->ev_head = (conn->ev_head + 1) % conn->ev_cap;
    conn->ev_count--;
    *out = conn->polled;
    return true;
}

uint32_t kvr_conn_num_live(const kvr_conn_t *conn)
{
    uint32_t n = 0;
    for (uint32_t i = 0; conn && i < conn->p.max_requests; i++)
        n += conn->creqs[i].phase != CREQ_FREE || conn->preqs[i].used;
    return n;
}

static void accept_new(kvr_conn_t *c)
{
    for (;;) {
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            return;
        kvr__peer_t *peer = NULL;
        if (add_peer(c, fd, false, &peer) != KVR_OK)
            continue;
        if (!c->has_key && !c->p.insecure && !peer->link->loopback_peer)
            kvr__link_close(peer->link, KVR_ERR_AUTH,
                            "refused a non-loopback peer without a key "
                            "(use a key file, or --insecure)");
    }
}

static kvr_status_t dispatch(kvr_conn_t *c, kvr__peer_t *peer,
                             const kvr_msg_t *msg)
{
    bool handled = false;
    kvr_status_t st = kvr__handshake_msg(c, peer, msg, &handled);
    if (handled || st != KVR_OK)
        return st;
    if (c->p.side == KVR_WIRE_CONSUMER)
        return kvr__consumer_msg(c, peer, msg);
    return kvr__producer_msg(c, peer, msg);
}

/* Frames a waiting transfer set aside are handled first, in order. */
static void drain_backlog(kvr_conn_t *c, kvr__peer_t *peer)
{
    for (uint32_t i = 0; i < peer->backlog_len; i++) {
        if (!peer->link->closed)
            dispatch(c, peer, &peer->backlog[i]);
        kvr_msg_free(&peer->backlog[i]);
    }
    peer->backlog_len = 0;
}

/* Reads and handles every complete frame of one link. */
static void service_link(kvr_conn_t *c, kvr__peer_t *peer)
{
    drain_backlog(c, peer);
    kvr__link_read(peer->link);
    while (!peer->link->closed) {
        kvr_msg_t msg;
        bool have = false;
        kvr_error_t err = {0};
        kvr_status_t st = kvr__link_next(peer->link, &msg, &have, &err);
        if (st != KVR_OK) {
            kvr__link_close(peer->link, st, "bad frame: %s", err.msg);
            break;
        }
        if (!have)
            break;
        dispatch(c, peer, &msg);
        kvr_msg_free(&msg);
    }
    if (peer->link->eof)
        kvr__link_close(peer->link, KVR_ERR_PEER_DEAD, "%s", peer->link->eof_why);
}

static void reap_closed(kvr_conn_t *c)
{
    for (uint32_t i = 0; i < c->num_peers;) {
        kvr__peer_t *peer = c->peers[i];
        if (!peer->link->closed || peer->pinned) {
            i++;
            continue;
        }
        if (c->p.side == KVR_WIRE_CONSUMER)
            kvr__consumer_peer_lost(c, peer);
        else
            kvr__producer_peer_lost(c, peer);
        if (peer->link->ready) {
            kvr_conn_event_t *e = kvr__event_push(c, KVR_EVENT_PEER_LOST, NULL, 0,
                                                  peer->link->close_status,
                                                  peer->link->close_why);
            e->peer_rank = peer->link->peer.side == KVR_WIRE_PRODUCER
                               ? peer->link->peer.topo.pp_rank
                               : peer->link->peer.topo.dcp_rank;
        }
        if (c->leader_link == peer)
            c->leader_link = NULL;
        free_peer(peer);
        c->peers[i] = c->peers[--c->num_peers];
    }
}

kvr_status_t kvr_conn_progress(kvr_conn_t *conn, uint32_t timeout_ms)
{
    if (conn == NULL)
        return KVR_ERR_INVALID;
    struct pollfd fds[KVR_CONN_MAX_LINKS + 1];
    uint32_t n = 0, first = 0;
    if (conn->listen_fd >= 0) {
        fds[n++] = (struct pollfd){.fd = conn->listen_fd, .events = POLLIN};
        first = 1;
    }
    for (uint32_t i = 0; i < conn->num_peers; i++)
        fds[n++] = (struct pollfd){
            .fd = conn->peers[i]->link->fd,
            .events = (short)(POLLIN | (kvr__link_wants_write(conn->peers[i]->link)
                                            ? POLLOUT : 0))};
    int rc = poll(fds, n, (int)(timeout_ms > 100 ? 100 : timeout_ms));
    if (rc < 0 && errno != EINTR)
        return KVR_ERR_IO;
    uint32_t peers_now = conn->num_peers;
    for (uint32_t i = 0; i < peers_now; i++) {
        short re = rc > 0 ? fds[first + i].revents : 0;
        if ((re & (POLLIN | POLLHUP | POLLERR)) || conn->peers[i]->backlog_len)
            service_link(conn, conn->peers[i]);
        if (re & POLLOUT)
            kvr__link_flush(conn->peers[i]->link);
    }
    if (first && rc > 0 && (fds[0].revents & POLLIN))
        accept_new(conn);
    if (conn->p.side == KVR_WIRE_CONSUMER)
        kvr__consumer_tick(conn);
    else
        kvr__producer_tick(conn);
    reap_closed(conn);
    return KVR_OK;
}
