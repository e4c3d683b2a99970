/* libFuzzer target over planner inputs: any layout, region geometry, block
 * tables and offsets, counts over the whole u64 range (a peer sends them).
 * The planner must never crash; every plan it accepts must fit its tables
 * (block counts that do not wrap), move bytes when it has tokens, and pass
 * the coverage proof (in bounds, every token exactly once). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_cursor.h"
#include "kvrelay/plan.h"

static void build_region(cursor_t *c, const kvr_layout_t *lay,
                         kvr_region_pair_t *pair)
{
    static const uint32_t dims[] = {16, 32, 128, 0, 24};
    kvr_role_t role = (kvr_role_t)(1 + take(c, 6));
    uint64_t tb = 1 + take(c, 40);
    uint32_t D = dims[take(c, 5)];
    uint64_t P = lay->block_size;
    for (int side = 0; side < 2; side++) {
        kvr_region_desc_t *r = side ? &pair->dst : &pair->src;
        r->role = take(c, 16) == 0 ? (kvr_role_t)(1 + take(c, 6)) : role;
        r->num_blocks = take_count(c, take(c, 40));
        r->index_dim = D;
        r->quant_block = take(c, 8) == 0 ? D / 2 : D;
        if (role == KVR_ROLE_INDEX)
            r->page_bytes = (side ? kvr_index_page_tokens(lay, true) : P) *
                            kvr_index_stride(D);
        else
            r->page_bytes = P * tb + (take(c, 16) == 0);
        r->bytes = take(c, 16) == 0 ? take(c, 255) * 64ull : 0;
    }
}

static void fail(const char *what, const kvr_request_t *req)
{
    fprintf(stderr, "accepted plan %s: %llu tokens, k=%llu, %zu src, %zu dst\n",
            what, (unsigned long long)req->num_tokens,
            (unsigned long long)req->num_computed_blocks, req->num_src_blocks,
            req->num_dst_blocks);
    abort();
}

/* An accepted request fits its tables and its plans move what it holds:
 * MLA exactly (N - k*V) tokens over the W ranks, any role some bytes. */
static void check_extent(const kvr_layout_t *lay, const kvr_region_pair_t *pair,
                         const kvr_request_t *req, kvr_plan_t *const *plans)
{
    uint64_t N = req->num_tokens, bs = lay->block_size, V = bs * lay->dcp_size;
    if (N / bs + (N % bs != 0) > req->num_src_blocks ||
        N / V + (N % V != 0) > req->num_dst_blocks)
        fail("outruns its tables", req);
    if (req->num_computed_blocks > N / V)
        fail("starts past its tokens", req);
    uint64_t todo = N - req->num_computed_blocks * V, bytes = 0;
    for (uint32_t r = 0; r < lay->dcp_size; r++)
        bytes += kvr_plan_bytes(plans[r]);
    if (todo > 0 && bytes == 0)
        fail("moves 0 bytes", req);
    if (pair->src.role == KVR_ROLE_MLA &&
        bytes != todo * kvr_region_token_bytes(lay, &pair->src))
        fail("moves the wrong MLA bytes", req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cursor_t c = {data, size};
    static const uint32_t bss[] = {1, 2, 4, 8, 16, 32, 64, 0};
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = bss[take(&c, 8)];
    lay.dcp_size = take(&c, 9);
    lay.interleave = take(&c, 65);
    lay.tp = lay.dcp_size * (1 + take(&c, 2)) + (take(&c, 16) == 0);
    lay.producer_tp = lay.tp;
    lay.replicate_index = take(&c, 2);
    lay.preshuffle = take(&c, 2);
    uint32_t rank = take(&c, 9);
    kvr_region_pair_t pair;
    memset(&pair, 0, sizeof(pair));
    build_region(&c, &lay, &pair);
    uint32_t src[64], dst[32];
    size_t nsrc = take(&c, 65), ndst = take(&c, 33);
    for (size_t i = 0; i < nsrc; i++)
        src[i] = take(&c, 48);
    for (size_t i = 0; i < ndst; i++)
        dst[i] = take(&c, 40);
    uint64_t N = take_count(&c, take(&c, 255) * (1 + take(&c, 8)));
    kvr_request_t req = {src, nsrc, dst, ndst, N, take_count(&c, take(&c, 5))};
    kvr_plan_t *plans[8] = {0};
    kvr_error_t err;
    kvr_status_t st = kvr_plan_create(&lay, rank, &pair, &req, &plans[0], &err);
    kvr_plan_destroy(plans[0]);
    plans[0] = NULL;
    if (st != KVR_OK || lay.dcp_size > 8)
        return 0;
    /* accepted for one rank means accepted for all, except that each
     * rank's own runs are bounds-checked against a registered length */
    for (uint32_t r = 0; r < lay.dcp_size; r++) {
        st = kvr_plan_create(&lay, r, &pair, &req, &plans[r], &err);
        if (st == KVR_ERR_RUN_OUT_OF_BOUNDS &&
            (pair.src.bytes || pair.dst.bytes))
            goto out;
        if (st != KVR_OK) {
            fprintf(stderr, "rank %u refused: %s\n", r, err.msg);
            abort();
        }
    }
    check_extent(&lay, &pair, &req, plans);
    /* the proof paints a map of the destination region: keep it small */
    if (kvr_region_bytes(&pair.src) > (1u << 24) ||
        kvr_region_bytes(&pair.dst) > (1u << 24))
        goto out;
    st = kvr_plan_check_coverage(&lay, &pair, &req,
                                 (const kvr_plan_t *const *)plans, &err);
    if (st != KVR_OK && st != KVR_ERR_INVALID) {
        fprintf(stderr, "coverage failed: %s\n", err.msg);
        abort();
    }
out:
    for (uint32_t r = 0; r < lay.dcp_size; r++)
        kvr_plan_destroy(plans[r]);
    return 0;
}
