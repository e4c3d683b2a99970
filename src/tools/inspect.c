/* Per-token decode of received pages (see kvrelay/inspect.h). Placement comes
 * from the layout math alone, never from the planner, so a planner bug cannot
 * hide itself: every token is located on both sides from §2-3's formulas and
 * compared part by part (latent; index key and scale). */
#include "kvrelay/inspect.h"

#include <stdlib.h>
#include <string.h>

#include "kvrelay/synth.h"
#include "layout_math.h"

typedef unsigned long long ull;

#define MAX_INDEX_DIM 1024 /* kvr_synth's key buffer */

/* Where one token lives in one image. */
typedef struct {
    const uint8_t *base;
    uint64_t page; /* byte offset of the token's page (latent: the token) */
    uint64_t t, P; /* index: slot in a page of P tokens */
    bool plain;    /* token order: latent, or D key bytes then the scale */
} loc_t;

typedef struct {
    const kvr_layout_t *lay;
    const kvr_region_pair_t *pair;
    const kvr_request_t *req;
    const kvr_inspect_opts_t *opts;
    kvr_inspect_result_t *res;
    uint32_t rank;
    uint64_t tb; /* MLA token bytes */
    uint64_t D;  /* index dim */
} ictx_t;

const char *kvr_inspect_part_name(uint32_t part)
{
    switch (part) {
    case KVR_INSPECT_PART_LATENT:
        return "latent";
    case KVR_INSPECT_PART_KEY:
        return "key";
    case KVR_INSPECT_PART_SCALE:
        return "scale";
    }
    return "?";
}

const char *kvr_inspect_kind_name(kvr_inspect_kind_t kind)
{
    switch (kind) {
    case KVR_INSPECT_WRONG:
        return "wrong";
    case KVR_INSPECT_SCALE:
        return "scale";
    case KVR_INSPECT_SOURCE:
        return "source";
    }
    return "?";
}

static uint64_t part_len(const ictx_t *c, uint32_t part)
{
    if (part == KVR_INSPECT_PART_LATENT)
        return c->tb;
    return part == KVR_INSPECT_PART_KEY ? c->D : 4;
}

/* Byte offset of byte i (token order) of a part. */
static uint64_t byte_off(const ictx_t *c, uint32_t part, const loc_t *l,
                         uint64_t i)
{
    if (part == KVR_INSPECT_PART_LATENT)
        return l->page + i;
    if (l->plain)
        return l->page + (part == KVR_INSPECT_PART_KEY ? i : c->D + i);
    if (part == KVR_INSPECT_PART_KEY)
        return l->page + kvr__index_key_off(l->t, i, c->D, c->lay->preshuffle);
    return l->page + kvr__index_scale_off(l->t, l->P, c->D) + i;
}

/* First differing byte of a part, or UINT64_MAX. Compares contiguous
 * segments (16 bytes of a preshuffled key, else the whole part). */
static uint64_t first_diff(const ictx_t *c, uint32_t part, const loc_t *a,
                           const loc_t *b)
{
    uint64_t len = part_len(c, part);
    uint64_t seg = part == KVR_INSPECT_PART_KEY && c->lay->preshuffle ? 16
                                                                      : len;
    for (uint64_t i = 0; i < len; i += seg) {
        const uint8_t *x = a->base + byte_off(c, part, a, i);
        const uint8_t *y = b->base + byte_off(c, part, b, i);
        if (memcmp(x, y, seg) == 0)
            continue;
        uint64_t j = 0;
        while (x[j] == y[j])
            j++;
        return i + j;
    }
    return UINT64_MAX;
}

static size_t kept(const kvr_inspect_result_t *res, kvr_inspect_kind_t kind)
{
    size_t n = 0;
    for (size_t i = 0; i < res->num_diffs; i++)
        n += res->diffs[i].kind == kind;
    return n;
}

