/* Control links over real sockets, in one process: two links joined through
 * a relay the test controls (it can tamper, reorder, replay or inject
 * bytes). A keyed handshake completes; a frame changed on the way closes the
 * receiving link with ERR_AUTH naming the frame, and its BYE reaches the
 * sender; before authentication a large frame is refused at its header with
 * nothing buffered; malformed frames and other major versions get a BYE.
 * A listener's same-host twin (a Unix socket named after its address) is
 * found by that address only, a name held is refused, and its links count
 * as loopback. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "link_peer.h"
#include "wire_ends.h"
#include "wire_samples.h"

#define RELAY_MAX (1u << 20)

/* One link and the relay's end of its socket. */
typedef struct {
    kvr__link_t *l;
    int relay;
    kvr_msg_t got[8]; /* messages past the handshake */
    int num_got;
} side_t;

static const uint8_t link_key[KVR_WIRE_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};

static void end_open(side_t *e, bool initiator, const uint8_t *key,
                     kvr_wire_side_t side)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    memset(e, 0, sizeof(*e));
    assert_int_equal(kvr__link_create(sv[0], initiator, key, &e->l, NULL),
                     KVR_OK);
    e->relay = sv[1];
    kvr_sample_hello(&e->l->ours); /* fresh nonce; the same layout both sides */
    e->l->ours.side = side;
    e->l->ours.has_key = key != NULL;
}

static void end_close(side_t *e)
{
    for (int i = 0; i < e->num_got; i++)
        kvr_msg_free(&e->got[i]);
    kvr__link_destroy(e->l);
    close(e->relay);
}

/* Everything the link wrote so far, as the relay sees it. */
static size_t drain(side_t *e, uint8_t *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(e->relay, buf + n, cap - n, 0);
        if (r <= 0)
            return n;
        n += (size_t)r;
    }
}

