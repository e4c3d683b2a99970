/* Codec: round trip of every message, every truncation, header errors,
 * caps on both sides, trailing garbage, and the documented byte layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/wire.h"
#include "wire_samples.h"

static uint8_t *encode(const kvr_msg_t *m, size_t *len)
{
    uint8_t *buf = NULL;
    kvr_error_t err = {0};
    kvr_status_t s = kvr_wire_encode_alloc(m, &buf, len, &err);
    if (s != KVR_OK)
        fail_msg("encode %s: %s", kvr_msg_type_name(m->type), err.msg);
    return buf;
}

/* decode must fail with code and a message containing needle. */
static void expect_decode(const uint8_t *buf, size_t len, kvr_status_t code,
                          const char *needle)
{
    kvr_msg_t m;
    memset(&m, 0xa5, sizeof(m));
    kvr_msg_t before = m;
    kvr_error_t err = {0};
    kvr_status_t s = kvr_wire_decode(buf, len, &m, &err);
    if (s != code || strstr(err.msg, needle) == NULL)
        fail_msg("decode: got %s \"%s\", want %s \"%s\"", kvr_status_name(s),
                 err.msg, kvr_status_name(code), needle);
    assert_memory_equal(&m, &before, sizeof(m)); /* untouched on failure */
}

static void expect_encode(const kvr_msg_t *m, kvr_status_t code,
                          const char *needle)
{
    kvr_error_t err = {0};
    size_t len = 0;
    kvr_status_t s = kvr_wire_encoded_size(m, &len, &err);
    if (s != code || strstr(err.msg, needle) == NULL)
        fail_msg("encode: got %s \"%s\", want %s \"%s\"", kvr_status_name(s),
                 err.msg, kvr_status_name(code), needle);
}

static uint32_t get_len(const uint8_t *b)
{
    return (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 |
           (uint32_t)b[11] << 24;
}

static void set_len(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[8 + i] = (uint8_t)(v >> (8 * i));
}

/* Calls fn with the encoded frame of every sample message. */
static void for_each_frame(void (*fn)(const kvr_msg_t *m, const uint8_t *buf,
                                      size_t len))
{
    for (size_t t = 0; t < kvr_num_sample_types; t++) {
        kvr_msg_t m;
        kvr_sample_msg(kvr_sample_types[t], &m);
        size_t len;
        uint8_t *buf = encode(&m, &len);
        fn(&m, buf, len);
        free(buf);
    }
}

static void round_trip(const kvr_msg_t *m, const uint8_t *buf, size_t len)
{
    kvr_msg_t d;
    size_t len2, need = 0;
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_decode(buf, len, &d, &err), KVR_OK);
    assert_int_equal(d.type, m->type);
    uint8_t *buf2 = encode(&d, &len2);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, buf2, len);
    assert_int_equal(kvr_wire_frame_need(buf, len, &need, NULL, NULL), KVR_OK);
    assert_int_equal(need, len);
    kvr_msg_free(&d);
    assert_null(d.priv_arena);
    free(buf2);
}

static void test_round_trip(void **state)
{
    (void)state;
    for_each_frame(round_trip);
}

static void test_decoded_fields(void **state)
{
    (void)state;
    kvr_msg_t m, d;
    kvr_sample_msg(KVR_MSG_WRITE_REQUEST, &m);
    size_t len;
    uint8_t *buf = encode(&m, &len);
    assert_int_equal(kvr_wire_decode(buf, len, &d, NULL), KVR_OK);
    free(buf); /* decoded arrays must not point into the frame */
    const kvr_msg_write_request_t *a = &m.u.write_request,
                                  *b = &d.u.write_request;
    assert_true(kvr_wire_id_equal(&a->request_id, &b->request_id));
    assert_int_equal(b->num_src_blocks, 5);
    assert_memory_equal(a->src_blocks, b->src_blocks, 5 * sizeof(uint32_t));
    assert_memory_equal(a->dst_blocks, b->dst_blocks, 2 * sizeof(uint32_t));
    assert_memory_equal(a->staging_slots, b->staging_slots,
                        3 * sizeof(uint32_t));
    assert_int_equal(b->executor, KVR_WIRE_EXEC_STAGED);
    assert_int_equal(b->write_nonce, a->write_nonce);
    assert_int_equal(b->deadline_ms, 1500);
    kvr_msg_free(&d);

    kvr_sample_msg(KVR_MSG_REGIONS, &m);
    buf = encode(&m, &len);
    assert_int_equal(kvr_wire_decode(buf, len, &d, NULL), KVR_OK);
    free(buf);
    assert_int_equal(d.u.regions.num_regions, 3);
    const kvr_wire_region_t *r = d.u.regions.regions;
    assert_int_equal(r[1].desc.role, KVR_ROLE_INDEX);
    assert_int_equal(r[1].desc.index_dim, 128);
    assert_int_equal(r[0].base, 0x7f0000001000ull);
    assert_int_equal(r[0].rkey_len, 6);
    assert_memory_equal(r[0].rkey, m.u.regions.regions[0].rkey, 6);
    assert_int_equal(r[2].rkey_len, 0);
    assert_null(r[2].rkey);
    assert_int_equal(r[2].desc.bytes, 16 << 20);
    assert_int_equal(d.u.regions.address_len, 7);
    assert_memory_equal(d.u.regions.address, m.u.regions.address, 7);
    kvr_msg_free(&d);
    kvr_msg_free(NULL);
}

