/* The agent's plan cache: see plan_cache.h. */
#include "plan_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"

#define BUCKETS 256u

/* A region descriptor field added without being keyed here would let two
 * different geometries share a plan: the build stops until it is keyed. */
_Static_assert(sizeof(kvr_region_desc_t) == 64,
               "kvr_region_desc_t changed: key its new fields in same_desc "
               "and hash_desc");

struct kvr__pentry {
    kvr__pcache_t *cache;
    kvr__pentry_t *next; /* bucket chain */
    kvr__pentry_t *idle_prev, *idle_next;
    uint64_t hash;
    uint32_t refs;
    uint32_t prank, crank; /* producer and consumer rank of the pair plan */
    kvr_region_pair_t *classes; /* one pair per class, the first seen */
    size_t nclasses;
    uint32_t *src, *dst;
    size_t nsrc, ndst;
    uint64_t tokens, computed;
    kvr_plan_set_t *set;
};

struct kvr__pcache {
    kvr_layout_t lay;
    kvr__pentry_t *buckets[BUCKETS];
    kvr__pentry_t *idle_head, *idle_tail; /* refs == 0, oldest first */
    size_t keep, idle, entries;
    uint64_t hits, misses;
};

/* Every field but the layer. Each is set: ours as registered, a peer's
 * decoded from REGIONS, which carries every field (the dense head
 * geometry too) into a zeroed record. */
static bool same_desc(const kvr_region_desc_t *a, const kvr_region_desc_t *b)
{
    return a->role == b->role && a->num_blocks == b->num_blocks &&
           a->page_bytes == b->page_bytes && a->index_dim == b->index_dim &&
           a->quant_block == b->quant_block && a->bytes == b->bytes &&
           a->heads == b->heads && a->head_dim == b->head_dim &&
           a->elem_bytes == b->elem_bytes && a->kv_planes == b->kv_planes &&
           a->hnd == b->hnd;
}

/* Pairs of one class: the same geometry on both sides, each pairing a
 * layer with the same layer (a pair that does not is its own class, so the
 * planner still sees it). */
