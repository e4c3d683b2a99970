/* Run generation, ordering and coalescing (docs/design.md §4). Token roles
 * (MLA) are planned in token units and scaled to bytes per region class, so
 * one walk serves every token class; index and page kinds are planned in
 * bytes. Every kind walks destination blocks in ascending id order, so runs
 * come out sorted by destination and the final sort is usually skipped. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layout_internal.h"
#include "layout_math.h"
#include "plan_internal.h"

kvr_plan_t *kvr__plan_new(size_t cap)
{
    kvr_plan_t *plan = calloc(1, sizeof(*plan));
    if (plan == NULL)
        return NULL;
    plan->cap = cap ? cap : 1;
    /* a capacity hint that wraps the byte count must not allocate less */
    plan->runs = plan->cap <= SIZE_MAX / sizeof(*plan->runs)
                     ? malloc(plan->cap * sizeof(*plan->runs))
                     : NULL;
    if (plan->runs == NULL) {
        free(plan);
        return NULL;
    }
    return plan;
}

void kvr_plan_destroy(kvr_plan_t *plan)
{
    if (plan == NULL)
        return;
    free(plan->runs);
    free(plan);
}

kvr_status_t kvr__plan_push(kvr_plan_t *plan, uint64_t src, uint64_t dst,
                            uint64_t len)
{
    if (plan->num_runs == plan->cap) {
        if (plan->cap > SIZE_MAX / 2 / sizeof(*plan->runs))
            return KVR_ERR_NO_MEMORY;
        size_t cap = plan->cap * 2;
        kvr_run_t *runs = realloc(plan->runs, cap * sizeof(*runs));
        if (runs == NULL)
            return KVR_ERR_NO_MEMORY;
        plan->runs = runs;
        plan->cap = cap;
    }
    plan->runs[plan->num_runs++] = (kvr_run_t){src, dst, len};
    return KVR_OK;
}

/* Ties broken on src so the order never depends on qsort's. */
static int cmp_dst(const void *a, const void *b)
{
    const kvr_run_t *x = a, *y = b;
    if (x->dst != y->dst)
        return x->dst < y->dst ? -1 : 1;
    return (x->src > y->src) - (x->src < y->src);
}

static int sorted_by_dst(const kvr_plan_t *plan)
{
    for (size_t i = 1; i < plan->num_runs; i++)
        if (plan->runs[i].dst < plan->runs[i - 1].dst)
            return 0;
    return 1;
}

/* Sorted by destination: the plan is deterministic whatever order the
 * tables are in, and the staged executor's byte stream (the runs in plan
 * order) is the consumer's page order. Neighbours merge only when source and
 * destination both continue, so every byte keeps its (src, dst) pair and a
 * merged run is one put or memcpy instead of several. uncoalesced is kept
 * because "bs / I runs per block" is a property of the plan before merging. */
void kvr__plan_finish(kvr_plan_t *plan)
{
    plan->uncoalesced = plan->num_runs;
    if (!sorted_by_dst(plan))
        qsort(plan->runs, plan->num_runs, sizeof(*plan->runs), cmp_dst);
    size_t out = 0;
    for (size_t i = 0; i < plan->num_runs; i++) {
        kvr_run_t r = plan->runs[i];
        kvr_run_t *last = out ? &plan->runs[out - 1] : NULL;
        if (last && last->src + last->len == r.src &&
            last->dst + last->len == r.dst)
            last->len += r.len;
        else
            plan->runs[out++] = r;
    }
    plan->num_runs = out;
    plan->bytes = plan->src_end = plan->dst_end = 0;
    for (size_t i = 0; i < out; i++) {
        const kvr_run_t *r = &plan->runs[i];
        plan->bytes += r->len;
        if (r->src + r->len > plan->src_end)
            plan->src_end = r->src + r->len;
        if (r->dst + r->len > plan->dst_end)
            plan->dst_end = r->dst + r->len;
    }
}

/* Indices [first, end) of a destination table in ascending block-id order,
 * so runs come out sorted by destination without sorting the runs. */
uint32_t *kvr__dst_order(const uint32_t *table, uint64_t first, uint64_t end)
{
    size_t n = (size_t)(end > first ? end - first : 0);
    kvr__id_index_t *tmp = malloc((n + 1) * sizeof(*tmp));
    uint32_t *order = malloc((n + 1) * sizeof(*order));
    if (tmp == NULL || order == NULL) {
        free(tmp);
        free(order);
        return NULL;
    }
    kvr__sort_ids(table, (uint32_t)first, n, tmp);
    for (size_t i = 0; i < n; i++)
        order[i] = tmp[i].index;
    free(tmp);
    return order;
}

