/* The session after AUTH: every frame carries a MAC over its direction's
 * sequence number, so tampering, reordering, replay, a dropped frame and
 * truncation are refused; before AUTH frames are small; with a key nothing
 * about the layout goes out before AUTH. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/wire.h"
#include "wire_ends.h"
#include "wire_samples.h"

#define STREAM_MAX 4096

/* Bytes one end sent: frames with their tags, back to back. */
typedef struct {
    uint8_t b[STREAM_MAX];
    size_t n;
    size_t at[8]; /* where each frame starts */
    size_t frames;
} stream_t;

static const kvr_msg_type_t sent_types[] = {
    KVR_MSG_WRITE_REQUEST,
    KVR_MSG_WRITE_DONE,
    KVR_MSG_RELEASE,
};
#define NUM_SENT (sizeof(sent_types) / sizeof(sent_types[0]))

/* Encodes and seals one sample message onto s. */
static void put(end_t *from, stream_t *s, kvr_msg_type_t type)
{
    kvr_msg_t m;
    kvr_sample_msg(type, &m);
    size_t len = 0, tag_len = 0;
    assert_int_equal(
        kvr_wire_encode(&m, s->b + s->n, STREAM_MAX - s->n, &len, NULL),
        KVR_OK);
    uint8_t *frame = s->b + s->n;
    assert_int_equal(
        kvr_wire_seal(from->auth, frame, len, frame + len, &tag_len, NULL),
        KVR_OK);
    s->at[s->frames++] = s->n;
    s->n += len + tag_len;
}

static void put_all(end_t *from, stream_t *s)
{
    memset(s, 0, sizeof(*s));
    for (size_t i = 0; i < NUM_SENT; i++)
        put(from, s, sent_types[i]);
    s->at[s->frames] = s->n;
}

/* Reads b as a stream reader does: frames are delivered until an error or
 * until the bytes run out mid-frame. Returns the status; *got counts the
 * messages delivered (from 0), each checked to be the one sent at its place,
 * and *used the bytes they took. */
static kvr_status_t take_from(end_t *to, const uint8_t *b, size_t n,
                              size_t *got, size_t *used, kvr_error_t *err)
{
    size_t pos = 0;
    for (;; *used = pos) {
        size_t need = 0, len = 0;
        kvr_status_t s = kvr_wire_session_need(to->auth, b + pos, n - pos,
                                               &need, NULL, err);
        if (s != KVR_OK || need > n - pos)
            return s;
        s = kvr_wire_open(to->auth, b + pos, need, &len, err);
        kvr_msg_t m;
        if (s == KVR_OK)
            s = kvr_wire_decode(b + pos, len, &m, err);
        if (s != KVR_OK)
            return s;
        assert_true(*got < NUM_SENT);
        assert_int_equal(m.type, sent_types[*got]);
        kvr_msg_free(&m);
        (*got)++;
        pos += need;
    }
}

static kvr_status_t take(end_t *to, const uint8_t *b, size_t n, size_t *got,
                         kvr_error_t *err)
{
    size_t used = 0;
    *got = 0;
    return take_from(to, b, n, got, &used, err);
}

static void expect_take(end_t *to, const uint8_t *b, size_t n, size_t want_got,
                        const char *needle)
{
    kvr_error_t err = {0};
    size_t got = 0;
    kvr_status_t s = take(to, b, n, &got, &err);
    assert_int_equal(got, want_got);
    expect(s, &err, KVR_ERR_AUTH, needle);
}