/* Every field of a region descriptor, the flag read as a bool. The
 * samples' values are not zero, so a field the decoder skipped differs. */
static void expect_same_desc(const kvr_region_desc_t *a,
                             const kvr_region_desc_t *b)
{
    assert_int_equal(a->role, b->role);
    assert_int_equal(a->layer, b->layer);
    assert_int_equal(a->num_blocks, b->num_blocks);
    assert_int_equal(a->page_bytes, b->page_bytes);
    assert_int_equal(a->index_dim, b->index_dim);
    assert_int_equal(a->quant_block, b->quant_block);
    assert_int_equal(a->bytes, b->bytes);
    assert_int_equal(a->heads, b->heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->elem_bytes, b->elem_bytes);
    assert_int_equal(a->kv_planes, b->kv_planes);
    assert_true(a->hnd == b->hnd);
}

/* REGIONS sets every descriptor field it carries, the dense head geometry
 * included (the agent plans and keys its plan cache on all of them). */
static void test_decoded_regions(void **state)
{
    (void)state;
    kvr_msg_t m, d;
    kvr_sample_msg(KVR_MSG_REGIONS, &m);
    kvr_wire_region_t regs[4];
    memcpy(regs, m.u.regions.regions, 3 * sizeof(regs[0]));
    regs[3] = (kvr_wire_region_t){.desc = {.role = KVR_ROLE_DENSE,
                                           .layer = 7,
                                           .num_blocks = 64,
                                           .page_bytes = 2 * 16 * 8 * 128 * 2,
                                           .heads = 8,
                                           .head_dim = 128,
                                           .elem_bytes = 2,
                                           .kv_planes = 2,
                                           .hnd = true},
                                  .base = 0x7f0020000000ull,
                                  .memory = KVR_WIRE_MEM_HOST};
    m.u.regions.regions = regs;
    m.u.regions.num_regions = 4;
    size_t len;
    uint8_t *buf = encode(&m, &len);
    assert_int_equal(kvr_wire_decode(buf, len, &d, NULL), KVR_OK);
    free(buf);
    assert_int_equal(d.u.regions.num_regions, 4);
    for (uint32_t i = 0; i < 4; i++)
        expect_same_desc(&d.u.regions.regions[i].desc, &regs[i].desc);
    kvr_msg_free(&d);
}

static void truncations(const kvr_msg_t *m, const uint8_t *buf, size_t len)
{
    (void)m;
    for (size_t cut = 0; cut < len; cut++)
        expect_decode(buf, cut, KVR_ERR_PROTO, "truncated frame");
    /* A shorter frame that says so: the payload runs out in a field. */
    for (size_t cut = KVR_WIRE_HEADER_BYTES; cut < len; cut++) {
        uint8_t *copy = malloc(cut);
        memcpy(copy, buf, cut);
        set_len(copy, (uint32_t)(cut - KVR_WIRE_HEADER_BYTES));
        expect_decode(copy, cut, KVR_ERR_PROTO, "truncated: needs");
        free(copy);
    }
}

static void test_every_truncation(void **state)
{
    (void)state;
    for_each_frame(truncations);
}

static void header_errors(const kvr_msg_t *m, const uint8_t *buf, size_t len)
{
    (void)m;
    uint8_t *bad = malloc(len);
    memcpy(bad, buf, len);
    bad[0] = 'X';
    expect_decode(bad, len, KVR_ERR_PROTO, "frame magic 0x5752565");
    memcpy(bad, buf, len);
    bad[4] = 1; /* 1.0 frames are another major version */
    bad[5] = 0;
    expect_decode(bad, len, KVR_ERR_VERSION, "frame version 1.0");
    bad[4] = 4;
    expect_decode(bad, len, KVR_ERR_VERSION, "frame version 4.0");
    memcpy(bad, buf, len);
    bad[6] = 99;
    expect_decode(bad, len, KVR_ERR_PROTO, "frame type 99 unknown");
    bad[6] = 0;
    expect_decode(bad, len, KVR_ERR_PROTO, "frame type 0 unknown");
    memcpy(bad, buf, len);
    set_len(bad, get_len(buf) + 1); /* one more than present */
    expect_decode(bad, len, KVR_ERR_PROTO, "truncated frame: frame length");
    set_len(bad, get_len(buf) - 1); /* one less than present */
    expect_decode(bad, len, KVR_ERR_PROTO, "trailing garbage: 1 bytes");
    set_len(bad, get_len(buf) | 0x01000000u); /* > cap */
    expect_decode(bad, len, KVR_ERR_WIRE_LIMIT, "frame length");
    memcpy(bad, buf, len);
    bad[5] = 9; /* another minor version is accepted */
    kvr_msg_t d;
    assert_int_equal(kvr_wire_decode(bad, len, &d, NULL), KVR_OK);
    kvr_msg_free(&d);
    free(bad);
}

