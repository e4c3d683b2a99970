/* Plans for many region pairs, one per region class (docs/design.md §4). */
#include <stdlib.h>

#include "plan_internal.h"

struct kvr_plan_set {
    size_t num_pairs;
    size_t num_classes;
    size_t *class_of;       /* per pair */
    kvr_plan_t **plans;     /* per class */
    uint64_t total_bytes;
    uint64_t total_runs;
};

/* Pairs with the same role and widths on both sides share one plan. */
static int same_class(const kvr_region_pair_t *a, const kvr_region_pair_t *b)
{
    return a->src.role == b->src.role &&
           a->src.page_bytes == b->src.page_bytes &&
           a->dst.page_bytes == b->dst.page_bytes &&
           a->src.index_dim == b->src.index_dim &&
           a->src.quant_block == b->src.quant_block &&
           a->dst.index_dim == b->dst.index_dim &&
           a->dst.quant_block == b->dst.quant_block;
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

/* Builds the class plans; the token-space plan is shared by token classes. */
static kvr_status_t build_plans(const kvr_layout_t *lay, uint32_t rank,
                                const kvr_region_pair_t *pairs,
                                const size_t *first, const kvr__kind_t *kinds,
                                const kvr_request_t *req, kvr_plan_set_t *set)
{
    kvr_plan_t *tokens = NULL;
    kvr_status_t st = KVR_OK;
    size_t token_classes = 0;
    for (size_t c = 0; c < set->num_classes; c++)
        token_classes += kinds[c] == KVR__KIND_TOKEN;
    for (size_t c = 0; c < set->num_classes && st == KVR_OK; c++) {
        const kvr_region_pair_t *p = &pairs[first[c]];
        if (kinds[c] != KVR__KIND_TOKEN) {
            st = kvr__plan_kind(lay, rank, p, req, kinds[c], &set->plans[c]);
            continue;
        }
        if (tokens == NULL)
            st = kvr__plan_tokens(lay, rank, req, &tokens);
        uint64_t unit = kvr_region_token_bytes(lay, &p->src);
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

static kvr_status_t classify(const kvr_layout_t *lay,
                             const kvr_region_pair_t *pairs, size_t n,
                             const kvr_request_t *req,
                             const kvr__req_info_t *info, size_t *first,
                             kvr__kind_t *kinds, kvr_plan_set_t *set,
                             kvr_error_t *err)
{
    for (size_t i = 0; i < n; i++) {
        kvr__kind_t kind;
        kvr_status_t st = kvr__check_pair(lay, &pairs[i], req, info, &kind, err);
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
                                 "than 2^64 bytes", set->num_pairs);
        set->total_runs += plan->num_runs;
    }
    return KVR_OK;
}

kvr_status_t kvr_plan_set_create(const kvr_layout_t *lay, uint32_t rank,
                                 const kvr_region_pair_t *pairs,
                                 size_t num_pairs, const kvr_request_t *req,
                                 kvr_plan_set_t **out, kvr_error_t *err)
{
    kvr__req_info_t info;
    if (out == NULL || (num_pairs && pairs == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "pairs or out is NULL");
    kvr_status_t st = kvr__check_request(lay, rank, req, &info, err);
    if (st != KVR_OK)
        return st;
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
    st = classify(lay, pairs, num_pairs, req, &info, first, kinds, set, err);
    if (st == KVR_OK) {
        st = build_plans(lay, rank, pairs, first, kinds, req, set);
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
