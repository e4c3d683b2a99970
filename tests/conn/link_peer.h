/* A test's own end of a control link (src/conn/link.h): the connector's
 * handshake reduced to its checks, for hand-made peers. */
#ifndef KVR_TEST_LINK_PEER_H
#define KVR_TEST_LINK_PEER_H

#include "link.h"

/* Handles a HELLO, HELLO_ACK, AUTH or LAYOUT from the peer (after the
 * gate); sends what the handshake owes and sets l->ready when done. */
kvr_status_t link_peer_handshake(kvr__link_t *l, const kvr_msg_t *m,
                                 kvr_error_t *err);

#endif