/* Rank r owns chunks c = (q*W + r)*I, local index q*I; virtual block k
 * holds q in [k*bs/I, (k+1)*bs/I) because local / bs == g / V. So the rank
 * visits only its own chunks, never testing tokens it does not own. A chunk
 * starts at a multiple of I and I divides bs, so it never straddles a source
 * block: one contiguous source run each, clipped at the last token. Its
 * destination row is local % bs = (q*I) % bs inside entry k's page. */
static kvr_status_t push_token_block(const kvr_request_t *req, uint64_t k,
                                     uint32_t rank, uint64_t bs, uint64_t I,
                                     uint64_t W, kvr_plan_t *plan)
{
    uint64_t N = req->num_tokens;
    for (uint64_t q = k * bs / I; q < (k + 1) * bs / I; q++) {
        uint64_t c = (q * W + rank) * I;
        if (c >= N)
            break;
        uint64_t len = N - c < I ? N - c : I;
        uint64_t src = kvr__src_slot(req->src_blocks, c, bs);
        uint64_t dst = (uint64_t)req->dst_blocks[k] * bs + (q * I) % bs;
        if (kvr__plan_push(plan, src, dst, len) != KVR_OK)
            return KVR_ERR_NO_MEMORY;
    }
    return KVR_OK;
}

/* Incremental: entries before k0 are cached, so the walk starts at entry k0
 * (global token k0 * V). The capacity guess is the rank's chunk count. */
kvr_status_t kvr__plan_tokens(const kvr_layout_t *lay, uint32_t rank,
                              const kvr_request_t *req, kvr_plan_t **out)
{
    uint64_t bs = lay->block_size, I = lay->interleave, W = lay->dcp_size;
    uint64_t V = bs * W, N = req->num_tokens, k0 = req->num_computed_blocks;
    uint64_t end = kvr__ceil_div(N, V);
    uint64_t chunks = N > k0 * V ? (N - k0 * V) / (I * W) + 1 : 1;
    kvr_plan_t *plan = kvr__plan_new((size_t)chunks);
    uint32_t *order = kvr__dst_order(req->dst_blocks, k0, end);
    kvr_status_t st = plan && order ? KVR_OK : KVR_ERR_NO_MEMORY;
    for (uint64_t i = 0; st == KVR_OK && i + k0 < end; i++)
        st = push_token_block(req, order[i], rank, bs, I, W, plan);
    free(order);
    if (st != KVR_OK) {
        kvr_plan_destroy(plan);
        return st;
    }
    kvr__plan_finish(plan);
    *out = plan;
    return KVR_OK;
}

/* Token units to bytes. Scaling keeps contiguity, so a coalesced token plan
 * stays coalesced and need not be merged again. */
void kvr__plan_scale(kvr_plan_t *plan, uint64_t unit)
{
    for (size_t i = 0; i < plan->num_runs; i++) {
        plan->runs[i].src *= unit;
        plan->runs[i].dst *= unit;
        plan->runs[i].len *= unit;
    }
    plan->bytes *= unit;
    plan->src_end *= unit;
    plan->dst_end *= unit;
}

kvr_status_t kvr__plan_scaled(const kvr_plan_t *tokens, uint64_t unit,
                              kvr_plan_t **out)
{
    kvr_plan_t *plan = kvr__plan_new(tokens->num_runs);
    if (plan == NULL)
        return KVR_ERR_NO_MEMORY;
    for (size_t i = 0; i < tokens->num_runs; i++) {
        const kvr_run_t *r = &tokens->runs[i];
        plan->runs[i] = (kvr_run_t){r->src * unit, r->dst * unit,
                                    r->len * unit};
    }
    plan->num_runs = tokens->num_runs;
    plan->uncoalesced = tokens->uncoalesced;
    plan->bytes = tokens->bytes * unit;
    plan->src_end = tokens->src_end * unit;
    plan->dst_end = tokens->dst_end * unit;
    *out = plan;
    return KVR_OK;
}

