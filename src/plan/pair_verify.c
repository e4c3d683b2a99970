/* Expected placement of every byte a consumer rank takes, and from which
 * producer rank (docs/design.md §2-3, §18), for the pair verifier and the
 * pair coverage proof (verify.c). Like kvr__expect_foreach it walks tokens
 * one by one with the formulas of layout_math.h, never the pieces and
 * patterns of pair.c, so the plans and this walk are two independent
 * derivations. */
#include "layout_math.h"
#include "plan_internal.h"

typedef struct {
    const kvr_layout_t *lay;
    const kvr_region_pair_t *pair;
    uint32_t c;
    const kvr_request_t *reqs;
    uint32_t only;
    kvr__expect_fn fn;
    void *ctx;
    uint64_t bsp, Wp, Ip, bsc, Wc, Ic; /* raw layout values, no defaults */
} expect_t;

/* The producer rank's own table: reqs[p], or the one request given when
 * the walk is restricted to one producer. */
static const uint32_t *table_of(const expect_t *e, uint32_t p)
{
    return (e->only == KVR__ALL_PRODUCERS ? &e->reqs[p] : e->reqs)->src_blocks;
}

static int wanted(const expect_t *e, uint32_t p)
{
    return e->only == KVR__ALL_PRODUCERS || e->only == p;
}

static const uint32_t *dst_table(const expect_t *e)
{
    return e->reqs->dst_blocks;
}

static int expect_latent(const expect_t *e, uint64_t g)
{
    if (kvr__owner(g, e->Ic, e->Wc) != e->c)
        return 0;
    uint32_t p = kvr__owner(g, e->Ip, e->Wp);
    if (!wanted(e, p))
        return 0;
    uint64_t tb = kvr_region_token_bytes(e->lay, &e->pair->dst);
    uint64_t lp = kvr__local(g, e->Ip, e->Wp);
    uint64_t src = (uint64_t)table_of(e, p)[lp / e->bsp] * e->bsp + lp % e->bsp;
    uint64_t dst = kvr__dst_slot(dst_table(e), g, e->bsc, e->Ic, e->Wc);
    return e->fn(e->ctx, g, "latent", p, src * tb, dst * tb, tb);
}

/* Where token g sits in an index page of one side: the page's byte offset
 * in the region, its row and the page's tokens P. */
typedef struct {
    uint64_t page, row, P;
} index_pos_t;

/* The producer's page of g: unsharded pages of bs_p (table by g / bs_p);
 * replicated pages of V_p (table by g / V_p, every rank); sharded (I_p ==
 * bs_p) pages of bs_p on the owner, its table by local block. */
static uint32_t index_src(const expect_t *e, uint64_t g, index_pos_t *s)
{
    const kvr_layout_t *lay = e->lay;
    uint64_t page_bytes = e->pair->src.page_bytes, Vp = e->bsp * e->Wp;
    uint32_t p = 0;
    uint64_t entry = g / e->bsp;
    *s = (index_pos_t){0, g % e->bsp, e->bsp};
    if (e->Wp > 1 && lay->producer_replicate_index) {
        p = e->c % (uint32_t)e->Wp;
        entry = g / Vp;
        *s = (index_pos_t){0, g % Vp, Vp};
    } else if (e->Wp > 1) {
        p = kvr__owner(g, e->Ip, e->Wp);
        uint64_t lp = kvr__local(g, e->Ip, e->Wp);
        entry = lp / e->bsp;
        s->row = lp % e->bsp;
    }
    if (wanted(e, p))
        s->page = table_of(e, p)[entry] * page_bytes;
    return p;
}

/* One index token: its key bytes in pieces contiguous on both sides (16
 * bytes when preshuffled: a row of a 16 x 16-byte tile; all D otherwise),
 * then its scale. The consumer's page: V_c tokens at row g % V_c when
 * replicated (or W == 1), else bs_c at row local % bs_c on the owner. */
