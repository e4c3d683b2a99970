/* libFuzzer target over pair planner inputs (docs/design.md §18): any
 * producer and consumer DCP, TP sizes, MLA, index, head-sharded dense and
 * identity regions, a table per producer rank, offsets. The planner must
 * never crash; when it accepts every pair, the pair coverage proof must
 * hold and each consumer's sources must be exactly its non-empty pairs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_cursor.h"
#include "kvrelay/plan.h"

#define MAXR 8

static void build_layout(cursor_t *c, kvr_layout_t *lay)
{
    static const uint32_t bss[] = {1, 2, 3, 4, 8, 16, 32, 0};
    *lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    lay->block_size = bss[take(c, 8)];
    lay->dcp_size = take(c, 5);
    lay->interleave = 1 + take(c, 32);
    lay->tp = 1 + take(c, 8);
    lay->producer_tp = 1 + take(c, 8);
    lay->producer_dcp = take(c, 5);
    lay->producer_interleave = take(c, 33);
    lay->producer_block_size = bss[take(c, 8)];
    lay->replicate_index = take(c, 2);
    lay->producer_replicate_index = take(c, 2);
    lay->preshuffle = take(c, 2);
}

static void build_region(cursor_t *c, const kvr_layout_t *lay,
                         kvr_region_pair_t *pair)
{
    static const uint32_t dims[] = {16, 32, 8, 0};
    memset(pair, 0, sizeof(*pair));
    kvr_region_desc_t r = {.role = (kvr_role_t)(1 + take(c, 6))};
    r.index_dim = r.quant_block = dims[take(c, 4)];
    if (r.role == KVR_ROLE_DENSE && take(c, 4) != 0) {
        r.heads = 1 + take(c, 8);
        r.head_dim = 1 + take(c, 4);
        r.elem_bytes = 1 + take(c, 2);
        r.kv_planes = take(c, 3);
        r.hnd = take(c, 2);
    }
    uint64_t tb = 1 + take(c, 8);
    for (int side = 0; side < 2; side++) {
        kvr_region_desc_t *d = side ? &pair->dst : &pair->src;
        *d = r;
        d->num_blocks = take(c, 40);
        if (r.role == KVR_ROLE_INDEX)
            d->page_bytes = kvr_index_page_tokens(lay, side) *
                            kvr_index_stride(r.index_dim);
        else if (r.heads)
            d->page_bytes = kvr_dense_page_bytes(lay, d, side);
        else
            d->page_bytes = (side ? lay->block_size
                                  : kvr_producer_block_size(lay)) *
                            tb;
        d->page_bytes += take(c, 32) == 0;
    }
}

/* Plans every pair; 0 when one is refused (nothing more to check). */
static int plan_all(const kvr_layout_t *lay, const kvr_region_pair_t *pair,
                    const kvr_request_t *reqs, uint32_t np, uint32_t nc,
                    kvr_plan_t **plans)
{
    for (uint32_t p = 0; p < np; p++)
        for (uint32_t c = 0; c < nc; c++)
            if (kvr_plan_create_pair(lay, p, c, pair, &reqs[p],
                                     &plans[p * nc + c], NULL) != KVR_OK)
                return 0;
    return 1;
}

static void check_sources(const kvr_layout_t *lay,
                          const kvr_region_pair_t *pair,
                          const kvr_request_t *req, uint32_t np, uint32_t nc,
                          kvr_plan_t *const *plans)
{
    for (uint32_t c = 0; c < nc; c++) {
        uint32_t ranks[MAXR];
        size_t n = 0, k = 0;
        if (kvr_plan_sources(lay, pair, c, req, ranks, MAXR, &n, NULL) !=
            KVR_OK)
            abort();
        for (uint32_t p = 0; p < np; p++)
            if (kvr_plan_bytes(plans[p * nc + c]) > 0 &&
                (k >= n || ranks[k++] != p)) {
                fprintf(stderr, "consumer %u: source %u missing\n", c, p);
                abort();
            }
        if (k != n)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cursor_t c = {data, size};
    kvr_layout_t lay;
    kvr_region_pair_t pair;
    build_layout(&c, &lay);
    build_region(&c, &lay, &pair);
    kvr_axis_t axis = kvr_region_axis(&pair.src);
    if (kvr_layout_check(&lay, NULL) != KVR_OK)
        return 0;
    uint32_t np = kvr_axis_ranks(&lay, axis, false);
    uint32_t nc = kvr_axis_ranks(&lay, axis, true);
    if (np > MAXR || nc > MAXR)
        return 0;
    static uint32_t src[MAXR][64], dst[32];
    kvr_request_t reqs[MAXR];
    size_t ndst = take(&c, 33);
    uint64_t N = take(&c, 255) * (1 + take(&c, 4)), k = take(&c, 4);
    if (take(&c, 16) == 0) /* counts a hostile peer may send */
        N = UINT64_MAX - take(&c, 255);
    if (take(&c, 16) == 0)
        k = UINT64_MAX >> take(&c, 64);
    for (size_t i = 0; i < ndst; i++)
        dst[i] = take(&c, 40);
    for (uint32_t p = 0; p < np; p++) {
        size_t nsrc = take(&c, 65);
        for (size_t i = 0; i < nsrc; i++)
            src[p][i] = take(&c, 48);
        reqs[p] = (kvr_request_t){src[p], nsrc, dst, ndst, N, k};
    }
    kvr_plan_t *plans[MAXR * MAXR] = {0};
    if (plan_all(&lay, &pair, reqs, np, nc, plans)) {
        kvr_error_t err;
        kvr_status_t st = kvr_plan_check_coverage_pair(
            &lay, &pair, reqs, (const kvr_plan_t *const *)plans, &err);
        if (st != KVR_OK && st != KVR_ERR_INVALID) {
            fprintf(stderr, "coverage failed: %s\n", err.msg);
            abort();
        }
        check_sources(&lay, &pair, &reqs[0], np, nc, plans);
    }
    for (uint32_t i = 0; i < np * nc; i++)
        kvr_plan_destroy(plans[i]);
    return 0;
}
