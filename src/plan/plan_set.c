/* Plans for many region pairs, one per region class (docs/design.md §4). */
#include <stdlib.h>

#include "plan_internal.h"

struct kvr_plan_set {
    size_t num_pairs;
    size_t num_classes;
    size_t *class_of;   /* per pair */
    kvr_plan_t **plans; /* per class */
    uint64_t total_bytes;
    uint64_t total_runs;
};

/* Head geometry of a dense region (twins are checked equal per pair). */
static int same_heads(const kvr_region_desc_t *a, const kvr_region_desc_t *b)
{
    return a->heads == b->heads && a->head_dim == b->head_dim &&
           a->elem_bytes == b->elem_bytes && a->kv_planes == b->kv_planes &&
           a->hnd == b->hnd;
}

/* Pairs with the same role and widths on both sides share one plan. */
static int same_class(const kvr_region_pair_t *a, const kvr_region_pair_t *b)
{
    return a->src.role == b->src.role &&
           a->src.page_bytes == b->src.page_bytes &&
           a->dst.page_bytes == b->dst.page_bytes &&
           a->src.index_dim == b->src.index_dim &&
           a->src.quant_block == b->src.quant_block &&
           a->dst.index_dim == b->dst.index_dim &&
           a->dst.quant_block == b->dst.quant_block &&
           same_heads(&a->src, &b->src);
}

void kvr_plan_set_destroy(kvr_plan_set_t *set)
{
    if (set == NULL)
        return;
    for (size_t c = 0; c < set->num_classes; c++)
        kvr_plan_destroy(set->plans[c]);
    free(set->plans);
    free(set->class_of);
    free(set);
}

static size_t find_class(const kvr_region_pair_t *pairs, const size_t *first,
                         size_t num_classes, const kvr_region_pair_t *p)
{
    for (size_t c = 0; c < num_classes; c++)
        if (same_class(&pairs[first[c]], p))
            return c;
    return num_classes;
}

/* Builds the class plans; the token-space plan is shared by token classes.
 * Token bytes are the consumer's (page_bytes / bs): the twins check made
 * them the producer's too, whatever its block size. */
static kvr_status_t build_plans(const kvr__planner_t *pl,
                                const kvr_region_pair_t *pairs,
                                const size_t *first, const kvr__kind_t *kinds,
                                kvr_plan_set_t *set)
{
    kvr_plan_t *tokens = NULL;
    kvr_status_t st = KVR_OK;
    size_t token_classes = 0;
    for (size_t c = 0; c < set->num_classes; c++)
        token_classes += kinds[c] == KVR__KIND_TOKEN;
    for (size_t c = 0; c < set->num_classes && st == KVR_OK; c++) {
        const kvr_region_pair_t *p = &pairs[first[c]];
        if (kinds[c] != KVR__KIND_TOKEN) {
            st = pl->plan(pl->ctx, p, kinds[c], &set->plans[c]);
            continue;
        }
        if (tokens == NULL)
            st = pl->tokens(pl->ctx, &tokens);
        uint64_t unit = kvr_region_token_bytes(pl->lay, &p->dst);
        if (st == KVR_OK && --token_classes == 0) { /* the last one keeps it */
            kvr__plan_scale(tokens, unit);
            set->plans[c] = tokens;
            tokens = NULL;
        } else if (st == KVR_OK) {
            st = kvr__plan_scaled(tokens, unit, &set->plans[c]);
        }
    }
    kvr_plan_destroy(tokens);
    return st;
}

static kvr_status_t classify(const kvr__planner_t *pl,
                             const kvr_region_pair_t *pairs, size_t n,
                             size_t *first, kvr__kind_t *kinds,
                             kvr_plan_set_t *set, kvr_error_t *err)
{
    for (size_t i = 0; i < n; i++) {
        kvr__kind_t kind;
        kvr_status_t st = pl->check(pl->ctx, &pairs[i], &kind, err);
        if (st != KVR_OK)
            return st;
        size_t c = find_class(pairs, first, set->num_classes, &pairs[i]);
        if (c == set->num_classes) {
            first[c] = i;
            kinds[c] = kind;
            set->num_classes++;
        }
        set->class_of[i] = c;
    }
    return KVR_OK;
}

static kvr_status_t finish_set(const kvr_region_pair_t *pairs,
                               kvr_plan_set_t *set, kvr_error_t *err)
{
    for (size_t i = 0; i < set->num_pairs; i++) {
        const kvr_plan_t *plan = set->plans[set->class_of[i]];
        kvr_status_t st = kvr__check_plan_bounds(plan, &pairs[i], err);
        if (st != KVR_OK)
            return st;
        if (__builtin_add_overflow(set->total_bytes, plan->bytes,
                                   &set->total_bytes))
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "the plans of %zu region pairs total more "
                                 "than 2^64 bytes",
                                 set->num_pairs);
        set->total_runs += plan->num_runs;
    }
    return KVR_OK;
}

