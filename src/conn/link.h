/* A control link: one TCP connection carrying wire frames, with its
 * handshake state. Non-blocking; the owner polls fd, calls kvr__link_read
 * and kvr__link_next when readable and kvr__link_flush when writable.
 * Internal to conn.
 *
 * The link applies the session rules of the wire layer (docs/PROTOCOL.md
 * Session MAC): before the peer authenticated it buffers at most two HELLO
 * frames' worth and refuses a larger frame at its header; with a key, every
 * frame it sends after its AUTH carries a tag and every frame it receives
 * after the peer's AUTH must verify. A frame it refuses (malformed, too
 * large, other major version, bad tag) is answered with BYE before the
 * close. */
#ifndef KVRELAY_CONN_LINK_H
#define KVRELAY_CONN_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/wire.h"

/* Hard cap on queued outgoing bytes per link: a peer that stops reading is
 * closed rather than buffered without bound. */
#define KVR_LINK_TX_MAX (64u << 20)

typedef struct kvr__link {
    int fd;
    bool initiator;
    bool loopback_peer;
    bool closed;
    bool eof; /* the peer closed; close once buffered frames are handled */
    char eof_why[128];
    bool hello_sent, hello_recv, auth_sent, layout_sent, ready;
    bool refused; /* closed by a handshake refusal, ours or the peer's */
    kvr_wire_auth_t *auth;
    kvr_msg_hello_t ours;
    kvr_msg_hello_t peer;
    uint8_t *rx;
    size_t rx_len, rx_cap;
    uint8_t *tx;
    size_t tx_len, tx_off, tx_cap;
    kvr_status_t close_status;
    char close_why[KVR_ERROR_MSG_MAX];
    void *owner_data; /* the side's per-peer state */
    uint8_t hello_frame[KVR_WIRE_HELLO_FRAME_MAX]; /* last HELLO received */
    size_t hello_len;
    bool tamper_next; /* tests: flip a bit of the next frame sent, after
                         its tag was made (a forgery on the wire) */
    bool corked; /* kvr__link_send queues only; the owner flushes later */
} kvr__link_t;

/* Takes ownership of a connected socket. key may be NULL. */
kvr_status_t kvr__link_create(int fd, bool initiator, const uint8_t *key,
                              kvr__link_t **out, kvr_error_t *err);
void kvr__link_destroy(kvr__link_t *link);

/* Blocking connect with a deadline, then non-blocking. */
kvr_status_t kvr__tcp_connect(const char *host, uint16_t port,
                              uint32_t timeout_ms, int *fd, kvr_error_t *err);
kvr_status_t kvr__tcp_listen(const char *host, uint16_t port, int *fd,
                             uint16_t *bound, kvr_error_t *err);

/* A listener's twin on this host: a Unix socket in the abstract namespace
 * named after its TCP address ("host:port", as peers dial it). A message
 * across it costs about half a loopback TCP one (docs/performance.md).
 * Abstract names live in the network namespace, as 127.0.0.1 does. *fd is
 * -1 where there can be none (an address too long for the name, no socket):
 * peers then use TCP. A name another process holds is KVR_ERR_EXISTS, as a
 * port taken is: peers on this host would dial that process. */
kvr_status_t kvr__local_listen(const char *address, int *fd, kvr_error_t *err);
/* Connected (non-blocking) to the local twin of address, or -1: no such
 * listener on this host, or its queue is full (dial TCP then). */
int kvr__local_connect(const char *address);

/* Encodes and queues a frame (and its tag), writing what the socket takes
 * now. HELLO and HELLO_ACK frames are noted for AUTH. */
kvr_status_t kvr__link_send(kvr__link_t *link, const kvr_msg_t *msg);
/* Sends link->ours as HELLO (initiator) or HELLO_ACK: whole without a key,
 * blanked with one (kvr_wire_hello_blank; the layout follows as LAYOUT). */
kvr_status_t kvr__link_send_hello(kvr__link_t *link, kvr_msg_type_t type);
/* Sends what the handshake owes the peer now: with a key, AUTH once both
 * HELLOs are exchanged and LAYOUT (link->ours) once the peer's AUTH
 * verified. True when the link is ready for requests (kvr_wire_auth_ready);
 * a failure closes the link. */
bool kvr__link_handshake_step(kvr__link_t *link);
/* Writes queued bytes; false when the link broke. */
bool kvr__link_flush(kvr__link_t *link);
bool kvr__link_wants_write(const kvr__link_t *link);

/* Reads what is available (within the buffer bound of the link's state).
 * Then kvr__link_next yields complete frames: KVR_OK with *have set, or an
 * error after which the link has sent BYE with the reason and is closed.
 * Handle each message before asking for the next: an AUTH changes how the
 * frames after it are read. */
kvr_status_t kvr__link_read(kvr__link_t *link);
kvr_status_t kvr__link_next(kvr__link_t *link, kvr_msg_t *msg, bool *have,
                            kvr_error_t *err);

/* Notes the last received HELLO frame for AUTH (after the gate let it in). */
kvr_status_t kvr__link_note_peer_hello(kvr__link_t *link, kvr_error_t *err);

/* Sends BYE with status and why (best effort), then closes the link with
 * "refused: why". */
void kvr__link_refuse(kvr__link_t *link, kvr_status_t status, const char *why);

/* Marks the link closed with a reason (first reason wins) and shuts it. */
void kvr__link_close(kvr__link_t *link, kvr_status_t why, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
