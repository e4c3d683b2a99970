/* The agent's plan cache (src/conn/plan_cache.h): the same key returns the
 * same plan; regions of one class share it whatever their layer; any part
 * of the key that differs (tables, counts, consumer rank, geometry) gets a
 * pair plan of its own, equal to what the planner makes fresh; released
 * plans are kept up to the limit and then dropped; a refused request
 * leaves nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "plan_cache.h"

#define BS 16u
#define W 4u
#define TOKEN_BYTES 64u
#define POOL 32u
#define TOKENS 200u

static kvr_layout_t layout(void)
{
    kvr_layout_t l = KVR_LAYOUT_INIT;
    l.block_size = BS;
    l.dcp_size = W;
    l.tp = W;
    return l;
}

static kvr_region_pair_t mla(uint32_t layer, uint64_t dst_blocks)
{
    kvr_region_desc_t s = {.role = KVR_ROLE_MLA,
                           .layer = layer,
                           .num_blocks = POOL * W,
                           .page_bytes = BS * TOKEN_BYTES};
    kvr_region_desc_t d = s;
    d.num_blocks = dst_blocks;
    return (kvr_region_pair_t){s, d};
}

typedef struct {
    uint32_t src[POOL * W], dst[POOL];
    kvr_request_t req;
} req_t;

static void make_req(req_t *r, uint32_t shift)
{
    for (uint32_t i = 0; i < POOL * W; i++)
        r->src[i] = (i * 7u + 3u) % (POOL * W);
    for (uint32_t i = 0; i < POOL; i++)
        r->dst[i] = (i + shift) % POOL;
    r->req = (kvr_request_t){r->src, (TOKENS + BS - 1) / BS, r->dst,
                             (TOKENS + BS * W - 1) / (BS * W), TOKENS, 0};
}

static const kvr_plan_t *plan1(kvr__pcache_t *c, uint32_t rank,
                               const kvr_region_pair_t *pair,
                               const kvr_request_t *req, kvr__pentry_t **ref)
{
    const kvr_plan_t *p = NULL;
    uint64_t bytes = 0;
    kvr_error_t err = {0};
    assert_int_equal(kvr__pcache_plan(c, 0, rank, pair, 1, req, &p, &bytes,
                                      ref, &err),
                     KVR_OK);
    assert_int_equal(bytes, kvr_plan_bytes(p));
    return p;
}

/* The cached plan's runs equal a fresh plan's. */
static void assert_same_runs(const kvr_plan_t *cached, uint32_t rank,
                             const kvr_region_pair_t *pair,
                             const kvr_request_t *req)
{
    kvr_layout_t l = layout();
    kvr_plan_t *fresh = NULL;
    assert_int_equal(
        kvr_plan_create_pair(&l, 0, rank, pair, req, &fresh, NULL), KVR_OK);
    size_t n1, n2;
    const kvr_run_t *a = kvr_plan_runs(cached, &n1),
                    *b = kvr_plan_runs(fresh, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(*a));
    kvr_plan_destroy(fresh);
}

static void same_key_same_plan(void **state)
{
    (void)state;
    kvr_layout_t l = layout();
    kvr__pcache_t *c = kvr__pcache_create(&l, 4);
    req_t r;
    make_req(&r, 0);
    kvr_region_pair_t pairs[3] = {mla(0, POOL), mla(1, POOL), mla(2, POOL)};
    const kvr_plan_t *plans[3];
    uint64_t bytes = 0;
    kvr__pentry_t *e1 = NULL, *e2 = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr__pcache_plan(c, 0, 1, pairs, 3, &r.req, plans,
                                      &bytes, &e1, &err),
                     KVR_OK);
    /* one class: every layer shares one plan, the bytes count each */
    assert_ptr_equal(plans[0], plans[1]);
    assert_ptr_equal(plans[0], plans[2]);
    assert_int_equal(bytes, 3 * kvr_plan_bytes(plans[0]));
    assert_true(kvr_plan_bytes(plans[0]) > 0);
    assert_same_runs(plans[0], 1, &pairs[0], &r.req);
    /* other layers of the same class and request: the same plan */
    kvr_region_pair_t later = mla(40, POOL);
    kvr__pentry_t *e3 = NULL;
    assert_ptr_equal(plan1(c, 1, &later, &r.req, &e2), plans[0]);
    /* an equal copy of the tables is the same key */
    req_t copy = r;
    copy.req.src_blocks = copy.src;
    copy.req.dst_blocks = copy.dst;
    assert_ptr_equal(plan1(c, 1, &pairs[1], &copy.req, &e3), plans[0]);
    kvr__pcache_stats_t s = kvr__pcache_stats(c);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.entries, 1);
    kvr__pcache_release(e1);
    kvr__pcache_release(e2);
    kvr__pcache_release(e3);
    assert_int_equal(kvr__pcache_stats(c).idle, 1);
    kvr__pcache_destroy(c);
}

