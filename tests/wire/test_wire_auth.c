/* Pre-shared key: key files, AUTH over both HELLO frames, replay and
 * reflection refused, and the gate before authentication. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvrelay/wire.h"
#include "wire_ends.h"
#include "wire_samples.h"

static const char key_hex[] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

static void test_key_parse(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_key_parse(key_hex, strlen(key_hex), key, &err),
                     KVR_OK);
    assert_int_equal(key[0], 0);
    assert_int_equal(key[31], 0x1f);
    char text[100];
    snprintf(text, sizeof(text), "  %s\n", key_hex);
    assert_int_equal(kvr_wire_key_parse(text, strlen(text), key, &err), KVR_OK);
    expect(kvr_wire_key_parse(key_hex, 62, key, &err), &err, KVR_ERR_INVALID,
           "key: 62 hex digits, expected 64 (32 bytes)");
    snprintf(text, sizeof(text), "%s00", key_hex);
    expect(kvr_wire_key_parse(text, strlen(text), key, &err), &err,
           KVR_ERR_INVALID, "66 hex digits");
    snprintf(text, sizeof(text), "%s", key_hex);
    text[10] = 'g';
    expect(kvr_wire_key_parse(text, strlen(text), key, &err), &err,
           KVR_ERR_INVALID, "bad hex character 0x67 at offset 10");
    expect(kvr_wire_key_parse("", 0, key, &err), &err, KVR_ERR_INVALID,
           "0 hex digits");
}

static void test_key_load(void **state)
{
    (void)state;
    char path[] = "/tmp/kvr-key-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "%s\n", key_hex);
    fclose(f);
    uint8_t key[KVR_WIRE_KEY_BYTES];
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_key_load(path, key, &err), KVR_OK);
    assert_int_equal(key[1], 1);
    f = fopen(path, "w");
    fprintf(f, "xyz\n");
    fclose(f);
    expect(kvr_wire_key_load(path, key, &err), &err, KVR_ERR_INVALID,
           "bad hex character 0x78 at offset 0");
    assert_non_null(strstr(err.msg, path));
    f = fopen(path, "w");
    for (int i = 0; i < 5; i++)
        fprintf(f, "%s\n", key_hex);
    fclose(f);
    expect(kvr_wire_key_load(path, key, &err), &err, KVR_ERR_INVALID,
           "longer than 256 bytes");
    unlink(path);
    expect(kvr_wire_key_load(path, key, &err), &err, KVR_ERR_IO,
           "No such file");
}

static void test_auth_ok(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a, b;
    handshake(&a, &b, key, key);
    assert_false(kvr_wire_auth_ready(a.auth));
    kvr_msg_auth_t ma, mb;
    assert_int_equal(kvr_wire_auth_sign(a.auth, &ma, NULL), KVR_OK);
    assert_int_equal(kvr_wire_auth_sign(b.auth, &mb, NULL), KVR_OK);
    assert_memory_not_equal(ma.mac, mb.mac, sizeof(ma.mac));
    assert_int_equal(kvr_wire_gate(b.auth, KVR_MSG_AUTH, NULL), KVR_OK);
    assert_int_equal(kvr_wire_auth_verify(b.auth, &ma, NULL), KVR_OK);
    assert_int_equal(kvr_wire_auth_verify(a.auth, &mb, NULL), KVR_OK);
    /* with a key the layout comes after AUTH: nothing else before it */
    kvr_error_t err = {0};
    assert_true(kvr_wire_auth_verified(a.auth));
    assert_false(kvr_wire_auth_ready(a.auth));
    expect(kvr_wire_gate(a.auth, KVR_MSG_REGIONS, &err), &err, KVR_ERR_PROTO,
           "REGIONS before the peer's LAYOUT");
    kvr_msg_t la, lb;
    assert_int_equal(kvr_wire_decode(a.frame, a.len, &la, NULL), KVR_OK);
    assert_int_equal(kvr_wire_decode(b.frame, b.len, &lb, NULL), KVR_OK);
    assert_int_equal(kvr_wire_gate(a.auth, KVR_MSG_LAYOUT, NULL), KVR_OK);
    assert_int_equal(kvr_wire_auth_note_layout(a.auth, &lb.u.hello, NULL),
                     KVR_OK);
    assert_int_equal(kvr_wire_auth_note_layout(b.auth, &la.u.hello, NULL),
                     KVR_OK);
    assert_true(kvr_wire_auth_ready(a.auth));
    assert_true(kvr_wire_auth_ready(b.auth));
    assert_int_equal(kvr_wire_gate(a.auth, KVR_MSG_REGIONS, NULL), KVR_OK);
    expect(kvr_wire_gate(a.auth, KVR_MSG_LAYOUT, &err), &err, KVR_ERR_PROTO,
           "LAYOUT received twice");
    expect(kvr_wire_gate(a.auth, KVR_MSG_AUTH, &err), &err, KVR_ERR_AUTH,
           "AUTH after authentication succeeded");
    expect(kvr_wire_gate(a.auth, KVR_MSG_HELLO, &err), &err, KVR_ERR_PROTO,
           "HELLO after the peer's HELLO");
    end_free(&a);
    end_free(&b);
}

