/* Caps and ranges, enforced on encode and on decode; frames are built by
 * hand here, so these tests also pin the byte layout of docs/PROTOCOL.md. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/wire.h"
#include "wire_samples.h"

/* A hand-built frame. */
typedef struct {
    uint8_t b[16384];
    size_t n;
} tb_t;

static void le(tb_t *t, uint64_t v, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        t->b[t->n++] = (uint8_t)(v >> (8 * i));
}

static tb_t *start(uint16_t type)
{
    tb_t *t = calloc(1, sizeof(*t));
    le(t, KVR_WIRE_MAGIC, 4);
    le(t, KVR_WIRE_VERSION_MAJOR, 1);
    le(t, KVR_WIRE_VERSION_MINOR, 1);
    le(t, type, 2);
    le(t, 0, 4); /* length, set by finish() */
    return t;
}

static void finish(tb_t *t)
{
    size_t n = t->n;
    t->n = 8;
    le(t, n - KVR_WIRE_HEADER_BYTES, 4);
    t->n = n;
}

/* request id "r1" and transfer id 5 */
static void head(tb_t *t)
{
    le(t, 2, 2);
    t->b[t->n++] = 'r';
    t->b[t->n++] = '1';
    le(t, 5, 8);
}

static void expect_decode(tb_t *t, kvr_status_t code, const char *needle)
{
    finish(t);
    kvr_msg_t m;
    kvr_error_t err = {0};
    kvr_status_t s = kvr_wire_decode(t->b, t->n, &m, &err);
    if (s != code || strstr(err.msg, needle) == NULL)
        fail_msg("decode: got %s \"%s\", want %s \"%s\"", kvr_status_name(s),
                 err.msg, kvr_status_name(code), needle);
    if (s == KVR_OK)
        kvr_msg_free(&m);
    free(t);
}

static void expect_encode(const kvr_msg_t *m, kvr_status_t code,
                          const char *needle)
{
    kvr_error_t err = {0};
    size_t len = 0;
    uint8_t buf[64];
    kvr_status_t s = kvr_wire_encode(m, buf, sizeof(buf), &len, &err);
    if (s != code || strstr(err.msg, needle) == NULL)
        fail_msg("encode: got %s \"%s\", want %s \"%s\"", kvr_status_name(s),
                 err.msg, kvr_status_name(code), needle);
}

static void test_request_id_cap(void **state)
{
    (void)state;
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_WRITE_DONE, &m);
    m.u.write_done.request_id.len = KVR_WIRE_REQ_ID_MAX + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "WRITE_DONE.request_id: length 257 > cap 256");
    tb_t *t = start(KVR_MSG_WRITE_DONE);
    le(t, KVR_WIRE_REQ_ID_MAX + 1, 2);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "WRITE_DONE.request_id: length 257 > cap 256");
    t = start(KVR_MSG_WRITE_DONE);
    le(t, 0, 2);
    expect_decode(t, KVR_ERR_PROTO, "WRITE_DONE.request_id: empty");
    kvr_wire_id_t id;
    char big[300] = {0};
    assert_int_equal(kvr_wire_id_set(&id, big, 257, NULL), KVR_ERR_WIRE_LIMIT);
    assert_int_equal(kvr_wire_id_set(&id, big, 0, NULL), KVR_ERR_WIRE_LIMIT);
    assert_int_equal(kvr_wire_id_set(&id, big, 256, NULL), KVR_OK);
}

/* Encode side of an array cap: the count alone is checked. */
static void over_cap(kvr_msg_type_t type, size_t count_off, const char *needle)
{
    kvr_msg_t m;
    kvr_sample_msg(type, &m);
    uint32_t big = 0x7fffffff;
    memcpy((char *)&m.u + count_off, &big, 4);
    expect_encode(&m, KVR_ERR_WIRE_LIMIT, needle);
}

#define OFF(T, m) offsetof(T, m)

