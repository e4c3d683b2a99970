/* Two ends of a connection for the auth and session tests: each end's auth
 * state and the HELLO frame it sent, driven through the handshake by hand.
 * Failures are cmocka failures. */
#ifndef KVR_TEST_WIRE_ENDS_H
#define KVR_TEST_WIRE_ENDS_H

#include <stddef.h>
#include <stdint.h>

#include "kvrelay/wire.h"

typedef struct {
    kvr_wire_auth_t *auth;
    uint8_t frame[KVR_WIRE_HELLO_FRAME_MAX];
    size_t len;
} end_t;

/* The key of the tests (bytes 0..31). */
void test_key(uint8_t key[KVR_WIRE_KEY_BYTES]);

/* An end whose HELLO (type HELLO or HELLO_ACK) is a sample with a fresh
 * nonce, side and has_key set; nothing noted yet. */
void end_init(end_t *e, const uint8_t *key, kvr_msg_type_t type,
              kvr_wire_side_t side);
void end_free(end_t *e);

/* Initiator a sends HELLO, acceptor b answers HELLO_ACK; both note both. */
void handshake(end_t *a, end_t *b, const uint8_t *ka, const uint8_t *kb);

/* handshake, then each end's AUTH as a frame through kvr_wire_seal and
 * verified by the other: both ends now seal and open every frame. */
void session(end_t *a, end_t *b, const uint8_t *key);

/* s is code and err's message holds needle. */
void expect(kvr_status_t s, const kvr_error_t *err, kvr_status_t code,
            const char *needle);

/* buf[0, n) is exactly one BYE frame of status code whose text holds
 * needle. */
void expect_bye_frame(const uint8_t *buf, size_t n, kvr_status_t code,
                      const char *needle);

#endif