/* Counts a finding and keeps the first max_report of its kind. */
static void record(const ictx_t *c, kvr_inspect_kind_t kind, uint64_t g,
                   uint32_t parts, uint32_t part, uint64_t byte,
                   const loc_t *want, const loc_t *got)
{
    kvr_inspect_result_t *res = c->res;
    res->found[kind]++;
    if (res->num_diffs >= res->diffs_cap ||
        kept(res, kind) >= c->opts->max_report)
        return;
    kvr_inspect_diff_t d = {.kind = kind,
                            .rank = c->rank,
                            .parts = parts,
                            .token = g,
                            .part = part,
                            .byte = byte};
    uint64_t len = part_len(c, part) - byte;
    d.excerpt_len = (uint32_t)(len < KVR_INSPECT_EXCERPT ? len
                                                         : KVR_INSPECT_EXCERPT);
    for (uint32_t j = 0; j < d.excerpt_len; j++) {
        d.expected[j] = want->base[byte_off(c, part, want, byte + j)];
        d.found[j] = got->base[byte_off(c, part, got, byte + j)];
    }
    d.src_offset = want->plain ? byte_off(c, part, got, byte)
                               : byte_off(c, part, want, byte);
    d.dst_offset = byte_off(c, part, got, byte);
    res->diffs[res->num_diffs++] = d;
}

/* Compares every part of token g: `want` against `got`. */
static void compare_token(const ictx_t *c, kvr_inspect_kind_t kind, uint64_t g,
                          const loc_t *want, const loc_t *got)
{
    static const uint32_t parts[] = {
        KVR_INSPECT_PART_LATENT, KVR_INSPECT_PART_KEY, KVR_INSPECT_PART_SCALE};
    bool index = c->pair->src.role == KVR_ROLE_INDEX;
    uint32_t bad = 0, first = 0;
    uint64_t first_byte = 0;
    c->res->checked[kind]++;
    for (size_t i = index ? 1 : 0; i < (index ? 3u : 1u); i++) {
        uint64_t b = first_diff(c, parts[i], want, got);
        if (b == UINT64_MAX)
            continue;
        if (bad == 0) {
            first = parts[i];
            first_byte = b;
        }
        bad |= parts[i];
    }
    if (bad != 0)
        record(c, kind, g, bad, first, first_byte, want, got);
}

/* Received index token: does its scale match its keys (synthetic data)? */
static void check_scale(const ictx_t *c, uint64_t g, const loc_t *got)
{
    c->res->checked[KVR_INSPECT_SCALE]++;
    if (kvr_synth_check_index_token(c->lay, got->base + got->page, got->P,
                                    got->t, (uint32_t)c->D, g, NULL) == KVR_OK)
        return;
    uint8_t want[MAX_INDEX_DIM + 4];
    for (uint64_t d = 0; d < c->D; d++)
        want[d] = got->base[byte_off(c, KVR_INSPECT_PART_KEY, got, d)];
    float s = kvr_synth_index_scale(want, (uint32_t)c->D);
    memcpy(want + c->D, &s, sizeof(s));
    loc_t derived = {.base = want, .plain = true};
    record(c, KVR_INSPECT_SCALE, g, KVR_INSPECT_PART_SCALE,
           KVR_INSPECT_PART_SCALE, 0, &derived, got);
}

/* Token g in the producer image. */
static loc_t src_loc(const ictx_t *c, const uint8_t *src, uint64_t g)
{
    uint64_t bs = c->lay->block_size;
    uint64_t slot = kvr__src_slot(c->req->src_blocks, g, bs);
    if (c->pair->src.role == KVR_ROLE_MLA)
        return (loc_t){src, slot * c->tb, 0, 0, false};
    return (loc_t){src, slot / bs * c->pair->src.page_bytes, slot % bs, bs,
                   false};
}

/* Token g in a consumer image: sharded slot on its owner, or the replicated
 * index page of V tokens. */
