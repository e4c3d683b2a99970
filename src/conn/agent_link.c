/* The agent's control links: non-blocking dial and accept, the handshake
 * (HELLO with instance id and incarnation; with a key blank HELLOs, AUTH,
 * then LAYOUT: docs/PROTOCOL.md), frame dispatch, closing
 * and reaping, connect/handshake deadlines and idle close. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent_internal.h"

static uint64_t ms_ns(uint32_t ms)
{
    return (uint64_t)ms * 1000000ull;
}

/* Accepted links are unauthenticated until their handshake is done: they
 * live on their own budget (max_unauth_links, handshake_timeout_ms) and
 * never take the seats of the link table (docs/security.md). */
static bool table_full(const kvr_agent_t *a)
{
    return a->num_links - a->num_unauth >= KVR_AGENT_MAX_LINKS;
}

static void leave_unauth(kvr_agent_t *a, kvr__alink_t *l)
{
    if (l->unauth) {
        l->unauth = false;
        a->num_unauth--;
    }
}

static kvr__alink_t *link_new(kvr_agent_t *a, kvr__alink_kind_t kind,
                              const char *address)
{
    bool unauth = kind == KVR__LINK_ACCEPT;
    if (!unauth && table_full(a))
        return NULL;
    kvr__alink_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->kind = kind;
    l->fd = -1;
    l->staging = -1;
    l->serial = ++a->next_serial;
    l->unauth = unauth;
    a->num_unauth += unauth;
    snprintf(l->address, sizeof(l->address), "%s", address);
    l->deadline_ns = kvr_now_ns() + ms_ns(unauth ? a->p.handshake_timeout_ms
                                                 : a->p.connect_timeout_ms);
    l->last_used_ns = kvr_now_ns();
    l->next = a->links;
    if (a->links)
        a->links->prev = l;
    a->links = l;
    a->num_links++;
    return l;
}

static kvr_status_t resolve(const char *address, struct addrinfo **res,
                            kvr_error_t *err)
{
    char host[KVR_AGENT_ADDR_MAX], service[8];
    const char *colon = strrchr(address, ':');
    size_t n = colon ? (size_t)(colon - address) : 0;
    if (colon == NULL || n == 0 || n >= sizeof(host) ||
        strlen(colon + 1) == 0 || strlen(colon + 1) >= sizeof(service))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "address '%s' is not host:port", address);
    memcpy(host, address, n);
    host[n] = '\0';
    snprintf(service, sizeof(service), "%s", colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    int rc = getaddrinfo(host, service, &hints, res);
    if (rc != 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "address '%s': %s", address,
                             gai_strerror(rc));
    return KVR_OK;
}

/* The peer's local twin when it runs on this host, else TCP (connecting:
 * the loop waits for it to be writable). */
static kvr_status_t open_socket(const char *address, int *fd, kvr_error_t *err)
{
    *fd = kvr__local_connect(address);
    if (*fd >= 0)
        return KVR_OK;
    struct addrinfo *res = NULL;
    kvr_status_t st = resolve(address, &res, err);
    if (st != KVR_OK)
        return st;
    *fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (*fd < 0 || (connect(*fd, res->ai_addr, res->ai_addrlen) != 0 &&
                    errno != EINPROGRESS))
        st = kvr_error_set(
            err, errno == ECONNREFUSED ? KVR_ERR_PEER_DEAD : KVR_ERR_IO,
            "connect %s: %s", address, strerror(errno));
    freeaddrinfo(res);
    return st;
}

