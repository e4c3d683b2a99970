/* The demo's decode router (src/tools/router.c) in one process: a hostile
 * OFFER (2^64 - 1 tokens, 0 tokens) is refused to its producer and never
 * assigned; a good one is assigned to every rank in parts, its blocks come
 * back when every rank released it and its prefix is cached for the next
 * request; a rank silent past the timeout fails the request and later
 * offers until it answers; an expected OFFER that never came is refused
 * as lost; an OFFER that reuses another's prefix waits for it, within
 * the timeout; router messages survive encoding and truncated ones are
 * refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "router.h"

typedef struct {
    uint32_t assigns[4], rank_refuses[4], refuses, failed;
    rt_msg_t last_assign, last_refuse, last_rank_refuse;
} seen_t;

static void to_rank(void *ctx, uint32_t rank, const rt_msg_t *m)
{
    seen_t *s = ctx;
    assert_true(rank < 4);
    if (m->type == RT_REFUSE) {
        s->rank_refuses[rank]++;
        s->last_rank_refuse = *m;
        return;
    }
    assert_int_equal(m->type, RT_ASSIGN);
    s->assigns[rank]++;
    s->last_assign = *m;
}

static void to_producer(void *ctx, const char *producer, const char *address,
                        const rt_msg_t *m)
{
    seen_t *s = ctx;
    assert_string_equal(producer, "prefill-0");
    assert_string_equal(address, "127.0.0.1:9");
    if (m->type == RT_FAILED) {
        s->failed++;
        return;
    }
    assert_int_equal(m->type, RT_REFUSE);
    s->refuses++;
    s->last_refuse = *m;
}

static bool never(void *ctx, const char *request)
{
    (void)ctx;
    (void)request;
    return false;
}

static kvr_layout_t layout(void)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = 16;
    lay.dcp_size = 2;
    lay.tp = 2;
    return lay;
}

static rt_msg_t *offer(const char *id, uint64_t tokens)
{
    static rt_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = RT_OFFER;
    snprintf(m.request, sizeof(m.request), "%s", id);
    snprintf(m.producer, sizeof(m.producer), "prefill-0");
    snprintf(m.address, sizeof(m.address), "127.0.0.1:9");
    m.tokens = tokens;
    return &m;
}

static router_t *make(seen_t *s, uint32_t blocks, uint32_t timeout_ms)
{
    kvr_layout_t lay = layout();
    router_ops_t ops = {s, to_rank, to_producer, never};
    router_t *r = router_create(&lay, 2, blocks, timeout_ms, &ops);
    assert_non_null(r);
    router_join(r, 1);
    return r;
}

static void test_hostile_offers_refused(void **state)
{
    (void)state;
    seen_t s = {0};
    router_t *r = make(&s, 16, 60000);
    router_offer(r, offer("huge", UINT64_MAX));
    assert_int_equal(s.refuses, 1);
    assert_int_equal(s.last_refuse.status, KVR_ERR_NO_SPACE);
    router_offer(r, offer("empty", 0));
    assert_int_equal(s.refuses, 2);
    assert_int_equal(s.assigns[0] + s.assigns[1], 0);
    assert_int_equal(s.rank_refuses[0], 2); /* no rank waits for them */
    assert_int_equal(s.rank_refuses[1], 2);
    assert_int_equal(router_blocks_in_use(r), 0);
    assert_int_equal(router_done(r), 2);
    router_destroy(r);
}

static void release(router_t *r, const char *id, uint32_t rank, kvr_status_t st)
{
    rt_msg_t m = {.type = RT_RELEASED, .status = (uint32_t)st};
    snprintf(m.request, sizeof(m.request), "%s", id);
    router_released(r, rank, &m);
}

