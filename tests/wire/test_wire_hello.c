/* HELLO: digest and raw fields, and a comparison that names the first raw
 * field that differs with both values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/plan.h"
#include "kvrelay/wire.h"

typedef struct {
    kvr_layout_t lay;
    kvr_region_desc_t regions[4];
    size_t n;
    kvr_wire_topo_t topo;
} side_cfg_t;

/* PP4 x TP1 producer stage 1 -> TP4 x DCP4 consumer, replicated index. */
static side_cfg_t config(void)
{
    side_cfg_t c = {.lay = KVR_LAYOUT_INIT, .n = 4};
    c.lay.dcp_size = 4;
    c.lay.tp = 4;
    c.lay.replicate_index = true;
    c.regions[0] = (kvr_region_desc_t){.role = KVR_ROLE_MLA,
                                       .layer = 0,
                                       .num_blocks = 100,
                                       .page_bytes = 64 * 576};
    c.regions[1] = c.regions[0];
    c.regions[1].layer = 1; /* same class */
    c.regions[2] = (kvr_region_desc_t){.role = KVR_ROLE_INDEX,
                                       .layer = 0,
                                       .num_blocks = 100,
                                       .page_bytes = 64 * 144,
                                       .index_dim = 128};
    c.regions[3] = (kvr_region_desc_t){
        .role = KVR_ROLE_STAGING, .num_blocks = 8, .page_bytes = 1 << 20};
    c.topo = (kvr_wire_topo_t){.pp_rank = 1,
                               .pp_size = 4,
                               .tp_rank = 0,
                               .tp_size = 1,
                               .dp_size = 1,
                               .layer_start = 15,
                               .layer_end = 30,
                               .dcp_rank = 0};
    return c;
}

static kvr_msg_hello_t hello_of(const side_cfg_t *c, kvr_wire_side_t side)
{
    kvr_msg_hello_t h;
    kvr_error_t err = {0};
    if (kvr_wire_hello_init(&h, side, &c->topo, &c->lay, c->regions, c->n,
                            &err) != KVR_OK)
        fail_msg("hello_init: %s", err.msg);
    return h;
}

static void test_hello_init(void **state)
{
    (void)state;
    side_cfg_t c = config();
    kvr_msg_hello_t a = hello_of(&c, KVR_WIRE_PRODUCER);
    kvr_msg_hello_t b = hello_of(&c, KVR_WIRE_PRODUCER);
    uint64_t digest;
    assert_int_equal(kvr_layout_digest(&c.lay, c.regions, c.n, &digest, NULL),
                     KVR_OK);
    assert_int_equal(a.digest, digest);
    assert_int_equal(a.proto_major, KVR_WIRE_VERSION_MAJOR);
    assert_int_equal(a.layout_version, KVR_LAYOUT_VERSION);
    assert_int_equal(a.num_classes, 2); /* two MLA layers share a class */
    assert_int_equal(a.classes[0].role, KVR_ROLE_MLA);
    assert_int_equal(a.classes[0].width, 576);
    assert_int_equal(a.classes[1].role, KVR_ROLE_INDEX);
    assert_int_equal(a.classes[1].width, 128);
    assert_int_equal(a.classes[1].quant, 128);
    assert_int_equal(a.topo.layer_start, 15);
    assert_false(a.has_key);
    assert_memory_not_equal(a.nonce, b.nonce, KVR_WIRE_NONCE_BYTES);
    assert_int_not_equal(kvr_wire_random_nonce(), 0);

    c.lay.interleave = 3; /* the layout is checked */
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_hello_init(&a, KVR_WIRE_PRODUCER, &c.topo, &c.lay,
                                         c.regions, c.n, &err),
                     KVR_ERR_INTERLEAVE_NOT_DIVISOR);
}

/* A producer with a block size of its own and head-sharded dense regions
 * (docs/design.md §18): each side announces its own regions and both reach
 * one digest, which its announced classes reproduce. */