kvr_status_t kvr__alink_dial(kvr_agent_t *a, const char *address,
                             kvr__alink_kind_t kind, kvr__alink_t **out,
                             kvr_error_t *err)
{
    int fd = -1;
    kvr_status_t st = open_socket(address, &fd, err);
    kvr__alink_t *l = st == KVR_OK ? link_new(a, kind, address) : NULL;
    if (st == KVR_OK && l == NULL)
        st = kvr_error_set(err, KVR_ERR_NO_SPACE, "dialling %s: %u links open",
                           address, a->num_links);
    if (st == KVR_OK && kvr__loop_watch(a, fd, l, true) != KVR_OK)
        st = kvr_error_set(err, KVR_ERR_IO, "epoll: %s", strerror(errno));
    if (st != KVR_OK) {
        if (fd >= 0)
            close(fd);
        if (l != NULL) {
            l->state = KVR__LINK_CLOSED; /* reaped like any other */
            l->refused = true;
        }
        return st;
    }
    l->fd = fd;
    l->state = KVR__LINK_CONNECTING;
    l->epoll_out = true;
    kvr__agent_log(a, "link %u: dialling %s", l->serial, address);
    *out = l;
    return KVR_OK;
}

static kvr_status_t attach_socket(kvr_agent_t *a, kvr__alink_t *l, int fd,
                                  bool initiator)
{
    kvr_error_t err = {0};
    kvr_status_t st = kvr__link_create(
        fd, initiator, a->has_key ? a->key : NULL, &l->link, &err);
    l->fd = -1;
    if (st != KVR_OK) {
        close(fd);
        kvr__alink_close(a, l, st, "link: %s", err.msg);
        return st;
    }
    l->state = KVR__LINK_HANDSHAKE;
    if (!a->has_key && !a->p.insecure && !l->link->loopback_peer) {
        kvr__alink_close(a, l, KVR_ERR_AUTH,
                         "refused a non-loopback peer "
                         "without a key (configure a key, or insecure)");
        return KVR_ERR_AUTH;
    }
    return KVR_OK;
}

/* The unauthenticated budget is full: the oldest such link goes, so a
 * flood of idle connections cannot keep a real peer out. */
static void make_unauth_room(kvr_agent_t *a)
{
    uint32_t live = 0;
    kvr__alink_t *oldest = NULL;
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next)
        if (l->unauth && l->state != KVR__LINK_CLOSED) {
            live++;
            oldest = l; /* new links go to the front */
        }
    if (live >= a->p.max_unauth_links && oldest != NULL)
        kvr__alink_close(a, oldest, KVR_ERR_PEER_DEAD,
                         "%u connections in their handshake: the oldest, "
                         "from %s, closed for a new one",
                         live, oldest->address);
}

/* At most max_unauth_links a turn: the ones closed for room are reaped
 * (their fds closed) before more come in; the listener stays readable. */
void kvr__alink_accept(kvr_agent_t *a, int listen_fd)
{
    for (uint32_t i = 0; i < a->p.max_unauth_links; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(listen_fd, (struct sockaddr *)&ss, &len,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        char peer[KVR_AGENT_ADDR_MAX] = "?";
        char host[INET6_ADDRSTRLEN] = "?";
        if (ss.ss_family == AF_UNIX)
            snprintf(host, sizeof(host), "local");
        if (ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host,
                      sizeof(host));
        snprintf(peer, sizeof(peer), "%s:%u", host,
                 ss.ss_family == AF_INET
                     ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                     : 0u);
        make_unauth_room(a);
        kvr__alink_t *l = link_new(a, KVR__LINK_ACCEPT, peer);
        if (l == NULL) {
            close(fd);
            kvr__agent_log(a, "refused %s: no memory for a link", peer);
            continue;
        }
        if (kvr__loop_watch(a, fd, l, false) != KVR_OK) {
            close(fd);
            l->state = KVR__LINK_CLOSED;
            continue;
        }
        attach_socket(a, l, fd, false);
    }
}

void kvr__alink_close(kvr_agent_t *a, kvr__alink_t *l, kvr_status_t why,
                      const char *fmt, ...)
{
    if (l->state == KVR__LINK_CLOSED)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->close_why, sizeof(l->close_why), fmt, ap);
    va_end(ap);
    l->close_status = why == KVR_OK ? KVR_ERR_PEER_DEAD : why;
    /* a refusal (layout, auth, role) is final for the waiting requests; a
     * loss (EOF, reset, idle close) is redialled by later ones */
    l->refused = why != KVR_OK && why != KVR_ERR_PEER_DEAD && why != KVR_ERR_IO;
    bool was_ready = l->state == KVR__LINK_READY;
    l->state = KVR__LINK_CLOSED;
    if (l->refused) {
        a->refusals++;
        a->refusal_status = l->close_status;
        snprintf(a->refusal_why, sizeof(a->refusal_why), "%s", l->close_why);
    }
    if (l->refused && !was_ready) {
        /* a peer we talk to at all: without a key its HELLO came, with
         * one its AUTH verified (anyone who reaches the port is not) */
        kvr__link_t *k = l->link;
        bool known = k != NULL && (a->has_key ? kvr_wire_auth_verified(k->auth)
                                              : k->hello_recv);
        char msg[KVR_ERROR_MSG_MAX + KVR_AGENT_ADDR_MAX + 2];
        snprintf(msg, sizeof(msg), "%s: %s", l->address, l->close_why);
        kvr__agent_peer_refused(a, &l->claimed, known, l->close_status, msg);
    }
    if (l->link != NULL) {
        kvr__link_flush(l->link);
        kvr__link_close(l->link, l->close_status, "%s", l->close_why);
    }
    /* a peer silent past a deadline: its data endpoint is force-closed at
     * reaping, not flushed (docs/agent.md Partitions) */
    if (why == KVR_ERR_TIMEOUT || why == KVR_ERR_TRANSPORT)
        kvr__dpeer_fail(l->data, l->close_status);
    kvr__agent_log(a, "link %u (%s) closed%s: %s", l->serial, l->address,
                   was_ready ? "" : " before it was ready", l->close_why);
}