static void test_offer_caps(void **state)
{
    (void)state;
    over_cap(KVR_MSG_OFFER, OFF(kvr_msg_offer_t, num_src_blocks),
             "OFFER.src_blocks: count 2147483647 > cap 131072");
    over_cap(KVR_MSG_OFFER, OFF(kvr_msg_offer_t, num_prompt),
             "OFFER.prompt: count 2147483647 > cap 1048576");
    tb_t *t = start(KVR_MSG_OFFER);
    head(t);
    le(t, 300, 8);
    le(t, KVR_WIRE_MAX_BLOCKS + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "OFFER.src_blocks: count 131073 > cap 131072");
    t = start(KVR_MSG_OFFER);
    head(t);
    le(t, 300, 8);
    le(t, 0, 4);
    le(t, KVR_WIRE_MAX_PROMPT + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "OFFER.prompt: count 1048577 > cap 1048576");
    t = start(KVR_MSG_OFFER); /* a count within the cap but past the data */
    head(t);
    le(t, 300, 8);
    le(t, 1000, 4);
    le(t, 1, 4);
    expect_decode(t, KVR_ERR_PROTO,
                  "OFFER.src_blocks: truncated: needs 4000 bytes");
}

static void test_assign_caps(void **state)
{
    (void)state;
    over_cap(KVR_MSG_ASSIGN, OFF(kvr_msg_assign_t, num_dst_blocks),
             "ASSIGN.dst_blocks: count 2147483647 > cap 131072");
    tb_t *t = start(KVR_MSG_ASSIGN);
    head(t);
    le(t, KVR_WIRE_MAX_BLOCKS + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT, "ASSIGN.dst_blocks: count 131073");
    t = start(KVR_MSG_ASSIGN);
    head(t);
    le(t, 0, 4);
    le(t, 0, 8);
    le(t, 0, 4);
    expect_decode(t, KVR_ERR_PROTO,
                  "ASSIGN.deadline_ms: value 0 outside [1, 3600000]");
}

/* WRITE_REQUEST up to its staging slots count. */
static tb_t *write_request_prefix(uint32_t src, uint32_t dst, uint8_t exec)
{
    tb_t *t = start(KVR_MSG_WRITE_REQUEST);
    head(t);
    le(t, src, 4);
    if (src > KVR_WIRE_MAX_BLOCKS)
        return t;
    for (uint32_t i = 0; i < src; i++)
        le(t, i, 4);
    le(t, dst, 4);
    if (dst > KVR_WIRE_MAX_BLOCKS)
        return t;
    for (uint32_t i = 0; i < dst; i++)
        le(t, i, 4);
    le(t, 64, 8); /* num_tokens */
    le(t, 0, 8);  /* num_computed_blocks */
    le(t, 1, 4);  /* dcp_rank */
    le(t, exec, 1);
    return t;
}

static void test_write_request_caps(void **state)
{
    (void)state;
    typedef kvr_msg_write_request_t W;
    over_cap(KVR_MSG_WRITE_REQUEST, OFF(W, num_src_blocks),
             "WRITE_REQUEST.src_blocks: count 2147483647 > cap 131072");
    over_cap(KVR_MSG_WRITE_REQUEST, OFF(W, num_dst_blocks),
             "WRITE_REQUEST.dst_blocks: count 2147483647");
    over_cap(KVR_MSG_WRITE_REQUEST, OFF(W, num_staging_slots),
             "WRITE_REQUEST.staging_slots: count 2147483647 > cap 4096");
    expect_decode(write_request_prefix(KVR_WIRE_MAX_BLOCKS + 1, 0, 0),
                  KVR_ERR_WIRE_LIMIT, "WRITE_REQUEST.src_blocks: count 131073");
    expect_decode(write_request_prefix(1, KVR_WIRE_MAX_BLOCKS + 1, 0),
                  KVR_ERR_WIRE_LIMIT, "WRITE_REQUEST.dst_blocks: count 131073");
    tb_t *t = write_request_prefix(1, 1, 2);
    le(t, KVR_WIRE_MAX_SLOTS + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "WRITE_REQUEST.staging_slots: count 4097 > cap 4096");
    expect_decode(write_request_prefix(1, 1, 5), KVR_ERR_PROTO,
                  "WRITE_REQUEST.executor: value 5 outside [0, 4]");
    t = write_request_prefix(1, 1, 1);
    le(t, 0, 4); /* no slots */
    le(t, 0, 8); /* nonce 0 */
    expect_decode(t, KVR_ERR_PROTO, "WRITE_REQUEST.write_nonce: value 0");
    t = write_request_prefix(1, 1, 1);
    le(t, 0, 4);
    le(t, 9, 8);
    le(t, KVR_WIRE_DEADLINE_MAX_MS + 1, 4);
    expect_decode(t, KVR_ERR_PROTO, "WRITE_REQUEST.deadline_ms: value 3600001");
}