static void test_hello_any_to_any(void **state)
{
    (void)state;
    side_cfg_t p = config(), c = config();
    p.lay.dcp_size = c.lay.dcp_size = 1;
    p.lay.tp = c.lay.tp = 2;
    p.lay.producer_tp = c.lay.producer_tp = 4;
    p.lay.producer_block_size = c.lay.producer_block_size = 32;
    kvr_region_desc_t d = {.role = KVR_ROLE_DENSE,
                           .num_blocks = 10,
                           .heads = 8,
                           .head_dim = 128,
                           .elem_bytes = 2,
                           .hnd = true};
    p.regions[0] = c.regions[0] = d;
    p.regions[0].page_bytes = kvr_dense_page_bytes(&p.lay, &d, false);
    c.regions[0].page_bytes = kvr_dense_page_bytes(&c.lay, &d, true);
    p.regions[1].page_bytes = 32 * 576; /* MLA: 576 B a token on both */
    p.n = c.n = 2;
    kvr_msg_hello_t a = hello_of(&p, KVR_WIRE_PRODUCER);
    kvr_msg_hello_t b = hello_of(&c, KVR_WIRE_CONSUMER);
    assert_int_equal(a.digest, b.digest);
    assert_int_equal(a.num_classes, 2);
    assert_int_equal(a.classes[0].width, 576);
    assert_memory_equal(a.classes, b.classes, 2 * sizeof(a.classes[0]));
    c.regions[0].hnd = false; /* page order is part of the class */
    c.regions[0].page_bytes = kvr_dense_page_bytes(&c.lay, &c.regions[0], true);
    assert_int_not_equal(hello_of(&c, KVR_WIRE_CONSUMER).digest, a.digest);
}

static void test_too_many_classes(void **state)
{
    (void)state;
    side_cfg_t c = config();
    kvr_region_desc_t r[KVR_WIRE_MAX_CLASSES + 1];
    for (size_t i = 0; i < KVR_WIRE_MAX_CLASSES + 1; i++)
        r[i] = (kvr_region_desc_t){.role = KVR_ROLE_STATE,
                                   .num_blocks = 1,
                                   .page_bytes = 64 * (i + 1)};
    kvr_msg_hello_t h;
    kvr_error_t err = {0};
    assert_int_equal(kvr_wire_hello_init(&h, KVR_WIRE_PRODUCER, &c.topo, &c.lay,
                                         r, KVR_WIRE_MAX_CLASSES + 1, &err),
                     KVR_ERR_WIRE_LIMIT);
    assert_non_null(strstr(err.msg, "more than 32 region classes"));
    assert_int_equal(kvr_wire_hello_init(&h, KVR_WIRE_PRODUCER, &c.topo, &c.lay,
                                         r, KVR_WIRE_MAX_CLASSES, &err),
                     KVR_OK);
    kvr_msg_t m = {.type = KVR_MSG_HELLO};
    m.u.hello = h;
    size_t len = 0;
    assert_int_equal(kvr_wire_encoded_size(&m, &len, NULL), KVR_OK);
    assert_true(len <= KVR_WIRE_HELLO_FRAME_MAX);
}

static void want_check(const kvr_msg_hello_t *ours, const kvr_msg_hello_t *peer,
                       kvr_status_t code, const char *needle)
{
    kvr_error_t err = {0};
    kvr_status_t s = kvr_wire_hello_check(ours, peer, KVR_WIRE_PRODUCER, &err);
    if (s != code || strstr(err.msg, needle) == NULL)
        fail_msg("check: got %s \"%s\", want %s \"%s\"", kvr_status_name(s),
                 err.msg, kvr_status_name(code), needle);
}

/* Consumer's view of a producer whose configuration differs by `edit`. */
typedef void (*edit_fn)(side_cfg_t *c);

static void expect_mismatch(edit_fn edit, const char *needle)
{
    side_cfg_t here = config(), there = config();
    edit(&there);
    kvr_msg_hello_t ours = hello_of(&here, KVR_WIRE_CONSUMER);
    kvr_msg_hello_t peer = hello_of(&there, KVR_WIRE_PRODUCER);
    want_check(&ours, &peer, KVR_ERR_LAYOUT_MISMATCH, needle);
}