/* ---- sending ---- */

/* Tests: drop, double or alter the nth frame of one type (control-frame
 * faults). Returns how many copies to send. */
static int fault_copies(kvr_agent_t *a, kvr__link_t *k, kvr_msg_type_t type)
{
    static const char *const what[] = {"dropped", "sent twice", "tampered"};
    kvr__frame_fault_t *f = &a->fault;
    if (f->nth == 0 || f->type != type || ++f->seen != f->nth)
        return 1;
    kvr__agent_log(a, "fault injection: %s #%u %s", kvr_msg_type_name(type),
                   f->nth, what[f->mode]);
    k->tamper_next = f->mode == KVR__FAULT_TAMPER;
    return f->mode == KVR__FAULT_DROP        ? 0
           : f->mode == KVR__FAULT_DUPLICATE ? 2
                                             : 1;
}

kvr_status_t kvr__alink_send(kvr_agent_t *a, kvr__alink_t *l,
                             const kvr_msg_t *msg)
{
    if (l == NULL || l->link == NULL || l->state == KVR__LINK_CLOSED)
        return KVR_ERR_PEER_DEAD;
    l->last_used_ns = kvr_now_ns();
    kvr_status_t st = KVR_OK;
    for (int i = fault_copies(a, l->link, msg->type); i > 0 && st == KVR_OK;
         i--)
        st = kvr__link_send(l->link, msg);
    if (st != KVR_OK)
        kvr__alink_close(a, l, st, "sending %s failed (%s)",
                         kvr_msg_type_name(msg->type), kvr_status_name(st));
    return st;
}

kvr_status_t kvr__alink_send_corked(kvr_agent_t *a, kvr__alink_t *l,
                                    const kvr_msg_t *msg)
{
    if (l != NULL && l->link != NULL)
        l->link->corked = a->corked = true;
    return kvr__alink_send(a, l, msg);
}

void kvr__alink_uncork_all(kvr_agent_t *a)
{
    if (!a->corked)
        return;
    a->corked = false;
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next) {
        if (l->link == NULL || !l->link->corked)
            continue;
        l->link->corked = false;
        if (l->state != KVR__LINK_CLOSED && !kvr__link_flush(l->link))
            kvr__alink_close(a, l, KVR_ERR_PEER_DEAD, "%s: %s", l->address,
                             l->link->close_why);
    }
}