/* Replicated: destination block k takes source pages j = k*W + s, key
 * planes at s*bs*D, then scale planes at W*bs*D + s*bs*4 (ascending: the plane
 * loop is outside so all key sub-planes precede the scales). The consumer page
 * holds V = W*bs tokens, and source token t is its token s*bs + t. Whole
 * planes move even when preshuffled: with bs % 16 == 0 every key offset
 * shifts by the same s*bs*D, every scale by s*bs*4. Never per token: a
 * C-byte window of an index page is not a token (docs/design.md §3). The
 * last page's slots past num_tokens move too, as the request's own slack. */
static kvr_status_t push_index_repl(const kvr_layout_t *lay,
                                    const kvr_region_pair_t *pair,
                                    const kvr_request_t *req, uint64_t k,
                                    uint64_t end_src, kvr_plan_t *plan)
{
    uint64_t bs = lay->block_size, W = lay->dcp_size, D = pair->src.index_dim;
    uint64_t dst = req->dst_blocks[k] * pair->dst.page_bytes;
    kvr_status_t st = KVR_OK;
    for (int plane = 0; plane < 2 && st == KVR_OK; plane++)
        for (uint64_t s = 0; s < W && k * W + s < end_src && st == KVR_OK;
             s++) {
            uint64_t src = req->src_blocks[k * W + s] * pair->src.page_bytes;
            st = plane == 0
                     ? kvr__plan_push(plan, src, dst + s * bs * D, bs * D)
                     : kvr__plan_push(plan, src + bs * D,
                                      dst + W * bs * D + s * bs * 4, bs * 4);
        }
    return st;
}

/* Sharded (I == bs or W == 1): block k's page from source page k*W + rank.
 * At I == bs source page j belongs wholly to rank j % W and lands in entry
 * j / W at the same rows, and both pages hold P = bs tokens, so the key and
 * scale planes are adjacent on both sides: one run of bs * (D + 4) bytes
 * (D/Q == 1). Padding never moves. */
static kvr_status_t push_index_shard(const kvr_layout_t *lay, uint32_t rank,
                                     const kvr_region_pair_t *pair,
                                     const kvr_request_t *req, uint64_t k,
                                     uint64_t end_src, kvr_plan_t *plan)
{
    uint64_t bs = lay->block_size, W = lay->dcp_size, D = pair->src.index_dim;
    uint64_t j = k * W + (W > 1 ? rank : 0);
    if (j >= end_src)
        return KVR_OK;
    return kvr__plan_push(plan, req->src_blocks[j] * pair->src.page_bytes,
                          req->dst_blocks[k] * pair->dst.page_bytes,
                          bs * (D + 4));
}

/* The identity layout (W == 1, equal TP): page j to page j. */
static kvr_status_t push_page(const kvr_region_pair_t *pair,
                              const kvr_request_t *req, uint64_t j,
                              kvr_plan_t *plan)
{
    return kvr__plan_push(plan, req->src_blocks[j] * pair->src.page_bytes,
                          req->dst_blocks[j] * pair->dst.page_bytes,
                          pair->src.page_bytes);
}

/* Plans any kind, walking destination blocks in ascending id order. The
 * capacity guess is the replicated worst case: 2 runs for each of the W
 * source pages of an entry. */
kvr_status_t kvr__plan_kind(const kvr_layout_t *lay, uint32_t rank,
                            const kvr_region_pair_t *pair,
                            const kvr_request_t *req, kvr__kind_t kind,
                            kvr_plan_t **out)
{
    if (kind == KVR__KIND_TOKEN) {
        kvr_status_t st = kvr__plan_tokens(lay, rank, req, out);
        if (st == KVR_OK)
            kvr__plan_scale(*out, kvr_region_token_bytes(lay, &pair->src));
        return st;
    }
    /* W == 1 for PAGE, so virtual blocks are blocks */
    uint64_t k0 = req->num_computed_blocks;
    uint64_t end_src = kvr__ceil_div(req->num_tokens, lay->block_size);
    uint64_t end = kvr__ceil_div(req->num_tokens, kvr_virtual_block(lay));
    kvr_plan_t *plan = kvr__plan_new(
        end > k0 ? 2 * lay->dcp_size * (size_t)(end - k0) : 1);
    uint32_t *order = kvr__dst_order(req->dst_blocks, k0, end);
    kvr_status_t st = plan && order ? KVR_OK : KVR_ERR_NO_MEMORY;
    for (uint64_t i = 0; st == KVR_OK && i + k0 < end; i++) {
        if (kind == KVR__KIND_INDEX_REPL)
            st = push_index_repl(lay, pair, req, order[i], end_src, plan);
        else if (kind == KVR__KIND_INDEX_SHARD)
            st = push_index_shard(lay, rank, pair, req, order[i], end_src,
                                  plan);
        else
            st = push_page(pair, req, order[i], plan);
    }
    free(order);
    if (st != KVR_OK) {
        kvr_plan_destroy(plan);
        return st;
    }
    kvr__plan_finish(plan);
    *out = plan;
    return KVR_OK;
}

