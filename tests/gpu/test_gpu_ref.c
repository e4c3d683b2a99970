/* The relayout description and host reference executors against the
 * planner: same bytes per rank, same destination images as
 * kvr_plan_apply_host and as a per-token construction, staging stream equal
 * to the plan's runs in order, chunked pack/unpack, and every check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/plan.h"
#include "relayout_case.h"

static kvr_region_pair_t pair_of(const relayout_case_t *c)
{
    return (kvr_region_pair_t){c->src, c->dst};
}

static kvr_request_t request_of(const relayout_case_t *c)
{
    const kvr_gpu_request_t *r = &c->req;
    return (kvr_request_t){r->src_blocks, r->num_src_blocks,
                           r->dst_blocks, r->num_dst_blocks,
                           r->num_tokens, r->num_computed_blocks};
}

/* The plan's runs, concatenated in plan order. */
static unsigned char *plan_stream(const kvr_plan_t *plan,
                                  const unsigned char *src)
{
    size_t n = 0;
    const kvr_run_t *runs = kvr_plan_runs(plan, &n);
    unsigned char *out = xmalloc(kvr_plan_bytes(plan));
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + at, src + runs[i].src, runs[i].len);
        at += runs[i].len;
    }
    return out;
}

/* Packs in random chunks (each must equal its slice of the whole stream),
 * unpacks them in reverse order, and compares with the expected image. */
static void check_chunks(const relayout_case_t *c, const kvr_gpu_relayout_t *rl,
                         uint32_t rank, const unsigned char *stream,
                         const unsigned char *expect, uint64_t *rng)
{
    uint64_t total = kvr_gpu_relayout_bytes(rl, rank);
    uint64_t chunk = 1 + rng_below(rng, (uint32_t)(total / 3 + 1));
    unsigned char *buf = xmalloc(chunk), *img = xmalloc(c->dst_bytes);
    case_poison(img, c->dst_bytes, rank);
    for (uint64_t end = total; end > 0;) {
        uint64_t off = end > chunk ? end - chunk : 0;
        CHECK_KVR(
            kvr_gpu_ref_pack(rl, rank, c->src_img, off, end - off, buf, &err));
        assert_memory_equal(buf, stream + off, end - off);
        CHECK_KVR(kvr_gpu_ref_unpack(rl, rank, buf, off, end - off, img, &err));
        end = off;
    }
    assert_memory_equal(img, expect, c->dst_bytes);
    free(buf);
    free(img);
}

static void check_rank(const relayout_case_t *c, const kvr_gpu_relayout_t *rl,
                       uint32_t rank, uint64_t *rng)
{
    kvr_region_pair_t pair = pair_of(c);
    kvr_request_t req = request_of(c);
    kvr_plan_t *plan = NULL;
    CHECK_KVR(kvr_plan_create(&c->lay, rank, &pair, &req, &plan, &err));
    assert_int_equal(kvr_gpu_relayout_bytes(rl, rank), kvr_plan_bytes(plan));
    unsigned char *expect = xmalloc(c->dst_bytes), *img = xmalloc(c->dst_bytes);
    case_poison(expect, c->dst_bytes, rank);
    case_expect(c, rank, expect);
    case_poison(img, c->dst_bytes, rank);
    kvr_plan_apply_host(plan, c->src_img, img);
    assert_memory_equal(img, expect, c->dst_bytes);
    case_poison(img, c->dst_bytes, rank);
    CHECK_KVR(kvr_gpu_ref_scatter(rl, rank, c->src_img, img, &err));
    assert_memory_equal(img, expect, c->dst_bytes);
    uint64_t total = kvr_plan_bytes(plan);
    unsigned char *stream = plan_stream(plan, c->src_img);
    unsigned char *packed = xmalloc(total);
    CHECK_KVR(kvr_gpu_ref_pack(rl, rank, c->src_img, 0, total, packed, &err));
    assert_memory_equal(packed, stream, total);
    if (total > 0)
        check_chunks(c, rl, rank, stream, expect, rng);
    free(packed);
    free(stream);
    free(img);
    free(expect);
    kvr_plan_destroy(plan);
}

