/* Pre-shared key authentication and the gate that keeps everything but the
 * handshake out until the peer is authenticated (docs/design.md §7 Handshake).
 *
 * AUTH = HMAC-SHA256(key, label || sender role || sender is initiator ||
 *                    u32 len || HELLO frame || u32 len || HELLO_ACK frame).
 * Both frames carry a fresh random nonce, so an AUTH replayed from another
 * session fails; the initiator byte keeps an AUTH from being reflected back
 * between two peers of the same role. */
#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire_internal.h"

#define AUTH_LABEL "kvrelay-auth-v1"
#define AUTH_LABEL_LEN (sizeof(AUTH_LABEL) - 1)
#define TRANSCRIPT_MAX (AUTH_LABEL_LEN + 2 + 2 * (4 + KVR_WIRE_HELLO_FRAME_MAX))
#define KEY_FILE_MAX 256

/* [0]: the initiator's HELLO, [1]: the acceptor's HELLO_ACK. */
typedef struct {
    bool noted, ours;
    uint8_t role;
    uint8_t nonce[KVR_WIRE_NONCE_BYTES];
    size_t len;
    uint8_t bytes[KVR_WIRE_HELLO_FRAME_MAX];
} hello_frame_t;

struct kvr_wire_auth {
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool has_key;
    bool authed;
    bool failed;
    hello_frame_t frame[2];
};

kvr_status_t kvr_wire_auth_create(const uint8_t *key, kvr_wire_auth_t **out,
                                  kvr_error_t *err)
{
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    if (sodium_init() < 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "libsodium init failed");
    kvr_wire_auth_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    if (key) {
        memcpy(a->key, key, sizeof(a->key));
        a->has_key = true;
    }
    *out = a;
    return KVR_OK;
}

void kvr_wire_auth_destroy(kvr_wire_auth_t *auth)
{
    if (auth == NULL)
        return;
    sodium_memzero(auth, sizeof(*auth));
    free(auth);
}

bool kvr_wire_auth_has_key(const kvr_wire_auth_t *auth)
{
    return auth && auth->has_key;
}

static bool both_noted(const kvr_wire_auth_t *a)
{
    return a->frame[0].noted && a->frame[1].noted;
}

static bool peer_noted(const kvr_wire_auth_t *a)
{
    return (a->frame[0].noted && !a->frame[0].ours) ||
           (a->frame[1].noted && !a->frame[1].ours);
}

bool kvr_wire_auth_ready(const kvr_wire_auth_t *auth)
{
    return auth && both_noted(auth) && (!auth->has_key || auth->authed);
}

/* Checks a HELLO frame against what is already noted; slot is its index. */
static kvr_status_t check_note(const kvr_wire_auth_t *a, const kvr_msg_t *m,
                               bool ours, kvr_error_t *err)
{
    int slot = m->type == KVR_MSG_HELLO ? 0 : 1;
    const hello_frame_t *other = &a->frame[1 - slot];
    if (a->frame[slot].noted)
        return kvr_error_set(err, KVR_ERR_PROTO, "%s noted twice (%s)",
                             kvr_msg_type_name(m->type),
                             ours ? "sent by us" : "from the peer");
    if (other->noted && other->ours == ours)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "HELLO and HELLO_ACK both %s",
                             ours ? "sent by us" : "from the peer");
    if (ours && m->u.hello.has_key != a->has_key)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "our HELLO says has_key %d but a key is %s",
                             m->u.hello.has_key,
                             a->has_key ? "configured" : "not configured");
    if (other->noted && sodium_memcmp(other->nonce, m->u.hello.nonce,
                                      KVR_WIRE_NONCE_BYTES) == 0)
        return kvr_error_set(err, KVR_ERR_AUTH,
                             "both HELLOs carry the same nonce (reflected HELLO)");
    return KVR_OK;
}

