/* Control links (TCP, or a Unix socket on one host): framing over a byte
 * stream, bounded buffers, the frame bookkeeping AUTH needs and the
 * session MAC (docs/PROTOCOL.md Session MAC). */
#include "link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define RX_CHUNK 65536u /* bytes asked of one recv */

static kvr_status_t errno_status(kvr_error_t *err, const char *what,
                                 const char *host, uint16_t port)
{
    int e = errno;
    return kvr_error_set(err, e == ETIMEDOUT ? KVR_ERR_TIMEOUT : KVR_ERR_IO,
                         "%s %s:%u: %s", what, host, port, strerror(e));
}

static bool is_loopback(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        return false;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;
        return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    }
    return ss.ss_family == AF_UNIX; /* a local twin: as 127.0.0.1 */
}

static void set_nonblocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static kvr_status_t resolve(const char *host, uint16_t port,
                            struct addrinfo **res, kvr_error_t *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    int rc = getaddrinfo(host, service, &hints, res);
    if (rc != 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "host '%s': %s", host,
                             gai_strerror(rc));
    return KVR_OK;
}

static kvr_status_t wait_connected(int fd, const char *host, uint16_t port,
                                   uint32_t timeout_ms, kvr_error_t *err)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int rc = poll(&p, 1, (int)timeout_ms);
    if (rc == 0)
        return kvr_error_set(err, KVR_ERR_TIMEOUT,
                             "connect %s:%u: no answer within %u ms", host,
                             port, timeout_ms);
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (rc < 0 || soerr != 0) {
        errno = rc < 0 ? errno : soerr;
        return errno_status(err, "connect", host, port);
    }
    return KVR_OK;
}

kvr_status_t kvr__tcp_connect(const char *host, uint16_t port,
                              uint32_t timeout_ms, int *fd, kvr_error_t *err)
{
    struct addrinfo *res = NULL;
    kvr_status_t st = resolve(host, port, &res, err);
    if (st != KVR_OK)
        return st;
    int s = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        freeaddrinfo(res);
        return errno_status(err, "socket for", host, port);
    }
    set_nonblocking(s);
    if (connect(s, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS)
        st = errno_status(err, "connect", host, port);
    else
        st = wait_connected(s, host, port, timeout_ms, err);
    freeaddrinfo(res);
    if (st != KVR_OK) {
        close(s);
        return st;
    }
    *fd = s;
    return KVR_OK;
}

kvr_status_t kvr__tcp_listen(const char *host, uint16_t port, int *fd,
                             uint16_t *bound, kvr_error_t *err)
{
    struct addrinfo *res = NULL;
    kvr_status_t st = resolve(host, port, &res, err);
    if (st != KVR_OK)
        return st;
    int s = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (s >= 0)
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (s < 0 || bind(s, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(s, 64) != 0) {
        st = errno_status(err, "listen on", host, port);
        if (s >= 0)
            close(s);
        freeaddrinfo(res);
        return st;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    getsockname(s, (struct sockaddr *)&ss, &len);
    uint16_t p = ss.ss_family == AF_INET6
                     ? ((struct sockaddr_in6 *)&ss)->sin6_port
                     : ((struct sockaddr_in *)&ss)->sin_port;
    set_nonblocking(s);
    *fd = s;
    if (bound != NULL)
        *bound = ntohs(p);
    return KVR_OK;
}

/* "\0kvrelay-link host:port": abstract (no file), gone with its socket. */
static socklen_t local_name(const char *address, struct sockaddr_un *sun)
{
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    int n = snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1,
                     "kvrelay-link %s", address);
    if (n < 0 || (size_t)n >= sizeof(sun->sun_path) - 1)
        return 0;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

kvr_status_t kvr__local_listen(const char *address, int *fd, kvr_error_t *err)
{
    struct sockaddr_un sun;
    socklen_t len = local_name(address, &sun);
    int s = len ? socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    *fd = -1;
    if (s >= 0 && (bind(s, (struct sockaddr *)&sun, len) != 0 ||
                   listen(s, 64) != 0)) {
        bool taken = errno == EADDRINUSE;
        close(s);
        return taken ? kvr_error_set(err, KVR_ERR_EXISTS,
                                     "another process on this host holds "
                                     "the local name of %s (kvrelay-link)",
                                     address)
                     : KVR_OK;
    }
    if (s >= 0)
        set_nonblocking(s);
    *fd = s;
    return KVR_OK;
}

int kvr__local_connect(const char *address)
{
    struct sockaddr_un sun;
    socklen_t len = local_name(address, &sun);
    int s = len ? socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                         0)
                : -1;
    /* a Unix connect is done or refused at once; EAGAIN: queue full */
    if (s >= 0 && connect(s, (struct sockaddr *)&sun, len) != 0) {
        close(s);
        return -1;
    }
    return s;
}

kvr_status_t kvr__link_create(int fd, bool initiator, const uint8_t *key,
                              kvr__link_t **out, kvr_error_t *err)
{
    kvr__link_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for a link");
    kvr_status_t st = kvr_wire_auth_create(key, &l->auth, err);
    if (st != KVR_OK) {
        free(l);
        return st;
    }
    set_nonblocking(fd);
    l->fd = fd;
    l->initiator = initiator;
    l->loopback_peer = is_loopback(fd);
    *out = l;
    return KVR_OK;
}

kvr_status_t kvr__link_note_peer_hello(kvr__link_t *link, kvr_error_t *err)
{
    return kvr_wire_auth_note_hello(link->auth, link->hello_frame,
                                    link->hello_len, false, err);
}

void kvr__link_destroy(kvr__link_t *link)
{
    if (link == NULL)
        return;
    if (link->fd >= 0)
        close(link->fd);
    kvr_wire_auth_destroy(link->auth);
    free(link->rx);
    free(link->tx);
    free(link);
}

void kvr__link_close(kvr__link_t *link, kvr_status_t why, const char *fmt, ...)
{
    if (link->closed)
        return;
    link->closed = true;
    link->close_status = why;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(link->close_why, sizeof(link->close_why), fmt, ap);
    va_end(ap);
    shutdown(link->fd, SHUT_RDWR);
}

static bool reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    uint8_t *b = realloc(*buf, c);
    if (b == NULL)
        return false;
    *buf = b;
    *cap = c;
    return true;
}