static void test_random_cases_match_planner(void **state)
{
    (void)state;
    uint64_t rng = 0x6b7672656c6179ull;
    for (int i = 0; i < 600; i++) {
        case_shape_t shape = case_random_shape(&rng);
        relayout_case_t c;
        case_make(&c, &shape, &rng);
        kvr_gpu_relayout_t *rl = NULL;
        char name[160];
        kvr_error_t err = {0};
        kvr_status_t st = kvr_gpu_relayout_create(&c.lay, &c.src, &c.dst,
                                                  &c.req, &rl, &err);
        if (st != KVR_OK)
            fail_msg("%s: %s", case_name(&shape, name, sizeof(name)), err.msg);
        for (uint32_t r = 0; r < shape.W; r++)
            check_rank(&c, rl, r, &rng);
        kvr_gpu_relayout_destroy(rl);
        case_free(&c);
    }
}

/* Consumer regions far larger than the request (more than 8 blocks a
 * table entry plus 4096): the destination order then comes from the radix
 * sort, not from a slot per id (relayout.c), and must be the same. */
static void test_large_consumer_regions(void **state)
{
    (void)state;
    uint64_t rng = 0x6c61726765ull;
    for (int i = 0; i < 20;) {
        case_shape_t shape = case_random_shape(&rng);
        if (shape.role != KVR_ROLE_MLA || shape.bs * shape.unit > 1600)
            continue;
        relayout_case_t c;
        case_make(&c, &shape, &rng);
        uint64_t big = 8 * c.req.num_dst_blocks + 4097 + rng_below(&rng, 999);
        uint32_t *ids = xmalloc(big * sizeof(*ids));
        for (uint64_t k = 0; k < big; k++)
            ids[k] = (uint32_t)k;
        for (uint64_t k = big; k > 1; k--) {
            uint32_t j = rng_below(&rng, (uint32_t)k), t = ids[k - 1];
            ids[k - 1] = ids[j];
            ids[j] = t;
        }
        free(c.dst_blocks);
        c.dst_blocks = ids;
        c.req.dst_blocks = ids;
        c.dst.num_blocks = big;
        c.dst_bytes = big * c.dst.page_bytes;
        kvr_gpu_relayout_t *rl = NULL;
        CHECK_KVR(kvr_gpu_relayout_create(&c.lay, &c.src, &c.dst, &c.req, &rl,
                                          &err));
        for (uint32_t r = 0; r < shape.W; r++)
            check_rank(&c, rl, r, &rng);
        kvr_gpu_relayout_destroy(rl);
        case_free(&c);
        i++;
    }
}

/* A small valid MLA case to break one field at a time. */
typedef struct {
    kvr_layout_t lay;
    kvr_region_desc_t src, dst;
    uint32_t src_blocks[8], dst_blocks[4];
    kvr_gpu_request_t req;
} base_t;

static base_t base_case(void)
{
    base_t b = {.lay = KVR_LAYOUT_INIT,
                .src_blocks = {7, 1, 6, 2, 5, 3, 4, 0},
                .dst_blocks = {3, 0, 2, 1}};
    b.lay.block_size = 16;
    b.lay.dcp_size = 2;
    b.lay.interleave = 4;
    b.lay.tp = 2;
    b.lay.producer_tp = 2;
    b.src = (kvr_region_desc_t){
        .role = KVR_ROLE_MLA, .num_blocks = 8, .page_bytes = 16 * 64};
    b.dst = b.src;
    b.dst.num_blocks = 4;
    b.req = (kvr_gpu_request_t){b.src_blocks, 8, b.dst_blocks, 4, 100, 0};
    return b;
}

static void expect_error(base_t *b, kvr_status_t code, const char *needle)
{
    kvr_error_t err = {0};
    kvr_gpu_relayout_t *rl = NULL;
    b->req.src_blocks = b->src_blocks;
    b->req.dst_blocks = b->dst_blocks;
    kvr_status_t st = kvr_gpu_relayout_create(&b->lay, &b->src, &b->dst,
                                              &b->req, &rl, &err);
    if (st != code || strstr(err.msg, needle) == NULL)
        fail_msg("expected %s with \"%s\", got %s: %s", kvr_status_name(code),
                 needle, kvr_status_name(st), err.msg);
    assert_null(rl);
}

