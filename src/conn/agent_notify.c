/* Notifications: small application messages between agents, what routers
 * built on the agent talk over (NIXL's genNotif/getNotifs is the
 * precedent). A notification goes over a link the agent already has to
 * that instance (and that address, when one is named), or a NOTIFY link
 * dialled for it; it waits while the link is not ready, and fails with
 * KVR_AGENT_NOTIFY_FAILED if the link never becomes ready. The sender's
 * identity is the link's (HELLO, or LAYOUT with a key), never the
 * message's. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"

const kvr_wire_id_t *kvr__alink_expected(const kvr_agent_t *a,
                                         const kvr__alink_t *l)
{
    if (l->state == KVR__LINK_READY || l->ever_ready)
        return &l->peer_instance;
    switch (l->kind) {
    case KVR__LINK_STAGE:
        return l->dir ? &l->dir->instance : NULL;
    case KVR__LINK_NOTIFY:
        return &l->want;
    case KVR__LINK_JOIN:
        return &a->instance;
    default:
        return NULL; /* accepted, not yet known */
    }
}

/* Does l lead to peer (at address, when one is named: the dialled address,
 * or the listener an accepted peer announced in its notifications)? */
static bool reaches(const kvr_agent_t *a, const kvr__alink_t *l,
                    const kvr_wire_id_t *peer, const char *address)
{
    const kvr_wire_id_t *who = kvr__alink_expected(a, l);
    if (l->state == KVR__LINK_CLOSED || who == NULL ||
        !kvr_wire_id_equal(who, peer))
        return false;
    if (address[0] == '\0')
        return l->state == KVR__LINK_READY;
    const char *at = l->kind == KVR__LINK_ACCEPT ? l->peer_address : l->address;
    return strcmp(at, address) == 0;
}

static kvr__alink_t *find_link(kvr_agent_t *a, const kvr_wire_id_t *peer,
                               const char *address)
{
    kvr__alink_t *waiting = NULL;
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next) {
        if (!reaches(a, l, peer, address))
            continue;
        if (l->state == KVR__LINK_READY)
            return l;
        if (waiting == NULL)
            waiting = l;
    }
    return waiting;
}

static void failed(kvr_agent_t *a, const kvr_wire_id_t *peer, size_t len,
                   kvr_status_t st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

static void failed(kvr_agent_t *a, const kvr_wire_id_t *peer, size_t len,
                   kvr_status_t st, const char *fmt, ...)
{
    char msg[KVR_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvr__agent_log(a, "%s", msg);
    kvr__agent_notify_failed(a, peer, st, msg, len);
}

static void send_now(kvr_agent_t *a, kvr__alink_t *l, const kvr_wire_id_t *peer,
                     const uint8_t *payload, size_t len)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_NOTIFY);
    snprintf(m.u.notify.address, sizeof(m.u.notify.address), "%s", a->address);
    m.u.notify.payload = payload;
    m.u.notify.len = (uint32_t)len;
    kvr_status_t st = kvr__alink_send(a, l, &m);
    if (st != KVR_OK)
        failed(a, peer, len, st, "notify to '%.*s' at %s: sending failed (%s)",
               (int)peer->len, peer->bytes, l->address, kvr_status_name(st));
}

static kvr_status_t hold(kvr__alink_t *l, const kvr__cmd_t *c)
{
    kvr__pnotify_t *p = malloc(sizeof(*p) + c->payload_len + 1);
    if (p == NULL)
        return KVR_ERR_NO_MEMORY;
    p->next = NULL;
    p->peer = c->producer;
    p->len = c->payload_len;
    memcpy(p->payload, c->payload, c->payload_len);
    if (l->pending_tail)
        l->pending_tail->next = p;
    else
        l->pending = p;
    l->pending_tail = p;
    return KVR_OK;
}

void kvr__notify_command(kvr_agent_t *a, kvr__cmd_t *c)
{
    const kvr_wire_id_t *peer = &c->producer;
    kvr__alink_t *l = find_link(a, peer, c->address);
    kvr_error_t err = {0};
    if (l == NULL && c->address[0] == '\0') {
        failed(a, peer, c->payload_len, KVR_ERR_NOT_FOUND,
               "notify to '%.*s': no link to that instance (name its address)",
               (int)peer->len, peer->bytes);
        return;
    }
    if (l == NULL &&
        kvr__alink_dial(a, c->address, KVR__LINK_NOTIFY, &l, &err) != KVR_OK) {
        failed(a, peer, c->payload_len, err.code, "notify to '%.*s' at %s: %s",
               (int)peer->len, peer->bytes, c->address, err.msg);
        return;
    }
    if (l->kind == KVR__LINK_NOTIFY && l->want.len == 0)
        l->want = *peer;
    if (l->state == KVR__LINK_READY)
        send_now(a, l, peer, c->payload, c->payload_len);
    else if (hold(l, c) != KVR_OK)
        failed(a, peer, c->payload_len, KVR_ERR_NO_MEMORY,
               "notify to '%.*s': no memory", (int)peer->len, peer->bytes);
}

void kvr__notify_link_ready(kvr_agent_t *a, kvr__alink_t *l)
{
    if (l->kind == KVR__LINK_NOTIFY &&
        !kvr_wire_id_equal(&l->peer_instance, &l->want)) {
        kvr__alink_close(a, l, KVR_ERR_PEER_ROLE,
                         "%s is instance '%.*s', not "
                         "'%.*s'",
                         l->address, (int)l->peer_instance.len,
                         l->peer_instance.bytes, (int)l->want.len,
                         l->want.bytes);
        return;
    }
    while (l->pending != NULL && l->state == KVR__LINK_READY) {
        kvr__pnotify_t *p = l->pending;
        l->pending = p->next;
        if (l->pending == NULL)
            l->pending_tail = NULL;
        send_now(a, l, &p->peer, p->payload, p->len);
        free(p);
    }
}

void kvr__notify_link_lost(kvr_agent_t *a, kvr__alink_t *l)
{
    while (l->pending != NULL) {
        kvr__pnotify_t *p = l->pending;
        l->pending = p->next;
        failed(a, &p->peer, p->len, l->close_status,
               "notify to '%.*s' at %s: %s", (int)p->peer.len, p->peer.bytes,
               l->address, l->close_why);
        free(p);
    }
    l->pending_tail = NULL;
}

void kvr__notify_msg(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_notify_t *m)
{
    if (m->address[0])
        snprintf(l->peer_address, sizeof(l->peer_address), "%s", m->address);
    kvr__notify_node_t *n = calloc(1, sizeof(*n) + m->len + 1);
    if (n == NULL) {
        kvr__agent_log(a, "a notification from %s dropped: no memory",
                       l->address);
        return;
    }
    n->sender = l->peer_instance;
    n->topo = l->link->peer.topo;
    n->side = l->link->peer.side;
    n->incarnation = l->peer_incarnation;
    snprintf(n->address, sizeof(n->address), "%s", m->address);
    n->len = m->len;
    if (m->len)
        memcpy(n->payload, m->payload, m->len);
    kvr__agent_notify_in(a, n);
}