kvr_status_t kvr_wire_auth_note_hello(kvr_wire_auth_t *auth, const void *frame,
                                      size_t len, bool ours, kvr_error_t *err)
{
    if (auth == NULL || frame == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "auth or frame is NULL");
    if (len > KVR_WIRE_HELLO_FRAME_MAX)
        return kvr_error_set(err, KVR_ERR_WIRE_LIMIT,
                             "HELLO frame of %zu bytes > cap %u", len,
                             KVR_WIRE_HELLO_FRAME_MAX);
    kvr_msg_t m;
    kvr_status_t s = kvr_wire_decode(frame, len, &m, err);
    if (s != KVR_OK)
        return s;
    if (m.type != KVR_MSG_HELLO && m.type != KVR_MSG_HELLO_ACK)
        s = kvr_error_set(err, KVR_ERR_PROTO, "expected HELLO or HELLO_ACK, got %s",
                          kvr_msg_type_name(m.type));
    if (s == KVR_OK)
        s = check_note(auth, &m, ours, err);
    if (s == KVR_OK) {
        hello_frame_t *f = &auth->frame[m.type == KVR_MSG_HELLO ? 0 : 1];
        f->noted = true;
        f->ours = ours;
        f->role = (uint8_t)m.u.hello.side;
        memcpy(f->nonce, m.u.hello.nonce, sizeof(f->nonce));
        f->len = len;
        memcpy(f->bytes, frame, len);
    }
    kvr_msg_free(&m);
    return s;
}

static size_t append(uint8_t *buf, size_t at, const void *p, size_t n)
{
    memcpy(buf + at, p, n);
    return at + n;
}

static size_t append_frame(uint8_t *buf, size_t at, const hello_frame_t *f)
{
    uint8_t len[4];
    for (int i = 0; i < 4; i++)
        len[i] = (uint8_t)(f->len >> (8 * i));
    at = append(buf, at, len, sizeof(len));
    return append(buf, at, f->bytes, f->len);
}

/* The MAC input for an AUTH sent by the side that sent frame[sender]. */
static size_t transcript(const kvr_wire_auth_t *a, int sender, uint8_t *buf)
{
    uint8_t who[2] = {a->frame[sender].role, sender == 0 ? 1 : 0};
    size_t n = append(buf, 0, AUTH_LABEL, AUTH_LABEL_LEN);
    n = append(buf, n, who, sizeof(who));
    n = append_frame(buf, n, &a->frame[0]);
    return append_frame(buf, n, &a->frame[1]);
}

static kvr_status_t check_can_mac(const kvr_wire_auth_t *a, kvr_error_t *err)
{
    if (!a->has_key)
        return kvr_error_set(err, KVR_ERR_AUTH, "no pre-shared key configured");
    if (!both_noted(a))
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "AUTH needs both HELLO frames first");
    return KVR_OK;
}

kvr_status_t kvr_wire_auth_sign(const kvr_wire_auth_t *auth,
                                kvr_msg_auth_t *out, kvr_error_t *err)
{
    if (auth == NULL || out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "auth or out is NULL");
    kvr_status_t s = check_can_mac(auth, err);
    if (s != KVR_OK)
        return s;
    uint8_t buf[TRANSCRIPT_MAX];
    size_t n = transcript(auth, auth->frame[0].ours ? 0 : 1, buf);
    crypto_auth_hmacsha256(out->mac, buf, n, auth->key);
    return KVR_OK;
}

kvr_status_t kvr_wire_auth_verify(kvr_wire_auth_t *auth,
                                  const kvr_msg_auth_t *msg, kvr_error_t *err)
{
    if (auth == NULL || msg == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "auth or msg is NULL");
    kvr_status_t s = check_can_mac(auth, err);
    if (s != KVR_OK)
        return s;
    if (auth->failed || auth->authed)
        return kvr_error_set(err, KVR_ERR_AUTH, "AUTH already %s",
                             auth->failed ? "failed" : "verified");
    uint8_t buf[TRANSCRIPT_MAX];
    size_t n = transcript(auth, auth->frame[0].ours ? 1 : 0, buf);
    if (crypto_auth_hmacsha256_verify(msg->mac, buf, n, auth->key) != 0) {
        auth->failed = true;
        return kvr_error_set(err, KVR_ERR_AUTH,
                             "peer's AUTH does not verify (wrong key, or "
                             "replayed from another session)");
    }
    auth->authed = true;
    return KVR_OK;
}