static void test_sequence_accepted(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a, b;
    session(&a, &b, key);
    stream_t s;
    for (int round = 0; round < 3; round++) {
        put_all(&a, &s);
        size_t got = 0;
        assert_int_equal(take(&b, s.b, s.n, &got, NULL), KVR_OK);
        assert_int_equal(got, NUM_SENT);
        put_all(&b, &s); /* the other direction has its own sequence */
        assert_int_equal(take(&a, s.b, s.n, &got, NULL), KVR_OK);
        assert_int_equal(got, NUM_SENT);
    }
    /* each frame is followed by its tag */
    size_t plain = 0;
    for (size_t i = 0; i < NUM_SENT; i++) {
        kvr_msg_t m;
        size_t len = 0;
        kvr_sample_msg(sent_types[i], &m);
        assert_int_equal(kvr_wire_encoded_size(&m, &len, NULL), KVR_OK);
        plain += len;
    }
    assert_int_equal(s.n, plain + NUM_SENT * KVR_WIRE_TAG_BYTES);
    /* one byte at a time, as a slow socket delivers them */
    put_all(&a, &s);
    size_t got = 0, pos = 0;
    for (size_t n = 1; n <= s.n; n++) {
        size_t used = 0;
        assert_int_equal(take_from(&b, s.b + pos, n - pos, &got, &used, NULL),
                         KVR_OK);
        pos += used;
    }
    assert_int_equal(got, NUM_SENT);
    assert_int_equal(pos, s.n);
    end_free(&a);
    end_free(&b);
}

/* One bit flipped anywhere in the three frames (header, payload or tag):
 * the frames before it are delivered, that one never is. */
static void test_tamper_refused(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a0, b0;
    session(&a0, &b0, key);
    stream_t s;
    put_all(&a0, &s);
    end_free(&a0);
    end_free(&b0);
    for (size_t i = 0; i < s.n; i++) {
        size_t frame = 0;
        while (s.at[frame + 1] <= i)
            frame++;
        size_t off = i - s.at[frame];
        end_t a, b;
        session(&a, &b, key);
        stream_t t;
        put_all(&a, &t);
        t.b[i] ^= 0x10;
        kvr_error_t err = {0};
        size_t got = 0;
        kvr_status_t st = take(&b, t.b, t.n, &got, &err);
        assert_int_equal(got, frame);
        if (off >= 8 &&
            off < 12) /* length: waits for bytes that never verify */
            assert_true(st == KVR_OK || st == KVR_ERR_AUTH ||
                        st == KVR_ERR_WIRE_LIMIT);
        else if (off < 5) /* magic, major version: refused at the header */
            assert_true(st == KVR_ERR_PROTO || st == KVR_ERR_VERSION);
        else {
            char needle[64];
            snprintf(needle, sizeof(needle), "frame %zu after the peer's AUTH",
                     frame + 1);
            expect(st, &err, KVR_ERR_AUTH, needle);
        }
        end_free(&a);
        end_free(&b);
    }
}

static void test_reorder_replay_drop_refused(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a, b;
    stream_t s;
    uint8_t buf[STREAM_MAX];

    session(&a, &b, key); /* frames 2 and 1 swapped */
    put_all(&a, &s);
    size_t l0 = s.at[1] - s.at[0], l1 = s.at[2] - s.at[1];
    memcpy(buf, s.b + s.at[1], l1);
    memcpy(buf + l1, s.b, l0);
    expect_take(&b, buf, l0 + l1, 0,
                "frame 1 after the peer's AUTH (WRITE_DONE");
    end_free(&a);
    end_free(&b);

    session(&a, &b, key); /* frame 1 twice */
    put_all(&a, &s);
    memcpy(buf, s.b, l0);
    memcpy(buf + l0, s.b, l0);
    expect_take(&b, buf, 2 * l0, 1,
                "frame 2 after the peer's AUTH (WRITE_REQUEST");
    end_free(&a);
    end_free(&b);

    session(&a, &b, key); /* frame 2 dropped */
    put_all(&a, &s);
    memcpy(buf, s.b, l0);
    memcpy(buf + l0, s.b + s.at[2], s.n - s.at[2]);
    expect_take(&b, buf, l0 + s.n - s.at[2], 1,
                "frame 2 after the peer's AUTH (RELEASE");
    /* a failure is final: the right frame 2 is refused too */
    expect_take(&b, s.b + s.at[1], l1, 0, "session over");
    end_free(&a);
    end_free(&b);
}

/* A frame cut short, its tag cut off, or a shorter frame forged from it
 * (payload byte removed, length fixed up): never delivered. */