static void refuse(kvr_agent_t *a, kvr__alink_t *l, kvr_status_t st,
                   const char *why)
{
    if (l->link != NULL && l->state != KVR__LINK_CLOSED)
        kvr__link_refuse(l->link, st, why); /* BYE with the reason */
    kvr__alink_close(a, l, st, "refused: %s", why);
}

/* ---- handshake ---- */

/* Stage links pull (consumer), JOIN links join (producer); elsewhere we
 * are what our role says (a dual-role agent: producer). */
static kvr_wire_side_t our_side(const kvr_agent_t *a, const kvr__alink_t *l)
{
    if (l->kind == KVR__LINK_STAGE)
        return KVR_WIRE_CONSUMER;
    if (l->kind == KVR__LINK_JOIN || (a->p.role & KVR_AGENT_PRODUCER))
        return KVR_WIRE_PRODUCER;
    return KVR_WIRE_CONSUMER;
}

/* Our HELLO: the regions that move (consumer-only ones and staging
 * excluded). */
static kvr_status_t build_hello(kvr_agent_t *a, kvr__alink_t *l,
                                kvr_error_t *err)
{
    kvr_region_desc_t *descs = calloc(a->num_regions + 1, sizeof(*descs));
    if (descs == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    size_t n = 0;
    for (uint32_t i = 0; i < a->num_regions; i++)
        if (kvr__region_moves(&a->regions[i]))
            descs[n++] = a->regions[i].desc;
    kvr_msg_hello_t *h = &l->link->ours;
    kvr_status_t st = kvr_wire_hello_init(h, our_side(a, l), &a->p.topo,
                                          &a->p.layout, descs, n, err);
    free(descs);
    h->has_key = a->has_key;
    h->instance = a->instance;
    h->incarnation = a->incarnation;
    snprintf(h->settings, sizeof(h->settings), "%s", a->settings);
    if (a->speaks_3_0)
        h->proto_minor = 0;
    return st;
}

static void start_handshake(kvr_agent_t *a, kvr__alink_t *l)
{
    kvr_error_t err = {0};
    kvr_status_t st = build_hello(a, l, &err);
    if (st == KVR_OK)
        st = kvr__link_send_hello(l->link, KVR_MSG_HELLO);
    if (st != KVR_OK)
        kvr__alink_close(a, l, st, "HELLO: %s",
                         err.msg[0] ? err.msg : kvr_status_name(st));
}

static void on_connected(kvr_agent_t *a, kvr__alink_t *l)
{
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr == EINPROGRESS || soerr == EALREADY)
        return;
    if (soerr != 0) {
        close(l->fd);
        l->fd = -1;
        kvr__alink_close(a, l,
                         soerr == ECONNREFUSED ? KVR_ERR_PEER_DEAD : KVR_ERR_IO,
                         "connect %s: %s", l->address, strerror(soerr));
        return;
    }
    if (attach_socket(a, l, l->fd, true) == KVR_OK)
        start_handshake(a, l);
}

/* Which peers each kind of link accepts, beyond kvr_wire_hello_check
 * (whether a stage may JOIN is checked at its JOIN). */
static kvr_status_t check_peer(const kvr_agent_t *a, const kvr__alink_t *l,
                               const kvr_msg_hello_t *p, kvr_error_t *err)
{
    bool same = kvr_wire_id_equal(&p->instance, &a->instance);
    bool peer_head = p->topo.pp_rank == 0 && p->topo.tp_rank == 0;
    if (p->instance.len == 0 || p->incarnation == 0)
        return kvr_error_set(err, KVR_ERR_PEER_ROLE,
                             "peer sent no instance id or incarnation (not an "
                             "agent)");
    if (p->topo.pp_rank >= p->topo.pp_size ||
        p->topo.tp_rank >= p->topo.tp_size)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "peer ranks pp %u/%u tp %u/%u "
                             "out of range",
                             p->topo.pp_rank, p->topo.pp_size, p->topo.tp_rank,
                             p->topo.tp_size);
    if (l->kind == KVR__LINK_JOIN && (!same || !peer_head))
        return kvr_error_set(err, KVR_ERR_PEER_ROLE,
                             "%s is stage (pp %u, tp %u) of instance '%.*s', "
                             "not the PP head of '%.*s'",
                             l->address, p->topo.pp_rank, p->topo.tp_rank,
                             (int)p->instance.len, p->instance.bytes,
                             (int)a->instance.len, a->instance.bytes);
    return KVR_OK;
}