static kvr_status_t gate_auth(const kvr_wire_auth_t *a, kvr_error_t *err)
{
    if (!a->has_key)
        return kvr_error_set(err, KVR_ERR_AUTH,
                             "AUTH received but no pre-shared key is "
                             "configured here");
    if (!both_noted(a))
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "AUTH before the HELLO exchange");
    if (a->failed || a->authed)
        return kvr_error_set(err, KVR_ERR_AUTH, "AUTH after authentication %s",
                             a->failed ? "failed" : "succeeded");
    return KVR_OK;
}

kvr_status_t kvr_wire_gate(const kvr_wire_auth_t *auth, kvr_msg_type_t type,
                           kvr_error_t *err)
{
    if (auth == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "auth is NULL");
    const char *name = kvr_msg_type_name(type);
    switch (type) {
    case KVR_MSG_BYE:
        return KVR_OK;
    case KVR_MSG_HELLO:
    case KVR_MSG_HELLO_ACK:
        if (peer_noted(auth))
            return kvr_error_set(err, KVR_ERR_PROTO,
                                 "%s after the peer's HELLO", name);
        return KVR_OK;
    case KVR_MSG_AUTH:
        return gate_auth(auth, err);
    default:
        break;
    }
    if (name == NULL)
        return kvr_error_set(err, KVR_ERR_PROTO, "message type %d unknown",
                             (int)type);
    if (!both_noted(auth))
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "%s before the HELLO exchange", name);
    if (auth->has_key && !auth->authed)
        return kvr_error_set(err, KVR_ERR_AUTH, "%s before authentication",
                             name);
    return KVR_OK;
}

/* ---- key files ---- */

kvr_status_t kvr_wire_key_parse(const char *text, size_t len,
                                uint8_t key[KVR_WIRE_KEY_BYTES],
                                kvr_error_t *err)
{
    if ((text == NULL && len) || key == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "text or key is NULL");
    while (len && isspace((unsigned char)text[len - 1]))
        len--;
    size_t start = 0;
    while (start < len && isspace((unsigned char)text[start]))
        start++;
    for (size_t i = start; i < len; i++)
        if (!isxdigit((unsigned char)text[i]))
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "key: bad hex character 0x%02x at offset %zu",
                                 (unsigned char)text[i], i);
    size_t digits = len - start;
    if (digits != 2 * KVR_WIRE_KEY_BYTES)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "key: %zu hex digits, expected %u (%u bytes)",
                             digits, 2 * KVR_WIRE_KEY_BYTES, KVR_WIRE_KEY_BYTES);
    size_t bin_len = 0;
    if (sodium_hex2bin(key, KVR_WIRE_KEY_BYTES, text + start, digits, NULL,
                       &bin_len, NULL) != 0 ||
        bin_len != KVR_WIRE_KEY_BYTES)
        return kvr_error_set(err, KVR_ERR_INVALID, "key: not valid hex");
    return KVR_OK;
}

kvr_status_t kvr_wire_key_load(const char *path,
                               uint8_t key[KVR_WIRE_KEY_BYTES],
                               kvr_error_t *err)
{
    if (path == NULL || key == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "path or key is NULL");
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return kvr_error_set(err, KVR_ERR_IO, "key file %s: %s", path,
                             strerror(errno));
    char buf[KEY_FILE_MAX + 1];
    size_t n = fread(buf, 1, sizeof(buf), f);
    bool bad_read = ferror(f);
    fclose(f);
    kvr_error_t e = {0};
    kvr_status_t s = KVR_OK;
    if (bad_read)
        s = kvr_error_set(&e, KVR_ERR_IO, "read failed");
    else if (n > KEY_FILE_MAX)
        s = kvr_error_set(&e, KVR_ERR_INVALID, "longer than %d bytes",
                          KEY_FILE_MAX);
    else
        s = kvr_wire_key_parse(buf, n, key, &e);
    sodium_memzero(buf, sizeof(buf));
    if (s != KVR_OK)
        return kvr_error_set(err, s, "key file %s: %s", path, e.msg);
    return KVR_OK;
}
