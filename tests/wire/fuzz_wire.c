/* libFuzzer target for the wire decoder. Any input must decode or fail
 * cleanly (no crash, leak or out-of-bounds read); whatever decodes must
 * re-encode to the same bytes (only the sender's minor version may differ),
 * and the stream helper must agree on the frame size. Decoded HELLOs also go
 * through the layout comparison and the auth transcript. */
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
    kvr_status_t s = kvr_wire_hello_check(&ours, &m->u.hello, m->u.hello.side, &err);
    CHECK(s == KVR_OK || err.code == s);
    kvr_wire_auth_t *auth = NULL;
    CHECK(kvr_wire_auth_create(NULL, &auth, NULL) == KVR_OK);
    s = kvr_wire_auth_note_hello(auth, data, size, false, &err);
    CHECK(s == KVR_OK || size > KVR_WIRE_HELLO_FRAME_MAX);
    kvr_wire_auth_destroy(auth);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvr_error_t err = {0};
    size_t need = 0;
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
    if (m.type == KVR_MSG_HELLO || m.type == KVR_MSG_HELLO_ACK)
        check_hello(data, size, &m);
    free(out);
    kvr_msg_free(&m);
    return 0;
}