static void on_ready(kvr_agent_t *a, kvr__alink_t *l);

/* What the handshake owes the peer now (AUTH, LAYOUT: the link helpers);
 * the link is up once both layouts were compared. */
static void handshake_step(kvr_agent_t *a, kvr__alink_t *l)
{
    kvr__link_t *k = l->link;
    if (l->state != KVR__LINK_HANDSHAKE)
        return;
    if (kvr__link_handshake_step(k))
        on_ready(a, l);
    else if (k->closed)
        kvr__alink_close(a, l, k->close_status, "%s", k->close_why);
}

/* Stage and JOIN links reach producers; any side may accept or be
 * notified. */
static kvr_wire_side_t peer_side_wanted(const kvr__alink_t *l)
{
    if (l->kind == KVR__LINK_STAGE || l->kind == KVR__LINK_JOIN)
        return KVR_WIRE_PRODUCER;
    return l->link->peer.side;
}

/* The peer's full HELLO (keyless: the HELLO itself; keyed: its LAYOUT,
 * after AUTH): the layout comparison, the agent's own checks, and the
 * peer's instance id and incarnation. Layouts are compared where KV can
 * move, i.e. both sides have regions; an agent without any (a router)
 * talks notifications only. */
static kvr_status_t take_full_hello(kvr_agent_t *a, kvr__alink_t *l,
                                    const kvr_msg_hello_t *full,
                                    kvr_error_t *err)
{
    kvr__link_t *k = l->link;
    l->claimed = full->instance; /* known, even if refused below */
    l->kv = full->num_classes > 0 && k->ours.num_classes > 0;
    kvr_status_t st = l->kv ? kvr_wire_hello_check(&k->ours, full,
                                                   peer_side_wanted(l), err)
                            : kvr_wire_hello_check_intro(
                                  &k->ours, full, peer_side_wanted(l), err);
    if (st == KVR_OK && a->has_key)
        st = kvr_wire_auth_note_layout(k->auth, full, err);
    if (st == KVR_OK)
        st = check_peer(a, l, full, err);
    if (st != KVR_OK)
        return st;
    k->peer = *full;
    l->peer_instance = full->instance;
    l->peer_incarnation = full->incarnation;
    return KVR_OK;
}

/* With a key the peer's HELLO is blank: only version, side and key are
 * checked now; the rest waits for its LAYOUT (docs/PROTOCOL.md). */
static void on_hello(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *msg)
{
    kvr__link_t *k = l->link;
    kvr_error_t err = {0};
    if (k->hello_recv || (msg->type == KVR_MSG_HELLO) == k->initiator) {
        refuse(a, l, KVR_ERR_PROTO, "unexpected HELLO");
        return;
    }
    k->peer = msg->u.hello;
    k->hello_recv = true;
    kvr_status_t st = kvr__link_note_peer_hello(k, &err);
    if (st == KVR_OK && !k->initiator)
        st = build_hello(a, l, &err);
    if (st == KVR_OK && a->has_key)
        st = kvr_wire_hello_check_intro(&k->ours, &k->peer, peer_side_wanted(l),
                                        &err);
    else if (st == KVR_OK)
        st = take_full_hello(a, l, &msg->u.hello, &err);
    if (st != KVR_OK) {
        refuse(a, l, st, err.msg);
        return;
    }
    if (!k->initiator && kvr__link_send_hello(k, KVR_MSG_HELLO_ACK) != KVR_OK) {
        kvr__alink_close(a, l, KVR_ERR_PEER_DEAD, "sending HELLO_ACK failed");
        return;
    }
    handshake_step(a, l);
}

