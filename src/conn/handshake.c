/* HELLO / HELLO_ACK / AUTH / LAYOUT / BYE / REGIONS: what happens before any
 * request (docs/PROTOCOL.md Handshake). With a key the layout is compared
 * only after AUTH; rkeys are unpacked only after authentication. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_internal.h"

static kvr_status_t build_hello(kvr_conn_t *c, kvr__link_t *link,
                                kvr_error_t *err)
{
    kvr_region_desc_t descs[KVR_CONN_MAX_REGIONS];
    size_t n = 0;
    for (uint32_t i = 0; i < c->num_regions; i++)
        if (c->regions[i].desc.role != KVR_ROLE_STAGING)
            descs[n++] = c->regions[i].desc;
    kvr_status_t st = kvr_wire_hello_init(&link->ours, c->p.side, &c->p.topo,
                                          &c->p.layout, descs, n, err);
    link->ours.has_key = c->has_key;
    return st;
}

static void refuse(kvr__peer_t *peer, kvr_status_t st, const char *why)
{
    kvr__link_refuse(peer->link, st, why);
}

kvr_status_t kvr__handshake_start(kvr_conn_t *c, kvr__peer_t *peer)
{
    kvr_error_t err = {0};
    kvr_status_t st = build_hello(c, peer->link, &err);
    if (st != KVR_OK) {
        kvr__link_close(peer->link, st, "HELLO: %s", err.msg);
        return st;
    }
    return kvr__link_send_hello(peer->link, KVR_MSG_HELLO);
}

/* Consumers accept producers; the leader also accepts the other ranks. */
static kvr_wire_side_t expected_side(const kvr_conn_t *c, const kvr__peer_t *p)
{
    if (c->p.side == KVR_WIRE_PRODUCER)
        return KVR_WIRE_CONSUMER;
    if (p->link->initiator) /* a rank dialing the leader */
        return KVR_WIRE_CONSUMER;
    if (c->leader != NULL && p->link->peer.side == KVR_WIRE_CONSUMER)
        return KVR_WIRE_CONSUMER;
    return KVR_WIRE_PRODUCER;
}

static kvr_status_t send_regions(kvr_conn_t *c, kvr__peer_t *peer);

bool kvr__serves_us(const kvr_conn_t *c, const kvr__peer_t *peer)
{
    const kvr_wire_topo_t *t = &peer->link->peer.topo;
    uint32_t size = t->tp_size ? t->tp_size : 1;
    return peer->link->peer.side == KVR_WIRE_PRODUCER &&
           t->tp_rank == c->p.topo.tp_rank % size;
}

/* A stage's layer range must not overlap another stage's (docs/design.md §7);
 * among the producer links that serve this rank, one per stage. */
static bool stage_overlaps(kvr_conn_t *c, kvr__peer_t *peer, char *why, size_t n)
{
    const kvr_wire_topo_t *t = &peer->link->peer.topo;
    if (!kvr__serves_us(c, peer))
        return false;
    for (uint32_t i = 0; i < c->num_peers; i++) {
        const kvr__peer_t *o = c->peers[i];
        const kvr_wire_topo_t *u = &o->link->peer.topo;
        if (o == peer || !o->link->ready || o->link->closed || !kvr__serves_us(c, o))
            continue;
        if (u->pp_rank == t->pp_rank || (t->layer_start < u->layer_end &&
                                         u->layer_start < t->layer_end)) {
            snprintf(why, n, "stage %u layers [%u, %u) collide with stage %u "
                     "layers [%u, %u)", t->pp_rank, t->layer_start, t->layer_end,
                     u->pp_rank, u->layer_start, u->layer_end);
            return true;
        }
    }
    return false;
}

static void on_ready(kvr_conn_t *c, kvr__peer_t *peer)
{
    char why[KVR_ERROR_MSG_MAX];
    bool producer = peer->link->peer.side == KVR_WIRE_PRODUCER;
    if (c->p.side == KVR_WIRE_CONSUMER && producer &&
        stage_overlaps(c, peer, why, sizeof(why))) {
        refuse(peer, KVR_ERR_LAYOUT_MISMATCH, why);
        return;
    }
    peer->link->ready = true;
    bool peer_producer = peer->link->peer.side == KVR_WIRE_PRODUCER;
    if (c->p.side == KVR_WIRE_CONSUMER && peer_producer)
        send_regions(c, peer);
    if (c->p.side == KVR_WIRE_CONSUMER && peer->link->initiator)
        c->leader_link = peer;
}

static void maybe_auth(kvr_conn_t *c, kvr__peer_t *peer)
{
    if (!peer->link->ready && kvr__link_handshake_step(peer->link))
        on_ready(c, peer);
}

/* With a key, the peer's HELLO is blank: only what needs no layout is
 * checked now, the rest at its LAYOUT, after AUTH. */