/* The biggest legal WRITE_REQUEST and OFFER encode and decode. */
static void test_at_caps(void **state)
{
    (void)state;
    uint32_t *ids = calloc(KVR_WIRE_MAX_PROMPT, sizeof(uint32_t));
    kvr_msg_t m, d;
    kvr_sample_msg(KVR_MSG_WRITE_REQUEST, &m);
    m.u.write_request.src_blocks = m.u.write_request.dst_blocks = ids;
    m.u.write_request.num_src_blocks = KVR_WIRE_MAX_BLOCKS;
    m.u.write_request.num_dst_blocks = KVR_WIRE_MAX_BLOCKS;
    m.u.write_request.staging_slots = ids;
    m.u.write_request.num_staging_slots = KVR_WIRE_MAX_SLOTS;
    uint8_t *buf;
    size_t len;
    assert_int_equal(kvr_wire_encode_alloc(&m, &buf, &len, NULL), KVR_OK);
    assert_int_equal(kvr_wire_decode(buf, len, &d, NULL), KVR_OK);
    assert_int_equal(d.u.write_request.num_dst_blocks, KVR_WIRE_MAX_BLOCKS);
    kvr_msg_free(&d);
    free(buf);
    kvr_sample_msg(KVR_MSG_OFFER, &m);
    m.u.offer.src_blocks = m.u.offer.prompt = ids;
    m.u.offer.num_src_blocks = KVR_WIRE_MAX_BLOCKS;
    m.u.offer.num_prompt = KVR_WIRE_MAX_PROMPT;
    assert_int_equal(kvr_wire_encode_alloc(&m, &buf, &len, NULL), KVR_OK);
    assert_true(len <= KVR_WIRE_HEADER_BYTES + KVR_WIRE_MAX_PAYLOAD);
    assert_int_equal(kvr_wire_decode(buf, len, &d, NULL), KVR_OK);
    assert_int_equal(d.u.offer.num_prompt, KVR_WIRE_MAX_PROMPT);
    kvr_msg_free(&d);
    free(buf);
    free(ids);
}