static void test_wrong_key(void **state)
{
    (void)state;
    uint8_t k1[KVR_WIRE_KEY_BYTES], k2[KVR_WIRE_KEY_BYTES];
    test_key(k1);
    memcpy(k2, k1, sizeof(k2));
    k2[31] ^= 1;
    end_t a, b;
    handshake(&a, &b, k1, k2);
    kvr_msg_auth_t ma;
    kvr_wire_auth_sign(a.auth, &ma, NULL);
    kvr_error_t err = {0};
    expect(kvr_wire_auth_verify(b.auth, &ma, &err), &err, KVR_ERR_AUTH,
           "does not verify");
    assert_false(kvr_wire_auth_ready(b.auth));
    /* A failure is final: even the right AUTH is refused now. */
    kvr_msg_auth_t mb;
    kvr_wire_auth_sign(b.auth, &mb, NULL);
    expect(kvr_wire_gate(b.auth, KVR_MSG_AUTH, &err), &err, KVR_ERR_AUTH,
           "AUTH after authentication failed");
    expect(kvr_wire_auth_verify(b.auth, &ma, &err), &err, KVR_ERR_AUTH,
           "already failed");
    expect(kvr_wire_gate(b.auth, KVR_MSG_WRITE_REQUEST, &err), &err,
           KVR_ERR_AUTH, "WRITE_REQUEST before authentication");
    end_free(&a);
    end_free(&b);
}

/* An AUTH recorded from one session does not open another: nonces differ. */
static void test_replay_refused(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a1, b1, a2, b2;
    handshake(&a1, &b1, key, key);
    kvr_msg_auth_t old;
    kvr_wire_auth_sign(a1.auth, &old, NULL);
    handshake(&a2, &b2, key, key);
    kvr_error_t err = {0};
    expect(kvr_wire_auth_verify(b2.auth, &old, &err), &err, KVR_ERR_AUTH,
           "replayed from another session");
    /* Reflection: b's own AUTH sent back to b does not verify either. */
    kvr_msg_auth_t mine;
    kvr_wire_auth_sign(b1.auth, &mine, NULL);
    expect(kvr_wire_auth_verify(b1.auth, &mine, &err), &err, KVR_ERR_AUTH,
           "does not verify");
    end_free(&a1);
    end_free(&b1);
    end_free(&a2);
    end_free(&b2);
}

static void test_gate_before_auth(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a;
    end_init(&a, key, KVR_MSG_HELLO, KVR_WIRE_CONSUMER);
    kvr_error_t err = {0};
    expect(kvr_wire_gate(a.auth, KVR_MSG_WRITE_DONE, &err), &err, KVR_ERR_PROTO,
           "WRITE_DONE before the HELLO exchange");
    expect(kvr_wire_gate(a.auth, KVR_MSG_AUTH, &err), &err, KVR_ERR_PROTO,
           "AUTH before the HELLO exchange");
    assert_int_equal(kvr_wire_gate(a.auth, KVR_MSG_BYE, NULL), KVR_OK);
    assert_int_equal(kvr_wire_gate(a.auth, KVR_MSG_HELLO_ACK, NULL), KVR_OK);
    kvr_msg_auth_t m;
    expect(kvr_wire_auth_sign(a.auth, &m, &err), &err, KVR_ERR_PROTO,
           "needs both HELLO frames");
    end_free(&a);

    end_t b, c;
    handshake(&b, &c, key, key);
    for (int t = KVR_MSG_REGIONS; t <= KVR_MSG_NOTIFY; t++) {
        expect(kvr_wire_gate(b.auth, (kvr_msg_type_t)t, &err), &err,
               KVR_ERR_AUTH, "before authentication");
        assert_non_null(strstr(err.msg, kvr_msg_type_name((kvr_msg_type_t)t)));
    }
    expect(kvr_wire_gate(b.auth, (kvr_msg_type_t)99, &err), &err, KVR_ERR_PROTO,
           "type 99 unknown");
    end_free(&b);
    end_free(&c);
}

