/* libFuzzer target for the wire decoder and the session framing. Any input
 * must decode or fail cleanly (no crash, leak or out-of-bounds read);
 * whatever decodes must re-encode to the same bytes (only the sender's minor
 * version may differ), and the stream helper must agree on the frame size.
 * Decoded HELLOs also go through the layout comparison and the auth
 * transcript. The input is also read as a stream by a peer that has not
 * authenticated (nothing above a HELLO frame is framed) and by one that has
 * (every frame must carry a valid tag); a decodable input is sealed and must
 * open to the same bytes, and with one byte changed must not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrelay/wire.h"
#include "wire_samples.h"

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            __builtin_trap();                                                  \
    } while (0)

static void check_hello(const uint8_t *data, size_t size, const kvr_msg_t *m)
{
    static kvr_msg_hello_t ours;
    static int have_ours;
    if (!have_ours) {
        kvr_sample_hello(&ours);
        have_ours = 1;
    }
    kvr_error_t err = {0};
    kvr_status_t s = kvr_wire_hello_check(&ours, &m->u.hello, m->u.hello.side,
                                          &err);
    CHECK(s == KVR_OK || err.code == s);
    s = kvr_wire_hello_check_intro(&ours, &m->u.hello, m->u.hello.side, &err);
    CHECK(s == KVR_OK || err.code == s);
    if (m->type == KVR_MSG_LAYOUT)
        return; /* LAYOUT is compared, never noted as a HELLO */
    kvr_wire_auth_t *auth = NULL;
    CHECK(kvr_wire_auth_create(NULL, &auth, NULL) == KVR_OK);
    s = kvr_wire_auth_note_hello(auth, data, size, false, &err);
    CHECK(s == KVR_OK || size > KVR_WIRE_HELLO_FRAME_MAX);
    kvr_wire_auth_destroy(auth);
}

/* One keyed session, made once: both HELLO frames and the initiator's
 * AUTH. Each input gets fresh ends from it. */
static struct {
    uint8_t key[KVR_WIRE_KEY_BYTES];
    uint8_t hello[2][KVR_WIRE_HELLO_FRAME_MAX];
    size_t len[2];
    kvr_msg_t auth; /* the initiator's */
    uint8_t auth_frame[64];
    size_t auth_len;
} S;

static void note_both(kvr_wire_auth_t *a, bool initiator)
{
    CHECK(kvr_wire_auth_note_hello(a, S.hello[0], S.len[0], initiator, NULL) ==
          KVR_OK);
    CHECK(kvr_wire_auth_note_hello(a, S.hello[1], S.len[1], !initiator, NULL) ==
          KVR_OK);
}

static void session_setup(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    S.key[0] = 7;
    for (int i = 0; i < 2; i++) {
        kvr_msg_t m;
        kvr_msg_init(&m, i == 0 ? KVR_MSG_HELLO : KVR_MSG_HELLO_ACK);
        kvr_sample_hello(&m.u.hello);
        m.u.hello.has_key = true;
        m.u.hello.side = i == 0 ? KVR_WIRE_PRODUCER : KVR_WIRE_CONSUMER;
        kvr_wire_hello_blank(&m.u.hello, &m.u.hello);
        CHECK(kvr_wire_encode(&m, S.hello[i], sizeof(S.hello[i]), &S.len[i],
                              NULL) == KVR_OK);
    }
    kvr_wire_auth_t *a = NULL;
    CHECK(kvr_wire_auth_create(S.key, &a, NULL) == KVR_OK);
    note_both(a, true);
    kvr_msg_init(&S.auth, KVR_MSG_AUTH);
    CHECK(kvr_wire_auth_sign(a, &S.auth.u.auth, NULL) == KVR_OK);
    CHECK(kvr_wire_encode(&S.auth, S.auth_frame, sizeof(S.auth_frame),
                          &S.auth_len, NULL) == KVR_OK);
    kvr_wire_auth_destroy(a);
}

/* tx: the initiator after sending its AUTH; rx: the acceptor after
 * verifying it. */
