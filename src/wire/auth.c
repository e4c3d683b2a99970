/* Pre-shared key authentication, the gate that keeps everything but the
 * handshake out until the peer is authenticated, and the session MAC on
 * every frame after AUTH (docs/PROTOCOL.md Authentication, Session MAC;
 * docs/design.md §7).
 *
 * AUTH = HMAC-SHA256(key, label || sender role || sender is initiator ||
 *                    u32 len || HELLO frame || u32 len || HELLO_ACK frame).
 * Both frames carry a fresh random nonce, so an AUTH replayed from another
 * session fails; the initiator byte keeps an AUTH from being reflected back
 * between two peers of the same role.
 *
 * Session keys: master = BLAKE2b keyed with the pre-shared key over
 * SESSION_LABEL and the same two frames; one subkey per direction
 * (crypto_kdf). Tag = HMAC-SHA512-256(direction key, u64 seq || frame). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire_internal.h"

#define AUTH_LABEL "kvrelay-auth-v1"
#define AUTH_LABEL_LEN (sizeof(AUTH_LABEL) - 1)
#define SESSION_LABEL "kvrelay-session-v1"
#define SESSION_CONTEXT "kvrsessn" /* crypto_kdf context: 8 bytes */
#define TRANSCRIPT_MAX                                                         \
    (sizeof(SESSION_LABEL) + 2 + 2 * (4 + KVR_WIRE_HELLO_FRAME_MAX))
#define SUBKEY_I2A 1 /* initiator -> acceptor */
#define SUBKEY_A2I 2
#define KEY_FILE_MAX 256

/* [0]: the initiator's HELLO, [1]: the acceptor's HELLO_ACK. */
typedef struct {
    bool noted, ours;
    uint8_t role;
    uint8_t nonce[KVR_WIRE_NONCE_BYTES];
    size_t len;
    uint8_t bytes[KVR_WIRE_HELLO_FRAME_MAX];
} hello_frame_t;

/* One direction of the session MAC. */
typedef struct {
    bool on;      /* frames carry a tag */
    bool broken;  /* rx: a frame did not verify; the session is over */
    uint64_t seq; /* of the next frame */
    uint8_t key[crypto_auth_hmacsha512256_KEYBYTES];
} session_dir_t;

struct kvr_wire_auth {
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool has_key;
    bool authed;
    bool failed;
    bool layout_noted;
    bool keys_made;
    hello_frame_t frame[2];
    session_dir_t tx, rx;
};

kvr_status_t kvr_wire_auth_create(const uint8_t *key, kvr_wire_auth_t **out,
                                  kvr_error_t *err)
{
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    if (kvr_init(err) != KVR_OK)
        return KVR_ERR_INIT;
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
    return auth && both_noted(auth) &&
           (!auth->has_key || (auth->authed && auth->layout_noted));
}

bool kvr_wire_auth_verified(const kvr_wire_auth_t *auth)
{
    return auth && auth->authed;
}

/* The peer passed what this connection asks of it before it may send more
 * than handshake frames. */