bool kvr__link_wants_write(const kvr__link_t *link)
{
    return !link->closed && link->tx_off < link->tx_len;
}

bool kvr__link_flush(kvr__link_t *link)
{
    while (link->tx_off < link->tx_len && !link->closed) {
        ssize_t n = send(link->fd, link->tx + link->tx_off,
                         link->tx_len - link->tx_off, MSG_NOSIGNAL);
        if (n > 0) {
            link->tx_off += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        kvr__link_close(link, KVR_ERR_PEER_DEAD, "send: %s",
                        n < 0 ? strerror(errno) : "closed");
        return false;
    }
    if (link->tx_off == link->tx_len)
        link->tx_off = link->tx_len = 0;
    return !link->closed;
}

/* Room for a frame and its tag, checked before the tag is made: a sealed
 * frame must go out, or the peer's sequence would skip one. */
static kvr_status_t tx_room(kvr__link_t *link, size_t len)
{
    size_t total = len + KVR_WIRE_TAG_BYTES;
    if (link->tx_len - link->tx_off + total > KVR_LINK_TX_MAX)
        return KVR_ERR_NO_SPACE;
    if (!reserve(&link->tx, &link->tx_cap, link->tx_len + total))
        return KVR_ERR_NO_MEMORY;
    return KVR_OK;
}

kvr_status_t kvr__link_send(kvr__link_t *link, const kvr_msg_t *msg)
{
    if (link->closed)
        return link->close_status ? link->close_status : KVR_ERR_PEER_DEAD;
    uint8_t *frame = NULL, tag[KVR_WIRE_TAG_BYTES];
    size_t len = 0, tag_len = 0;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_wire_encode_alloc(msg, &frame, &len, &err);
    if (st != KVR_OK)
        return st;
    if (msg->type == KVR_MSG_HELLO || msg->type == KVR_MSG_HELLO_ACK)
        st = kvr_wire_auth_note_hello(link->auth, frame, len, true, &err);
    if (st == KVR_OK)
        st = tx_room(link, len);
    if (st == KVR_OK)
        st = kvr_wire_seal(link->auth, frame, len, tag, &tag_len, &err);
    if (st == KVR_OK) {
        memcpy(link->tx + link->tx_len, frame, len);
        memcpy(link->tx + link->tx_len + len, tag, tag_len);
        if (link->tamper_next)
            link->tx[link->tx_len + len / 2] ^= 0x01;
        link->tamper_next = false;
        link->tx_len += len + tag_len;
    }
    free(frame);
    if (st == KVR_OK && !link->corked)
        kvr__link_flush(link);
    return st;
}

kvr_status_t kvr__link_send_hello(kvr__link_t *link, kvr_msg_type_t type)
{
    kvr_msg_t m = {.type = type};
    if (kvr_wire_auth_has_key(link->auth))
        kvr_wire_hello_blank(&link->ours, &m.u.hello);
    else
        m.u.hello = link->ours;
    kvr_status_t st = kvr__link_send(link, &m);
    link->hello_sent = st == KVR_OK;
    return st;
}

static kvr_status_t send_auth(kvr__link_t *l, kvr_error_t *err)
{
    kvr_msg_t m = {.type = KVR_MSG_AUTH};
    kvr_status_t st = kvr_wire_auth_sign(l->auth, &m.u.auth, err);
    if (st == KVR_OK)
        st = kvr__link_send(l, &m);
    l->auth_sent = st == KVR_OK;
    return st;
}

bool kvr__link_handshake_step(kvr__link_t *l)
{
    kvr_error_t err = {0};
    kvr_status_t st = KVR_OK;
    bool key = kvr_wire_auth_has_key(l->auth);
    if (l->closed || !l->hello_sent || !l->hello_recv)
        return false;
    if (key && !l->auth_sent)
        st = send_auth(l, &err);
    if (st == KVR_OK && key && !l->layout_sent &&
        kvr_wire_auth_verified(l->auth)) {
        kvr_msg_t m = {.type = KVR_MSG_LAYOUT};
        m.u.hello = l->ours;
        st = kvr__link_send(l, &m);
        l->layout_sent = st == KVR_OK;
    }
    if (st != KVR_OK) {
        kvr__link_close(l, st, "handshake: %s",
                        err.msg[0] ? err.msg : kvr_status_name(st));
        return false;
    }
    return kvr_wire_auth_ready(l->auth) && (!key || l->layout_sent);
}

void kvr__link_refuse(kvr__link_t *link, kvr_status_t status, const char *why)
{
    if (link->closed)
        return;
    kvr_msg_t bye;
    kvr_msg_init(&bye, KVR_MSG_BYE);
    bye.u.bye.status = status;
    snprintf(bye.u.bye.text, sizeof(bye.u.bye.text), "%s", why);
    kvr__link_send(link, &bye);
    kvr__link_flush(link);
    link->refused = !link->ready;
    kvr__link_close(link, status, "refused: %s", why);
}

/* Bytes the link may hold unread: two HELLO frames until the peer
 * authenticated, then the largest frame and one read more. */
static size_t rx_bound(const kvr__link_t *link)
{
    size_t max = kvr_wire_session_frame_max(link->auth);
    return max + (max < RX_CHUNK ? max : RX_CHUNK);
}

kvr_status_t kvr__link_read(kvr__link_t *link)
{
    for (;;) {
        size_t bound = rx_bound(link);
        if (link->rx_len >= bound)
            return KVR_OK; /* let next() consume before reading more */
        size_t want = bound - link->rx_len < RX_CHUNK ? bound - link->rx_len
                                                      : RX_CHUNK;
        if (!reserve(&link->rx, &link->rx_cap, link->rx_len + want))
            return KVR_ERR_NO_MEMORY;
        ssize_t n = recv(link->fd, link->rx + link->rx_len, want, 0);
        if (n > 0) {
            link->rx_len += (size_t)n;
            if ((size_t)n < want) /* drained for now: the fd is polled level- */
                return KVR_OK;    /* triggered, so no recv just for EAGAIN */
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return KVR_OK;
        /* frames already read (a BYE with the reason) are handled first */
        link->eof = true;
        snprintf(link->eof_why, sizeof(link->eof_why),
                 "peer closed the connection%s%s", n < 0 ? ": " : "",
                 n < 0 ? strerror(errno) : "");
        return KVR_ERR_PEER_DEAD;
    }
}

/* Frames the next complete frame in rx: header checks (size bound of the
 * link's state, version), tag, decode. */
static kvr_status_t take_frame(kvr__link_t *link, kvr_msg_t *msg, bool *have,
                               kvr_error_t *err)
{
    size_t need = 0, len = 0;
    kvr_status_t st = kvr_wire_session_need(link->auth, link->rx, link->rx_len,
                                            &need, NULL, err);
    if (st != KVR_OK || link->rx_len < need)
        return st;
    st = kvr_wire_open(link->auth, link->rx, need, &len, err);
    if (st == KVR_OK)
        st = kvr_wire_decode(link->rx, len, msg, err);
    bool hello = st == KVR_OK &&
                 (msg->type == KVR_MSG_HELLO || msg->type == KVR_MSG_HELLO_ACK);
    if (hello && len <= sizeof(link->hello_frame)) {
        memcpy(link->hello_frame, link->rx, len);
        link->hello_len = len;
    } else if (hello) {
        kvr_msg_free(msg);
        st = kvr_error_set(err, KVR_ERR_PROTO, "HELLO frame of %zu bytes", len);
    }
    if (st != KVR_OK)
        return st;
    memmove(link->rx, link->rx + need, link->rx_len - need);
    link->rx_len -= need;
    *have = true;
    return KVR_OK;
}

kvr_status_t kvr__link_next(kvr__link_t *link, kvr_msg_t *msg, bool *have,
                            kvr_error_t *err)
{
    kvr_error_t e = {0};
    *have = false;
    kvr_status_t st = take_frame(link, msg, have, &e);
    if (st != KVR_OK)
        kvr__link_refuse(link, st, e.msg);
    if (err != NULL && st != KVR_OK)
        *err = e;
    return st;
}