static void session_ends(kvr_wire_auth_t **tx, kvr_wire_auth_t **rx)
{
    uint8_t tag[KVR_WIRE_TAG_BYTES];
    size_t tag_len = 1;
    session_setup();
    CHECK(kvr_wire_auth_create(S.key, tx, NULL) == KVR_OK);
    note_both(*tx, true);
    CHECK(kvr_wire_seal(*tx, S.auth_frame, S.auth_len, tag, &tag_len, NULL) ==
          KVR_OK);
    CHECK(tag_len == 0);
    CHECK(kvr_wire_auth_create(S.key, rx, NULL) == KVR_OK);
    note_both(*rx, false);
    CHECK(kvr_wire_auth_verify(*rx, &S.auth.u.auth, NULL) == KVR_OK);
}

/* Reads data as a stream at auth; errors must be reported with a message,
 * and nothing larger than the session allows is ever framed. */
static void read_stream(kvr_wire_auth_t *auth, const uint8_t *data, size_t size)
{
    size_t pos = 0;
    while (pos < size) {
        size_t need = 0, len = 0;
        kvr_error_t err = {0};
        size_t max = kvr_wire_session_frame_max(auth);
        kvr_status_t s = kvr_wire_session_need(auth, data + pos, size - pos,
                                               &need, NULL, &err);
        CHECK(s != KVR_OK || need <= max);
        if (s != KVR_OK || need > size - pos) {
            CHECK(s == KVR_OK || (err.code == s && err.msg[0] != '\0'));
            return;
        }
        s = kvr_wire_open(auth, data + pos, need, &len, &err);
        kvr_msg_t m;
        if (s == KVR_OK)
            s = kvr_wire_decode(data + pos, len, &m, &err);
        CHECK(s == KVR_OK || (err.code == s && err.msg[0] != '\0'));
        if (s != KVR_OK)
            return;
        kvr_msg_free(&m);
        pos += need;
    }
}

static void check_streams(const uint8_t *data, size_t size)
{
    kvr_wire_auth_t *pre = NULL, *tx = NULL, *rx = NULL;
    CHECK(kvr_wire_auth_create(S.key, &pre, NULL) == KVR_OK);
    read_stream(pre, data, size);
    kvr_wire_auth_destroy(pre);
    session_ends(&tx, &rx);
    read_stream(rx, data, size);
    kvr_wire_auth_destroy(tx);
    kvr_wire_auth_destroy(rx);
}

/* A frame sealed opens to itself; with one byte changed it never opens. */
static void check_sealed(const uint8_t *data, size_t size)
{
    kvr_wire_auth_t *tx = NULL, *rx = NULL;
    uint8_t *buf = malloc(size + KVR_WIRE_TAG_BYTES);
    size_t tag_len = 0, len = 0;
    CHECK(buf != NULL);
    memcpy(buf, data, size);
    for (int round = 0; round < 2; round++) {
        session_ends(&tx, &rx);
        CHECK(kvr_wire_seal(tx, buf, size, buf + size, &tag_len, NULL) ==
              KVR_OK);
        CHECK(tag_len == KVR_WIRE_TAG_BYTES);
        size_t at = (data[size - 1] * 131u + size) % (size + tag_len);
        buf[at] ^= (uint8_t)(round * (1 + data[0] % 255));
        kvr_status_t s = kvr_wire_open(rx, buf, size + tag_len, &len, NULL);
        CHECK(round == 0 ? s == KVR_OK && len == size : s == KVR_ERR_AUTH);
        buf[at] ^= (uint8_t)(round * (1 + data[0] % 255));
        kvr_wire_auth_destroy(tx);
        kvr_wire_auth_destroy(rx);
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvr_error_t err = {0};
    size_t need = 0;
    check_streams(data, size);
    kvr_status_t fs = kvr_wire_frame_need(data, size, &need, NULL, &err);
    kvr_msg_t m;
    kvr_status_t s = kvr_wire_decode(data, size, &m, &err);
    if (s != KVR_OK) {
        CHECK(err.code == s && err.msg[0] != '\0');
        return 0;
    }
    CHECK(fs == KVR_OK && need == size);
    uint8_t *out = NULL;
    size_t len = 0;
    CHECK(kvr_wire_encode_alloc(&m, &out, &len, &err) == KVR_OK);
    CHECK(len == size);
    CHECK(memcmp(out, data, 5) == 0);
    CHECK(memcmp(out + 6, data + 6, size - 6) == 0);
    if (m.type == KVR_MSG_HELLO || m.type == KVR_MSG_HELLO_ACK ||
        m.type == KVR_MSG_LAYOUT)
        check_hello(data, size, &m);
    check_sealed(data, size);
    free(out);
    kvr_msg_free(&m);
    return 0;
}