/* 100 tokens at V = 32 are 4 blocks; the 3 whole ones are hashed. */
static void test_assign_release_cache(void **state)
{
    (void)state;
    seen_t s = {0};
    router_t *r = make(&s, 16, 60000);
    rt_msg_t *o = offer("a", 100);
    o->num_hashes = 3;
    for (uint32_t i = 0; i < 3; i++)
        memset(o->hashes[i].bytes, (int)i + 1, KVR_BLOCK_HASH_BYTES);
    router_offer(r, o);
    assert_int_equal(s.assigns[0], 1);
    assert_int_equal(s.assigns[1], 1);
    assert_int_equal(s.last_assign.total, 4);
    assert_int_equal(s.last_assign.computed, 0);
    assert_int_equal(router_blocks_in_use(r), 4);
    release(r, "a", 0, KVR_OK);
    assert_int_equal(router_blocks_in_use(r), 4); /* rank 1 still holds them */
    release(r, "a", 1, KVR_OK);
    assert_int_equal(router_blocks_in_use(r), 0);
    /* the same prefix: 3 blocks come from the cache */
    rt_msg_t *b = offer("b", 100);
    b->num_hashes = 3;
    for (uint32_t i = 0; i < 3; i++)
        memset(b->hashes[i].bytes, (int)i + 1, KVR_BLOCK_HASH_BYTES);
    router_offer(r, b);
    assert_int_equal(s.last_assign.computed, 3);
    release(r, "b", 0, KVR_ERR_CANCELED);
    release(r, "b", 1, KVR_OK);
    assert_int_equal(router_blocks_in_use(r), 0);
    assert_int_equal(router_done(r), 2);
    router_destroy(r);
}

/* Rank 1 never answers: the request fails at the timeout and its
 * producer is told; until rank 1 answers again, every new OFFER is
 * refused at once to the producer and every rank (a load needs every
 * rank), then offers are placed again. */
static void test_silent_rank_times_out(void **state)
{
    (void)state;
    seen_t s = {0};
    router_t *r = make(&s, 16, 50);
    router_offer(r, offer("c", 40));
    release(r, "c", 0, KVR_OK);
    usleep(100000);
    router_tick(r);
    assert_int_equal(router_blocks_in_use(r), 0);
    assert_int_equal(router_done(r), 1);
    assert_int_equal(router_failed(r), 1);
    assert_int_equal(s.failed, 1); /* its stages stop holding it */
    router_offer(r, offer("d", 40));
    assert_int_equal(s.refuses, 1);
    assert_int_equal(s.last_refuse.status, KVR_ERR_PEER_DEAD);
    assert_int_equal(s.rank_refuses[0], 1);
    assert_int_equal(s.rank_refuses[1], 1);
    assert_non_null(strstr(s.last_rank_refuse.text, "rank(s) 1 silent"));
    assert_int_equal(router_done(r), 2);
    release(r, "c", 1, KVR_ERR_TIMEOUT); /* late, but it answers again */
    router_offer(r, offer("e", 40));
    assert_int_equal(s.assigns[1], 2);
    assert_int_equal(s.refuses, 1);
    router_destroy(r);
}

/* The group expects f and g from prefill-0 and h from prefill-1. f's
 * OFFER comes, g's is lost: once the timeout passed after f's, g is
 * refused (ERR_TIMEOUT) to the producer and every rank, and a late OFFER
 * of g is not assigned. h waits: prefill-1 was never heard from. */
static void test_lost_offer(void **state)
{
    (void)state;
    seen_t s = {0};
    router_t *r = make(&s, 16, 200);
    router_expect(r, "f", "prefill-0");
    router_expect(r, "g", "prefill-0");
    router_expect(r, "h", "prefill-1");
    router_offer(r, offer("f", 40));
    assert_int_equal(s.assigns[1], 1);
    router_tick(r);
    assert_int_equal(s.refuses, 0); /* not due yet */
    release(r, "f", 0, KVR_OK);
    release(r, "f", 1, KVR_OK);
    usleep(300000);
    router_tick(r);
    assert_int_equal(s.refuses, 1);
    assert_string_equal(s.last_refuse.request, "g");
    assert_int_equal(s.last_refuse.status, KVR_ERR_TIMEOUT);
    assert_int_equal(s.rank_refuses[0], 1);
    assert_int_equal(s.rank_refuses[1], 1);
    assert_int_equal(router_done(r), 2);
    assert_int_equal(router_failed(r), 1);
    router_tick(r); /* refused once */
    assert_int_equal(s.refuses, 1);
    router_offer(r, offer("g", 40));
    assert_int_equal(s.assigns[1], 1);
    assert_int_equal(router_done(r), 2);
    router_destroy(r);
}