static void bs16(side_cfg_t *c)
{
    c->lay.block_size = 16;
    c->regions[0].page_bytes = c->regions[1].page_bytes = 16 * 576;
}
static void w2(side_cfg_t *c)
{
    c->lay.dcp_size = 2;
}
static void i4(side_cfg_t *c)
{
    c->lay.interleave = 4;
}
static void sharded(side_cfg_t *c)
{
    c->lay.replicate_index = false;
}
static void plain(side_cfg_t *c)
{
    c->lay.preshuffle = false;
}
static void bf16(side_cfg_t *c)
{
    c->regions[0].page_bytes = c->regions[1].page_bytes = 64 * 1152;
}
static void no_index(side_cfg_t *c)
{
    c->n = 2;
}
static void d64(side_cfg_t *c)
{
    c->regions[2].index_dim = 64;
    c->regions[2].page_bytes = 64 * 80;
}
static void tp8(side_cfg_t *c)
{
    c->lay.tp = 8;
}
static void ptp2(side_cfg_t *c)
{
    c->lay.producer_tp = 2;
}
static void i4_and_bs32(side_cfg_t *c)
{
    c->lay.interleave = 4;
    c->lay.block_size = 32;
}
static void other_layer(side_cfg_t *c)
{
    c->regions[1].layer = 7;
}

static void test_mismatch_names_field(void **state)
{
    (void)state;
    expect_mismatch(bs16,
                    "layout mismatch: block size 64 vs 16 (here vs peer)");
    expect_mismatch(w2, "DCP size W 4 vs 2");
    expect_mismatch(i4, "interleave 1 vs 4");
    expect_mismatch(sharded, "replicated vs sharded index");
    expect_mismatch(plain, "preshuffled vs plain index keys");
    expect_mismatch(bf16,
                    "region class mla token bytes 576 vs mla token bytes 1152");
    expect_mismatch(d64, "region class index D 128 Q 128 vs index D 64 Q 64");
    expect_mismatch(tp8, "consumer TP size 4 vs 8");
    expect_mismatch(ptp2, "producer TP size 1 vs 2");
    expect_mismatch(i4_and_bs32, "block size 64 vs 32"); /* the first one */

    side_cfg_t c = config();
    kvr_msg_hello_t ours = hello_of(&c, KVR_WIRE_CONSUMER);
    kvr_msg_hello_t peer = hello_of(&c, KVR_WIRE_PRODUCER);
    peer.layout_version = 9;
    want_check(&ours, &peer, KVR_ERR_LAYOUT_MISMATCH, "layout version 1 vs 9");
    peer = hello_of(&c, KVR_WIRE_PRODUCER);
    peer.digest ^= 1;
    want_check(&ours, &peer, KVR_ERR_LAYOUT_MISMATCH,
               "digest (raw fields agree)");
}

static void test_check_ok(void **state)
{
    (void)state;
    side_cfg_t here = config(), there = config();
    other_layer(&there); /* layers, counts and ranks are not layout */
    there.regions[0].num_blocks = 5;
    there.topo.pp_rank = 3;
    kvr_msg_hello_t ours = hello_of(&here, KVR_WIRE_CONSUMER);
    kvr_msg_hello_t peer = hello_of(&there, KVR_WIRE_PRODUCER);
    assert_int_equal(
        kvr_wire_hello_check(&ours, &peer, KVR_WIRE_PRODUCER, NULL), KVR_OK);
    assert_int_equal(
        kvr_wire_hello_check(&peer, &ours, KVR_WIRE_CONSUMER, NULL), KVR_OK);
}

static kvr_status_t check_of(const side_cfg_t *here, kvr_wire_side_t here_side,
                             const side_cfg_t *there,
                             kvr_wire_side_t there_side, kvr_error_t *err)
{
    kvr_msg_hello_t ours = hello_of(here, here_side);
    kvr_msg_hello_t peer = hello_of(there, there_side);
    return kvr_wire_hello_check(&ours, &peer, there_side, err);
}