static void test_truncation_refused(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a, b;
    stream_t s;
    kvr_error_t err = {0};
    size_t len = 0;

    session(&a, &b, key);
    put_all(&a, &s);
    size_t l0 = s.at[1];
    expect(kvr_wire_open(b.auth, s.b, l0 - 1, &len, &err), &err, KVR_ERR_AUTH,
           "frame 1 after the peer's AUTH (WRITE_REQUEST");
    assert_non_null(strstr(err.msg, "truncated"));
    end_free(&a);
    end_free(&b);

    session(&a, &b, key); /* tag dropped: the next frame's bytes stand in */
    put_all(&a, &s);
    uint8_t buf[STREAM_MAX];
    memcpy(buf, s.b, l0 - KVR_WIRE_TAG_BYTES);
    memcpy(buf + l0 - KVR_WIRE_TAG_BYTES, s.b + l0, s.n - l0);
    expect_take(&b, buf, s.n - KVR_WIRE_TAG_BYTES, 0, "does not verify");
    end_free(&a);
    end_free(&b);

    session(&a, &b, key); /* last payload byte removed, length one less */
    put_all(&a, &s);
    size_t flen = l0 - KVR_WIRE_TAG_BYTES;
    memcpy(buf, s.b, flen - 1);
    memcpy(buf + flen - 1, s.b + flen, KVR_WIRE_TAG_BYTES);
    buf[8]--; /* the payload length is far above 0 */
    expect_take(&b, buf, l0 - 1, 0, "does not verify");
    end_free(&a);
    end_free(&b);

    /* the stream ends inside a frame: nothing delivered, nothing failed */
    session(&a, &b, key);
    put_all(&a, &s);
    size_t got = 9;
    assert_int_equal(take(&b, s.b, l0 - 1, &got, NULL), KVR_OK);
    assert_int_equal(got, 0);
    assert_int_equal(take(&b, s.b, s.n, &got, NULL), KVR_OK);
    assert_int_equal(got, NUM_SENT);
    end_free(&a);
    end_free(&b);
}

/* A frame sealed by one end never opens at that same end (one key per
 * direction) nor in another session at the same sequence number. */
static void test_reflection_and_other_session_refused(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a, b, a2, b2;
    stream_t s;
    session(&a, &b, key);
    put_all(&b, &s);
    expect_take(&b, s.b, s.n, 0, "frame 1");
    session(&a2, &b2, key);
    expect_take(&a2, s.b, s.n, 0, "frame 1");
    size_t got = 0;
    assert_int_equal(take(&a, s.b, s.n, &got, NULL), KVR_OK);
    assert_int_equal(got, NUM_SENT);
    end_free(&a);
    end_free(&b);
    end_free(&a2);
    end_free(&b2);
}

/* Without a key frames are unchanged: no tag, nothing to open. */
static void test_no_key_unchanged(void **state)
{
    (void)state;
    end_t a, b;
    handshake(&a, &b, NULL, NULL);
    stream_t s;
    put_all(&a, &s);
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_WRITE_REQUEST, &m);
    size_t len = 0;
    assert_int_equal(kvr_wire_encoded_size(&m, &len, NULL), KVR_OK);
    assert_int_equal(s.at[1], len);
    size_t got = 0;
    assert_int_equal(take(&b, s.b, s.n, &got, NULL), KVR_OK);
    assert_int_equal(got, NUM_SENT);
    end_free(&a);
    end_free(&b);
}

/* A header as a peer would send it: only the 12 bytes, announcing length. */
static void header(uint8_t h[KVR_WIRE_HEADER_BYTES], uint16_t type,
                   uint32_t len)
{
    const uint8_t magic[4] = {'K', 'V', 'R', 'W'};
    memcpy(h, magic, 4);
    h[4] = KVR_WIRE_VERSION_MAJOR;
    h[5] = KVR_WIRE_VERSION_MINOR;
    h[6] = (uint8_t)type;
    h[7] = 0;
    for (int i = 0; i < 4; i++)
        h[8 + i] = (uint8_t)(len >> (8 * i));
}