kvr_status_t kvr_plan_create(const kvr_layout_t *lay, uint32_t rank,
                             const kvr_region_pair_t *pair,
                             const kvr_request_t *req, kvr_plan_t **out,
                             kvr_error_t *err)
{
    kvr__req_info_t info;
    kvr__kind_t kind;
    /* Every check runs before a run is made; the bounds check needs the
     * plan's extents, so it runs after and is free when they fit. */
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    kvr_status_t st = kvr__check_request(lay, rank, req, &info, err);
    if (st == KVR_OK)
        st = kvr__check_pair(lay, pair, req, &info, &kind, err);
    if (st != KVR_OK)
        return st;
    kvr_plan_t *plan = NULL;
    st = kvr__plan_kind(lay, rank, pair, req, kind, &plan);
    return kvr__plan_deliver(st, plan, pair, out, err);
}

kvr_status_t kvr__plan_deliver(kvr_status_t st, kvr_plan_t *plan,
                               const kvr_region_pair_t *pair, kvr_plan_t **out,
                               kvr_error_t *err)
{
    if (st != KVR_OK)
        return kvr_error_set(err, st, "no memory for the plan");
    st = kvr__check_plan_bounds(plan, pair, err);
    if (st != KVR_OK) {
        kvr_plan_destroy(plan);
        return st;
    }
    *out = plan;
    return KVR_OK;
}

const kvr_run_t *kvr_plan_runs(const kvr_plan_t *plan, size_t *num_runs)
{
    if (num_runs != NULL)
        *num_runs = plan ? plan->num_runs : 0;
    return plan ? plan->runs : NULL;
}

size_t kvr_plan_num_runs(const kvr_plan_t *plan)
{
    return plan ? plan->num_runs : 0;
}

size_t kvr_plan_runs_uncoalesced(const kvr_plan_t *plan)
{
    return plan ? plan->uncoalesced : 0;
}

uint64_t kvr_plan_bytes(const kvr_plan_t *plan)
{
    return plan ? plan->bytes : 0;
}

void kvr_plan_apply_host(const kvr_plan_t *plan, const void *src_base,
                         void *dst_base)
{
    const unsigned char *src = src_base;
    unsigned char *dst = dst_base;
    for (size_t i = 0; i < plan->num_runs; i++)
        memcpy(dst + plan->runs[i].dst, src + plan->runs[i].src,
               plan->runs[i].len);
}

/* Runs from elsewhere (tests, Python) are kept as given: not sorted, not
 * merged, so a caller can replay a plan exactly. */
kvr_status_t kvr_plan_from_runs(const kvr_run_t *runs, size_t num_runs,
                                kvr_plan_t **out)
{
    if (out == NULL || (num_runs && runs == NULL))
        return KVR_ERR_INVALID;
    kvr_plan_t *plan = kvr__plan_new(num_runs);
    if (plan == NULL)
        return KVR_ERR_NO_MEMORY;
    if (num_runs)
        memcpy(plan->runs, runs, num_runs * sizeof(*runs));
    plan->num_runs = num_runs;
    plan->uncoalesced = num_runs;
    for (size_t i = 0; i < num_runs; i++) {
        uint64_t src_end, dst_end;
        if (__builtin_add_overflow(runs[i].src, runs[i].len, &src_end) ||
            __builtin_add_overflow(runs[i].dst, runs[i].len, &dst_end) ||
            __builtin_add_overflow(plan->bytes, runs[i].len, &plan->bytes)) {
            kvr_plan_destroy(plan);
            return KVR_ERR_INVALID; /* a run or the total passes 2^64 */
        }
        plan->src_end = src_end > plan->src_end ? src_end : plan->src_end;
        plan->dst_end = dst_end > plan->dst_end ? dst_end : plan->dst_end;
    }
    *out = plan;
    return KVR_OK;
}