static int expect_index(const expect_t *e, uint64_t g)
{
    const kvr_layout_t *lay = e->lay;
    uint64_t Vc = e->bsc * e->Wc, D = e->pair->src.index_dim;
    int repl = kvr__consumer_index_repl(lay);
    if (!repl && kvr__owner(g, e->Ic, e->Wc) != e->c)
        return 0;
    index_pos_t s, d = {dst_table(e)[g / Vc] * e->pair->dst.page_bytes,
                        repl ? g % Vc : kvr__local(g, e->Ic, e->Wc) % e->bsc,
                        repl ? Vc : e->bsc};
    uint32_t p = index_src(e, g, &s);
    if (!wanted(e, p))
        return 0;
    uint64_t step = lay->preshuffle ? 16 : D;
    for (uint64_t b = 0; b < D; b += step) {
        uint64_t so = kvr__index_key_off(s.row, b, D, lay->preshuffle);
        uint64_t dof = kvr__index_key_off(d.row, b, D, lay->preshuffle);
        if (e->fn(e->ctx, g, "key", p, s.page + so, d.page + dof, step))
            return 1;
    }
    return e->fn(e->ctx, g, "scale", p,
                 s.page + kvr__index_scale_off(s.row, s.P, D),
                 d.page + kvr__index_scale_off(d.row, d.P, D), 4);
}

/* Every head the consumer tp rank holds, each plane, from the producer tp
 * rank kvr__head_source names, at the head's local index on each side. */
static int expect_dense(const expect_t *e, uint64_t g)
{
    const kvr_region_desc_t *r = &e->pair->src;
    uint64_t H = r->heads, TPp = e->lay->producer_tp, TPc = e->lay->tp;
    uint64_t Hp = kvr__heads_local(H, TPp), Hc = kvr__heads_local(H, TPc);
    uint64_t DE = (uint64_t)r->head_dim * r->elem_bytes;
    uint64_t planes = r->kv_planes ? r->kv_planes : 2;
    uint64_t c0 = kvr__head_first(e->c, H, TPc);
    uint64_t sp = r->page_bytes / planes, dp = e->pair->dst.page_bytes / planes;
    uint64_t dpage = dst_table(e)[g / e->bsc] * e->pair->dst.page_bytes;
    for (uint64_t k = 0; k < planes; k++)
        for (uint64_t h = c0; h < c0 + Hc; h++) {
            uint32_t p = (uint32_t)kvr__head_source(h, e->c, H, TPp);
            if (!wanted(e, p))
                continue;
            uint64_t js = h - kvr__head_first(p, H, TPp);
            uint64_t so = table_of(e, p)[g / e->bsp] * r->page_bytes + k * sp +
                          kvr__dense_off(g % e->bsp, js, e->bsp, Hp, DE,
                                         r->hnd);
            uint64_t dof = dpage + k * dp +
                           kvr__dense_off(g % e->bsc, h - c0, e->bsc, Hc, DE,
                                          r->hnd);
            if (e->fn(e->ctx, g, planes == 2 && k ? "V" : "K", p, so, dof, DE))
                return 1;
        }
    return 0;
}

/* Identity pages (W == 1 on both sides, one bs): every page of rank c
 * comes from the same rank of the producer. g is the page's first token,
 * for messages. */
static void expect_pages(const expect_t *e)
{
    const kvr_request_t *req = e->reqs;
    uint64_t end = kvr__ceil_div(req->num_tokens, e->bsc);
    if (!wanted(e, e->c))
        return;
    for (uint64_t j = req->num_computed_blocks; j < end; j++)
        if (e->fn(e->ctx, j * e->bsc, "page", e->c,
                  table_of(e, e->c)[j] * e->pair->src.page_bytes,
                  dst_table(e)[j] * e->pair->dst.page_bytes,
                  e->pair->src.page_bytes))
            return;
}

void kvr__expect_pair_foreach(const kvr_layout_t *lay, uint32_t consumer,
                              const kvr_region_pair_t *pair,
                              const kvr_request_t *reqs, uint32_t only,
                              kvr__kind_t kind, kvr__expect_fn fn, void *ctx)
{
    expect_t e = {lay,
                  pair,
                  consumer,
                  reqs,
                  only,
                  fn,
                  ctx,
                  kvr_producer_block_size(lay),
                  kvr_producer_dcp(lay),
                  kvr_producer_interleave(lay),
                  lay->block_size,
                  lay->dcp_size,
                  lay->interleave};
    if (kind == KVR__KIND_PAGE) {
        expect_pages(&e);
        return;
    }
    uint64_t first = reqs->num_computed_blocks * e.bsc * e.Wc;
    for (uint64_t g = first; g < reqs->num_tokens; g++) {
        int stop = kind == KVR__KIND_TOKEN   ? expect_latent(&e, g)
                   : kind == KVR__KIND_DENSE ? expect_dense(&e, g)
                                             : expect_index(&e, g);
        if (stop)
            return;
    }
}