static void expect_need(const end_t *e, uint16_t type, uint32_t len,
                        kvr_status_t code, size_t want_need)
{
    uint8_t h[KVR_WIRE_HEADER_BYTES];
    header(h, type, len);
    size_t need = 0;
    kvr_error_t err = {0};
    kvr_status_t s = kvr_wire_session_need(e->auth, h, sizeof(h), &need, NULL,
                                           &err);
    if (s != code)
        fail_msg("length %u: got %s \"%s\"", len, kvr_status_name(s), err.msg);
    if (code == KVR_OK)
        assert_int_equal(need, want_need);
    else
        assert_non_null(
            strstr(err.msg, "before the peer authenticated: cap 1088"));
}

/* Before the peer authenticated, a frame larger than a HELLO is refused at
 * its header, before a reader buffers its body. */
static void test_preauth_size(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    const uint32_t big = KVR_WIRE_MAX_PAYLOAD - 1,
                   fit = KVR_WIRE_HELLO_FRAME_MAX - 12;
    end_t a, b;
    end_init(&b, key, KVR_MSG_HELLO_ACK, KVR_WIRE_PRODUCER); /* nothing yet */
    assert_int_equal(kvr_wire_session_frame_max(b.auth),
                     KVR_WIRE_HELLO_FRAME_MAX);
    expect_need(&b, KVR_MSG_HELLO, fit, KVR_OK, KVR_WIRE_HELLO_FRAME_MAX);
    expect_need(&b, KVR_MSG_HELLO, fit + 1, KVR_ERR_WIRE_LIMIT, 0);
    expect_need(&b, KVR_MSG_OFFER, big, KVR_ERR_WIRE_LIMIT, 0);
    end_free(&b);

    handshake(&a, &b, key, key); /* HELLOs, no AUTH yet */
    expect_need(&b, KVR_MSG_AUTH, 32, KVR_OK, 44);
    expect_need(&b, KVR_MSG_REGIONS, big, KVR_ERR_WIRE_LIMIT, 0);
    end_free(&a);
    end_free(&b);

    session(&a, &b, key); /* authenticated: the cap and the tag */
    assert_int_equal(kvr_wire_session_frame_max(b.auth),
                     12 + KVR_WIRE_MAX_PAYLOAD + KVR_WIRE_TAG_BYTES);
    expect_need(&b, KVR_MSG_REGIONS, big, KVR_OK, 12 + (size_t)big + 32);
    end_free(&a);
    end_free(&b);

    handshake(&a, &b, NULL, NULL); /* keyless: the HELLO exchange is enough */
    expect_need(&b, KVR_MSG_REGIONS, big, KVR_OK, 12 + (size_t)big);
    end_free(&a);
    end_free(&b);
    end_init(&a, NULL, KVR_MSG_HELLO, KVR_WIRE_CONSUMER);
    expect_need(&a, KVR_MSG_REGIONS, big, KVR_ERR_WIRE_LIMIT, 0);
    end_free(&a);
}

/* With a key, the HELLO carries the version, side, key flag and nonce and
 * nothing else; the layout goes in LAYOUT, accepted only after AUTH. */
