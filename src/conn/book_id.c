/* Completion ids (docs/design.md §8): validation, completion_req_key, keyed
 * hashing, owned copies and printable forms. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "book.h"

kvr_status_t kvr_completion_id_check(const kvr_completion_id_t *id,
                                     kvr_error_t *err)
{
    if (id == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "completion id is NULL");
    if (id->req_id_len == 0 || id->req_id_len > KVR_REQ_ID_MAX)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "request id length %zu outside 1..%d",
                             id->req_id_len, KVR_REQ_ID_MAX);
    if (id->req_id == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "request id bytes are NULL (length %zu)",
                             id->req_id_len);
    if (!id->is_op && id->generation != 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "bare request id with generation %lld "
                             "(only operation ids carry one)",
                             (long long)id->generation);
    if (id->generation < 0 || id->generation > KVR_GENERATION_MAX)
        return kvr_error_set(
            err, KVR_ERR_INVALID, "generation %lld outside 0..%lld",
            (long long)id->generation, (long long)KVR_GENERATION_MAX);
    return KVR_OK;
}

kvr_status_t kvr_completion_req_key(const kvr_completion_id_t *id,
                                    kvr_completion_id_t *out, kvr_error_t *err)
{
    kvr_status_t s = kvr_completion_id_check(id, err);
    if (s != KVR_OK)
        return s;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    *out = kvr_completion_req(id->req_id, id->req_id_len);
    return KVR_OK;
}

kvr_status_t kvr__hkey_init(uint8_t hkey[KVR__HKEY_BYTES], kvr_error_t *err)
{
    if (kvr_init(err) != KVR_OK)
        return KVR_ERR_INIT;
    crypto_shorthash_keygen(hkey);
    return KVR_OK;
}

static uint64_t hash_fields(const uint8_t *bytes, size_t len, bool is_op,
                            uint64_t gen, const uint8_t hkey[KVR__HKEY_BYTES])
{
    uint8_t buf[9 + KVR_REQ_ID_MAX], out[crypto_shorthash_BYTES];
    buf[0] = is_op ? 1 : 0;
    kvr__put_le(buf + 1, gen, 8);
    memcpy(buf + 9, bytes, len);
    crypto_shorthash(out, buf, 9 + len, hkey);
    return kvr__get_le(out, 8);
}

kvr_status_t kvr__view_of(const kvr_completion_id_t *id,
                          const uint8_t hkey[KVR__HKEY_BYTES], kvr__view_t *out,
                          kvr_error_t *err)
{
    kvr_status_t s = kvr_completion_id_check(id, err);
    if (s != KVR_OK)
        return s;
    out->bytes = id->req_id;
    out->len = id->req_id_len;
    out->is_op = id->is_op;
    out->gen = (uint64_t)id->generation;
    out->hash = hash_fields(out->bytes, out->len, out->is_op, out->gen, hkey);
    return KVR_OK;
}

kvr__view_t kvr__view_req(const kvr__view_t *v,
                          const uint8_t hkey[KVR__HKEY_BYTES])
{
    kvr__view_t r = {v->bytes, v->len, false, 0, v->hash};
    if (v->is_op)
        r.hash = hash_fields(r.bytes, r.len, false, 0, hkey);
    return r;
}

kvr__view_t kvr__view_of_key(const kvr__key_t *k)
{
    kvr__view_t v = {k->bytes, k->len, k->is_op, k->gen, k->hash};
    return v;
}

kvr__key_t *kvr__key_new(const kvr__view_t *v)
{
    kvr__key_t *k = malloc(sizeof(*k) + v->len);
    if (k == NULL)
        return NULL;
    k->hash = v->hash;
    k->gen = v->gen;
    k->len = (uint16_t)v->len;
    k->is_op = v->is_op;
    memcpy(k->bytes, v->bytes, v->len);
    return k;
}

bool kvr__key_eq(const kvr__key_t *k, const kvr__view_t *v)
{
    return k->hash == v->hash && k->len == v->len && k->is_op == v->is_op &&
           k->gen == v->gen && memcmp(k->bytes, v->bytes, v->len) == 0;
}

/* Appends escaped bytes while they fit, leaving room for "..." + tail. */
static size_t repr_bytes(char *buf, size_t cap, const uint8_t *b, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        char tmp[5];
        int w = (b[i] >= 0x20 && b[i] < 0x7f && b[i] != '"' && b[i] != '\\')
                    ? snprintf(tmp, sizeof(tmp), "%c", b[i])
                    : snprintf(tmp, sizeof(tmp), "\\x%02x", b[i]);
        if (n + (size_t)w + 3 >= cap) {
            memcpy(buf + n, "...", 3);
            return n + 3;
        }
        memcpy(buf + n, tmp, (size_t)w);
        n += (size_t)w;
    }
    return n;
}

void kvr__view_repr(const kvr__view_t *v, char buf[KVR__REPR_MAX])
{
    /* room for the quotes and ", <generation>)" */
    char body[KVR__REPR_MAX - 32];
    size_t n = repr_bytes(body, sizeof(body), v->bytes, v->len);
    body[n] = '\0';
    if (v->is_op)
        snprintf(buf, KVR__REPR_MAX, "(\"%s\", %llu)", body,
                 (unsigned long long)v->gen);
    else
        snprintf(buf, KVR__REPR_MAX, "\"%s\"", body);
}

kvr_status_t kvr__fail_full(kvr_error_t *err, const char *what,
                            const kvr__view_t *v, const char *limit,
                            size_t value)
{
    char repr[KVR__REPR_MAX];
    kvr__view_repr(v, repr);
    return kvr_error_set(err, KVR_ERR_TABLE_FULL,
                         "%s %s: table full (%s %zu reached)", what, repr,
                         limit, value);
}

kvr_status_t kvr__fail_nomem(kvr_error_t *err, const char *what,
                             const kvr__view_t *v)
{
    char repr[KVR__REPR_MAX];
    kvr__view_repr(v, repr);
    return kvr_error_set(err, KVR_ERR_NO_MEMORY, "%s %s: out of memory", what,
                         repr);
}

kvr_status_t kvr__check_size(const char *what, size_t n, kvr_error_t *err)
{
    if (n < 1 || n > KVR_BOOK_MAX_ENTRIES)
        return kvr_error_set(err, KVR_ERR_INVALID, "%s %zu outside 1..%u", what,
                             n, KVR_BOOK_MAX_ENTRIES);
    return KVR_OK;
}
