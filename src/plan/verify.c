/* Expected placement of every byte (docs/design.md §2-3), the byte verifier and
 * the coverage proof built on it. The expectation walks tokens with the
 * formulas of layout_math.h, never the plan's runs, so a planner bug cannot
 * confirm itself: the coverage proof compares two independent derivations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout_math.h"
#include "plan_internal.h"

typedef unsigned long long ull;

/* One index token: its key bytes in pieces that are contiguous on both
 * sides (16 bytes when preshuffled: one row of a 16 x 16-byte tile; all D
 * otherwise), then its scale. td is the token's row in the destination page:
 * g % V in a replicated page of V tokens, local % bs in a sharded one. */
static int expect_index_token(const kvr_layout_t *lay,
                              const kvr_region_pair_t *pair,
                              const kvr_request_t *req, uint64_t g, int repl,
                              kvr__expect_fn fn, void *ctx)
{
    uint64_t bs = lay->block_size, W = lay->dcp_size, V = bs * W;
    uint64_t D = pair->src.index_dim;
    uint64_t sp = req->src_blocks[g / bs] * pair->src.page_bytes;
    uint64_t dp = req->dst_blocks[g / V] * pair->dst.page_bytes;
    uint64_t ts = g % bs;
    uint64_t td = repl ? g % V : kvr__local(g, lay->interleave, W) % bs;
    uint64_t Pd = repl ? V : bs;
    uint64_t step = lay->preshuffle ? 16 : D;
    for (uint64_t d = 0; d < D; d += step) {
        uint64_t so = kvr__index_key_off(ts, d, D, lay->preshuffle);
        uint64_t dof = kvr__index_key_off(td, d, D, lay->preshuffle);
        if (fn(ctx, g, "key", 0, sp + so, dp + dof, step))
            return 1;
    }
    return fn(ctx, g, "scale", 0, sp + kvr__index_scale_off(ts, bs, D),
              dp + kvr__index_scale_off(td, Pd, D), 4);
}

/* Identity pages (W == 1): g is the page's first token, for messages. */
static void expect_pages(const kvr_layout_t *lay, const kvr_region_pair_t *pair,
                         const kvr_request_t *req, kvr__expect_fn fn, void *ctx)
{
    uint64_t bs = lay->block_size;
    uint64_t end = kvr__ceil_div(req->num_tokens, bs);
    for (uint64_t j = req->num_computed_blocks; j < end; j++)
        if (fn(ctx, j * bs, "page", 0,
               req->src_blocks[j] * pair->src.page_bytes,
               req->dst_blocks[j] * pair->dst.page_bytes, pair->src.page_bytes))
            return;
}

void kvr__expect_foreach(const kvr_layout_t *lay, uint32_t rank,
                         const kvr_region_pair_t *pair,
                         const kvr_request_t *req, kvr__kind_t kind,
                         kvr__expect_fn fn, void *ctx)
{
    uint64_t bs = lay->block_size, I = lay->interleave, W = lay->dcp_size;
    uint64_t first = req->num_computed_blocks * bs * W;
    if (kind == KVR__KIND_PAGE) {
        expect_pages(lay, pair, req, fn, ctx);
        return;
    }
    uint64_t tb = kvr_region_token_bytes(lay, &pair->src);
    for (uint64_t g = first; g < req->num_tokens; g++) {
        int owned = kvr__owner(g, I, W) == rank;
        int stop = 0;
        if (kind == KVR__KIND_TOKEN && owned)
            stop = fn(ctx, g, "latent", 0,
                      kvr__src_slot(req->src_blocks, g, bs) * tb,
                      kvr__dst_slot(req->dst_blocks, g, bs, I, W) * tb, tb);
        else if (kind == KVR__KIND_INDEX_REPL ||
                 (kind == KVR__KIND_INDEX_SHARD && owned))
            stop = expect_index_token(lay, pair, req, g,
                                      kind == KVR__KIND_INDEX_REPL, fn, ctx);
        if (stop)
            return;
    }
}