kvr_status_t kvr__plan_set_build(const kvr__planner_t *pl,
                                 const kvr_region_pair_t *pairs,
                                 size_t num_pairs, kvr_plan_set_t **out,
                                 kvr_error_t *err)
{
    kvr_status_t st;
    kvr_plan_set_t *set = calloc(1, sizeof(*set));
    size_t *first = calloc(num_pairs + 1, sizeof(*first));
    kvr__kind_t *kinds = calloc(num_pairs + 1, sizeof(*kinds));
    if (set == NULL || first == NULL || kinds == NULL)
        goto no_memory;
    set->num_pairs = num_pairs;
    set->class_of = calloc(num_pairs + 1, sizeof(*set->class_of));
    set->plans = calloc(num_pairs + 1, sizeof(*set->plans));
    if (set->class_of == NULL || set->plans == NULL)
        goto no_memory;
    st = classify(pl, pairs, num_pairs, first, kinds, set, err);
    if (st == KVR_OK) {
        st = build_plans(pl, pairs, first, kinds, set);
        if (st != KVR_OK)
            kvr_error_set(err, st, "no memory for plans");
    }
    if (st == KVR_OK)
        st = finish_set(pairs, set, err);
    free(first);
    free(kinds);
    if (st != KVR_OK) {
        kvr_plan_set_destroy(set);
        return st;
    }
    *out = set;
    return KVR_OK;
no_memory:
    free(first);
    free(kinds);
    kvr_plan_set_destroy(set);
    return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %zu pairs",
                         num_pairs);
}

/* The single-producer planner of kvr_plan_set_create (docs/design.md §4). */
typedef struct {
    const kvr_layout_t *lay;
    uint32_t rank;
    const kvr_request_t *req;
    kvr__req_info_t info;
} rank_planner_t;

static kvr_status_t rank_check(void *ctx, const kvr_region_pair_t *pair,
                               kvr__kind_t *kind, kvr_error_t *err)
{
    rank_planner_t *r = ctx;
    return kvr__check_pair(r->lay, pair, r->req, &r->info, kind, err);
}

static kvr_status_t rank_tokens(void *ctx, kvr_plan_t **out)
{
    rank_planner_t *r = ctx;
    return kvr__plan_tokens(r->lay, r->rank, r->req, out);
}

static kvr_status_t rank_plan(void *ctx, const kvr_region_pair_t *pair,
                              kvr__kind_t kind, kvr_plan_t **out)
{
    rank_planner_t *r = ctx;
    return kvr__plan_kind(r->lay, r->rank, pair, r->req, kind, out);
}

kvr_status_t kvr_plan_set_create(const kvr_layout_t *lay, uint32_t rank,
                                 const kvr_region_pair_t *pairs,
                                 size_t num_pairs, const kvr_request_t *req,
                                 kvr_plan_set_t **out, kvr_error_t *err)
{
    rank_planner_t r = {lay, rank, req, {0}};
    if (out == NULL || (num_pairs && pairs == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "pairs or out is NULL");
    kvr_status_t st = kvr__check_request(lay, rank, req, &r.info, err);
    if (st != KVR_OK)
        return st;
    kvr__planner_t pl = {lay, &r, rank_check, rank_tokens, rank_plan};
    return kvr__plan_set_build(&pl, pairs, num_pairs, out, err);
}

size_t kvr_plan_set_num_classes(const kvr_plan_set_t *set)
{
    return set ? set->num_classes : 0;
}

const kvr_plan_t *kvr_plan_set_class(const kvr_plan_set_t *set, size_t cls)
{
    return set && cls < set->num_classes ? set->plans[cls] : NULL;
}

size_t kvr_plan_set_class_of(const kvr_plan_set_t *set, size_t pair)
{
    return set && pair < set->num_pairs ? set->class_of[pair] : SIZE_MAX;
}

const kvr_plan_t *kvr_plan_set_plan_of(const kvr_plan_set_t *set, size_t pair)
{
    return kvr_plan_set_class(set, kvr_plan_set_class_of(set, pair));
}

uint64_t kvr_plan_set_total_bytes(const kvr_plan_set_t *set)
{
    return set ? set->total_bytes : 0;
}

uint64_t kvr_plan_set_total_runs(const kvr_plan_set_t *set)
{
    return set ? set->total_runs : 0;
}
