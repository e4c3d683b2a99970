/* Framing plus one table-driven encoder and decoder for every message.
 *
 * Decoding runs twice over the payload: the first pass validates every
 * length, count, cap and range and measures the arena the arrays need; only
 * then is the arena allocated (so no allocation ever follows an unchecked
 * count) and the second pass fills it. The message is written to the caller
 * only when both passes succeeded. */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire_internal.h"

#define ARENA_ALIGN 16u

typedef struct {
    uint8_t *out;      /* encode: output; NULL while measuring */
    const uint8_t *in; /* decode: payload */
    size_t pos, end;
    char *arena;       /* decode: arrays go here; NULL while measuring */
    size_t arena_pos;  /* arena bytes used (or needed) */
    kvr_status_t bad;  /* out-of-range value: ERR_INVALID or ERR_PROTO */
    const char *msg;   /* message name, for errors */
    const char *outer; /* enclosing array field, or NULL */
    uint32_t index;    /* element index within outer */
    kvr_error_t *err;
} cur_t;

/* Error naming the field: "WRITE_REQUEST.dst_blocks: ..." or
 * "REGIONS.regions[3].desc.role: ...". */
static kvr_status_t ferr(const cur_t *c, const kvr__field_t *f,
                         kvr_status_t code, const char *fmt, ...)
{
    char detail[KVR_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    if (c->outer)
        return kvr_error_set(c->err, code, "%s.%s[%" PRIu32 "].%s: %s", c->msg,
                             c->outer, c->index, f->name, detail);
    return kvr_error_set(c->err, code, "%s.%s: %s", c->msg, f->name, detail);
}

static uint64_t load_int(const void *p, size_t mem)
{
    uint8_t v8;
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    switch (mem) {
    case 1:
        memcpy(&v8, p, 1);
        return v8;
    case 2:
        memcpy(&v16, p, 2);
        return v16;
    case 4:
        memcpy(&v32, p, 4);
        return v32;
    default:
        memcpy(&v64, p, 8);
        return v64;
    }
}

/* v is within the field's range, so it fits mem bytes. */
static void store_int(void *p, size_t mem, uint64_t v)
{
    uint8_t v8 = (uint8_t)v;
    uint16_t v16 = (uint16_t)v;
    uint32_t v32 = (uint32_t)v;
    switch (mem) {
    case 1:
        memcpy(p, &v8, 1);
        break;
    case 2:
        memcpy(p, &v16, 2);
        break;
    case 4:
        memcpy(p, &v32, 4);
        break;
    default:
        memcpy(p, &v, 8);
        break;
    }
}

/* ---- encoder: sizes were validated before anything is written ---- */

static void put_le(cur_t *c, uint64_t v, size_t n)
{
    assert(n <= c->end - c->pos);
    if (c->out)
        kvr__put_le(c->out + c->pos, v, n);
    c->pos += n;
}

static void put_bytes(cur_t *c, const void *p, size_t n)
{
    assert(n <= c->end - c->pos);
    if (c->out && n)
        memcpy(c->out + c->pos, p, n);
    c->pos += n;
}

static kvr_status_t enc_rec(cur_t *c, const kvr__rec_t *r, const char *rec);

static kvr_status_t check_range(const cur_t *c, const kvr__field_t *f,
                                uint64_t v)
{
    if (v >= f->lo && v <= f->hi)
        return KVR_OK;
    return ferr(c, f, c->bad,
                "value %" PRIu64 " outside [%" PRIu64 ", %" PRIu64 "]", v,
                f->lo, f->hi);
}

static kvr_status_t enc_string(cur_t *c, const kvr__field_t *f, const void *p,
                               size_t n)
{
    if (n > f->hi)
        return ferr(c, f, KVR_ERR_WIRE_LIMIT, "length %zu > cap %" PRIu64, n,
                    f->hi);
    if (n < f->lo)
        return ferr(c, f, KVR_ERR_INVALID, "empty");
    put_le(c, n, 2);
    put_bytes(c, p, n);
    return KVR_OK;
}

static kvr_status_t enc_items(cur_t *c, const kvr__field_t *f, const char *p,
                              uint32_t n)
{
    switch (f->kind) {
    case KVR__F_U32S:
        for (uint32_t i = 0; i < n; i++)
            put_le(c, load_int(p + 4 * (size_t)i, 4), 4);
        return KVR_OK;
    case KVR__F_BYTES:
        put_bytes(c, p, n);
        return KVR_OK;
    default:
        break;
    }
    for (c->index = 0, c->outer = f->name; c->index < n; c->index++) {
        kvr_status_t s = enc_rec(c, f->sub, p + c->index * f->sub->size);
        if (s != KVR_OK)
            return s;
    }
    c->outer = NULL;
    return KVR_OK;
}

static kvr_status_t enc_array(cur_t *c, const kvr__field_t *f, const char *rec)
{
    uint32_t n = (uint32_t)load_int(rec + f->count_off, 4);
    if (n > f->hi)
        return ferr(c, f, KVR_ERR_WIRE_LIMIT,
                    "count %" PRIu32 " > cap %" PRIu64, n, f->hi);
    const char *p = rec + f->off;
    if (f->kind != KVR__F_INLINE)
        memcpy(&p, rec + f->off, sizeof(p));
    if (n && p == NULL)
        return ferr(c, f, KVR_ERR_INVALID, "NULL with count %" PRIu32, n);
    put_le(c, n, 4);
    return enc_items(c, f, p, n);
}

static kvr_status_t enc_field(cur_t *c, const kvr__field_t *f, const char *rec)
{
    const char *p = rec + f->off;
    kvr_status_t s = KVR_OK;
    uint64_t v;
    switch (f->kind) {
    case KVR__F_INT:
        v = load_int(p, f->mem);
        s = check_range(c, f, v);
        if (s == KVR_OK)
            put_le(c, v, f->wire);
        return s;
    case KVR__F_ID:
        return enc_string(c, f, ((const kvr_wire_id_t *)(const void *)p)->bytes,
                          ((const kvr_wire_id_t *)(const void *)p)->len);
    case KVR__F_TEXT:
        return enc_string(c, f, p, strnlen(p, KVR_WIRE_TEXT_MAX + 1));
    case KVR__F_FIXED:
        put_bytes(c, p, f->hi);
        return KVR_OK;
    default:
        return enc_array(c, f, rec);
    }
}

static kvr_status_t enc_rec(cur_t *c, const kvr__rec_t *r, const char *rec)
{
    for (size_t i = 0; i < r->num_fields; i++) {
        kvr_status_t s = enc_field(c, &r->fields[i], rec);
        if (s != KVR_OK)
            return s;
    }
    return KVR_OK;
}

/* ---- decoder: rec is NULL while measuring ---- */

static kvr_status_t take(cur_t *c, const kvr__field_t *f, size_t n,
                         const uint8_t **p)
{
    if (n > c->end - c->pos)
        return ferr(
            c, f, KVR_ERR_PROTO,
            "truncated: needs %zu bytes at payload offset %zu, %zu left", n,
            c->pos, c->end - c->pos);
    *p = c->in + c->pos;
    c->pos += n;
    return KVR_OK;
}

static kvr_status_t get_le(cur_t *c, const kvr__field_t *f, size_t n,
                           uint64_t *v)
{
    const uint8_t *p = NULL;
    kvr_status_t s = take(c, f, n, &p);
    if (s == KVR_OK)
        *v = kvr__get_le(p, n);
    return s;
}

static void *arena_take(cur_t *c, size_t n)
{
    if (n == 0)
        return NULL;
    size_t at = (c->arena_pos + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    c->arena_pos = at + n;
    return c->arena ? c->arena + at : NULL;
}

static kvr_status_t dec_rec(cur_t *c, const kvr__rec_t *r, char *rec);

static kvr_status_t dec_string(cur_t *c, const kvr__field_t *f,
                               const uint8_t **p, uint64_t *n)
{
    kvr_status_t s = get_le(c, f, 2, n);
    if (s != KVR_OK)
        return s;
    if (*n > f->hi)
        return ferr(c, f, KVR_ERR_WIRE_LIMIT,
                    "length %" PRIu64 " > cap %" PRIu64, *n, f->hi);
    if (*n < f->lo)
        return ferr(c, f, KVR_ERR_PROTO, "empty");
    return take(c, f, (size_t)*n, p);
}

static kvr_status_t dec_id(cur_t *c, const kvr__field_t *f, char *dst)
{
    const uint8_t *p = NULL;
    uint64_t n;
    kvr_status_t s = dec_string(c, f, &p, &n);
    if (s == KVR_OK && dst) {
        kvr_wire_id_t *id = (kvr_wire_id_t *)(void *)dst;
        id->len = (uint16_t)n;
        memcpy(id->bytes, p, (size_t)n);
    }
    return s;
}

/* Text must hold no NUL so that it is a C string and re-encodes the same. */
static kvr_status_t dec_text(cur_t *c, const kvr__field_t *f, char *dst)
{
    const uint8_t *p = NULL;
    uint64_t n;
    kvr_status_t s = dec_string(c, f, &p, &n);
    if (s == KVR_OK && memchr(p, 0, (size_t)n))
        return ferr(c, f, KVR_ERR_PROTO, "NUL byte inside the text");
    if (s == KVR_OK && dst) {
        memcpy(dst, p, (size_t)n);
        dst[n] = '\0';
    }
    return s;
}

static kvr_status_t dec_items(cur_t *c, const kvr__field_t *f, char *arr,
                              uint32_t n)
{
    const uint8_t *p = NULL;
    kvr_status_t s;
    if (f->kind == KVR__F_U32S || f->kind == KVR__F_BYTES) {
        size_t width = f->kind == KVR__F_U32S ? 4 : 1;
        s = take(c, f, (size_t)n * width, &p);
        for (uint32_t i = 0; s == KVR_OK && arr && i < n; i++)
            store_int(arr + i * width, width,
                      kvr__get_le(p + i * width, width));
        return s;
    }
    for (c->index = 0, c->outer = f->name; c->index < n; c->index++) {
        s = dec_rec(c, f->sub, arr ? arr + c->index * f->sub->size : NULL);
        if (s != KVR_OK)
            return s;
    }
    c->outer = NULL;
    return KVR_OK;
}

static size_t item_size(const kvr__field_t *f)
{
    switch (f->kind) {
    case KVR__F_U32S:
        return 4;
    case KVR__F_BYTES:
        return 1;
    default:
        return f->sub->size;
    }
}

static kvr_status_t dec_array(cur_t *c, const kvr__field_t *f, char *rec)
{
    uint64_t n;
    kvr_status_t s = get_le(c, f, 4, &n);
    if (s != KVR_OK)
        return s;
    if (n > f->hi)
        return ferr(c, f, KVR_ERR_WIRE_LIMIT,
                    "count %" PRIu64 " > cap %" PRIu64, n, f->hi);
    char *arr;
    if (f->kind == KVR__F_INLINE)
        arr = rec ? rec + f->off : NULL;
    else
        arr = arena_take(c, (size_t)n * item_size(f));
    s = dec_items(c, f, arr, (uint32_t)n);
    if (s == KVR_OK && rec) {
        store_int(rec + f->count_off, 4, n);
        if (f->kind != KVR__F_INLINE)
            memcpy(rec + f->off, &arr, sizeof(arr));
    }
    return s;
}

static kvr_status_t dec_field(cur_t *c, const kvr__field_t *f, char *rec)
{
    char *dst = rec ? rec + f->off : NULL;
    const uint8_t *p = NULL;
    kvr_status_t s;
    uint64_t v;
    switch (f->kind) {
    case KVR__F_INT:
        s = get_le(c, f, f->wire, &v);
        if (s == KVR_OK)
            s = check_range(c, f, v);
        if (s == KVR_OK && dst)
            store_int(dst, f->mem, v);
        return s;
    case KVR__F_ID:
        return dec_id(c, f, dst);
    case KVR__F_TEXT:
        return dec_text(c, f, dst);
    case KVR__F_FIXED:
        s = take(c, f, f->hi, &p);
        if (s == KVR_OK && dst)
            memcpy(dst, p, f->hi);
        return s;
    default:
        return dec_array(c, f, rec);
    }
}

static kvr_status_t dec_rec(cur_t *c, const kvr__rec_t *r, char *rec)
{
    for (size_t i = 0; i < r->num_fields; i++) {
        kvr_status_t s = dec_field(c, &r->fields[i], rec);
        if (s != KVR_OK)
            return s;
    }
    return KVR_OK;
}

/* ---- frames ---- */

static kvr_status_t check_header(const uint8_t *b, kvr_wire_header_t *h,
                                 kvr_error_t *err)
{
    uint32_t magic = (uint32_t)kvr__get_le(b, 4);
    if (magic != KVR_WIRE_MAGIC)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "frame magic 0x%08" PRIx32
                             ", expected 0x%08x (\"KVRW\")",
                             magic, KVR_WIRE_MAGIC);
    h->major = b[4];
    h->minor = b[5];
    h->type = (uint16_t)kvr__get_le(b + 6, 2);
    h->length = (uint32_t)kvr__get_le(b + 8, 4);
    if (h->major != KVR_WIRE_VERSION_MAJOR)
        return kvr_error_set(
            err, KVR_ERR_VERSION,
            "frame version %u.%u: major version %u not supported "
            "(this side speaks %u.%u)",
            h->major, h->minor, h->major, KVR_WIRE_VERSION_MAJOR,
            KVR_WIRE_VERSION_MINOR);
    if (h->length > KVR_WIRE_MAX_PAYLOAD)
        return kvr_error_set(err, KVR_ERR_WIRE_LIMIT,
                             "frame length %" PRIu32 " > cap %u", h->length,
                             KVR_WIRE_MAX_PAYLOAD);
    return KVR_OK;
}

kvr_status_t kvr_wire_frame_need(const void *buf, size_t len, size_t *need,
                                 kvr_wire_header_t *hdr, kvr_error_t *err)
{
    if ((buf == NULL && len) || need == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buf or need is NULL");
    if (len < KVR_WIRE_HEADER_BYTES) {
        *need = KVR_WIRE_HEADER_BYTES;
        return KVR_OK;
    }
    kvr_wire_header_t h;
    kvr_status_t s = check_header(buf, &h, err);
    if (s != KVR_OK)
        return s;
    *need = KVR_WIRE_HEADER_BYTES + (size_t)h.length;
    if (hdr)
        *hdr = h;
    return KVR_OK;
}

static kvr_status_t frame_payload(const uint8_t *b, size_t len,
                                  kvr_wire_header_t *h, kvr_error_t *err)
{
    if (len < KVR_WIRE_HEADER_BYTES)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "truncated frame: %zu bytes, the header needs %u",
                             len, KVR_WIRE_HEADER_BYTES);
    kvr_status_t s = check_header(b, h, err);
    if (s != KVR_OK)
        return s;
    size_t have = len - KVR_WIRE_HEADER_BYTES;
    if (have < h->length)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "truncated frame: frame length %" PRIu32
                             " but %zu payload bytes present",
                             h->length, have);
    if (have > h->length)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "trailing garbage: %zu bytes after the frame "
                             "(frame length %" PRIu32 ")",
                             have - h->length, h->length);
    if (kvr__schema(h->type) == NULL)
        return kvr_error_set(err, KVR_ERR_PROTO, "frame type %u unknown",
                             h->type);
    return KVR_OK;
}