static void test_checks(void **state)
{
    (void)state;
    base_t b = base_case();
    b.lay.interleave = 3;
    expect_error(&b, KVR_ERR_INTERLEAVE_NOT_DIVISOR, "interleave 3");
    b = base_case();
    b.dst.role = KVR_ROLE_INDEX;
    expect_error(&b, KVR_ERR_ROLE_MISMATCH, "consumer region layer 0 is index");
    b = base_case();
    b.src.role = b.dst.role = KVR_ROLE_DENSE;
    expect_error(&b, KVR_ERR_NOT_IMPLEMENTED, "W=2");
    b = base_case();
    b.src.role = b.dst.role = KVR_ROLE_STATE;
    expect_error(&b, KVR_ERR_NO_RELAYOUT, "under W=2");
    b = base_case();
    b.src.role = b.dst.role = KVR_ROLE_STAGING;
    expect_error(&b, KVR_ERR_NO_RELAYOUT, "not KV");
    b = base_case();
    b.req.num_src_blocks = 6;
    expect_error(&b, KVR_ERR_SRC_TABLE_SHORT, "need 7 source blocks");
    b = base_case();
    b.req.num_dst_blocks = 3;
    expect_error(&b, KVR_ERR_DST_TABLE_SHORT, "need 4 destination blocks");
    b = base_case();
    b.req.num_computed_blocks = 4;
    expect_error(&b, KVR_ERR_INCREMENTAL, "num_computed_blocks 4");
    b = base_case();
    b.src_blocks[3] = 8;
    expect_error(&b, KVR_ERR_BLOCK_RANGE, "source block id 8 at table index 3");
    b = base_case();
    b.dst_blocks[2] = 3;
    expect_error(&b, KVR_ERR_DUPLICATE_BLOCK, "block id 3 appears twice");
    b = base_case();
    b.dst.bytes = 3 * b.dst.page_bytes + 10;
    expect_error(&b, KVR_ERR_RUN_OUT_OF_BOUNDS, "page of block 3");
    b = base_case();
    b.dst.page_bytes = 16 * 32;
    expect_error(&b, KVR_ERR_PAGE_GEOMETRY, "consumer page bytes 512");
    b = base_case();
    b.src.page_bytes = b.dst.page_bytes = 1000;
    expect_error(&b, KVR_ERR_PAGE_NOT_TOKENS, "page bytes 1000");
}

static void test_index_checks(void **state)
{
    (void)state;
    base_t b = base_case();
    b.src = (kvr_region_desc_t){.role = KVR_ROLE_INDEX,
                                .num_blocks = 8,
                                .index_dim = 128,
                                .page_bytes = 16 * 144};
    b.dst = b.src;
    b.dst.num_blocks = 4;
    expect_error(&b, KVR_ERR_SHARDED_INDEX_INTERLEAVE, "needs I == bs");
    b.lay.replicate_index = true;
    expect_error(&b, KVR_ERR_PAGE_GEOMETRY, "consumer index region");
    b.dst.page_bytes = 32 * 144;
    b.dst.index_dim = 64;
    expect_error(&b, KVR_ERR_PAGE_GEOMETRY, "consumer D=64");
    b.dst.index_dim = 128;
    b.src.quant_block = 64;
    expect_error(&b, KVR_ERR_INDEX_QUANT, "D/Q must be 1");
}

static void test_limits_and_ranges(void **state)
{
    (void)state;
    static uint32_t ids[32769];
    for (uint32_t i = 0; i < 32769; i++)
        ids[i] = i;
    base_t b = base_case();
    b.lay.block_size = b.lay.interleave = 65536;
    b.lay.dcp_size = b.lay.tp = b.lay.producer_tp = 1;
    b.src.num_blocks = b.dst.num_blocks = 32769;
    b.src.page_bytes = b.dst.page_bytes = 65536;
    kvr_gpu_request_t req = {ids, 32769, ids, 32769, 1ull << 31, 0};
    kvr_error_t err = {0};
    kvr_gpu_relayout_t *rl = NULL;
    assert_int_equal(
        kvr_gpu_relayout_create(&b.lay, &b.src, &b.dst, &req, &rl, &err),
        KVR_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "2147483648 tokens"));

    b = base_case();
    b.req.src_blocks = b.src_blocks; /* base_case's copies are gone */
    b.req.dst_blocks = b.dst_blocks;
    assert_int_equal(
        kvr_gpu_relayout_create(&b.lay, &b.src, &b.dst, &b.req, &rl, &err),
        KVR_OK);
    assert_int_equal(kvr_gpu_relayout_bytes(rl, 0) +
                         kvr_gpu_relayout_bytes(rl, 1),
                     100 * 64);
    assert_int_equal(kvr_gpu_relayout_bytes(rl, 2), 0);
    unsigned char buf[64];
    assert_int_equal(kvr_gpu_ref_pack(rl, 2, buf, 0, 1, buf, &err),
                     KVR_ERR_RANK_RANGE);
    assert_int_equal(kvr_gpu_ref_pack(rl, 0, buf, 52 * 64 - 10, 11, buf, &err),
                     KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "outside rank 0's 3328 bytes"));
    assert_int_equal(kvr_gpu_ref_unpack(rl, 0, NULL, 0, 1, buf, &err),
                     KVR_ERR_INVALID);
    kvr_gpu_relayout_destroy(rl);
    kvr_gpu_relayout_destroy(NULL);
}

