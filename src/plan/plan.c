/* Run generation, ordering and coalescing (DESIGN.md §4). */
#include <stdlib.h>
#include <string.h>

#include "../layout/layout_math.h"
#include "plan_internal.h"

kvr_plan_t *kvr__plan_new(size_t cap)
{
    kvr_plan_t *plan = calloc(1, sizeof(*plan));
    if (plan == NULL)
        return NULL;
    plan->cap = cap ? cap : 1;
    plan->runs = malloc(plan->cap * sizeof(*plan->runs));
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

/* Rank r owns chunks c = (q*W + r)*I; its local index there is q*I. */
kvr_status_t kvr__plan_tokens(const kvr_layout_t *lay, uint32_t rank,
                              const kvr_request_t *req, kvr_plan_t **out)
{
    uint64_t bs = lay->block_size, I = lay->interleave, W = lay->dcp_size;
    uint64_t V = bs * W, N = req->num_tokens;
    uint64_t first = req->num_computed_blocks * V;
    uint64_t chunks = N > first ? (N - first) / (I * W) + 1 : 1;
    kvr_plan_t *plan = kvr__plan_new((size_t)chunks);
    if (plan == NULL)
        return KVR_ERR_NO_MEMORY;
    for (uint64_t q = first / (I * W);; q++) {
        uint64_t c = (q * W + rank) * I;
        if (c >= N)
            break;
        uint64_t len = N - c < I ? N - c : I;
        uint64_t src = kvr__src_slot(req->src_blocks, c, bs);
        uint64_t dst = (uint64_t)req->dst_blocks[c / V] * bs + (q * I) % bs;
        if (kvr__plan_push(plan, src, dst, len) != KVR_OK) {
            kvr_plan_destroy(plan);
            return KVR_ERR_NO_MEMORY;
        }
    }
    kvr__plan_finish(plan);
    *out = plan;
    return KVR_OK;
}

kvr_status_t kvr__plan_scaled(const kvr_plan_t *tokens, uint64_t unit,
                              kvr_plan_t **out)
{
    kvr_plan_t *plan = kvr__plan_new(tokens->num_runs);
    if (plan == NULL)
        return KVR_ERR_NO_MEMORY;
    for (size_t i = 0; i < tokens->num_runs; i++) {
        const kvr_run_t *r = &tokens->runs[i];
        plan->runs[i] = (kvr_run_t){r->src * unit, r->dst * unit, r->len * unit};
    }
    plan->num_runs = tokens->num_runs;
    plan->uncoalesced = tokens->uncoalesced;
    plan->bytes = tokens->bytes * unit;
    plan->src_end = tokens->src_end * unit;
    plan->dst_end = tokens->dst_end * unit;
    *out = plan;
    return KVR_OK;
}

static kvr_status_t push_index_repl(const kvr_layout_t *lay,
                                    const kvr_region_pair_t *pair,
                                    const kvr_request_t *req, uint64_t j,
                                    kvr_plan_t *plan)
{
    uint64_t bs = lay->block_size, W = lay->dcp_size, D = pair->src.index_dim;
    uint64_t s = j % W;
    uint64_t src = req->src_blocks[j] * pair->src.page_bytes;
    uint64_t dst = req->dst_blocks[j / W] * pair->dst.page_bytes;
    kvr_status_t st = kvr__plan_push(plan, src, dst + s * bs * D, bs * D);
    if (st == KVR_OK)
        st = kvr__plan_push(plan, src + bs * D, dst + W * bs * D + s * bs * 4,
                            bs * 4);
    return st;
}

static kvr_status_t push_index_shard(const kvr_layout_t *lay, uint32_t rank,
                                     const kvr_region_pair_t *pair,
                                     const kvr_request_t *req, uint64_t j,
                                     kvr_plan_t *plan)
{
    uint64_t bs = lay->block_size, W = lay->dcp_size, D = pair->src.index_dim;
    if (kvr__owner(j * bs, lay->interleave, W) != rank)
        return KVR_OK;
    return kvr__plan_push(plan, req->src_blocks[j] * pair->src.page_bytes,
                          req->dst_blocks[j / W] * pair->dst.page_bytes,
                          bs * (D + 4));
}

static kvr_status_t push_page(const kvr_region_pair_t *pair,
                              const kvr_request_t *req, uint64_t j,
                              kvr_plan_t *plan)
{
    return kvr__plan_push(plan, req->src_blocks[j] * pair->src.page_bytes,
                          req->dst_blocks[j] * pair->dst.page_bytes,
                          pair->src.page_bytes);
}

/* Page-granular kinds: one step per touched source block. */
kvr_status_t kvr__plan_kind(const kvr_layout_t *lay, uint32_t rank,
                            const kvr_region_pair_t *pair,
                            const kvr_request_t *req, kvr__kind_t kind,
                            kvr_plan_t **out)
{
    if (kind == KVR__KIND_TOKEN) {
        kvr_plan_t *tokens = NULL;
        kvr_status_t st = kvr__plan_tokens(lay, rank, req, &tokens);
        if (st == KVR_OK)
            st = kvr__plan_scaled(tokens, kvr_region_token_bytes(lay, &pair->src),
                                  out);
        kvr_plan_destroy(tokens);
        return st;
    }
    uint64_t first = req->num_computed_blocks * lay->dcp_size;
    uint64_t end = kvr__ceil_div(req->num_tokens, lay->block_size);
    kvr_plan_t *plan = kvr__plan_new(end > first ? 2 * (size_t)(end - first) : 1);
    if (plan == NULL)
        return KVR_ERR_NO_MEMORY;
    kvr_status_t st = KVR_OK;
    for (uint64_t j = first; j < end && st == KVR_OK; j++) {
        if (kind == KVR__KIND_INDEX_REPL)
            st = push_index_repl(lay, pair, req, j, plan);
        else if (kind == KVR__KIND_INDEX_SHARD)
            st = push_index_shard(lay, rank, pair, req, j, plan);
        else
            st = push_page(pair, req, j, plan);
    }
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
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    kvr_status_t st = kvr__check_request(lay, rank, req, &info, err);
    if (st == KVR_OK)
        st = kvr__check_pair(lay, pair, req, &info, &kind, err);
    if (st != KVR_OK)
        return st;
    kvr_plan_t *plan = NULL;
    st = kvr__plan_kind(lay, rank, pair, req, kind, &plan);
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
        plan->bytes += runs[i].len;
        if (runs[i].src + runs[i].len > plan->src_end)
            plan->src_end = runs[i].src + runs[i].len;
        if (runs[i].dst + runs[i].len > plan->dst_end)
            plan->dst_end = runs[i].dst + runs[i].len;
    }
    *out = plan;
    return KVR_OK;
}