static void test_header_errors(void **state)
{
    (void)state;
    for_each_frame(header_errors);
}

static void trailing(const kvr_msg_t *m, const uint8_t *buf, size_t len)
{
    (void)m;
    uint8_t *big = malloc(len + 3);
    memcpy(big, buf, len);
    memset(big + len, 0, 3);
    expect_decode(big, len + 3, KVR_ERR_PROTO, "trailing garbage: 3 bytes");
    set_len(big, get_len(buf) + 3); /* length covers the garbage */
    expect_decode(big, len + 3, KVR_ERR_PROTO, "3 unread bytes");
    free(big);
}

static void test_trailing_garbage(void **state)
{
    (void)state;
    for_each_frame(trailing);
}

static void test_frame_need(void **state)
{
    (void)state;
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_OFFER, &m);
    size_t len, need = 0;
    uint8_t *buf = encode(&m, &len);
    kvr_wire_header_t h;
    for (size_t n = 0; n < KVR_WIRE_HEADER_BYTES; n++) {
        assert_int_equal(kvr_wire_frame_need(buf, n, &need, &h, NULL), KVR_OK);
        assert_int_equal(need, KVR_WIRE_HEADER_BYTES);
    }
    assert_int_equal(kvr_wire_frame_need(buf, 12, &need, &h, NULL), KVR_OK);
    assert_int_equal(need, len);
    assert_int_equal(h.type, KVR_MSG_OFFER);
    assert_int_equal(h.length, len - 12);
    buf[6] = 200; /* unknown types still frame: a newer minor may send them */
    assert_int_equal(kvr_wire_frame_need(buf, 12, &need, &h, NULL), KVR_OK);
    assert_int_equal(h.type, 200);
    kvr_error_t err = {0};
    buf[1] = 0;
    assert_int_equal(kvr_wire_frame_need(buf, 12, &need, &h, &err),
                     KVR_ERR_PROTO);
    assert_non_null(strstr(err.msg, "frame magic"));
    free(buf);
}

static void test_encode_errors(void **state)
{
    (void)state;
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_WRITE_DONE, &m);
    size_t len = 0, need = 0;
    kvr_wire_encoded_size(&m, &need, NULL);
    uint8_t buf[512];
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_encode(&m, buf, need - 1, &len, &err),
                     KVR_ERR_BUFFER_SMALL);
    assert_int_equal(len, 0);
    assert_int_equal(kvr_wire_encode(&m, buf, sizeof(buf), &len, &err), KVR_OK);
    assert_int_equal(len, need);
    m.type = (kvr_msg_type_t)6;
    expect_encode(&m, KVR_ERR_INVALID, "type 6 unknown");
    kvr_sample_msg(KVR_MSG_WRITE_REQUEST, &m);
    m.u.write_request.src_blocks = NULL;
    expect_encode(&m, KVR_ERR_INVALID,
                  "WRITE_REQUEST.src_blocks: NULL with count 5");
    kvr_sample_msg(KVR_MSG_WRITE_REQUEST, &m);
    m.u.write_request.deadline_ms = 0;
    expect_encode(&m, KVR_ERR_INVALID,
                  "deadline_ms: value 0 outside [1, 3600000]");
    m.u.write_request.deadline_ms = KVR_WIRE_DEADLINE_MAX_MS + 1;
    expect_encode(&m, KVR_ERR_INVALID, "deadline_ms: value 3600001");
    kvr_sample_msg(KVR_MSG_WRITE_REQUEST, &m);
    m.u.write_request.write_nonce = 0;
    expect_encode(&m, KVR_ERR_INVALID, "write_nonce: value 0");
    kvr_sample_msg(KVR_MSG_WRITE_FAILED, &m);
    m.u.write_failed.status = KVR_OK;
    expect_encode(&m, KVR_ERR_INVALID, "WRITE_FAILED.status: value 0");
    kvr_sample_msg(KVR_MSG_RELEASE, &m);
    m.u.release.request_id.len = 0;
    expect_encode(&m, KVR_ERR_INVALID, "RELEASE.request_id: empty");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_decoded_fields),
        cmocka_unit_test(test_decoded_regions),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_header_errors),
        cmocka_unit_test(test_trailing_garbage),
        cmocka_unit_test(test_frame_need),
        cmocka_unit_test(test_encode_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