/* Run tables: random runs (long ones cut into pieces), a scatter equals
 * copying each run; packing in random chunks gives the runs' bytes in
 * order, and unpacking them in other chunks lands them as the scatter
 * did; bad ranges and buffers are refused. */
static void test_run_copies(void **state)
{
    (void)state;
    enum { SRC = 1 << 16, NRUNS = 40 };
    static unsigned char src[SRC], want[SRC], got[SRC], pack[SRC];
    kvr_gpu_run_t runs[NRUNS];
    uint64_t total = 0, at = 0;
    srand(7);
    for (size_t i = 0; i < SRC; i++)
        src[i] = (unsigned char)rand();
    memset(want, 0xee, sizeof(want));
    for (int i = 0; i < NRUNS; i++) { /* disjoint destinations */
        uint64_t len = 1 + (uint64_t)rand() % (i == 3 ? 40000 : 700);
        if (at + len > SRC)
            len = SRC - at;
        uint64_t so = (uint64_t)rand() % (SRC - len + 1);
        runs[i] = (kvr_gpu_run_t){(uint64_t)(uintptr_t)(src + so),
                                  (uint64_t)(uintptr_t)(got + at), len};
        memcpy(want + at, src + so, len);
        at += len;
        total += len;
    }
    kvr_gpu_runs_t *rt = NULL;
    kvr_error_t err = {0};
    assert_int_equal(kvr_gpu_runs_create(runs, NRUNS, &rt, &err), KVR_OK);
    assert_int_equal(kvr_gpu_runs_bytes(rt), total);
    memset(got, 0xee, sizeof(got));
    assert_int_equal(kvr_gpu_runs_copy_ref(rt, 0, total, NULL, NULL, &err),
                     KVR_OK);
    assert_memory_equal(got, want, SRC);
    for (uint64_t pos = 0, len; pos < total; pos += len) {
        len = 1 + (uint64_t)rand() % 5000;
        len = len < total - pos ? len : total - pos;
        assert_int_equal(
            kvr_gpu_runs_copy_ref(rt, pos, len, NULL, pack + pos, &err),
            KVR_OK);
    }
    assert_memory_equal(pack, want, total); /* got's order is the stream */
    memset(got, 0xee, sizeof(got));
    for (uint64_t pos = 0, len; pos < total; pos += len) {
        len = 1 + (uint64_t)rand() % 20000;
        len = len < total - pos ? len : total - pos;
        assert_int_equal(
            kvr_gpu_runs_copy_ref(rt, pos, len, pack + pos, NULL, &err),
            KVR_OK);
    }
    assert_memory_equal(got, want, SRC);
    assert_int_equal(kvr_gpu_runs_copy_ref(rt, total - 1, 2, NULL, pack, &err),
                     KVR_ERR_RUN_OUT_OF_BOUNDS);
    assert_int_equal(kvr_gpu_runs_copy_ref(rt, 0, 1, pack, pack, &err),
                     KVR_ERR_INVALID);
    kvr_gpu_runs_destroy(rt);
    kvr_gpu_run_t nodst = {(uint64_t)(uintptr_t)src, 0, 10};
    assert_int_equal(kvr_gpu_runs_create(&nodst, 1, &rt, &err), KVR_OK);
    assert_int_equal(kvr_gpu_runs_copy_ref(rt, 0, 10, NULL, NULL, &err),
                     KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no destination address"));
    assert_int_equal(kvr_gpu_runs_copy_ref(rt, 2, 8, NULL, pack, &err),
                     KVR_OK);
    assert_memory_equal(pack, src + 2, 8);
    kvr_gpu_runs_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_cases_match_planner),
        cmocka_unit_test(test_large_consumer_regions),
        cmocka_unit_test(test_checks),
        cmocka_unit_test(test_index_checks),
        cmocka_unit_test(test_limits_and_ranges),
        cmocka_unit_test(test_run_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