/* The biggest legal REGIONS still fits the payload cap. */
static void test_regions_at_cap(void **state)
{
    (void)state;
    kvr_wire_region_t *r = calloc(KVR_WIRE_MAX_REGIONS, sizeof(*r));
    uint8_t *rkey = calloc(KVR_WIRE_RKEY_MAX, 1);
    for (uint32_t i = 0; i < KVR_WIRE_MAX_REGIONS; i++) {
        r[i].desc.role = KVR_ROLE_MLA;
        r[i].desc.layer = i;
        r[i].rkey = rkey;
        r[i].rkey_len = KVR_WIRE_RKEY_MAX;
    }
    kvr_msg_t m, d;
    kvr_msg_init(&m, KVR_MSG_REGIONS);
    m.u.regions.regions = r;
    m.u.regions.num_regions = KVR_WIRE_MAX_REGIONS;
    m.u.regions.address = rkey;
    m.u.regions.address_len = KVR_WIRE_ADDR_MAX;
    uint8_t *buf;
    size_t len;
    assert_int_equal(kvr_wire_encode_alloc(&m, &buf, &len, NULL), KVR_OK);
    assert_int_equal(kvr_wire_decode(buf, len, &d, NULL), KVR_OK);
    assert_int_equal(d.u.regions.regions[1023].desc.layer, 1023);
    kvr_msg_free(&d);
    free(buf);
    r[5].rkey_len = KVR_WIRE_RKEY_MAX + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "REGIONS.regions[5].rkey: count 4097 > cap 4096");
    r[5].rkey_len = 0;
    r[7].desc.role = (kvr_role_t)9;
    expect_encode(&m, KVR_ERR_INVALID,
                  "REGIONS.regions[7].desc.role: value 9 outside [1, 6]");
    m.u.regions.num_regions = KVR_WIRE_MAX_REGIONS + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "REGIONS.regions: count 1025 > cap 1024");
    m.u.regions.num_regions = 0;
    m.u.regions.address = rkey;
    m.u.regions.address_len = KVR_WIRE_ADDR_MAX + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "REGIONS.address: count 4097 > cap 4096");
    free(rkey);
    free(r);
}

/* One region of REGIONS, up to its rkey (then the rkey and memory u8). */
static void region_prefix(tb_t *t, uint8_t role)
{
    le(t, role, 1);
    le(t, 3, 4);        /* layer */
    le(t, 10, 8);       /* num_blocks */
    le(t, 64 * 576, 8); /* page_bytes */
    le(t, 0, 4);        /* index_dim */
    le(t, 0, 4);        /* quant_block */
    le(t, 0, 8);        /* bytes */
    le(t, 0x1000, 8);   /* base */
}

/* After the rkey: memory, then the 3.0 dense head geometry (heads,
 * head_dim, elem_bytes, kv_planes, hnd). */
static void region_suffix(tb_t *t)
{
    le(t, KVR_WIRE_MEM_HOST, 1);
    for (int i = 0; i < 4; i++)
        le(t, 0, 4);
    le(t, 0, 1);
}

static void test_regions_decode_caps(void **state)
{
    (void)state;
    tb_t *t = start(KVR_MSG_REGIONS);
    le(t, KVR_WIRE_MAX_REGIONS + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "REGIONS.regions: count 1025 > cap 1024");
    t = start(KVR_MSG_REGIONS);
    le(t, 2, 4);
    region_prefix(t, KVR_ROLE_MLA);
    le(t, 0, 4);
    region_suffix(t);
    region_prefix(t, KVR_ROLE_INDEX);
    le(t, KVR_WIRE_RKEY_MAX + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "REGIONS.regions[1].rkey: count 4097 > cap 4096");
    t = start(KVR_MSG_REGIONS);
    le(t, 1, 4);
    region_prefix(t, 0);
    expect_decode(t, KVR_ERR_PROTO,
                  "REGIONS.regions[0].desc.role: value 0 outside [1, 6]");
    t = start(KVR_MSG_REGIONS);
    le(t, 1, 4);
    region_prefix(t, KVR_ROLE_MLA);
    le(t, 0, 4);
    region_suffix(t);
    le(t, KVR_WIRE_ADDR_MAX + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "REGIONS.address: count 4097 > cap 4096");
    t = start(KVR_MSG_REGIONS); /* 1000 regions announced, 1 present */
    le(t, 1000, 4);
    region_prefix(t, KVR_ROLE_MLA);
    le(t, 0, 4);
    region_suffix(t);
    expect_decode(t, KVR_ERR_PROTO, "REGIONS.regions[1].desc.role: truncated");
    t = start(KVR_MSG_REGIONS);
    le(t, 1, 4);
    region_prefix(t, KVR_ROLE_MLA);
    le(t, 0, 4);
    le(t, 2, 1); /* neither host nor CUDA memory */
    expect_decode(t, KVR_ERR_PROTO,
                  "REGIONS.regions[0].memory: value 2 outside [0, 1]");
}