/* ---- verifier ---- */

typedef struct {
    const unsigned char *src;
    const unsigned char *dst;
    const kvr_region_pair_t *pair;
    uint32_t rank;
    kvr_error_t *err;
    kvr_status_t st;
} verify_ctx_t;

/* memcmp first; only a mismatch is walked byte by byte to name it. The
 * source is one producer rank's region: the walk skips the others. */
static int verify_segment(void *arg, uint64_t g, const char *part,
                          uint32_t producer, uint64_t so, uint64_t dof,
                          uint64_t len)
{
    verify_ctx_t *v = arg;
    (void)producer;
    if (memcmp(v->src + so, v->dst + dof, len) == 0)
        return 0;
    uint64_t i = 0;
    while (v->src[so + i] == v->dst[dof + i])
        i++;
    v->st = kvr_error_set(v->err, KVR_ERR_VERIFY,
                          "%s layer %u rank %u: token %llu wrong: %s byte %llu "
                          "at dst offset %llu: expected 0x%02x (src offset "
                          "%llu) found 0x%02x",
                          kvr_role_name(v->pair->dst.role), v->pair->dst.layer,
                          v->rank, (ull)g, part, (ull)i, (ull)(dof + i),
                          v->src[so + i], (ull)(so + i), v->dst[dof + i]);
    return 1;
}

