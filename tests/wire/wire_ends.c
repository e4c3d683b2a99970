#include "wire_ends.h"

#include <setjmp.h>
#include <stdarg.h>
#include <string.h>

#include <cmocka.h>

#include "wire_samples.h"

static const char key_hex[] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

void test_key(uint8_t key[KVR_WIRE_KEY_BYTES])
{
    assert_int_equal(kvr_wire_key_parse(key_hex, strlen(key_hex), key, NULL),
                     KVR_OK);
}

void end_init(end_t *e, const uint8_t *key, kvr_msg_type_t type,
              kvr_wire_side_t side)
{
    assert_int_equal(kvr_wire_auth_create(key, &e->auth, NULL), KVR_OK);
    kvr_msg_t m;
    kvr_msg_init(&m, type);
    kvr_sample_hello(&m.u.hello); /* fresh nonce */
    m.u.hello.side = side;
    m.u.hello.has_key = key != NULL;
    assert_int_equal(
        kvr_wire_encode(&m, e->frame, sizeof(e->frame), &e->len, NULL), KVR_OK);
}

void end_free(end_t *e)
{
    kvr_wire_auth_destroy(e->auth);
}

void handshake(end_t *a, end_t *b, const uint8_t *ka, const uint8_t *kb)
{
    end_init(a, ka, KVR_MSG_HELLO, KVR_WIRE_CONSUMER);
    end_init(b, kb, KVR_MSG_HELLO_ACK, KVR_WIRE_PRODUCER);
    assert_int_equal(
        kvr_wire_auth_note_hello(a->auth, a->frame, a->len, true, NULL),
        KVR_OK);
    assert_int_equal(kvr_wire_gate(b->auth, KVR_MSG_HELLO, NULL), KVR_OK);
    assert_int_equal(
        kvr_wire_auth_note_hello(b->auth, a->frame, a->len, false, NULL),
        KVR_OK);
    assert_int_equal(
        kvr_wire_auth_note_hello(b->auth, b->frame, b->len, true, NULL),
        KVR_OK);
    assert_int_equal(kvr_wire_gate(a->auth, KVR_MSG_HELLO_ACK, NULL), KVR_OK);
    assert_int_equal(
        kvr_wire_auth_note_hello(a->auth, b->frame, b->len, false, NULL),
        KVR_OK);
}

/* from signs its AUTH and sends it as a frame; to verifies it. */
static void send_auth(end_t *from, end_t *to)
{
    kvr_msg_t m = {.type = KVR_MSG_AUTH};
    uint8_t frame[64], tag[KVR_WIRE_TAG_BYTES];
    size_t len = 0, tag_len = 1;
    assert_int_equal(kvr_wire_auth_sign(from->auth, &m.u.auth, NULL), KVR_OK);
    assert_int_equal(kvr_wire_encode(&m, frame, sizeof(frame), &len, NULL),
                     KVR_OK);
    assert_int_equal(kvr_wire_seal(from->auth, frame, len, tag, &tag_len, NULL),
                     KVR_OK);
    assert_int_equal(tag_len, 0); /* AUTH itself carries no tag */
    assert_int_equal(kvr_wire_auth_verify(to->auth, &m.u.auth, NULL), KVR_OK);
}

void session(end_t *a, end_t *b, const uint8_t *key)
{
    handshake(a, b, key, key);
    send_auth(b, a); /* the acceptor's AUTH follows its HELLO_ACK */
    send_auth(a, b);
}

void expect(kvr_status_t s, const kvr_error_t *err, kvr_status_t code,
            const char *needle)
{
    if (s != code || strstr(err->msg, needle) == NULL)
        fail_msg("got %s \"%s\", want %s \"%s\"", kvr_status_name(s), err->msg,
                 kvr_status_name(code), needle);
}

void expect_bye_frame(const uint8_t *buf, size_t n, kvr_status_t code,
                      const char *needle)
{
    kvr_msg_t m;
    assert_int_equal(kvr_wire_decode(buf, n, &m, NULL), KVR_OK);
    assert_int_equal(m.type, KVR_MSG_BYE);
    assert_int_equal(m.u.bye.status, code);
    if (strstr(m.u.bye.text, needle) == NULL)
        fail_msg("BYE \"%s\" lacks \"%s\"", m.u.bye.text, needle);
    kvr_msg_free(&m);
}