static void on_hello(kvr_conn_t *c, kvr__peer_t *peer, const kvr_msg_t *msg)
{
    kvr__link_t *l = peer->link;
    kvr_error_t err = {0};
    if (l->hello_recv || (msg->type == KVR_MSG_HELLO) == l->initiator) {
        refuse(peer, KVR_ERR_PROTO, "unexpected HELLO");
        return;
    }
    l->peer = msg->u.hello;
    l->hello_recv = true;
    kvr_status_t st = kvr__link_note_peer_hello(l, &err);
    if (st == KVR_OK && !l->initiator)
        st = build_hello(c, l, &err);
    if (st == KVR_OK && c->has_key)
        st = kvr_wire_hello_check_intro(&l->ours, &l->peer,
                                        expected_side(c, peer), &err);
    else if (st == KVR_OK)
        st = kvr_wire_hello_check(&l->ours, &l->peer, expected_side(c, peer), &err);
    if (st != KVR_OK) {
        refuse(peer, st, err.msg);
        return;
    }
    if (!l->initiator)
        kvr__link_send_hello(l, KVR_MSG_HELLO_ACK);
    maybe_auth(c, peer);
}

static void on_auth(kvr_conn_t *c, kvr__peer_t *peer, const kvr_msg_t *msg)
{
    kvr_error_t err = {0};
    kvr_status_t st = kvr_wire_auth_verify(peer->link->auth, &msg->u.auth, &err);
    if (st != KVR_OK) {
        refuse(peer, st, err.msg);
        return;
    }
    maybe_auth(c, peer);
}

/* The peer's layout, authenticated: the comparison a keyless HELLO gets. */
static void on_layout(kvr_conn_t *c, kvr__peer_t *peer, const kvr_msg_t *msg)
{
    kvr__link_t *l = peer->link;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_wire_hello_check(&l->ours, &msg->u.hello,
                                           expected_side(c, peer), &err);
    if (st == KVR_OK)
        st = kvr_wire_auth_note_layout(l->auth, &msg->u.hello, &err);
    if (st != KVR_OK) {
        refuse(peer, st, err.msg);
        return;
    }
    l->peer = msg->u.hello;
    maybe_auth(c, peer);
}

/* ---- REGIONS ---- */

static kvr_status_t send_regions(kvr_conn_t *c, kvr__peer_t *peer)
{
    kvr_wire_region_t *regs = calloc(c->num_regions + 1, sizeof(*regs));
    uint8_t *keys = calloc(c->num_regions + 1, KVR_DATA_RKEY_MAX);
    kvr_status_t st = regs && keys ? KVR_OK : KVR_ERR_NO_MEMORY;
    for (uint32_t i = 0; st == KVR_OK && i < c->num_regions; i++) {
        uint8_t *k = keys + (size_t)i * KVR_DATA_RKEY_MAX;
        kvr_error_t err = {0};
        regs[i].desc = c->regions[i].desc;
        regs[i].base = (uint64_t)(uintptr_t)c->regions[i].base;
        regs[i].rkey = k;
        regs[i].memory = c->regions[i].device ? KVR_WIRE_MEM_CUDA : KVR_WIRE_MEM_HOST;
        st = c->regions[i].device
                 ? kvr__gpu_export(c->regions[i].base, k, &regs[i].rkey_len, &err)
                 : kvr__dmem_rkey(c->regions[i].mem, k, &regs[i].rkey_len);
    }
    kvr_msg_t m = {.type = KVR_MSG_REGIONS};
    const void *addr = NULL;
    size_t alen = 0;
    if (st == KVR_OK)
        st = kvr__data_address(c->data, &addr, &alen);
    m.u.regions.regions = regs;
    m.u.regions.num_regions = c->num_regions;
    m.u.regions.address = addr;
    m.u.regions.address_len = (uint32_t)alen;
    if (st == KVR_OK)
        st = kvr__peer_send(peer, &m);
    if (st != KVR_OK)
        kvr__link_close(peer->link, st, "sending REGIONS failed (%s)",
                        kvr_status_name(st));
    free(regs);
    free(keys);
    return st;
}

/* A KV region must live where ours do: host with host (transport puts),
 * CUDA with CUDA (gpu-direct); staging is always host memory. */
static kvr_status_t map_device(const kvr_conn_t *c, const kvr_wire_region_t *r,
                               kvr__rregion_t *out, kvr_error_t *err)
{
    bool ours_cuda = c->p.cuda_device >= 0;
    bool cuda = r->memory == KVR_WIRE_MEM_CUDA;
    if (r->desc.role == KVR_ROLE_STAGING ? cuda : cuda != ours_cuda)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED, "consumer %s region layer "
                             "%u is in %s memory, this producer's KV is in %s "
                             "memory", kvr_role_name(r->desc.role), r->desc.layer,
                             cuda ? "CUDA" : "host", ours_cuda ? "CUDA" : "host");
    if (!cuda)
        return KVR_OK;
    if (r->rkey_len > sizeof(out->rkey))
        return kvr_error_set(err, KVR_ERR_PROTO, "CUDA key of %u bytes", r->rkey_len);
    memcpy(out->rkey, r->rkey, r->rkey_len);
    out->rkey_len = r->rkey_len;
    return kvr__gpu_open(c->p.cuda_device, r->rkey, r->rkey_len, &out->dev_ptr, err);
}