static loc_t dst_loc(const ictx_t *c, const uint8_t *dst, uint64_t g)
{
    uint64_t bs = c->lay->block_size, W = c->lay->dcp_size;
    uint64_t I = c->lay->interleave;
    if (c->pair->dst.role == KVR_ROLE_INDEX && c->lay->replicate_index) {
        uint64_t slot = kvr__dst_slot_repl(c->req->dst_blocks, g, bs, W);
        return (loc_t){dst, slot / (bs * W) * c->pair->dst.page_bytes,
                       slot % (bs * W), bs * W, false};
    }
    uint64_t slot = kvr__dst_slot(c->req->dst_blocks, g, bs, I, W);
    if (c->pair->dst.role == KVR_ROLE_MLA)
        return (loc_t){dst, slot * c->tb, 0, 0, false};
    return (loc_t){dst, slot / bs * c->pair->dst.page_bytes, slot % bs, bs,
                   false};
}

static bool rank_holds(const ictx_t *c, uint64_t g)
{
    if (c->pair->src.role == KVR_ROLE_INDEX && c->lay->replicate_index)
        return true;
    return kvr__owner(g, c->lay->interleave, c->lay->dcp_size) == c->rank;
}

static uint64_t first_token(const ictx_t *c)
{
    return c->req->num_computed_blocks * c->lay->block_size * c->lay->dcp_size;
}

/* ---- validation: every input checked, every offset in bounds ---- */

static kvr_status_t check_pair(const kvr_layout_t *lay,
                               const kvr_region_pair_t *p, bool synthetic,
                               kvr_error_t *err)
{
    const kvr_region_desc_t *s = &p->src, *d = &p->dst;
    if (s->role != d->role)
        return kvr_error_set(err, KVR_ERR_ROLE_MISMATCH,
                             "producer region is "
                             "%s, consumer region is %s",
                             kvr_role_name(s->role), kvr_role_name(d->role));
    if (s->role != KVR_ROLE_MLA && s->role != KVR_ROLE_INDEX)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "inspect decodes mla and "
                             "index regions, not %s",
                             kvr_role_name(s->role));
    kvr_status_t st = kvr_region_check(lay, s, false, err);
    if (st == KVR_OK)
        st = kvr_region_check(lay, d, true, err);
    if (st != KVR_OK)
        return st;
    if (s->role == KVR_ROLE_MLA) {
        if (s->page_bytes != d->page_bytes)
            return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                                 "mla layer %u: "
                                 "producer page bytes %llu, consumer %llu",
                                 s->layer, (ull)s->page_bytes,
                                 (ull)d->page_bytes);
        return KVR_OK;
    }
    if (s->index_dim != d->index_dim)
        return kvr_error_set(err, KVR_ERR_PAGE_GEOMETRY,
                             "index layer %u: "
                             "producer D=%u, consumer D=%u",
                             s->layer, s->index_dim, d->index_dim);
    if (!lay->replicate_index && lay->dcp_size > 1 &&
        lay->interleave != lay->block_size)
        return kvr_error_set(err, KVR_ERR_SHARDED_INDEX_INTERLEAVE,
                             "sharded index under W=%u needs I == bs (I=%u, "
                             "bs=%u)",
                             lay->dcp_size, lay->interleave, lay->block_size);
    if (synthetic && s->index_dim > MAX_INDEX_DIM)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "index D=%u > %d is not "
                             "synthetic data",
                             s->index_dim, MAX_INDEX_DIM);
    return KVR_OK;
}

static kvr_status_t check_image(const kvr_region_desc_t *r, const void *base,
                                uint64_t len, const char *side,
                                kvr_error_t *err)
{
    uint64_t need;
    if (base == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "%s image is NULL", side);
    if (__builtin_mul_overflow(r->num_blocks, r->page_bytes, &need))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%s region: %llu blocks x "
                             "%llu bytes overflows",
                             side, (ull)r->num_blocks, (ull)r->page_bytes);
    if (len < need)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%s image holds %llu bytes, "
                             "its region needs %llu blocks x %llu = %llu",
                             side, (ull)len, (ull)r->num_blocks,
                             (ull)r->page_bytes, (ull)need);
    return KVR_OK;
}