static void inject(side_t *e, const uint8_t *buf, size_t n)
{
    assert_int_equal(send(e->relay, buf, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads and handles what arrived; returns the first error. */
static kvr_status_t service(side_t *e, kvr_error_t *err)
{
    kvr__link_read(e->l);
    while (!e->l->closed) {
        kvr_msg_t m;
        bool have = false;
        kvr_status_t st = kvr__link_next(e->l, &m, &have, err);
        if (st != KVR_OK || !have)
            return st;
        bool app = m.type >= KVR_MSG_REGIONS || m.type == KVR_MSG_BYE;
        if (app && e->num_got < 8) {
            e->got[e->num_got++] = m;
            continue;
        }
        st = app ? KVR_OK : link_peer_handshake(e->l, &m, err);
        kvr_msg_free(&m);
        if (st != KVR_OK) {
            kvr__link_refuse(e->l, st, err->msg);
            return st;
        }
    }
    return KVR_OK;
}

/* Moves bytes from one end's socket to the other's, untouched. */
static void relay(side_t *from, side_t *to)
{
    static uint8_t buf[RELAY_MAX];
    size_t n = drain(from, buf, sizeof(buf));
    if (n)
        inject(to, buf, n);
}

static void connect_pair(side_t *a, side_t *b, const uint8_t *key)
{
    end_open(a, true, key, KVR_WIRE_PRODUCER);
    end_open(b, false, key, KVR_WIRE_CONSUMER);
    assert_int_equal(kvr__link_send_hello(a->l, KVR_MSG_HELLO), KVR_OK);
    for (int round = 0; round < 8 && !(a->l->ready && b->l->ready); round++) {
        relay(a, b);
        assert_int_equal(service(b, NULL), KVR_OK);
        relay(b, a);
        assert_int_equal(service(a, NULL), KVR_OK);
    }
    assert_true(a->l->ready && b->l->ready);
    assert_false(a->l->closed || b->l->closed);
}

static void test_local_twin(void **state)
{
    (void)state;
    char name[64], other[64];
    snprintf(name, sizeof(name), "127.0.0.1:%d", 1000 + (int)getpid());
    snprintf(other, sizeof(other), "127.0.0.2:%d", 1000 + (int)getpid());
    int l = -1, l2 = -1;
    kvr_error_t err = {0};
    assert_int_equal(kvr__local_listen(name, &l, &err), KVR_OK);
    assert_true(l >= 0);
    /* the name is taken: refused as a taken port is, naming the address */
    assert_int_equal(kvr__local_listen(name, &l2, &err), KVR_ERR_EXISTS);
    assert_int_equal(l2, -1);
    assert_non_null(strstr(err.msg, name));
    assert_int_equal(kvr__local_connect(other), -1); /* no such twin */
    int c = kvr__local_connect(name);
    assert_true(c >= 0);
    int s = -1;
    for (int i = 0; i < 1000 && s < 0; i++) /* the listener is non-blocking */
        s = accept(l, NULL, NULL);
    assert_true(s >= 0);
    side_t e;
    memset(&e, 0, sizeof(e));
    assert_int_equal(kvr__link_create(s, false, NULL, &e.l, NULL), KVR_OK);
    assert_true(e.l->loopback_peer); /* local as 127.0.0.1 is */
    uint8_t byte = 7;
    assert_int_equal(send(c, &byte, 1, MSG_NOSIGNAL), 1);
    kvr__link_read(e.l);
    assert_int_equal(e.l->rx_len, 1);
    kvr__link_destroy(e.l);
    close(c);
    close(l);
    assert_int_equal(kvr__local_connect(name), -1); /* gone with its socket */
}

static void send_sample(side_t *e, kvr_msg_type_t type)
{
    kvr_msg_t m;
    kvr_sample_msg(type, &m);
    assert_int_equal(kvr__link_send(e->l, &m), KVR_OK);
}

static void test_keyed_round_trip(void **state)
{
    (void)state;
    side_t a, b;
    connect_pair(&a, &b, link_key);
    assert_true(a.l->layout_sent && b.l->layout_sent);
    send_sample(&a, KVR_MSG_WRITE_DONE);
    send_sample(&a, KVR_MSG_CHUNK_DONE);
    relay(&a, &b);
    assert_int_equal(service(&b, NULL), KVR_OK);
    assert_int_equal(b.num_got, 2);
    assert_int_equal(b.got[0].type, KVR_MSG_WRITE_DONE);
    assert_int_equal(b.got[1].u.chunk_done.slot, 5);
    send_sample(&b, KVR_MSG_RELEASE);
    relay(&b, &a);
    assert_int_equal(service(&a, NULL), KVR_OK);
    assert_int_equal(a.num_got, 1);
    assert_int_equal(a.got[0].type, KVR_MSG_RELEASE);
    /* the peer's layout arrived with LAYOUT, after AUTH */
    assert_int_equal(a.l->peer.layout.dcp_size, 4);
    end_close(&a);
    end_close(&b);
}

/* b refused what the relay delivered: closed with ERR_AUTH naming the
 * frame, and its BYE, sealed, reaches a with the same reason. */
static void expect_auth_refusal(side_t *a, side_t *b, const char *needle)
{
    kvr_error_t err = {0};
    assert_int_equal(service(b, &err), KVR_ERR_AUTH);
    assert_true(b->l->closed);
    assert_int_equal(b->l->close_status, KVR_ERR_AUTH);
    if (strstr(b->l->close_why, needle) == NULL)
        fail_msg("close reason \"%s\" lacks \"%s\"", b->l->close_why, needle);
    assert_int_equal(b->num_got, 0);
    relay(b, a);
    assert_int_equal(service(a, NULL), KVR_OK);
    assert_int_equal(a->num_got, 1);
    assert_int_equal(a->got[0].type, KVR_MSG_BYE);
    assert_int_equal(a->got[0].u.bye.status, KVR_ERR_AUTH);
    assert_non_null(strstr(a->got[0].u.bye.text, needle));
}

static void test_tampered_frame_closes(void **state)
{
    (void)state;
    side_t a, b;
    connect_pair(&a, &b, link_key);
    send_sample(&a, KVR_MSG_WRITE_REQUEST);
    static uint8_t buf[RELAY_MAX];
    size_t n = drain(&a, buf, sizeof(buf));
    buf[40] ^= 1; /* a block id */
    inject(&b, buf, n);
    /* LAYOUT was a's first frame after AUTH */
    expect_auth_refusal(&a, &b, "frame 2 after the peer's AUTH (WRITE_REQUEST");
    end_close(&a);
    end_close(&b);
}

static void test_reordered_and_replayed_frames_close(void **state)
{
    (void)state;
    static uint8_t buf[RELAY_MAX], one[RELAY_MAX];
    side_t a, b;
    connect_pair(&a, &b, link_key);
    send_sample(&a, KVR_MSG_WRITE_DONE);
    size_t n1 = drain(&a, one, sizeof(one));
    send_sample(&a, KVR_MSG_RELEASE);
    size_t n2 = drain(&a, buf, sizeof(buf));
    memcpy(buf + n2, one, n1);
    inject(&b, buf, n1 + n2); /* RELEASE before WRITE_DONE */
    expect_auth_refusal(&a, &b, "frame 2 after the peer's AUTH (RELEASE");
    end_close(&a);
    end_close(&b);

    connect_pair(&a, &b, link_key);
    send_sample(&a, KVR_MSG_WRITE_DONE);
    n1 = drain(&a, one, sizeof(one));
    inject(&b, one, n1);
    inject(&b, one, n1); /* the same frame again */
    kvr_error_t err = {0};
    assert_int_equal(service(&b, &err), KVR_ERR_AUTH);
    assert_int_equal(b.num_got, 1); /* the first copy only */
    assert_non_null(
        strstr(b.l->close_why, "frame 3 after the peer's AUTH (WRITE_DONE"));
    end_close(&a);
    end_close(&b);
}

/* Without a key the frames on the socket are the plain encoding. */
static void test_keyless_frames_unchanged(void **state)
{
    (void)state;
    side_t a, b;
    connect_pair(&a, &b, NULL);
    send_sample(&a, KVR_MSG_WRITE_DONE);
    static uint8_t buf[RELAY_MAX];
    size_t n = drain(&a, buf, sizeof(buf));
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_WRITE_DONE, &m);
    uint8_t *plain = NULL;
    size_t len = 0;
    assert_int_equal(kvr_wire_encode_alloc(&m, &plain, &len, NULL), KVR_OK);
    assert_int_equal(n, len);
    assert_memory_equal(buf, plain, len);
    free(plain);
    inject(&b, buf, n);
    assert_int_equal(service(&b, NULL), KVR_OK);
    assert_int_equal(b.num_got, 1);
    end_close(&a);
    end_close(&b);
}

/* b answered with one BYE of status code whose text holds needle, then
 * closed. */
static void expect_bye(side_t *b, kvr_status_t code, const char *needle)
{
    static uint8_t buf[RELAY_MAX];
    kvr_error_t err = {0};
    assert_int_equal(service(b, &err), code);
    assert_true(b->l->closed);
    expect_bye_frame(buf, drain(b, buf, sizeof(buf)), code, needle);
}

/* An unauthenticated peer announcing a frame of 8 MiB - 1: refused at the
 * header, with a few KiB buffered however much it already sent. */
static void test_preauth_large_frame(void **state)
{
    (void)state;
    static uint8_t junk[256 << 10];
    const uint8_t *keys[] = {link_key, NULL};
    for (int k = 0; k < 2; k++) {
        side_t b;
        end_open(&b, false, keys[k], KVR_WIRE_CONSUMER);
        memset(junk, 0, sizeof(junk));
        memcpy(junk, "KVRW", 4);
        junk[4] = KVR_WIRE_VERSION_MAJOR;
        junk[6] = KVR_MSG_OFFER;
        uint32_t len = KVR_WIRE_MAX_PAYLOAD - 1;
        memcpy(junk + 8, &len, 4);
        ssize_t sent = send(b.relay, junk, sizeof(junk), MSG_NOSIGNAL);
        assert_true(sent > 4096);
        expect_bye(
            &b, KVR_ERR_WIRE_LIMIT,
            "OFFER frame of 8388619 bytes before the peer authenticated");
        assert_true(b.l->rx_cap <= 4096);
        end_close(&b);
    }
}

static void test_malformed_and_version_get_bye(void **state)
{
    (void)state;
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_HELLO, &m);
    m.u.hello.side = KVR_WIRE_PRODUCER;
    uint8_t frame[KVR_WIRE_HELLO_FRAME_MAX];
    size_t len = 0;
    assert_int_equal(kvr_wire_encode(&m, frame, sizeof(frame), &len, NULL),
                     KVR_OK);
    struct {
        size_t at;
        uint8_t value;
        kvr_status_t code;
        const char *needle;
    } cases[] = {
        {0, 'X', KVR_ERR_PROTO, "frame magic"},
        {4, 1, KVR_ERR_VERSION, "frame version 1."},
        {6, 99, KVR_ERR_PROTO, "frame type 99 unknown"},
        {14, 3, KVR_ERR_PROTO, "HELLO.side: value 3"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        side_t b;
        end_open(&b, false, link_key, KVR_WIRE_CONSUMER);
        uint8_t bad[sizeof(frame)];
        memcpy(bad, frame, len);
        bad[cases[i].at] = cases[i].value;
        inject(&b, bad, len);
        expect_bye(&b, cases[i].code, cases[i].needle);
        end_close(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyed_round_trip),
        cmocka_unit_test(test_tampered_frame_closes),
        cmocka_unit_test(test_reordered_and_replayed_frames_close),
        cmocka_unit_test(test_keyless_frames_unchanged),
        cmocka_unit_test(test_preauth_large_frame),
        cmocka_unit_test(test_malformed_and_version_get_bye),
        cmocka_unit_test(test_local_twin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