static kvr_status_t map_regions(const kvr_conn_t *c, kvr__peer_t *peer,
                                const kvr_msg_regions_t *m, kvr_error_t *err)
{
    peer->regions = calloc(m->num_regions + 1, sizeof(*peer->regions));
    if (peer->regions == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint32_t i = 0; i < m->num_regions; i++) {
        const kvr_wire_region_t *r = &m->regions[i];
        /* sizes from the wire: no zero-block staging, no length that wraps */
        kvr_status_t st = kvr__region_valid(c, &r->desc, true, err);
        if (st != KVR_OK)
            return st;
        uint64_t len = kvr_region_bytes(&r->desc);
        st = map_device(c, r, &peer->regions[i], err);
        peer->num_regions = i + 1; /* a mapping made is closed with the peer */
        if (st == KVR_OK && r->memory == KVR_WIRE_MEM_HOST)
            st = kvr__dpeer_map(peer->data, r->base, len, r->rkey, r->rkey_len,
                                &peer->regions[i].mapping, err);
        if (st != KVR_OK)
            return st;
        peer->regions[i].desc = r->desc;
        if (r->desc.role == KVR_ROLE_STAGING && peer->staging < 0) {
            peer->staging = (int)i;
            /* the last slot is never granted: the cost probe's scratch */
            uint64_t slot = r->desc.page_bytes;
            st = kvr__dpeer_map(peer->data, r->base + (r->desc.num_blocks - 1) * slot,
                                slot, r->rkey, r->rkey_len, &peer->probe_mapping,
                                err);
            if (st != KVR_OK)
                return st;
        }
    }
    return KVR_OK;
}

int kvr__twin_of(const kvr__peer_t *peer, const kvr_region_desc_t *d)
{
    for (uint32_t j = 0; j < peer->num_regions; j++)
        if (peer->regions[j].desc.role == d->role &&
            peer->regions[j].desc.layer == d->layer)
            return (int)j;
    return -1;
}

/* Every producer region needs a consumer region of the same (role, layer). */
static kvr_status_t check_twins(const kvr_conn_t *c, const kvr__peer_t *peer,
                                kvr_error_t *err)
{
    for (uint32_t i = 0; i < c->num_regions; i++) {
        const kvr_region_desc_t *d = &c->regions[i].desc;
        if (kvr__twin_of(peer, d) < 0)
            return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                                 "producer %s region layer %u has no twin on "
                                 "consumer rank %u", kvr_role_name(d->role),
                                 d->layer, peer->link->peer.topo.dcp_rank);
    }
    return KVR_OK;
}

static void on_regions(kvr_conn_t *c, kvr__peer_t *peer, const kvr_msg_t *msg)
{
    kvr_error_t err = {0};
    const kvr_msg_regions_t *m = &msg->u.regions;
    if (c->p.side != KVR_WIRE_PRODUCER || peer->regions_ready) {
        refuse(peer, KVR_ERR_PROTO, "unexpected REGIONS");
        return;
    }
    kvr_status_t st = kvr__dpeer_open(c->data, m->address, m->address_len,
                                      &peer->data, &err);
    if (st == KVR_OK)
        st = map_regions(c, peer, m, &err);
    if (st == KVR_OK)
        st = check_twins(c, peer, &err);
    if (st == KVR_OK && peer->staging >= 0 &&
        peer->regions[peer->staging].desc.num_blocks > 1)
        st = kvr__data_probe(peer->data, peer->probe_mapping,
                             peer->regions[peer->staging].desc.page_bytes, &err);
    if (st != KVR_OK) {
        refuse(peer, st, err.msg);
        return;
    }
    peer->regions_ready = true;
}

kvr_status_t kvr__handshake_msg(kvr_conn_t *c, kvr__peer_t *peer,
                                const kvr_msg_t *msg, bool *handled)
{
    kvr_error_t err = {0};
    *handled = true;
    if (msg->type == KVR_MSG_BYE) {
        kvr__link_close(peer->link, msg->u.bye.status ? msg->u.bye.status
                                                      : KVR_ERR_PEER_DEAD,
                        "peer said: %s", msg->u.bye.text);
        return KVR_OK;
    }
    kvr_status_t st = kvr_wire_gate(peer->link->auth, msg->type, &err);
    if (st != KVR_OK) {
        refuse(peer, st, err.msg);
        return KVR_OK;
    }
    switch (msg->type) {
    case KVR_MSG_HELLO:
    case KVR_MSG_HELLO_ACK: on_hello(c, peer, msg); break;
    case KVR_MSG_AUTH: on_auth(c, peer, msg); break;
    case KVR_MSG_LAYOUT: on_layout(c, peer, msg); break;
    case KVR_MSG_REGIONS: on_regions(c, peer, msg); break;
    default: *handled = false; break;
    }
    return KVR_OK;
}

bool kvr__peer_ready(const kvr_conn_t *c, const kvr__peer_t *peer)
{
    if (!peer->link->ready)
        return false;
    if (c->p.side == KVR_WIRE_PRODUCER)
        return peer->regions_ready;
    return true;
}