static bool same_pair(const kvr_region_pair_t *a, const kvr_region_pair_t *b)
{
    return a->src.layer == a->dst.layer && b->src.layer == b->dst.layer &&
           same_desc(&a->src, &b->src) && same_desc(&a->dst, &b->dst);
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static uint64_t hash_desc(uint64_t h, const kvr_region_desc_t *d)
{
    h = mix(h, (uint64_t)d->role);
    h = mix(h, d->num_blocks);
    h = mix(h, d->page_bytes);
    h = mix(h, ((uint64_t)d->index_dim << 32) | d->quant_block);
    h = mix(h, d->bytes);
    h = mix(h, ((uint64_t)d->heads << 32) | d->head_dim);
    h = mix(h, ((uint64_t)d->elem_bytes << 32) | d->kv_planes);
    return mix(h, d->hnd);
}

static uint64_t hash_ids(uint64_t h, const uint32_t *ids, size_t n)
{
    h = mix(h, n);
    for (size_t i = 0; i < n; i++)
        h = mix(h, ids[i]);
    return h;
}

static uint64_t hash_key(uint32_t prank, uint32_t crank,
                         const kvr_region_pair_t *classes, size_t k,
                         const kvr_request_t *req)
{
    uint64_t h = mix(0x6b767265ull, ((uint64_t)prank << 32) | crank);
    for (size_t i = 0; i < k; i++) {
        h = hash_desc(h, &classes[i].src);
        h = hash_desc(h, &classes[i].dst);
        h = mix(h, classes[i].src.layer == classes[i].dst.layer);
    }
    h = mix(h, req->num_tokens);
    h = mix(h, req->num_computed_blocks);
    h = hash_ids(h, req->src_blocks, req->num_src_blocks);
    return hash_ids(h, req->dst_blocks, req->num_dst_blocks);
}

static bool same_ids(const uint32_t *a, size_t na, const uint32_t *b,
                     size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
}

static bool matches(const kvr__pentry_t *e, uint64_t hash, uint32_t prank,
                    uint32_t crank, const kvr_region_pair_t *classes, size_t k,
                    const kvr_request_t *req)
{
    if (e->hash != hash || e->prank != prank || e->crank != crank ||
        e->nclasses != k ||
        e->tokens != req->num_tokens ||
        e->computed != req->num_computed_blocks ||
        !same_ids(e->src, e->nsrc, req->src_blocks, req->num_src_blocks) ||
        !same_ids(e->dst, e->ndst, req->dst_blocks, req->num_dst_blocks))
        return false;
    for (size_t i = 0; i < k; i++)
        if (!same_pair(&e->classes[i], &classes[i]))
            return false;
    return true;
}

kvr__pcache_t *kvr__pcache_create(const kvr_layout_t *lay, size_t keep)
{
    kvr__pcache_t *c = calloc(1, sizeof(*c));
    if (c != NULL) {
        c->lay = *lay;
        c->keep = keep;
    }
    return c;
}

static void entry_free(kvr__pentry_t *e)
{
    kvr_plan_set_destroy(e->set);
    free(e->classes);
    free(e->src);
    free(e->dst);
    free(e);
}

void kvr__pcache_destroy(kvr__pcache_t *c)
{
    if (c == NULL)
        return;
    for (size_t b = 0; b < BUCKETS; b++)
        for (kvr__pentry_t *e = c->buckets[b], *n; e != NULL; e = n) {
            n = e->next;
            entry_free(e);
        }
    free(c);
}

static void idle_unlink(kvr__pcache_t *c, kvr__pentry_t *e)
{
    if (e->idle_prev)
        e->idle_prev->idle_next = e->idle_next;
    else
        c->idle_head = e->idle_next;
    if (e->idle_next)
        e->idle_next->idle_prev = e->idle_prev;
    else
        c->idle_tail = e->idle_prev;
    e->idle_prev = e->idle_next = NULL;
    c->idle--;
}

static void evict(kvr__pcache_t *c, kvr__pentry_t *e)
{
    idle_unlink(c, e);
    kvr__pentry_t **p = &c->buckets[e->hash % BUCKETS];
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    c->entries--;
    entry_free(e);
}

static uint32_t *copy_ids(const uint32_t *ids, size_t n)
{
    uint32_t *out = malloc((n + 1) * sizeof(*out));
    if (out != NULL && n > 0)
        memcpy(out, ids, n * sizeof(*out));
    return out;
}

static kvr_status_t add_entry(kvr__pcache_t *c, uint64_t hash,
                              uint32_t prank, uint32_t crank,
                              const kvr_region_pair_t *classes, size_t k,
                              const kvr_request_t *req, kvr__pentry_t **out,
                              kvr_error_t *err)
{
    kvr__pentry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for a plan");
    e->classes = malloc((k + 1) * sizeof(*e->classes));
    e->src = copy_ids(req->src_blocks, req->num_src_blocks);
    e->dst = copy_ids(req->dst_blocks, req->num_dst_blocks);
    kvr_status_t st = e->classes && e->src && e->dst
                          ? kvr_plan_set_create_pair(&c->lay, prank, crank,
                                                     classes, k, req, &e->set,
                                                     err)
                          : kvr_error_set(err, KVR_ERR_NO_MEMORY,
                                          "no memory for a plan");
    if (st != KVR_OK) {
        entry_free(e);
        return st;
    }
    memcpy(e->classes, classes, k * sizeof(*classes));
    *e = (kvr__pentry_t){.cache = c,
                         .hash = hash,
                         .refs = 1,
                         .prank = prank,
                         .crank = crank,
                         .classes = e->classes,
                         .nclasses = k,
                         .src = e->src,
                         .dst = e->dst,
                         .nsrc = req->num_src_blocks,
                         .ndst = req->num_dst_blocks,
                         .tokens = req->num_tokens,
                         .computed = req->num_computed_blocks,
                         .set = e->set,
                         .next = c->buckets[hash % BUCKETS]};
    c->buckets[hash % BUCKETS] = e;
    c->entries++;
    *out = e;
    return KVR_OK;
}

/* The distinct classes of pairs, and each pair's class. */
static size_t classify(const kvr_region_pair_t *pairs, size_t n,
                       kvr_region_pair_t *classes, size_t *class_of)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < k && !same_pair(&classes[j], &pairs[i]))
            j++;
        if (j == k)
            classes[k++] = pairs[i];
        class_of[i] = j;
    }
    return k;
}