static kvr_status_t decode_pass(const kvr__rec_t *r, const uint8_t *payload,
                                uint32_t length, char *arena, void *rec,
                                size_t *arena_used, kvr_error_t *err)
{
    cur_t c = {.in = payload,
               .end = length,
               .arena = arena,
               .bad = KVR_ERR_PROTO,
               .msg = r->name,
               .err = err};
    kvr_status_t s = dec_rec(&c, r, rec);
    if (s == KVR_OK && c.pos != c.end)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "%s: %zu unread bytes after the last field "
                             "(frame length %" PRIu32 ")",
                             r->name, c.end - c.pos, length);
    *arena_used = c.arena_pos;
    return s;
}

kvr_status_t kvr_wire_decode(const void *buf, size_t len, kvr_msg_t *out,
                             kvr_error_t *err)
{
    if ((buf == NULL && len) || out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buf or out is NULL");
    kvr_wire_header_t h;
    kvr_status_t s = frame_payload(buf, len, &h, err);
    if (s != KVR_OK)
        return s;
    const kvr__rec_t *r = kvr__schema(h.type);
    const uint8_t *payload = (const uint8_t *)buf + KVR_WIRE_HEADER_BYTES;
    size_t need, used;
    s = decode_pass(r, payload, h.length, NULL, NULL, &need, err);
    if (s != KVR_OK)
        return s;
    kvr_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = (kvr_msg_type_t)h.type;
    /* zeroed: a record's padding, and any member its schema does not
     * carry, read as 0 rather than as whatever the heap held */
    if (need && (m.priv_arena = calloc(1, need)) == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                             "%s: no memory for %zu bytes", r->name, need);
    s = decode_pass(r, payload, h.length, m.priv_arena, &m.u, &used, err);
    assert(s == KVR_OK && used == need);
    *out = m;
    return s;
}

/* Validates msg and returns its payload size. */
static kvr_status_t payload_size(const kvr_msg_t *msg, const kvr__rec_t **r,
                                 size_t *size, kvr_error_t *err)
{
    if (msg == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "msg is NULL");
    *r = ((unsigned)msg->type <= UINT16_MAX) ? kvr__schema((uint16_t)msg->type)
                                             : NULL;
    if (*r == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "message type %d unknown",
                             (int)msg->type);
    cur_t c = {
        .end = SIZE_MAX, .bad = KVR_ERR_INVALID, .msg = (*r)->name, .err = err};
    kvr_status_t s = enc_rec(&c, *r, (const char *)&msg->u);
    if (s == KVR_OK && c.pos > KVR_WIRE_MAX_PAYLOAD)
        s = kvr_error_set(err, KVR_ERR_WIRE_LIMIT, "%s: payload %zu > cap %u",
                          (*r)->name, c.pos, KVR_WIRE_MAX_PAYLOAD);
    *size = c.pos;
    return s;
}

kvr_status_t kvr_wire_encoded_size(const kvr_msg_t *msg, size_t *len,
                                   kvr_error_t *err)
{
    const kvr__rec_t *r = NULL;
    size_t size = 0;
    if (len == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "len is NULL");
    kvr_status_t s = payload_size(msg, &r, &size, err);
    if (s == KVR_OK)
        *len = KVR_WIRE_HEADER_BYTES + size;
    return s;
}

kvr_status_t kvr_wire_encode(const kvr_msg_t *msg, void *buf, size_t cap,
                             size_t *len, kvr_error_t *err)
{
    const kvr__rec_t *r = NULL;
    size_t size = 0;
    if ((buf == NULL && cap) || len == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buf or len is NULL");
    kvr_status_t s = payload_size(msg, &r, &size, err);
    if (s != KVR_OK)
        return s;
    size_t total = KVR_WIRE_HEADER_BYTES + size;
    if (cap < total)
        return kvr_error_set(err, KVR_ERR_BUFFER_SMALL,
                             "%s needs %zu bytes, buffer has %zu", r->name,
                             total, cap);
    cur_t c = {.out = buf,
               .end = total,
               .bad = KVR_ERR_INVALID,
               .msg = r->name,
               .err = err};
    put_le(&c, KVR_WIRE_MAGIC, 4);
    put_le(&c, KVR_WIRE_VERSION_MAJOR, 1);
    put_le(&c, KVR_WIRE_VERSION_MINOR, 1);
    put_le(&c, (uint64_t)msg->type, 2);
    put_le(&c, size, 4);
    s = enc_rec(&c, r, (const char *)&msg->u);
    assert(s == KVR_OK && c.pos == total);
    *len = total;
    return s;
}

kvr_status_t kvr_wire_encode_alloc(const kvr_msg_t *msg, uint8_t **out,
                                   size_t *len, kvr_error_t *err)
{
    size_t size = 0;
    if (out == NULL || len == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out or len is NULL");
    kvr_status_t s = kvr_wire_encoded_size(msg, &size, err);
    if (s != KVR_OK)
        return s;
    uint8_t *buf = malloc(size);
    if (buf == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %zu bytes",
                             size);
    s = kvr_wire_encode(msg, buf, size, len, err);
    assert(s == KVR_OK);
    *out = buf;
    return s;
}

void kvr_msg_init(kvr_msg_t *msg, kvr_msg_type_t type)
{
    if (msg == NULL)
        return;
    memset(msg, 0, sizeof(*msg));
    msg->type = type;
    switch (type) {
    case KVR_MSG_HELLO:
    case KVR_MSG_HELLO_ACK:
    case KVR_MSG_LAYOUT:
        msg->u.hello.proto_major = KVR_WIRE_VERSION_MAJOR;
        msg->u.hello.proto_minor = KVR_WIRE_VERSION_MINOR;
        break;
    case KVR_MSG_ASSIGN:
        msg->u.assign.deadline_ms = KVR_WIRE_DEADLINE_DEFAULT_MS;
        break;
    case KVR_MSG_WRITE_REQUEST:
    case KVR_MSG_STREAM_REQUEST:
        msg->u.write_request.deadline_ms = KVR_WIRE_DEADLINE_DEFAULT_MS;
        break;
    default:
        break;
    }
}

void kvr_msg_free(kvr_msg_t *msg)
{
    if (msg == NULL)
        return;
    free(msg->priv_arena);
    memset(msg, 0, sizeof(*msg));
}

kvr_status_t kvr_wire_id_set(kvr_wire_id_t *id, const void *bytes, size_t len,
                             kvr_error_t *err)
{
    if (id == NULL || (bytes == NULL && len))
        return kvr_error_set(err, KVR_ERR_INVALID, "id or bytes is NULL");
    if (len < 1 || len > KVR_WIRE_REQ_ID_MAX)
        return kvr_error_set(err, KVR_ERR_WIRE_LIMIT,
                             "request id of %zu bytes, must be 1..%u", len,
                             KVR_WIRE_REQ_ID_MAX);
    memset(id, 0, sizeof(*id));
    id->len = (uint16_t)len;
    memcpy(id->bytes, bytes, len);
    return KVR_OK;
}

bool kvr_wire_id_equal(const kvr_wire_id_t *a, const kvr_wire_id_t *b)
{
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}