static void on_auth(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *msg)
{
    kvr_error_t err = {0};
    kvr_status_t st = kvr_wire_auth_verify(l->link->auth, &msg->u.auth, &err);
    if (st != KVR_OK) {
        refuse(a, l, st, err.msg);
        return;
    }
    handshake_step(a, l);
}

static void on_layout(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *msg)
{
    kvr_error_t err = {0};
    kvr_status_t st = take_full_hello(a, l, &msg->u.hello, &err);
    if (st != KVR_OK) {
        refuse(a, l, st, err.msg);
        return;
    }
    handshake_step(a, l);
}

/* Same peer process seat, another incarnation: the old process is gone. */
static bool same_seat(const kvr__alink_t *x, const kvr__alink_t *y)
{
    const kvr_wire_topo_t *s = &x->link->peer.topo, *t = &y->link->peer.topo;
    return x->kind == y->kind && x->link->peer.side == y->link->peer.side &&
           kvr_wire_id_equal(&x->peer_instance, &y->peer_instance) &&
           s->pp_rank == t->pp_rank && s->tp_rank == t->tp_rank &&
           s->dcp_rank == t->dcp_rank && s->dp_rank == t->dp_rank;
}

static void close_old_incarnations(kvr_agent_t *a, kvr__alink_t *l)
{
    for (kvr__alink_t *o = a->links; o != NULL; o = o->next)
        if (o != l && o->state == KVR__LINK_READY && same_seat(o, l) &&
            o->peer_incarnation != l->peer_incarnation)
            kvr__alink_close(a, o, KVR_ERR_PEER_DEAD,
                             "peer '%.*s' (pp %u, tp %u, dcp %u) restarted: "
                             "incarnation %016llx is now %016llx",
                             (int)l->peer_instance.len, l->peer_instance.bytes,
                             l->link->peer.topo.pp_rank,
                             l->link->peer.topo.tp_rank,
                             l->link->peer.topo.dcp_rank,
                             (unsigned long long)o->peer_incarnation,
                             (unsigned long long)l->peer_incarnation);
}

static void on_ready(kvr_agent_t *a, kvr__alink_t *l)
{
    leave_unauth(a, l);
    if (a->num_links - a->num_unauth > KVR_AGENT_MAX_LINKS) {
        refuse(a, l, KVR_ERR_NO_SPACE, "link table full");
        return;
    }
    l->state = KVR__LINK_READY;
    l->ever_ready = true;
    l->last_used_ns = kvr_now_ns();
    kvr__agent_log(a, "link %u (%s) ready: peer '%.*s' pp %u tp %u dcp %u",
                   l->serial, l->address, (int)l->peer_instance.len,
                   l->peer_instance.bytes, l->link->peer.topo.pp_rank,
                   l->link->peer.topo.tp_rank, l->link->peer.topo.dcp_rank);
    close_old_incarnations(a, l);
    switch (l->kind) {
    case KVR__LINK_STAGE:
        kvr__link_ready_stage(a, l);
        break;
    case KVR__LINK_JOIN:
        kvr__link_ready_join(a, l);
        break;
    case KVR__LINK_ACCEPT:
        kvr__link_ready_accept(a, l);
        break;
    case KVR__LINK_NOTIFY:
        break;
    }
    if (l->state == KVR__LINK_READY)
        kvr__notify_link_ready(a, l);
}

/* ---- frames ---- */

/* After the handshake: what each kind of link may carry. KV messages
 * reach a producer from the consumers it accepted; any link carries
 * notifications. */