static kvr_status_t check_ids(const uint32_t *ids, uint64_t from, uint64_t to,
                              const kvr_region_desc_t *r, const char *side,
                              kvr_error_t *err)
{
    for (uint64_t i = from; i < to; i++)
        if (ids[i] >= r->num_blocks)
            return kvr_error_set(err, KVR_ERR_BLOCK_RANGE,
                                 "%s block id %u at "
                                 "table index %llu is outside the region's "
                                 "%llu blocks",
                                 side, ids[i], (ull)i, (ull)r->num_blocks);
    return KVR_OK;
}

/* Table lengths, incremental offset and block ids of the tokens checked. */
static kvr_status_t check_request(const kvr_layout_t *lay,
                                  const kvr_region_pair_t *p,
                                  const kvr_request_t *q, kvr_error_t *err)
{
    uint64_t N = q->num_tokens, k = q->num_computed_blocks,
             bs = lay->block_size;
    uint64_t V = bs * lay->dcp_size, kV, kW;
    if ((q->num_src_blocks && !q->src_blocks) ||
        (q->num_dst_blocks && !q->dst_blocks) || N > (1ull << 48))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "request: NULL block table "
                             "or %llu tokens",
                             (ull)N);
    uint64_t end_src = kvr__ceil_div(N, bs), end_dst = kvr__ceil_div(N, V);
    if (end_src > q->num_src_blocks || end_dst > q->num_dst_blocks)
        return kvr_error_set(err,
                             end_src > q->num_src_blocks
                                 ? KVR_ERR_SRC_TABLE_SHORT
                                 : KVR_ERR_DST_TABLE_SHORT,
                             "%llu tokens need %llu source and %llu "
                             "destination blocks; the tables have %zu and %zu",
                             (ull)N, (ull)end_src, (ull)end_dst,
                             q->num_src_blocks, q->num_dst_blocks);
    if (k != 0 && (__builtin_mul_overflow(k, V, &kV) || kV >= N ||
                   __builtin_mul_overflow(k, (uint64_t)lay->dcp_size, &kW)))
        return kvr_error_set(err, KVR_ERR_INCREMENTAL,
                             "num_computed_blocks "
                             "%llu x V=%llu is not below %llu tokens",
                             (ull)k, (ull)V, (ull)N);
    kvr_status_t st = check_ids(q->src_blocks, k * lay->dcp_size, end_src,
                                &p->src, "source", err);
    return st != KVR_OK ? st
                        : check_ids(q->dst_blocks, k, end_dst, &p->dst,
                                    "destination", err);
}