/* Every part of the key that differs gets its own, correct, plan. */
static void key_parts(void **state)
{
    (void)state;
    kvr_layout_t l = layout();
    kvr__pcache_t *c = kvr__pcache_create(&l, 16);
    req_t base, other_dst, fewer;
    make_req(&base, 0);
    make_req(&other_dst, 5);
    make_req(&fewer, 0);
    fewer.req.num_tokens = TOKENS - 9;
    kvr_region_pair_t p = mla(0, POOL), bigger = mla(0, POOL + 1);
    kvr__pentry_t *e[6] = {0};
    const kvr_plan_t *a = plan1(c, 0, &p, &base.req, &e[0]);
    const kvr_plan_t *dst = plan1(c, 0, &p, &other_dst.req, &e[1]);
    const kvr_plan_t *tok = plan1(c, 0, &p, &fewer.req, &e[2]);
    const kvr_plan_t *rank = plan1(c, 2, &p, &base.req, &e[3]);
    const kvr_plan_t *geo = plan1(c, 0, &bigger, &base.req, &e[4]);
    const kvr_plan_t *again = plan1(c, 0, &p, &base.req, &e[5]);
    const kvr_plan_t *all[] = {a, dst, tok, rank, geo};
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            assert_ptr_not_equal(all[i], all[j]);
    assert_ptr_equal(again, a);
    assert_same_runs(dst, 0, &p, &other_dst.req);
    assert_same_runs(tok, 0, &p, &fewer.req);
    assert_same_runs(rank, 2, &p, &base.req);
    assert_true(kvr_plan_bytes(tok) < kvr_plan_bytes(a));
    kvr__pcache_stats_t s = kvr__pcache_stats(c);
    assert_int_equal(s.misses, 5);
    assert_int_equal(s.hits, 1);
    for (int i = 0; i < 6; i++)
        kvr__pcache_release(e[i]);
    kvr__pcache_destroy(c);
}

/* Released plans stay (and are found again) up to `keep`, least recently
 * used dropped first; a referenced plan is never dropped. */
static void eviction(void **state)
{
    (void)state;
    kvr_layout_t l = layout();
    kvr__pcache_t *c = kvr__pcache_create(&l, 2);
    req_t r[4];
    kvr_region_pair_t p = mla(0, POOL);
    kvr__pentry_t *e[4] = {0}, *held = NULL, *back = NULL;
    for (uint32_t i = 0; i < 4; i++)
        make_req(&r[i], i);
    const kvr_plan_t *first = plan1(c, 0, &p, &r[0].req, &held);
    for (uint32_t i = 1; i < 4; i++)
        plan1(c, 0, &p, &r[i].req, &e[i]);
    for (uint32_t i = 1; i < 4; i++)
        kvr__pcache_release(e[i]);
    kvr__pcache_stats_t s = kvr__pcache_stats(c);
    assert_int_equal(s.idle, 2); /* r[1] dropped */
    assert_int_equal(s.entries, 3);
    assert_ptr_equal(plan1(c, 0, &p, &r[0].req, &back), first);
    kvr__pcache_release(back);
    assert_int_equal(kvr__pcache_stats(c).idle, 2); /* still held once */
    plan1(c, 0, &p, &r[3].req, &back); /* a kept one: a hit */
    assert_int_equal(kvr__pcache_stats(c).hits, 2);
    kvr__pcache_release(back);
    plan1(c, 0, &p, &r[1].req, &back); /* dropped: planned again */
    s = kvr__pcache_stats(c);
    assert_int_equal(s.misses, 5);
    assert_same_runs(first, 0, &p, &r[0].req);
    kvr__pcache_release(back);
    kvr__pcache_release(held);
    assert_true(kvr__pcache_stats(c).idle <= 2);
    kvr__pcache_destroy(c);
}

/* The planner's refusal comes back, naming the layer of the class's first
 * region, and nothing is cached. */
static void refusal(void **state)
{
    (void)state;
    kvr_layout_t l = layout();
    kvr__pcache_t *c = kvr__pcache_create(&l, 4);
    req_t r;
    make_req(&r, 0);
    r.dst[0] = POOL + 100; /* outside the destination region */
    kvr_region_pair_t pairs[2] = {mla(7, POOL), mla(8, POOL)};
    const kvr_plan_t *plans[2];
    uint64_t bytes = 1;
    kvr__pentry_t *e = NULL;
    kvr_error_t err = {0};
    assert_int_not_equal(kvr__pcache_plan(c, 0, 0, pairs, 2, &r.req, plans,
                                          &bytes, &e, &err),
                         KVR_OK);
    assert_non_null(strstr(err.msg, "7"));
    assert_null(e);
    assert_int_equal(kvr__pcache_stats(c).entries, 0);
    kvr__pcache_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_key_same_plan),
        cmocka_unit_test(key_parts),
        cmocka_unit_test(eviction),
        cmocka_unit_test(refusal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
