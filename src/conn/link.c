/* TCP control links: framing over a byte stream, bounded buffers, and the
 * frame bookkeeping AUTH needs. */
#include "link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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
    return false;
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
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
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
    if (connect(s, res->ai_addr, res->ai_addrlen) != 0 &&
        errno != EINPROGRESS)
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

void kvr__link_close(kvr__link_t *link, kvr_status_t why, const char *fmt,
                     ...)
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

kvr_status_t kvr__link_send(kvr__link_t *link, const kvr_msg_t *msg)
{
    if (link->closed)
        return link->close_status ? link->close_status : KVR_ERR_PEER_DEAD;
    uint8_t *frame = NULL;
    size_t len = 0;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_wire_encode_alloc(msg, &frame, &len, &err);
    if (st != KVR_OK)
        return st;
    if (msg->type == KVR_MSG_HELLO || msg->type == KVR_MSG_HELLO_ACK)
        st = kvr_wire_auth_note_hello(link->auth, frame, len, true, &err);
    if (st == KVR_OK && link->tx_len - link->tx_off + len > KVR_LINK_TX_MAX)
        st = KVR_ERR_NO_SPACE;
    if (st == KVR_OK && !reserve(&link->tx, &link->tx_cap, link->tx_len + len))
        st = KVR_ERR_NO_MEMORY;
    if (st == KVR_OK) {
        memcpy(link->tx + link->tx_len, frame, len);
        link->tx_len += len;
    }
    free(frame);
    if (st == KVR_OK)
        kvr__link_flush(link);
    return st;
}

kvr_status_t kvr__link_read(kvr__link_t *link)
{
    for (;;) {
        if (!reserve(&link->rx, &link->rx_cap, link->rx_len + 65536))
            return KVR_ERR_NO_MEMORY;
        ssize_t n = recv(link->fd, link->rx + link->rx_len, 65536, 0);
        if (n > 0) {
            link->rx_len += (size_t)n;
            if (link->rx_len > KVR_WIRE_HEADER_BYTES + KVR_WIRE_MAX_PAYLOAD + 65536)
                return KVR_OK; /* let next() consume before reading more */
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return KVR_OK;
        /* frames already read (a BYE with the reason) are handled first */
        link->eof = true;
        snprintf(link->eof_why, sizeof(link->eof_why), "peer closed the connection%s%s",
                 n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
        return KVR_ERR_PEER_DEAD;
    }
}

kvr_status_t kvr__link_next(kvr__link_t *link, kvr_msg_t *msg, bool *have,
                            kvr_error_t *err)
{
    size_t need = 0;
    kvr_wire_header_t hdr;
    *have = false;
    kvr_status_t st = kvr_wire_frame_need(link->rx, link->rx_len, &need, &hdr, err);
    if (st != KVR_OK || link->rx_len < need)
        return st;
    st = kvr_wire_decode(link->rx, need, msg, err);
    bool hello = st == KVR_OK &&
                 (msg->type == KVR_MSG_HELLO || msg->type == KVR_MSG_HELLO_ACK);
    if (hello && need <= sizeof(link->hello_frame)) {
        memcpy(link->hello_frame, link->rx, need);
        link->hello_len = need;
    } else if (hello) {
        kvr_msg_free(msg);
        st = kvr_error_set(err, KVR_ERR_PROTO, "HELLO frame of %zu bytes", need);
    }
    memmove(link->rx, link->rx + need, link->rx_len - need);
    link->rx_len -= need;
    *have = st == KVR_OK;
    return st;
}