static void hello_prefix(tb_t *t, uint8_t side, uint8_t flag)
{
    le(t, KVR_WIRE_VERSION_MAJOR, 1);
    le(t, KVR_WIRE_VERSION_MINOR, 1);
    le(t, side, 1);
    le(t, flag, 1);                     /* has_key */
    for (int i = 0; i < 9 + 1 + 5; i++) /* topo, layout version, layout */
        le(t, 1, 4);
    le(t, flag, 1); /* replicate_index */
    le(t, 0, 1);    /* preshuffle */
}

static void test_hello_caps(void **state)
{
    (void)state;
    tb_t *t = start(KVR_MSG_HELLO);
    hello_prefix(t, KVR_WIRE_CONSUMER, 0);
    le(t, KVR_WIRE_MAX_CLASSES + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT, "HELLO.classes: count 33 > cap 32");
    t = start(KVR_MSG_HELLO_ACK);
    hello_prefix(t, 3, 0);
    expect_decode(t, KVR_ERR_PROTO, "HELLO_ACK.side: value 3 outside [1, 2]");
    t = start(KVR_MSG_HELLO);
    hello_prefix(t, KVR_WIRE_PRODUCER, 2);
    expect_decode(t, KVR_ERR_PROTO, "HELLO.has_key: value 2 outside [0, 1]");
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_HELLO, &m);
    m.u.hello.num_classes = KVR_WIRE_MAX_CLASSES + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT, "HELLO.classes: count 33 > cap 32");
    m.u.hello.num_classes = KVR_WIRE_MAX_CLASSES;
    for (uint32_t i = 0; i < KVR_WIRE_MAX_CLASSES; i++)
        m.u.hello.classes[i].role = KVR_ROLE_OTHER;
    memset(m.u.hello.settings, 's', KVR_WIRE_TEXT_MAX); /* the longest */
    size_t len = 0;
    assert_int_equal(kvr_wire_encoded_size(&m, &len, NULL), KVR_OK);
    assert_true(len <= KVR_WIRE_HELLO_FRAME_MAX);
    memset(m.u.hello.settings, 's', sizeof(m.u.hello.settings));
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "HELLO.settings: length 256 > cap 255");
}

/* The agent's messages: STAGES' count and sizes, the instance id's cap. */
static void test_agent_caps(void **state)
{
    (void)state;
    tb_t *t = start(KVR_MSG_STAGES);
    le(t, 2, 4);
    le(t, 1, 4);
    le(t, KVR_WIRE_MAX_STAGES + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "STAGES.stages: count 1025 > cap 1024");
    t = start(KVR_MSG_STAGES);
    le(t, 0, 4);
    expect_decode(t, KVR_ERR_PROTO, "STAGES.pp_size: value 0 outside");
    t = start(KVR_MSG_STAGES); /* one stage, its address truncated */
    le(t, 1, 4);
    le(t, 1, 4);
    le(t, 1, 4);
    le(t, 0, 4);
    le(t, 0, 4);
    le(t, 7, 8);
    le(t, 9, 2);
    expect_decode(t, KVR_ERR_PROTO, "STAGES.stages[0].address: truncated");
    t = start(KVR_MSG_JOIN);
    le(t, 300, 2);
    expect_decode(t, KVR_ERR_WIRE_LIMIT, "JOIN.address: length 300 > cap 255");
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_HELLO, &m);
    m.u.hello.instance.len = KVR_WIRE_INSTANCE_MAX + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT, "HELLO.instance: length 65 > cap 64");
    m.u.hello.instance.len = KVR_WIRE_INSTANCE_MAX;
    size_t len = 0;
    assert_int_equal(kvr_wire_encoded_size(&m, &len, NULL), KVR_OK);
    kvr_sample_msg(KVR_MSG_STAGES, &m);
    m.u.stages.num_stages = KVR_WIRE_MAX_STAGES + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "STAGES.stages: count 1025 > cap 1024");
    t = start(KVR_MSG_NOTIFY); /* no address, a payload over the cap */
    le(t, 0, 2);
    le(t, KVR_WIRE_NOTIFY_MAX + 1, 4);
    expect_decode(t, KVR_ERR_WIRE_LIMIT,
                  "NOTIFY.payload: count 16385 > cap 16384");
    static uint8_t big[KVR_WIRE_NOTIFY_MAX + 1];
    kvr_sample_msg(KVR_MSG_NOTIFY, &m);
    m.u.notify.payload = big;
    m.u.notify.len = KVR_WIRE_NOTIFY_MAX;
    assert_int_equal(kvr_wire_encoded_size(&m, &len, NULL), KVR_OK);
    m.u.notify.len = KVR_WIRE_NOTIFY_MAX + 1;
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "NOTIFY.payload: count 16385 > cap 16384");
}