kvr_status_t kvr_verify_region(const kvr_layout_t *lay, uint32_t rank,
                               const kvr_region_pair_t *pair,
                               const kvr_request_t *req, const void *src_base,
                               const void *dst_base, kvr_error_t *err)
{
    kvr__req_info_t info;
    kvr__kind_t kind;
    if (src_base == NULL || dst_base == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buffer is NULL");
    kvr_status_t st = kvr__check_request(lay, rank, req, &info, err);
    if (st == KVR_OK)
        st = kvr__check_pair(lay, pair, req, &info, &kind, err);
    if (st != KVR_OK)
        return st;
    verify_ctx_t v = {src_base, dst_base, pair, rank, err, KVR_OK};
    kvr__expect_foreach(lay, rank, pair, req, kind, verify_segment, &v);
    return v.st;
}

/* ---- coverage proof ---- */

/* The map holds, per destination byte, 1 + the source byte a run wrote there
 * (0: unwritten), then COVERED once an expected byte matched it. Hence the
 * 4 GiB limit on regions in this test mode. */
#define COVERED UINT32_MAX

typedef struct {
    uint32_t *map;      /* per destination byte: source byte + 1, 0 unwritten */
    uint64_t src_bytes; /* producer p's byte b is p * src_bytes + b */
    uint32_t rank;
    uint64_t tokens;
    uint64_t last_g;
    kvr_error_t *err;
    kvr_status_t st;
} cover_ctx_t;

static int cover_segment(void *arg, uint64_t g, const char *part,
                         uint32_t producer, uint64_t so, uint64_t dof,
                         uint64_t len)
{
    cover_ctx_t *c = arg;
    if (g != c->last_g || c->tokens == 0)
        c->tokens++;
    c->last_g = g;
    so += producer * c->src_bytes;
    for (uint64_t i = 0; i < len; i++) {
        uint32_t got = c->map[dof + i];
        if (got == so + i + 1) {
            c->map[dof + i] = COVERED;
            continue;
        }
        c->st = kvr_error_set(c->err, KVR_ERR_VERIFY,
                              "rank %u token %llu %s byte %llu: dst byte %llu "
                              "%s (expected src byte %llu, got %lld)",
                              c->rank, (ull)g, part, (ull)i, (ull)(dof + i),
                              got == 0 ? "never written"
                                       : "from the wrong source",
                              (ull)(so + i), (long long)got - 1);
        return 1;
    }
    return 0;
}

/* A byte written twice is an error even with the same value: two runs
 * racing on one byte would be a plan bug the data might hide. Source bytes
 * are numbered from id0 (producer rank * source region bytes). */
static kvr_status_t paint_plan(const kvr_plan_t *plan, uint32_t rank,
                               uint64_t id0, uint64_t src_bytes,
                               uint64_t dst_bytes, uint32_t *map,
                               kvr_error_t *err)
{
    for (size_t i = 0; i < plan->num_runs; i++) {
        const kvr_run_t *r = &plan->runs[i];
        if (r->src + r->len > src_bytes || r->dst + r->len > dst_bytes)
            return kvr_error_set(err, KVR_ERR_RUN_OUT_OF_BOUNDS,
                                 "rank %u run %zu (src %llu dst %llu len %llu) "
                                 "leaves the regions",
                                 rank, i, (ull)r->src, (ull)r->dst,
                                 (ull)r->len);
        for (uint64_t b = 0; b < r->len; b++) {
            if (map[r->dst + b] != 0)
                return kvr_error_set(err, KVR_ERR_VERIFY,
                                     "rank %u writes dst byte %llu twice", rank,
                                     (ull)(r->dst + b));
            map[r->dst + b] = (uint32_t)(id0 + r->src + b + 1);
        }
    }
    return KVR_OK;
}

/* Leftover writes are legal only as index slack: in a request page, inside
 * the planes. Index planes move whole even when the request ends inside the
 * page, so the slots past num_tokens are written with bytes nobody reads;
 * anything else written and not expected is a plan bug. */
static kvr_status_t check_leftovers(const kvr_layout_t *lay,
                                    const kvr_region_pair_t *pair,
                                    const kvr_request_t *req, kvr__kind_t kind,
                                    uint32_t rank, const uint32_t *map,
                                    uint64_t dst_bytes, kvr_error_t *err)
{
    int index = kind == KVR__KIND_INDEX_REPL || kind == KVR__KIND_INDEX_SHARD ||
                kind == KVR__KIND_INDEX_PAIR;
    uint64_t planes = kvr_index_page_tokens(lay, true) *
                      (pair->dst.index_dim + 4ull);
    uint64_t end = kvr__ceil_div(req->num_tokens, kvr_virtual_block(lay));
    /* only pages inside the registered length can hold a leftover write
     * (num_blocks may be far larger than the registered bytes) */
    uint64_t pages = dst_bytes / pair->dst.page_bytes + 1;
    pages = pages < pair->dst.num_blocks ? pages : pair->dst.num_blocks;
    unsigned char *in_request = calloc(pages + 1, 1);
    if (in_request == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint64_t k = req->num_computed_blocks; k < end; k++)
        if (req->dst_blocks[k] < pages)
            in_request[req->dst_blocks[k]] = 1;
    kvr_status_t st = KVR_OK;
    for (uint64_t x = 0; x < dst_bytes && st == KVR_OK; x++) {
        if (map[x] == 0 || map[x] == COVERED)
            continue;
        uint64_t page = x / pair->dst.page_bytes;
        if (!index || page >= pages || !in_request[page] ||
            x % pair->dst.page_bytes >= planes)
            st = kvr_error_set(err, KVR_ERR_VERIFY,
                               "rank %u writes dst byte %llu (page %llu) "
                               "that holds none of the request's tokens",
                               rank, (ull)x, (ull)page);
    }
    free(in_request);
    return st;
}

/* One consumer rank's share of the proof: its plans painted (one per
 * producer rank, source bytes numbered per producer), then every expected
 * byte checked against them, then the leftovers. */
typedef struct {
    const kvr_layout_t *lay;
    const kvr_region_pair_t *pair;
    const kvr_request_t *req; /* pair proofs: one per producer rank */
    kvr__kind_t kind;
    int pairs;
    const kvr_plan_t *const *plans;
    uint32_t producers, consumers;
} cover_t;

static kvr_status_t cover_rank(const cover_t *cv, uint32_t rank, uint32_t *map,
                               uint64_t *tokens, kvr_error_t *err)
{
    uint64_t src_bytes = kvr_region_bytes(&cv->pair->src);
    uint64_t dst_bytes = kvr_region_bytes(&cv->pair->dst);
    memset(map, 0, dst_bytes * sizeof(*map));
    kvr_status_t st = KVR_OK;
    for (uint32_t p = 0; p < cv->producers && st == KVR_OK; p++)
        st = paint_plan(cv->plans[(size_t)p * cv->consumers + rank], rank,
                        p * src_bytes, src_bytes, dst_bytes, map, err);
    if (st != KVR_OK)
        return st;
    cover_ctx_t c = {map, src_bytes, rank, 0, 0, err, KVR_OK};
    if (cv->pairs)
        kvr__expect_pair_foreach(cv->lay, rank, cv->pair, cv->req,
                                 KVR__ALL_PRODUCERS, cv->kind, cover_segment,
                                 &c);
    else
        kvr__expect_foreach(cv->lay, rank, cv->pair, cv->req, cv->kind,
                            cover_segment, &c);
    if (c.st != KVR_OK)
        return c.st;
    *tokens += c.tokens;
    return check_leftovers(cv->lay, cv->pair, cv->req, cv->kind, rank, map,
                           dst_bytes, err);
}

/* Token placements the W ranks must make together: N - k*V tokens once each
 * when sharded, W times when replicated; identity plans count pages. */
static uint64_t expected_total(const kvr_layout_t *lay,
                               const kvr_request_t *req, kvr__kind_t kind)
{
    uint64_t bs = lay->block_size, W = lay->dcp_size;
    if (kind == KVR__KIND_PAGE)
        return kvr__ceil_div(req->num_tokens, bs) - req->num_computed_blocks;
    uint64_t first = req->num_computed_blocks * bs * W;
    uint64_t n = req->num_tokens > first ? req->num_tokens - first : 0;
    return kind == KVR__KIND_INDEX_REPL ? n * W : n;
}

/* Runs the proof over every consumer rank; the source ids need
 * producers * source bytes < 4 GiB (test mode). */
static kvr_status_t cover_all(const cover_t *cv, uint64_t expected,
                              kvr_error_t *err)
{
    uint64_t dst_bytes = kvr_region_bytes(&cv->pair->dst);
    if (cv->plans == NULL || dst_bytes >= COVERED ||
        kvr_region_bytes(&cv->pair->src) * cv->producers >= COVERED)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "coverage needs every plan and regions < 4 GiB");
    uint32_t *map = malloc((dst_bytes + 1) * sizeof(*map));
    if (map == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for the map");
    uint64_t tokens = 0;
    kvr_status_t st = KVR_OK;
    for (uint32_t r = 0; r < cv->consumers && st == KVR_OK; r++)
        st = cover_rank(cv, r, map, &tokens, err);
    free(map);
    if (st == KVR_OK && tokens != expected)
        st = kvr_error_set(err, KVR_ERR_VERIFY,
                           "ranks hold %llu token placements, expected %llu",
                           (ull)tokens, (ull)expected);
    return st;
}

kvr_status_t kvr_plan_check_coverage(const kvr_layout_t *lay,
                                     const kvr_region_pair_t *pair,
                                     const kvr_request_t *req,
                                     const kvr_plan_t *const *rank_plans,
                                     kvr_error_t *err)
{
    kvr__req_info_t info;
    kvr__kind_t kind;
    kvr_status_t st = kvr__check_request(lay, 0, req, &info, err);
    if (st == KVR_OK)
        st = kvr__check_pair(lay, pair, req, &info, &kind, err);
    if (st != KVR_OK)
        return st;
    cover_t cv = {lay, pair, req, kind, 0, rank_plans, 1, lay->dcp_size};
    return cover_all(&cv, expected_total(lay, req, kind), err);
}

/* ---- pairs (docs/design.md §18) ---- */

kvr_status_t
kvr_verify_region_pair(const kvr_layout_t *lay, uint32_t producer_rank,
                       uint32_t consumer_rank, const kvr_region_pair_t *pair,
                       const kvr_request_t *req, const void *src_base,
                       const void *dst_base, kvr_error_t *err)
{
    kvr__pair_t x;
    kvr__kind_t kind;
    if (src_base == NULL || dst_base == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buffer is NULL");
    kvr_status_t st = kvr__pair_prepare(lay, producer_rank, consumer_rank, req,
                                        pair, &x, &kind, err);
    if (st != KVR_OK)
        return st;
    verify_ctx_t v = {src_base, dst_base, pair, consumer_rank, err, KVR_OK};
    kvr__expect_pair_foreach(lay, consumer_rank, pair, req, producer_rank, kind,
                             verify_segment, &v);
    return v.st;
}

/* Placements the nc consumer ranks together make: each token once when
 * token-sharded, on every rank when replicated or head-sharded (every tp
 * rank holds every token of its heads); identity plans count pages, on
 * every rank of their axis. */
static uint64_t pair_expected(const kvr_layout_t *lay, const kvr_request_t *req,
                              kvr__kind_t kind, uint32_t nc)
{
    uint64_t V = kvr_virtual_block(lay), first = req->num_computed_blocks * V;
    uint64_t n = req->num_tokens > first ? req->num_tokens - first : 0;
    if (kind == KVR__KIND_PAGE)
        return (kvr__ceil_div(req->num_tokens, lay->block_size) -
                req->num_computed_blocks) *
               nc;
    if (kind == KVR__KIND_DENSE ||
        (kind == KVR__KIND_INDEX_PAIR && kvr__consumer_index_repl(lay)))
        return n * nc;
    return n;
}

/* Every request must share the consumer side: one table, tokens, offset. */
static kvr_status_t check_reqs(const kvr_request_t *reqs, uint32_t n,
                               kvr_error_t *err)
{
    size_t table = reqs[0].num_dst_blocks * sizeof(*reqs[0].dst_blocks);
    for (uint32_t p = 1; p < n; p++)
        if (reqs[p].num_dst_blocks != reqs[0].num_dst_blocks ||
            (table && memcmp(reqs[p].dst_blocks, reqs[0].dst_blocks, table)) ||
            reqs[p].num_tokens != reqs[0].num_tokens ||
            reqs[p].num_computed_blocks != reqs[0].num_computed_blocks)
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "producer rank %u's request differs from rank "
                                 "0's on the consumer side",
                                 p);
    return KVR_OK;
}

kvr_status_t kvr_plan_check_coverage_pair(const kvr_layout_t *lay,
                                          const kvr_region_pair_t *pair,
                                          const kvr_request_t *reqs,
                                          const kvr_plan_t *const *plans,
                                          kvr_error_t *err)
{
    kvr__pair_t x;
    kvr__kind_t kind;
    if (reqs == NULL || pair == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "reqs or pair is NULL");
    kvr_axis_t axis = kvr_region_axis(&pair->src);
    uint32_t np = kvr_axis_ranks(lay, axis, false);
    uint32_t nc = kvr_axis_ranks(lay, axis, true);
    kvr_status_t st = check_reqs(reqs, np, err);
    for (uint32_t p = 0; p < np && st == KVR_OK; p++)
        st = kvr__pair_prepare(lay, p, 0, &reqs[p], pair, &x, &kind, err);
    if (st != KVR_OK)
        return st;
    cover_t cv = {lay, pair, reqs, kind, 1, plans, np, nc};
    return cover_all(&cv, pair_expected(lay, reqs, kind, nc), err);
}