/* A PP stage with no index layer holds no index class: valid, seen from
 * either side. A consumer that lacks a class the producer holds, or two
 * decode ranks that differ in their classes, are real mismatches. */
static void test_stage_without_a_class(void **state)
{
    (void)state;
    side_cfg_t full = config(), lean = config();
    no_index(&lean);
    kvr_error_t err = {0};
    const kvr_wire_side_t P = KVR_WIRE_PRODUCER, C = KVR_WIRE_CONSUMER;
    assert_int_equal(check_of(&full, C, &lean, P, &err), KVR_OK);
    assert_int_equal(check_of(&lean, P, &full, C, &err), KVR_OK);

    assert_int_equal(check_of(&lean, C, &full, P, &err),
                     KVR_ERR_LAYOUT_MISMATCH);
    assert_non_null(strstr(err.msg,
                           "the producer's (peer) region class index D "
                           "128 Q 128 has no twin on the consumer (here)"));
    assert_int_equal(check_of(&full, P, &lean, C, &err),
                     KVR_ERR_LAYOUT_MISMATCH);
    assert_non_null(
        strstr(err.msg, "the producer's (here) region class index"));

    assert_int_equal(check_of(&full, C, &lean, C, &err),
                     KVR_ERR_LAYOUT_MISMATCH);
    assert_non_null(
        strstr(err.msg, "region class 1: index D 128 Q 128 vs (none)"));
}

static void settings_check(const char *here, const char *there,
                           const char *needle)
{
    side_cfg_t c = config();
    kvr_msg_hello_t ours = hello_of(&c, KVR_WIRE_CONSUMER);
    kvr_msg_hello_t peer = hello_of(&c, KVR_WIRE_PRODUCER);
    strcpy(ours.settings, here);
    strcpy(peer.settings, there);
    if (needle == NULL)
        assert_int_equal(
            kvr_wire_hello_check(&ours, &peer, KVR_WIRE_PRODUCER, NULL),
            KVR_OK);
    else
        want_check(&ours, &peer, KVR_ERR_LAYOUT_MISMATCH, needle);
}

/* Application settings: equal pairs in any order pass; the first pair that
 * differs is named with both values; a layout mismatch is named first. */
static void test_settings(void **state)
{
    (void)state;
    settings_check("", "", NULL);
    settings_check("requests=4 tokens=3000", "tokens=3000  requests=4", NULL);
    settings_check("requests=4 tokens=3000", "requests=2 tokens=3000",
                   "settings differ: requests=4 vs requests=2 (here vs peer)");
    settings_check("requests=4 tokens=3000", "requests=4",
                   "settings differ: tokens=3000 vs (unset) (here vs peer)");
    settings_check("requests=4", "requests=4 seed=9",
                   "settings differ: (unset) vs seed=9 (here vs peer)");
    settings_check("reuse", "reuse=no", "settings differ: reuse vs reuse=no");

    side_cfg_t c = config(), d = config();
    i4(&d);
    kvr_msg_hello_t ours = hello_of(&c, KVR_WIRE_CONSUMER);
    kvr_msg_hello_t peer = hello_of(&d, KVR_WIRE_PRODUCER);
    strcpy(peer.settings, "requests=2");
    want_check(&ours, &peer, KVR_ERR_LAYOUT_MISMATCH, "interleave 1 vs 4");

    /* settings travel in the frame */
    kvr_msg_t m = {.type = KVR_MSG_HELLO}, out;
    m.u.hello = ours;
    strcpy(m.u.hello.settings, "requests=4 seed=1");
    uint8_t buf[KVR_WIRE_HELLO_FRAME_MAX];
    size_t len;
    assert_int_equal(kvr_wire_encode(&m, buf, sizeof(buf), &len, NULL), KVR_OK);
    assert_int_equal(kvr_wire_decode(buf, len, &out, NULL), KVR_OK);
    assert_string_equal(out.u.hello.settings, "requests=4 seed=1");
    kvr_msg_free(&out);
}