/* WRITE_FAILED up to its status: head, pp rank, tp rank, nonce 1. */
static void failed_prefix(tb_t *t)
{
    head(t);
    le(t, 0, 4);
    le(t, 0, 4);
    le(t, 1, 8);
}

static void text_frame(uint16_t type, size_t n, uint8_t fill)
{
    tb_t *t = start(type);
    if (type == KVR_MSG_WRITE_FAILED)
        failed_prefix(t);
    le(t, KVR_ERR_TIMEOUT, 4);
    le(t, n, 2);
    memset(t->b + t->n, fill, n);
    t->n += n;
    if (n > KVR_WIRE_TEXT_MAX)
        expect_decode(t, KVR_ERR_WIRE_LIMIT, ".text: length 256 > cap 255");
    else if (fill == 0)
        expect_decode(t, KVR_ERR_PROTO, ".text: NUL byte");
    else
        expect_decode(t, KVR_OK, "");
}

static void test_text_caps(void **state)
{
    (void)state;
    text_frame(KVR_MSG_BYE, 255, 'x');
    text_frame(KVR_MSG_BYE, 256, 'x');
    text_frame(KVR_MSG_BYE, 3, 0);
    text_frame(KVR_MSG_WRITE_FAILED, 255, 'y');
    text_frame(KVR_MSG_WRITE_FAILED, 256, 'y');
    text_frame(KVR_MSG_WRITE_FAILED, 1, 0);
    kvr_msg_t m;
    kvr_sample_msg(KVR_MSG_WRITE_FAILED, &m);
    memset(m.u.write_failed.text, 'z', sizeof(m.u.write_failed.text));
    expect_encode(&m, KVR_ERR_WIRE_LIMIT,
                  "WRITE_FAILED.text: length 256 > cap 255");
    tb_t *t = start(KVR_MSG_WRITE_FAILED);
    failed_prefix(t);
    le(t, 0, 4);
    expect_decode(t, KVR_ERR_PROTO,
                  "WRITE_FAILED.status: value 0 outside [1, 2147483647]");
}

/* The encoder's bytes are exactly the documented layout. */
static void test_byte_layout(void **state)
{
    (void)state;
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_WRITE_DONE);
    kvr_wire_id_set(&m.u.write_done.request_id, "r1", 2, NULL);
    m.u.write_done.transfer_id = 5;
    m.u.write_done.pp_rank = 3;
    m.u.write_done.tp_rank = 1;
    m.u.write_done.write_nonce = 0x0102030405060708ull;
    m.u.write_done.bytes = 4096;
    m.u.write_done.chunks = 2;
    tb_t *t = start(KVR_MSG_WRITE_DONE);
    head(t);
    le(t, 3, 4);
    le(t, 1, 4);
    le(t, 0x0102030405060708ull, 8);
    le(t, 4096, 8);
    le(t, 2, 4);
    finish(t);
    uint8_t buf[128];
    size_t len = 0;
    assert_int_equal(kvr_wire_encode(&m, buf, sizeof(buf), &len, NULL), KVR_OK);
    assert_int_equal(len, t->n);
    assert_memory_equal(buf, t->b, len);
    assert_memory_equal(buf, "KVRW\x03\x01\x14\x00", 8);
    free(t);
}

