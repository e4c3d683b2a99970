#include "link_peer.h"

kvr_status_t link_peer_handshake(kvr__link_t *l, const kvr_msg_t *m,
                                 kvr_error_t *err)
{
    kvr_wire_side_t want = l->ours.side == KVR_WIRE_PRODUCER
                               ? KVR_WIRE_CONSUMER
                               : KVR_WIRE_PRODUCER;
    bool key = kvr_wire_auth_has_key(l->auth);
    kvr_status_t st = kvr_wire_gate(l->auth, m->type, err);
    if (st == KVR_OK &&
        (m->type == KVR_MSG_HELLO || m->type == KVR_MSG_HELLO_ACK)) {
        l->peer = m->u.hello;
        l->hello_recv = true;
        st = kvr__link_note_peer_hello(l, err);
        if (st == KVR_OK)
            st = key ? kvr_wire_hello_check_intro(&l->ours, &l->peer, want, err)
                     : kvr_wire_hello_check(&l->ours, &l->peer, want, err);
        if (st == KVR_OK && !l->initiator)
            st = kvr__link_send_hello(l, KVR_MSG_HELLO_ACK);
    } else if (st == KVR_OK && m->type == KVR_MSG_AUTH) {
        st = kvr_wire_auth_verify(l->auth, &m->u.auth, err);
    } else if (st == KVR_OK && m->type == KVR_MSG_LAYOUT) {
        st = kvr_wire_hello_check(&l->ours, &m->u.hello, want, err);
        if (st == KVR_OK)
            st = kvr_wire_auth_note_layout(l->auth, &m->u.hello, err);
        if (st == KVR_OK)
            l->peer = m->u.hello;
    }
    if (st == KVR_OK && !l->ready)
        l->ready = kvr__link_handshake_step(l);
    return st;
}