static bool peer_trusted(const kvr_wire_auth_t *a)
{
    return a->has_key ? a->authed : both_noted(a);
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
        return kvr_error_set(err, KVR_ERR_PROTO, "HELLO and HELLO_ACK both %s",
                             ours ? "sent by us" : "from the peer");
    if (ours && m->u.hello.has_key != a->has_key)
        return kvr_error_set(
            err, KVR_ERR_INVALID, "our HELLO says has_key %d but a key is %s",
            m->u.hello.has_key, a->has_key ? "configured" : "not configured");
    if (other->noted && sodium_memcmp(other->nonce, m->u.hello.nonce,
                                      KVR_WIRE_NONCE_BYTES) == 0)
        return kvr_error_set(
            err, KVR_ERR_AUTH,
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
        s = kvr_error_set(err, KVR_ERR_PROTO,
                          "expected HELLO or HELLO_ACK, got %s",
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
    kvr__put_le(len, f->len, sizeof(len));
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

/* Session keys, once both HELLOs are noted: a master bound to this
 * session's frames (both nonces, both roles), then one key per direction,
 * so a frame reflected back to its sender never verifies. */
static void make_keys(kvr_wire_auth_t *a)
{
    if (a->keys_made)
        return;
    uint8_t buf[TRANSCRIPT_MAX], master[crypto_kdf_KEYBYTES];
    size_t n = append(buf, 0, SESSION_LABEL, sizeof(SESSION_LABEL) - 1);
    n = append_frame(buf, n, &a->frame[0]);
    n = append_frame(buf, n, &a->frame[1]);
    crypto_generichash(master, sizeof(master), buf, n, a->key, sizeof(a->key));
    bool initiator = a->frame[0].ours;
    crypto_kdf_derive_from_key(a->tx.key, sizeof(a->tx.key),
                               initiator ? SUBKEY_I2A : SUBKEY_A2I,
                               SESSION_CONTEXT, master);
    crypto_kdf_derive_from_key(a->rx.key, sizeof(a->rx.key),
                               initiator ? SUBKEY_A2I : SUBKEY_I2A,
                               SESSION_CONTEXT, master);
    sodium_memzero(master, sizeof(master));
    sodium_memzero(buf, sizeof(buf));
    a->keys_made = true;
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
    make_keys(auth);
    auth->rx.on = true;
    return KVR_OK;
}

kvr_status_t kvr_wire_auth_note_layout(kvr_wire_auth_t *auth,
                                       const kvr_msg_hello_t *layout,
                                       kvr_error_t *err)
{
    if (auth == NULL || layout == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "auth or layout is NULL");
    kvr_status_t s = kvr_wire_gate(auth, KVR_MSG_LAYOUT, err);
    if (s != KVR_OK)
        return s;
    const hello_frame_t *hello = &auth->frame[auth->frame[0].ours ? 1 : 0];
    if (layout->side != hello->role || !layout->has_key ||
        sodium_memcmp(layout->nonce, hello->nonce, sizeof(hello->nonce)) != 0)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "LAYOUT's side, key flag or nonce differ from "
                             "the peer's HELLO");
    auth->layout_noted = true;
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

static kvr_status_t gate_layout(const kvr_wire_auth_t *a, kvr_error_t *err)
{
    if (!a->has_key)
        return kvr_error_set(err, KVR_ERR_AUTH,
                             "LAYOUT received but no pre-shared key is "
                             "configured here");
    if (!a->authed)
        return kvr_error_set(err, KVR_ERR_AUTH, "LAYOUT before authentication");
    if (a->layout_noted)
        return kvr_error_set(err, KVR_ERR_PROTO, "LAYOUT received twice");
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
    case KVR_MSG_LAYOUT:
        return gate_layout(auth, err);
    default:
        break;
    }
    if (name == NULL)
        return kvr_error_set(err, KVR_ERR_PROTO, "message type %d unknown",
                             (int)type);
    if (!both_noted(auth))
        return kvr_error_set(err, KVR_ERR_PROTO, "%s before the HELLO exchange",
                             name);
    if (auth->has_key && !auth->authed)
        return kvr_error_set(err, KVR_ERR_AUTH, "%s before authentication",
                             name);
    if (auth->has_key && !auth->layout_noted)
        return kvr_error_set(err, KVR_ERR_PROTO, "%s before the peer's LAYOUT",
                             name);
    return KVR_OK;
}

/* ---- session framing and MAC ---- */

size_t kvr_wire_session_frame_max(const kvr_wire_auth_t *auth)
{
    if (auth == NULL || !peer_trusted(auth))
        return KVR_WIRE_HELLO_FRAME_MAX;
    return KVR_WIRE_HEADER_BYTES + KVR_WIRE_MAX_PAYLOAD +
           (auth->rx.on ? KVR_WIRE_TAG_BYTES : 0);
}

/* "WRITE_REQUEST", or "type 99" for a type this side does not know. */
static const char *type_text(uint16_t type, char *buf, size_t cap)
{
    const char *name = kvr_msg_type_name((kvr_msg_type_t)type);
    if (name != NULL)
        return name;
    snprintf(buf, cap, "type %u", type);
    return buf;
}

static uint16_t frame_type(const uint8_t *frame)
{
    return (uint16_t)(frame[6] | frame[7] << 8);
}

kvr_status_t kvr_wire_session_need(const kvr_wire_auth_t *auth, const void *buf,
                                   size_t len, size_t *need,
                                   kvr_wire_header_t *hdr, kvr_error_t *err)
{
    if (auth == NULL || need == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "auth or need is NULL");
    kvr_wire_header_t h;
    size_t n = 0;
    kvr_status_t s = kvr_wire_frame_need(buf, len, &n, &h, err);
    if (s != KVR_OK || len < KVR_WIRE_HEADER_BYTES) {
        *need = n;
        return s;
    }
    if (auth->rx.on)
        n += KVR_WIRE_TAG_BYTES;
    size_t max = kvr_wire_session_frame_max(auth);
    char t[16];
    if (n > max)
        return kvr_error_set(err, KVR_ERR_WIRE_LIMIT,
                             "%s frame of %zu bytes before the peer "
                             "authenticated: cap %zu",
                             type_text(h.type, t, sizeof(t)), n, max);
    *need = n;
    if (hdr)
        *hdr = h;
    return KVR_OK;
}

/* HMAC-SHA512-256(direction key, u64 seq little-endian || frame). */
static void frame_tag(const session_dir_t *d, const uint8_t *frame, size_t len,
                      uint8_t tag[KVR_WIRE_TAG_BYTES])
{
    uint8_t seq[8];
    kvr__put_le(seq, d->seq, sizeof(seq));
    crypto_auth_hmacsha512256_state st;
    crypto_auth_hmacsha512256_init(&st, d->key, sizeof(d->key));
    crypto_auth_hmacsha512256_update(&st, seq, sizeof(seq));
    crypto_auth_hmacsha512256_update(&st, frame, len);
    crypto_auth_hmacsha512256_final(&st, tag);
    sodium_memzero(&st, sizeof(st));
}

kvr_status_t kvr_wire_seal(kvr_wire_auth_t *auth, const void *frame, size_t len,
                           uint8_t tag[KVR_WIRE_TAG_BYTES], size_t *tag_len,
                           kvr_error_t *err)
{
    if (auth == NULL || frame == NULL || tag == NULL || tag_len == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "NULL argument");
    if (len < KVR_WIRE_HEADER_BYTES)
        return kvr_error_set(err, KVR_ERR_INVALID, "frame of %zu bytes", len);
    if (auth->tx.on && auth->tx.seq == UINT64_MAX)
        return kvr_error_set(err, KVR_ERR_WIRE_LIMIT,
                             "session sequence numbers exhausted");
    if (auth->tx.on) {
        frame_tag(&auth->tx, frame, len, tag);
        auth->tx.seq++;
        *tag_len = KVR_WIRE_TAG_BYTES;
        return KVR_OK;
    }
    if (auth->has_key && frame_type(frame) == KVR_MSG_AUTH) {
        kvr_status_t s = check_can_mac(auth, err);
        if (s != KVR_OK)
            return s;
        make_keys(auth); /* every frame after our AUTH carries a tag */
        auth->tx.on = true;
    }
    *tag_len = 0;
    return KVR_OK;
}

/* Whether b[0, n) is exactly one frame by its header. */
static bool whole_frame(const uint8_t *b, size_t n)
{
    size_t need = 0;
    return n >= KVR_WIRE_HEADER_BYTES &&
           kvr_wire_frame_need(b, n, &need, NULL, NULL) == KVR_OK && need == n;
}

kvr_status_t kvr_wire_open(kvr_wire_auth_t *auth, const void *buf, size_t len,
                           size_t *frame_len, kvr_error_t *err)
{
    if (auth == NULL || (buf == NULL && len) || frame_len == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "NULL argument");
    if (auth->rx.broken)
        return kvr_error_set(err, KVR_ERR_AUTH,
                             "an earlier frame did not verify: session over");
    if (!auth->rx.on) {
        *frame_len = len;
        return KVR_OK;
    }
    const uint8_t *b = buf;
    size_t n = len > KVR_WIRE_TAG_BYTES ? len - KVR_WIRE_TAG_BYTES : 0;
    uint8_t tag[KVR_WIRE_TAG_BYTES];
    bool whole = whole_frame(b, n);
    if (whole)
        frame_tag(&auth->rx, b, n, tag);
    if (!whole || crypto_verify_32(tag, b + n) != 0) {
        char t[16];
        auth->rx.broken = true;
        return kvr_error_set(
            err, KVR_ERR_AUTH,
            "frame %" PRIu64 " after the peer's AUTH (%s, "
            "%zu bytes): %s",
            auth->rx.seq + 1,
            len >= 8 ? type_text(frame_type(b), t, sizeof(t)) : "no header",
            len,
            whole ? "MAC does not verify (tampered, "
                    "reordered, replayed, or a frame before it is "
                    "missing)"
                  : "truncated: not a frame and a tag");
    }
    auth->rx.seq++;
    *frame_len = n;
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
        return kvr_error_set(
            err, KVR_ERR_INVALID, "key: %zu hex digits, expected %u (%u bytes)",
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
