/* Head-sharded dense K/V (docs/design.md §18): a producer tp rank and a
 * consumer tp rank share a contiguous range of kv heads (possibly none);
 * the pair plan moves that range of every token. Both sides are W == 1, so
 * the token pieces (pair.c) are where a producer block meets a consumer
 * block; each is expanded here into byte runs per plane and head range. */
#include <stdlib.h>

#include "layout_math.h"
#include "plan_internal.h"

/* Consumer tp rank c holds heads [c0, c0 + Hc). When TP_p <= H each head
 * has one holder and the range from p is an intersection of two ranges;
 * when TP_p > H producer p holds one head, replica p % (TP_p / H) of it,
 * and c takes it from there only if kvr__head_source picks that replica. */
void kvr__dense_map(const kvr_layout_t *lay, const kvr_region_desc_t *r,
                    uint32_t p, uint32_t c, kvr__dense_map_t *m)
{
    uint64_t H = r->heads, TPp = lay->producer_tp, TPc = lay->tp;
    m->Hp = kvr__heads_local(H, TPp);
    m->Hc = kvr__heads_local(H, TPc);
    m->DE = (uint64_t)r->head_dim * r->elem_bytes;
    m->planes = r->kv_planes ? r->kv_planes : 2;
    m->hnd = r->hnd;
    uint64_t c0 = kvr__head_first(c, H, TPc), lo, hi;
    if (TPp <= H) {
        lo = c0 > p * m->Hp ? c0 : p * m->Hp;
        hi = c0 + m->Hc < (p + 1) * m->Hp ? c0 + m->Hc : (p + 1) * m->Hp;
    } else {
        lo = kvr__head_first(p, H, TPp);
        hi = lo + 1;
        if (kvr__head_source(lo, c, H, TPp) != p || lo < c0 || lo >= c0 + m->Hc)
            hi = lo;
    }
    m->nh = hi > lo ? hi - lo : 0;
    m->js = m->nh ? lo - kvr__head_first(p, H, TPp) : 0;
    m->jd = m->nh ? lo - c0 : 0;
}

typedef struct {
    kvr__dense_map_t m;
    uint64_t bs_p, bs_c, page_p, page_c;
} dense_geo_t;

/* One token piece, one plane: NHD rows hold every local head, so the heads
 * moved are one run per token, or one run for the whole piece when they
 * are all the heads of both pages. */
static kvr_status_t nhd_piece(const dense_geo_t *g, uint64_t sb, uint64_t rs,
                              uint64_t db, uint64_t rd, uint64_t n,
                              kvr_plan_t *out)
{
    const kvr__dense_map_t *m = &g->m;
    if (m->nh == m->Hp && m->nh == m->Hc)
        return kvr__plan_push(
            out, sb + kvr__dense_off(rs, 0, g->bs_p, m->Hp, m->DE, 0),
            db + kvr__dense_off(rd, 0, g->bs_c, m->Hc, m->DE, 0),
            n * m->Hp * m->DE);
    for (uint64_t t = 0; t < n; t++) {
        kvr_status_t st = kvr__plan_push(
            out, sb + kvr__dense_off(rs + t, m->js, g->bs_p, m->Hp, m->DE, 0),
            db + kvr__dense_off(rd + t, m->jd, g->bs_c, m->Hc, m->DE, 0),
            m->nh * m->DE);
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

/* Runs sorted by destination within the consumer page: planes in order;
 * in a plane, NHD rows ascend with the pieces, HND ascends head by head
 * (one run per piece per head: a head's rows are contiguous). */
static kvr_status_t dense_expand(const void *arg, const kvr_plan_t *pieces,
                                 kvr_plan_t *out)
{
    const dense_geo_t *g = arg;
    const kvr__dense_map_t *m = &g->m;
    uint64_t plane_p = g->page_p / m->planes, plane_c = g->page_c / m->planes;
    uint64_t heads = m->hnd ? m->nh : 1;
    kvr_status_t st = KVR_OK;
    for (uint64_t k = 0; k < m->planes; k++)
        for (uint64_t u = 0; u < heads; u++)
            for (size_t i = 0; i < pieces->num_runs && st == KVR_OK; i++) {
                const kvr_run_t *r = &pieces->runs[i];
                uint64_t sb = r->src / g->bs_p * g->page_p + k * plane_p;
                uint64_t db = r->dst / g->bs_c * g->page_c + k * plane_c;
                uint64_t rs = r->src % g->bs_p, rd = r->dst % g->bs_c;
                if (!m->hnd)
                    st = nhd_piece(g, sb, rs, db, rd, r->len, out);
                else
                    st = kvr__plan_push(
                        out,
                        sb + kvr__dense_off(rs, m->js + u, g->bs_p, m->Hp,
                                            m->DE, 1),
                        db + kvr__dense_off(rd, m->jd + u, g->bs_c, m->Hc,
                                            m->DE, 1),
                        r->len * m->DE);
            }
    return st;
}

/* The token pattern of a dense pair is that of DCP ranks 0 and 0 (W == 1
 * on both sides): every token, cut where either side's block ends. */
kvr_status_t kvr__pair_dense(const kvr__pair_t *x,
                             const kvr_region_pair_t *pair, kvr_plan_t **out)
{
    dense_geo_t g = {.bs_p = x->ps.bs,
                     .bs_c = x->cs.bs,
                     .page_p = pair->src.page_bytes,
                     .page_c = pair->dst.page_bytes};
    kvr__dense_map(x->lay, &pair->src, x->p, x->c, &g.m);
    kvr__pair_t t = *x;
    t.p = t.c = 0;
    uint64_t per = g.m.planes * (g.m.hnd            ? g.m.nh
                                 : g.m.nh == g.m.Hp ? 1
                                                    : x->cs.bs);
    return kvr__pair_walk(&t, g.m.nh ? x->N : 0, dense_expand, &g, (size_t)per,
                          out);
}