static bool on_request_frame(kvr_agent_t *a, kvr__alink_t *l,
                             const kvr_msg_t *m)
{
    bool accepted = l->kind == KVR__LINK_ACCEPT;
    bool peer_consumer = l->link->peer.side == KVR_WIRE_CONSUMER;
    bool from_consumer = accepted && peer_consumer &&
                         (a->p.role & KVR_AGENT_PRODUCER);
    bool stage_link = l->kind == KVR__LINK_STAGE;
    bool streams = !a->speaks_3_0;
    switch (m->type) {
    case KVR_MSG_NOTIFY:
        kvr__notify_msg(a, l, &m->u.notify);
        return true;
    case KVR_MSG_REGIONS:
        if (from_consumer)
            kvr__link_on_regions(a, l, &m->u.regions);
        return from_consumer;
    case KVR_MSG_STREAM_REQUEST:
        from_consumer = from_consumer && streams;
        /* fall through */
    case KVR_MSG_WRITE_REQUEST:
    case KVR_MSG_RELEASE:
        if (from_consumer)
            kvr__send_msg(a, l, m);
        return from_consumer;
    case KVR_MSG_CHUNK_DONE: /* a chunk (to us) or its ack (from us) */
        if (from_consumer)
            kvr__send_msg(a, l, m);
        else if (stage_link)
            kvr__recv_msg(a, l, m);
        return from_consumer || stage_link;
    case KVR_MSG_JOIN:
        if (accepted && !peer_consumer)
            kvr__link_on_join(a, l, &m->u.join);
        return accepted && !peer_consumer;
    case KVR_MSG_STAGES: /* a head greets every consumer link with one */
        if (stage_link)
            kvr__link_on_stages(a, l, &m->u.stages);
        return stage_link || l->kind == KVR__LINK_NOTIFY;
    case KVR_MSG_LAYERS_DONE:
        stage_link = stage_link && streams;
        /* fall through */
    case KVR_MSG_WRITE_DONE:
    case KVR_MSG_WRITE_FAILED:
        if (stage_link)
            kvr__recv_msg(a, l, m);
        return stage_link;
    default:
        return false;
    }
}

static void on_frame(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_t *m)
{
    kvr_error_t err = {0};
    l->last_used_ns = kvr_now_ns();
    if (m->type == KVR_MSG_BYE) {
        kvr__alink_close(a, l,
                         m->u.bye.status ? m->u.bye.status : KVR_ERR_PEER_DEAD,
                         "%s said: %s", l->address,
                         m->u.bye.text[0] ? m->u.bye.text : "goodbye");
        return;
    }
    kvr_status_t st = kvr_wire_gate(l->link->auth, m->type, &err);
    if (st != KVR_OK) {
        refuse(a, l, st, err.msg);
        return;
    }
    if (m->type == KVR_MSG_HELLO || m->type == KVR_MSG_HELLO_ACK)
        on_hello(a, l, m);
    else if (m->type == KVR_MSG_AUTH)
        on_auth(a, l, m);
    else if (m->type == KVR_MSG_LAYOUT)
        on_layout(a, l, m);
    else if (l->state != KVR__LINK_READY)
        refuse(a, l, KVR_ERR_PROTO, "request message before the handshake");
    else if (!on_request_frame(a, l, m))
        refuse(a, l, KVR_ERR_PROTO, "unexpected message on this link");
}

bool kvr__alink_inject(kvr_agent_t *a, kvr__alink_kind_t kind,
                       const kvr_msg_t *m)
{
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next)
        if (l->kind == kind && l->state == KVR__LINK_READY) {
            on_frame(a, l, m);
            return true;
        }
    return false;
}

static void read_frames(kvr_agent_t *a, kvr__alink_t *l)
{
    kvr__link_read(l->link);
    while (l->state != KVR__LINK_CLOSED) {
        kvr_msg_t msg;
        bool have = false;
        kvr_error_t err = {0};
        kvr_status_t st = kvr__link_next(l->link, &msg, &have, &err);
        if (st != KVR_OK) {
            kvr__alink_close(a, l, st, "bad frame from %s: %s", l->address,
                             err.msg);
            break;
        }
        if (!have)
            break;
        on_frame(a, l, &msg);
        kvr_msg_free(&msg);
    }
    if (l->link->eof)
        kvr__alink_close(a, l, KVR_ERR_PEER_DEAD, "%s: %s", l->address,
                         l->link->eof_why);
}