static rt_msg_t *prefixed(const char *id)
{
    rt_msg_t *o = offer(id, 100);
    o->num_hashes = 3;
    for (uint32_t i = 0; i < 3; i++)
        memset(o->hashes[i].bytes, (int)i + 1, KVR_BLOCK_HASH_BYTES);
    return o;
}

/* z reuses a's prefix and its OFFER comes first (another producer's):
 * it waits until a was placed and released, then hits a's 3 cached
 * blocks. y reuses x's, which never comes: y is placed without once the
 * timeout passed after y's OFFER. */
static void test_reuse_waits_for_source(void **state)
{
    (void)state;
    seen_t s = {0};
    router_t *r = make(&s, 16, 200);
    router_expect(r, "a", "prefill-0");
    router_expect(r, "z", "prefill-1");
    router_reuses(r, "z", "a");
    router_offer(r, prefixed("z"));
    router_tick(r);
    assert_int_equal(s.assigns[0], 0);
    router_offer(r, prefixed("a"));
    assert_int_equal(s.assigns[0], 1);
    assert_string_equal(s.last_assign.request, "a");
    router_tick(r);
    assert_int_equal(s.assigns[0], 1); /* a's prefix is in flight */
    release(r, "a", 0, KVR_OK);
    release(r, "a", 1, KVR_OK);
    router_tick(r);
    assert_int_equal(s.assigns[0], 2);
    assert_string_equal(s.last_assign.request, "z");
    assert_int_equal(s.last_assign.computed, 3);
    release(r, "z", 0, KVR_OK);
    release(r, "z", 1, KVR_OK);
    router_expect(r, "x", "prefill-2"); /* never heard from: not lost */
    router_expect(r, "y", "prefill-0");
    router_reuses(r, "y", "x");
    router_offer(r, offer("y", 40));
    router_tick(r);
    assert_int_equal(s.assigns[0], 2);
    usleep(300000);
    router_tick(r);
    assert_int_equal(s.assigns[0], 3);
    assert_string_equal(s.last_assign.request, "y");
    assert_int_equal(s.refuses, 0);
    router_destroy(r);
}

static void test_encoding(void **state)
{
    (void)state;
    static rt_msg_t m, back;
    static uint8_t buf[KVR_AGENT_NOTIFY_MAX];
    memset(&m, 0, sizeof(m));
    m.type = RT_ASSIGN;
    snprintf(m.request, sizeof(m.request), "req-7");
    m.tokens = 1234;
    m.total = RT_IDS_MAX + 5;
    m.offset = RT_IDS_MAX;
    m.count = 5;
    for (uint32_t i = 0; i < 5; i++)
        m.ids[i] = 100 + i;
    size_t len = rt_encode(&m, buf);
    assert_true(len > 0);
    assert_true(rt_decode(buf, len, &back));
    assert_string_equal(back.request, "req-7");
    assert_int_equal(back.ids[4], 104);
    assert_int_equal(back.total, RT_IDS_MAX + 5);
    for (size_t cut = 0; cut < len; cut++)
        assert_false(rt_decode(buf, cut, &back));
    buf[0] = 99; /* an unknown type */
    assert_false(rt_decode(buf, len, &back));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_offers_refused),
        cmocka_unit_test(test_assign_release_cache),
        cmocka_unit_test(test_silent_rank_times_out),
        cmocka_unit_test(test_lost_offer),
        cmocka_unit_test(test_reuse_waits_for_source),
        cmocka_unit_test(test_encoding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