static void test_no_key(void **state)
{
    (void)state;
    end_t a, b;
    handshake(&a, &b, NULL, NULL);
    assert_false(kvr_wire_auth_has_key(a.auth));
    assert_true(kvr_wire_auth_ready(a.auth));
    assert_int_equal(kvr_wire_gate(a.auth, KVR_MSG_WRITE_DONE, NULL), KVR_OK);
    kvr_error_t err = {0};
    expect(kvr_wire_gate(a.auth, KVR_MSG_AUTH, &err), &err, KVR_ERR_AUTH,
           "no pre-shared key is configured here");
    kvr_msg_auth_t m = {{0}};
    expect(kvr_wire_auth_sign(a.auth, &m, &err), &err, KVR_ERR_AUTH,
           "no pre-shared key");
    expect(kvr_wire_auth_verify(a.auth, &m, &err), &err, KVR_ERR_AUTH,
           "no pre-shared key");
    end_free(&a);
    end_free(&b);
}

static void test_note_errors(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES] = {1};
    end_t a, b;
    end_init(&a, key, KVR_MSG_HELLO, KVR_WIRE_CONSUMER);
    end_init(&b, NULL, KVR_MSG_HELLO, KVR_WIRE_PRODUCER);
    kvr_error_t err = {0};
    /* our HELLO must announce the key we hold */
    expect(kvr_wire_auth_note_hello(a.auth, b.frame, b.len, true, &err), &err,
           KVR_ERR_INVALID, "has_key 0 but a key is configured");
    assert_int_equal(
        kvr_wire_auth_note_hello(a.auth, a.frame, a.len, true, NULL), KVR_OK);
    expect(kvr_wire_auth_note_hello(a.auth, a.frame, a.len, true, &err), &err,
           KVR_ERR_PROTO, "HELLO noted twice");
    /* both sides initiated */
    expect(kvr_wire_auth_note_hello(a.auth, b.frame, b.len, false, &err), &err,
           KVR_ERR_PROTO, "HELLO noted twice (from the peer)");
    /* our HELLO reflected back as the peer's HELLO_ACK */
    uint8_t refl[KVR_WIRE_HELLO_FRAME_MAX];
    memcpy(refl, a.frame, a.len);
    refl[6] = KVR_MSG_HELLO_ACK;
    expect(kvr_wire_auth_note_hello(a.auth, refl, a.len, false, &err), &err,
           KVR_ERR_AUTH, "same nonce");
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_BYE, &m);
    uint8_t buf[512];
    size_t len;
    kvr_wire_encode(&m, buf, sizeof(buf), &len, NULL);
    expect(kvr_wire_auth_note_hello(a.auth, buf, len, false, &err), &err,
           KVR_ERR_PROTO, "expected HELLO or HELLO_ACK, got BYE");
    expect(kvr_wire_auth_note_hello(a.auth, buf, len - 1, false, &err), &err,
           KVR_ERR_PROTO, "truncated");
    end_free(&a);
    end_free(&b);
    kvr_wire_auth_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_parse),
        cmocka_unit_test(test_key_load),
        cmocka_unit_test(test_auth_ok),
        cmocka_unit_test(test_wrong_key),
        cmocka_unit_test(test_replay_refused),
        cmocka_unit_test(test_gate_before_auth),
        cmocka_unit_test(test_no_key),
        cmocka_unit_test(test_note_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