static void test_no_layout_before_auth(void **state)
{
    (void)state;
    kvr_msg_t full, blank, d;
    kvr_msg_init(&full, KVR_MSG_HELLO);
    kvr_sample_hello(&full.u.hello);
    full.u.hello.has_key = true;
    kvr_msg_init(&blank, KVR_MSG_HELLO);
    kvr_wire_hello_blank(&full.u.hello, &blank.u.hello);
    uint8_t frame[KVR_WIRE_HELLO_FRAME_MAX];
    size_t len = 0;
    assert_int_equal(kvr_wire_encode(&blank, frame, sizeof(frame), &len, NULL),
                     KVR_OK);
    assert_int_equal(kvr_wire_decode(frame, len, &d, NULL), KVR_OK);
    kvr_msg_hello_t want;
    memset(&want, 0, sizeof(want));
    want.proto_major = KVR_WIRE_VERSION_MAJOR;
    want.proto_minor = KVR_WIRE_VERSION_MINOR;
    want.side = KVR_WIRE_CONSUMER;
    want.has_key = true;
    memcpy(want.nonce, full.u.hello.nonce, sizeof(want.nonce));
    assert_memory_equal(&d.u.hello, &want, sizeof(want));
    /* no byte of the digest is on the wire */
    assert_null(
        memmem(frame, len, &full.u.hello.digest, sizeof(full.u.hello.digest)));
    /* the blank HELLO passes what is checked before AUTH, nothing more */
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_hello_check_intro(&full.u.hello, &d.u.hello,
                                                KVR_WIRE_CONSUMER, &err),
                     KVR_OK);
    assert_int_not_equal(kvr_wire_hello_check(&full.u.hello, &d.u.hello,
                                              KVR_WIRE_CONSUMER, &err),
                         KVR_OK);

    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a, b;
    handshake(&a, &b, key, key);
    expect(kvr_wire_gate(b.auth, KVR_MSG_LAYOUT, &err), &err, KVR_ERR_AUTH,
           "LAYOUT before authentication");
    kvr_msg_t la;
    assert_int_equal(kvr_wire_decode(a.frame, a.len, &la, NULL), KVR_OK);
    expect(kvr_wire_auth_note_layout(b.auth, &la.u.hello, &err), &err,
           KVR_ERR_AUTH, "LAYOUT before authentication");
    end_free(&a);
    end_free(&b);

    session(&a, &b, key);
    assert_int_equal(kvr_wire_decode(a.frame, a.len, &la, NULL), KVR_OK);
    la.u.hello.nonce[0] ^= 1; /* not the nonce of a's HELLO */
    expect(kvr_wire_auth_note_layout(b.auth, &la.u.hello, &err), &err,
           KVR_ERR_PROTO, "differ from the peer's HELLO");
    la.u.hello.nonce[0] ^= 1;
    assert_int_equal(kvr_wire_auth_note_layout(b.auth, &la.u.hello, NULL),
                     KVR_OK);
    end_free(&a);
    end_free(&b);

    end_t c, e; /* no key: no LAYOUT at all */
    handshake(&c, &e, NULL, NULL);
    expect(kvr_wire_gate(e.auth, KVR_MSG_LAYOUT, &err), &err, KVR_ERR_AUTH,
           "no pre-shared key is configured here");
    end_free(&c);
    end_free(&e);
}

static void test_seal_errors(void **state)
{
    (void)state;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    test_key(key);
    end_t a;
    end_init(&a, key, KVR_MSG_HELLO, KVR_WIRE_CONSUMER);
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_AUTH, &m);
    uint8_t frame[64], tag[KVR_WIRE_TAG_BYTES];
    size_t len = 0, tag_len = 0;
    kvr_wire_encode(&m, frame, sizeof(frame), &len, NULL);
    kvr_error_t err = {0};
    expect(kvr_wire_seal(a.auth, frame, len, tag, &tag_len, &err), &err,
           KVR_ERR_PROTO, "AUTH needs both HELLO frames first");
    assert_int_equal(kvr_wire_seal(a.auth, frame, 11, tag, &tag_len, &err),
                     KVR_ERR_INVALID);
    assert_int_equal(kvr_wire_seal(NULL, frame, len, tag, &tag_len, &err),
                     KVR_ERR_INVALID);
    assert_int_equal(kvr_wire_open(NULL, frame, len, &tag_len, &err),
                     KVR_ERR_INVALID);
    end_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequence_accepted),
        cmocka_unit_test(test_tamper_refused),
        cmocka_unit_test(test_reorder_replay_drop_refused),
        cmocka_unit_test(test_truncation_refused),
        cmocka_unit_test(test_reflection_and_other_session_refused),
        cmocka_unit_test(test_no_key_unchanged),
        cmocka_unit_test(test_preauth_size),
        cmocka_unit_test(test_no_layout_before_auth),
        cmocka_unit_test(test_seal_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