static kvr__pentry_t *lookup(kvr__pcache_t *c, uint64_t hash, uint32_t prank,
                             uint32_t crank, const kvr_region_pair_t *classes,
                             size_t k, const kvr_request_t *req)
{
    for (kvr__pentry_t *e = c->buckets[hash % BUCKETS]; e; e = e->next)
        if (matches(e, hash, prank, crank, classes, k, req))
            return e;
    return NULL;
}

kvr_status_t kvr__pcache_plan(kvr__pcache_t *c, uint32_t prank,
                              uint32_t crank, const kvr_region_pair_t *pairs,
                              size_t n,
                              const kvr_request_t *req,
                              const kvr_plan_t **plans, uint64_t *bytes,
                              kvr__pentry_t **entry, kvr_error_t *err)
{
    kvr_region_pair_t *classes = malloc((n + 1) * sizeof(*classes));
    size_t *class_of = malloc((n + 1) * sizeof(*class_of));
    kvr_status_t st = KVR_OK;
    if (classes == NULL || class_of == NULL) {
        st = kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for a plan");
        goto out;
    }
    size_t k = classify(pairs, n, classes, class_of);
    uint64_t hash = hash_key(prank, crank, classes, k, req);
    kvr__pentry_t *e = lookup(c, hash, prank, crank, classes, k, req);
    if (e != NULL) {
        c->hits++;
        if (e->refs++ == 0)
            idle_unlink(c, e);
    } else if ((st = add_entry(c, hash, prank, crank, classes, k, req, &e,
                               err)) == KVR_OK) {
        c->misses++;
    } else {
        goto out;
    }
    *bytes = 0;
    for (size_t i = 0; i < n && st == KVR_OK; i++) {
        plans[i] = kvr_plan_set_plan_of(e->set, class_of[i]);
        if (__builtin_add_overflow(*bytes, kvr_plan_bytes(plans[i]), bytes))
            st = kvr_error_set(err, KVR_ERR_INVALID,
                               "the plans of %zu region pairs total more "
                               "than 2^64 bytes",
                               n);
    }
    if (st == KVR_OK)
        *entry = e;
    else
        kvr__pcache_release(e);
out:
    free(classes);
    free(class_of);
    return st;
}

void kvr__pcache_release(kvr__pentry_t *e)
{
    if (e == NULL || e->refs == 0 || --e->refs > 0)
        return;
    kvr__pcache_t *c = e->cache;
    e->idle_prev = c->idle_tail;
    e->idle_next = NULL;
    if (c->idle_tail)
        c->idle_tail->idle_next = e;
    else
        c->idle_head = e;
    c->idle_tail = e;
    c->idle++;
    while (c->idle > c->keep)
        evict(c, c->idle_head);
}

kvr__pcache_stats_t kvr__pcache_stats(const kvr__pcache_t *c)
{
    kvr__pcache_stats_t s = {c->hits, c->misses, c->entries, c->idle};
    return s;
}

/* ---- the agent's cache ---- */

#define AGENT_KEEP 32u /* unreferenced plans kept per agent */

kvr_status_t kvr__agent_plan(kvr_agent_t *a, uint32_t prank, uint32_t crank,
                             const kvr_region_pair_t *pairs, size_t n,
                             const kvr_request_t *req, kvr__dseg_t *segs,
                             uint64_t *bytes, kvr__pentry_t **ref,
                             kvr_error_t *err)
{
    const kvr_plan_t **plans = malloc((n + 1) * sizeof(*plans));
    if (a->pcache == NULL)
        a->pcache = kvr__pcache_create(&a->p.layout, AGENT_KEEP);
    kvr_status_t st =
        plans != NULL && a->pcache != NULL
            ? kvr__pcache_plan(a->pcache, prank, crank, pairs, n, req, plans,
                               bytes, ref, err)
            : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for a plan");
    for (size_t i = 0; st == KVR_OK && i < n; i++)
        segs[i].plan = plans[i];
    if (st != KVR_OK)
        *bytes = 0;
    free(plans);
    return st;
}