static kvr_status_t check_all(const kvr_layout_t *lay, uint32_t rank,
                              const kvr_region_pair_t *pair,
                              const kvr_request_t *req,
                              const kvr_inspect_opts_t *opts,
                              const kvr_inspect_result_t *res, kvr_error_t *err)
{
    if (pair == NULL || req == NULL || res == NULL ||
        (res->diffs_cap && res->diffs == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "NULL region pair, request "
                             "or result");
    kvr_status_t st = kvr_layout_check_rank(lay, rank, err);
    if (st == KVR_OK)
        st = check_pair(lay, pair, opts->synthetic, err);
    return st != KVR_OK ? st : check_request(lay, pair, req, err);
}

static ictx_t make_ctx(const kvr_layout_t *lay, uint32_t rank,
                       const kvr_region_pair_t *pair, const kvr_request_t *req,
                       const kvr_inspect_opts_t *opts,
                       kvr_inspect_result_t *res)
{
    ictx_t c = {lay, pair, req, opts, res, rank, 0, pair->src.index_dim};
    if (pair->src.role == KVR_ROLE_MLA)
        c.tb = pair->src.page_bytes / lay->block_size;
    return c;
}

static kvr_inspect_opts_t effective_opts(const kvr_inspect_opts_t *opts)
{
    kvr_inspect_opts_t o = KVR_INSPECT_OPTS_INIT;
    if (opts != NULL)
        o = *opts;
    if (o.max_report == 0)
        o.max_report = KVR_INSPECT_DEFAULT_REPORT;
    return o;
}

kvr_status_t kvr_inspect_buffers(const kvr_layout_t *lay, uint32_t rank,
                                 const kvr_region_pair_t *pair,
                                 const kvr_request_t *req, const void *src,
                                 uint64_t src_len, const void *dst,
                                 uint64_t dst_len,
                                 const kvr_inspect_opts_t *opts,
                                 kvr_inspect_result_t *res, kvr_error_t *err)
{
    kvr_inspect_opts_t o = effective_opts(opts);
    kvr_status_t st = check_all(lay, rank, pair, req, &o, res, err);
    if (st == KVR_OK)
        st = check_image(&pair->src, src, src_len, "source", err);
    if (st == KVR_OK)
        st = check_image(&pair->dst, dst, dst_len, "destination", err);
    if (st != KVR_OK)
        return st;
    ictx_t c = make_ctx(lay, rank, pair, req, &o, res);
    bool scales = o.synthetic && pair->src.role == KVR_ROLE_INDEX;
    for (uint64_t g = first_token(&c); g < req->num_tokens; g++) {
        if (!rank_holds(&c, g))
            continue;
        loc_t want = src_loc(&c, src, g), got = dst_loc(&c, dst, g);
        compare_token(&c, KVR_INSPECT_WRONG, g, &want, &got);
        if (scales)
            check_scale(&c, g, &got);
    }
    return KVR_OK;
}

/* The synthetic token g in token order (latent, or key then scale). */
static void synth_token(const ictx_t *c, uint64_t g, uint32_t token_id,
                        uint8_t *out)
{
    uint32_t layer = c->pair->src.layer;
    if (c->pair->src.role == KVR_ROLE_MLA) {
        kvr_synth_latent(c->opts->seed, layer, g, token_id, out, c->tb);
        return;
    }
    kvr_synth_index_key(c->opts->seed, layer, g, token_id, out, (uint32_t)c->D);
    float s = kvr_synth_index_scale(out, (uint32_t)c->D);
    memcpy(out + c->D, &s, sizeof(s));
}

kvr_status_t kvr_inspect_source(const kvr_layout_t *lay,
                                const kvr_region_pair_t *pair,
                                const kvr_request_t *req,
                                const uint32_t *token_ids, const void *src,
                                uint64_t src_len,
                                const kvr_inspect_opts_t *opts,
                                kvr_inspect_result_t *res, kvr_error_t *err)
{
    kvr_inspect_opts_t o = effective_opts(opts);
    o.synthetic = true;
    kvr_status_t st = check_all(lay, 0, pair, req, &o, res, err);
    if (st == KVR_OK)
        st = check_image(&pair->src, src, src_len, "source", err);
    if (st == KVR_OK && token_ids == NULL && req->num_tokens > 0)
        st = kvr_error_set(err, KVR_ERR_INVALID, "token ids are NULL");
    if (st != KVR_OK)
        return st;
    ictx_t c = make_ctx(lay, 0, pair, req, &o, res);
    uint8_t *buf = malloc(c.tb + c.D + 4);
    if (buf == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                             "no memory for a %llu-byte "
                             "token",
                             (ull)(c.tb + c.D + 4));
    for (uint64_t g = first_token(&c); g < req->num_tokens; g++) {
        synth_token(&c, g, token_ids[g], buf);
        loc_t want = {.base = buf, .plain = true}, got = src_loc(&c, src, g);
        compare_token(&c, KVR_INSPECT_SOURCE, g, &want, &got);
    }
    free(buf);
    return KVR_OK;
}