void kvr__alink_on_io(kvr_agent_t *a, kvr__alink_t *l, uint32_t events)
{
    if (l->state == KVR__LINK_CLOSED)
        return;
    if (l->state == KVR__LINK_CONNECTING) {
        on_connected(a, l);
        return;
    }
    if ((events & EPOLLOUT) && !kvr__link_flush(l->link))
        kvr__alink_close(a, l, KVR_ERR_PEER_DEAD, "%s: %s", l->address,
                         l->link->close_why);
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        read_frames(a, l);
}

/* ---- timers, reaping ---- */

static void tick_one(kvr_agent_t *a, kvr__alink_t *l, uint64_t now,
                     uint64_t *next)
{
    uint64_t at = UINT64_MAX;
    if (l->state == KVR__LINK_CONNECTING || l->state == KVR__LINK_HANDSHAKE) {
        if (now >= l->deadline_ns)
            kvr__alink_close(
                a, l, KVR_ERR_TIMEOUT,
                "%s %s: no answer within "
                "%u ms",
                l->state == KVR__LINK_CONNECTING ? "connect" : "handshake with",
                l->address,
                l->unauth ? a->p.handshake_timeout_ms
                          : a->p.connect_timeout_ms);
        at = l->deadline_ns;
    } else if (l->state == KVR__LINK_READY && l->users == 0 &&
               l->pending == NULL &&
               (l->kind == KVR__LINK_STAGE || l->kind == KVR__LINK_NOTIFY)) {
        at = l->last_used_ns + ms_ns(a->p.idle_close_ms);
        if (now >= at) {
            kvr_msg_t bye;
            kvr_msg_init(&bye, KVR_MSG_BYE);
            snprintf(bye.u.bye.text, sizeof(bye.u.bye.text), "idle");
            kvr__link_send(l->link, &bye);
            kvr__alink_close(a, l, KVR_OK, "idle for %u ms",
                             a->p.idle_close_ms);
        }
    }
    if (l->state != KVR__LINK_CLOSED && at < *next)
        *next = at;
}

void kvr__alink_tick(kvr_agent_t *a, uint64_t now, uint64_t *next)
{
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next)
        tick_one(a, l, now, next);
}

static void link_free(kvr_agent_t *a, kvr__alink_t *l)
{
    int fd = l->link ? l->link->fd : l->fd;
    kvr__loop_unwatch(a, fd);
    if (l->link == NULL && l->fd >= 0)
        close(l->fd);
    kvr__dpeer_close(l->data);
    kvr__agpu_link_free(a, l); /* after the puts reading it were flushed */
    for (uint32_t i = 0; l->maps != NULL && i < l->num_maps; i++)
        kvr__agpu_unmap(&l->maps[i]);
    free(l->maps);
    free(l->twins);
    for (kvr__pnotify_t *p = l->pending, *n; p != NULL; p = n) {
        n = p->next;
        free(p);
    }
    kvr__link_destroy(l->link);
    leave_unauth(a, l);
    if (l->prev)
        l->prev->next = l->next;
    else
        a->links = l->next;
    if (l->next)
        l->next->prev = l->prev;
    a->num_links--;
    free(l);
}

/* Closed links: the requests and pulls on them learn it, then they go.
 * Handlers may close more links, hence the loop. */
void kvr__alink_reap(kvr_agent_t *a)
{
    for (bool again = true; again;) {
        again = false;
        for (kvr__alink_t *l = a->links, *n; l != NULL; l = n) {
            n = l->next;
            if (l->state != KVR__LINK_CLOSED)
                continue;
            kvr__send_link_lost(a, l);
            kvr__recv_link_lost(a, l);
            kvr__link_lost_dir(a, l);
            kvr__link_lost_stage(a, l);
            kvr__notify_link_lost(a, l);
            if (a->join_link == l) {
                a->join_link = NULL;
                a->join_retry_ns = kvr_now_ns() + 200 * 1000000ull;
            }
            link_free(a, l);
            again = true;
            break; /* handlers may have freed or closed others */
        }
    }
}

void kvr__alink_free_all(kvr_agent_t *a)
{
    while (a->links != NULL)
        link_free(a, a->links);
    a->join_link = NULL;
}