/* 3.1's streaming messages: LAYERS_DONE's bytes, and STREAM_REQUEST is
 * WRITE_REQUEST's payload with the layer range after it (so a 3.0 reader,
 * which refuses trailing bytes, is never sent one: docs/PROTOCOL.md). */
static void test_stream_layout(void **state)
{
    (void)state;
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_LAYERS_DONE);
    kvr_msg_layers_done_t *g = &m.u.layers_done;
    kvr_wire_id_set(&g->request_id, "r1", 2, NULL);
    g->transfer_id = 5;
    g->pp_rank = 2;
    g->write_nonce = 9;
    g->layer_begin = 4;
    g->layer_end = 6;
    g->bytes = 1 << 20;
    g->chunks = 1;
    tb_t *t = start(KVR_MSG_LAYERS_DONE);
    head(t);
    le(t, 2, 4);
    le(t, 0, 4);
    le(t, 9, 8);
    le(t, 4, 4);
    le(t, 6, 4);
    le(t, 1 << 20, 8);
    le(t, 1, 4);
    finish(t);
    uint8_t buf[256], wbuf[256];
    size_t len = 0, wlen = 0;
    assert_int_equal(kvr_wire_encode(&m, buf, sizeof(buf), &len, NULL), KVR_OK);
    assert_int_equal(len, t->n);
    assert_memory_equal(buf, t->b, len);
    assert_memory_equal(buf, "KVRW\x03\x01\x1c\x00", 8);
    free(t);
    t = start(KVR_MSG_LAYERS_DONE);
    head(t);
    le(t, 2, 4);
    le(t, 0, 4);
    le(t, 9, 8);
    le(t, 0, 4);
    le(t, 0, 4);
    expect_decode(t, KVR_ERR_PROTO, "LAYERS_DONE.layer_end: value 0");

    kvr_sample_msg(KVR_MSG_WRITE_REQUEST, &m);
    assert_int_equal(kvr_wire_encode(&m, wbuf, sizeof(wbuf), &wlen, NULL),
                     KVR_OK);
    m.type = KVR_MSG_STREAM_REQUEST;
    m.u.write_request.layer_begin = 7;
    m.u.write_request.layer_end = 0x01020304;
    assert_int_equal(kvr_wire_encode(&m, buf, sizeof(buf), &len, NULL), KVR_OK);
    assert_int_equal(len, wlen + 8);
    assert_int_equal(buf[6], KVR_MSG_STREAM_REQUEST);
    assert_memory_equal(buf + 8 + 4, wbuf + 8 + 4, wlen - 12); /* payload */
    assert_memory_equal(buf + wlen, "\x07\x00\x00\x00\x04\x03\x02\x01", 8);
    m.u.write_request.layer_end = 0;
    expect_encode(&m, KVR_ERR_INVALID, "STREAM_REQUEST.layer_end: value 0");
    /* the same payload under WRITE_REQUEST has 8 bytes too many */
    buf[6] = KVR_MSG_WRITE_REQUEST;
    kvr_msg_t d;
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_decode(buf, len, &d, &err), KVR_ERR_PROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_id_cap),
        cmocka_unit_test(test_stream_layout),
        cmocka_unit_test(test_offer_caps),
        cmocka_unit_test(test_assign_caps),
        cmocka_unit_test(test_write_request_caps),
        cmocka_unit_test(test_at_caps),
        cmocka_unit_test(test_regions_at_cap),
        cmocka_unit_test(test_regions_decode_caps),
        cmocka_unit_test(test_hello_caps),
        cmocka_unit_test(test_agent_caps),
        cmocka_unit_test(test_text_caps),
        cmocka_unit_test(test_byte_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