static void test_version_role_key_topo(void **state)
{
    (void)state;
    side_cfg_t c = config();
    kvr_msg_hello_t ours = hello_of(&c, KVR_WIRE_CONSUMER);
    kvr_msg_hello_t peer = hello_of(&c, KVR_WIRE_PRODUCER);
    peer.proto_major = 4;
    peer.proto_minor = 0;
    peer.layout.block_size = 1; /* version wins over layout */
    char want[64];
    snprintf(want, sizeof(want), "protocol version 3.%u vs 4.0",
             KVR_WIRE_VERSION_MINOR);
    want_check(&ours, &peer, KVR_ERR_VERSION, want);

    peer = hello_of(&c, KVR_WIRE_PRODUCER);
    kvr_error_t err = {0};
    assert_int_equal(
        kvr_wire_hello_check(&ours, &peer, KVR_WIRE_CONSUMER, &err),
        KVR_ERR_PEER_ROLE);
    assert_non_null(strstr(err.msg, "peer is a producer, expected a consumer"));

    peer.has_key = true;
    want_check(&ours, &peer, KVR_ERR_AUTH,
               "pre-shared key: not configured here, configured on the peer");

    peer = hello_of(&c, KVR_WIRE_PRODUCER);
    peer.topo.pp_rank = 4;
    want_check(&ours, &peer, KVR_ERR_PROTO, "peer pp rank 4 >= pp size 4");
    peer = hello_of(&c, KVR_WIRE_PRODUCER);
    peer.topo.dcp_rank = 4;
    want_check(&ours, &peer, KVR_ERR_PROTO, "peer dcp rank 4 >= dcp size 4");
    peer = hello_of(&c, KVR_WIRE_PRODUCER);
    peer.topo.layer_end = peer.topo.layer_start;
    want_check(&ours, &peer, KVR_ERR_PROTO,
               "peer layer range [15, 15) is empty");
}

/* A HELLO survives the wire, so the check works on decoded messages. */
static void test_hello_on_the_wire(void **state)
{
    (void)state;
    side_cfg_t c = config();
    kvr_msg_t m = {.type = KVR_MSG_HELLO_ACK}, d;
    m.u.hello = hello_of(&c, KVR_WIRE_CONSUMER);
    uint8_t buf[KVR_WIRE_HELLO_FRAME_MAX];
    size_t len;
    assert_int_equal(kvr_wire_encode(&m, buf, sizeof(buf), &len, NULL), KVR_OK);
    assert_int_equal(kvr_wire_decode(buf, len, &d, NULL), KVR_OK);
    assert_int_equal(d.type, KVR_MSG_HELLO_ACK);
    assert_int_equal(d.u.hello.digest, m.u.hello.digest);
    assert_int_equal(d.u.hello.num_classes, 2);
    assert_int_equal(d.u.hello.classes[1].width, 128);
    assert_int_equal(d.u.hello.layout.dcp_size, 4);
    assert_true(d.u.hello.layout.replicate_index);
    assert_int_equal(d.u.hello.topo.layer_end, 30);
    assert_memory_equal(d.u.hello.nonce, m.u.hello.nonce, KVR_WIRE_NONCE_BYTES);
    kvr_msg_hello_t ours = hello_of(&c, KVR_WIRE_PRODUCER);
    assert_int_equal(
        kvr_wire_hello_check(&ours, &d.u.hello, KVR_WIRE_CONSUMER, NULL),
        KVR_OK);
    kvr_msg_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_init),
        cmocka_unit_test(test_hello_any_to_any),
        cmocka_unit_test(test_too_many_classes),
        cmocka_unit_test(test_mismatch_names_field),
        cmocka_unit_test(test_check_ok),
        cmocka_unit_test(test_stage_without_a_class),
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_version_role_key_topo),
        cmocka_unit_test(test_hello_on_the_wire),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
