#include "merge_case.h"

#include <string.h>

#include "layout_math.h"

/* Request i's relayout: source pages from `from` and consumer pages from
 * `at` in the pools' orders. */
static kvr_gpu_relayout_t *request(const case_shape_t *s, uint64_t tokens,
                                   const uint32_t *src_pages,
                                   const uint32_t *dst_pages, uint64_t pools[2])
{
    kvr_layout_t lay = case_layout(s);
    kvr_region_desc_t src = case_region(s, 0, pools[0]);
    kvr_region_desc_t dst = case_region(s, 1, pools[1]);
    kvr_gpu_request_t q = {src_pages, kvr__ceil_div(tokens, s->bs), dst_pages,
                           kvr__ceil_div(tokens, (uint64_t)s->bs * s->W),
                           tokens, 0};
    kvr_gpu_relayout_t *rl = NULL;
    CHECK_KVR(kvr_gpu_relayout_create(&lay, &src, &dst, &q, &rl, &err));
    return rl;
}

static void expect(merge_case_t *m)
{
    for (uint32_t l = 0; l < m->layers; l++)
        for (uint32_t r = 0; r < m->W; r++) {
            unsigned char *e = xmalloc(m->dst_bytes);
            memcpy(e, m->poison, m->dst_bytes);
            for (uint32_t i = 0; i < m->nreq; i++)
                CHECK_KVR(kvr_gpu_ref_scatter(m->rls[i], r, m->src_img[l], e,
                                              &err));
            m->expect[l * m->W + r] = e;
        }
}

void merge_make(merge_case_t *m, const case_shape_t *s, const uint64_t *tokens,
                uint32_t nreq, uint32_t layers, uint64_t *rng)
{
    memset(m, 0, sizeof(*m));
    m->nreq = nreq;
    m->layers = layers;
    m->W = s->W;
    uint64_t pools[2] = {3, 2}; /* spare pages */
    for (uint32_t i = 0; i < nreq; i++) {
        pools[0] += kvr__ceil_div(tokens[i], s->bs);
        pools[1] += kvr__ceil_div(tokens[i], (uint64_t)s->bs * s->W);
    }
    uint32_t *sp = case_random_ids(rng, pools[0]);
    uint32_t *dp = case_random_ids(rng, pools[1]);
    m->rls = xmalloc(nreq * sizeof(*m->rls));
    for (uint64_t i = 0, from = 0, at = 0; i < nreq; i++) {
        m->rls[i] = request(s, tokens[i], sp + from, dp + at, pools);
        from += kvr__ceil_div(tokens[i], s->bs);
        at += kvr__ceil_div(tokens[i], (uint64_t)s->bs * s->W);
    }
    m->src_bytes = pools[0] * case_region(s, 0, 1).page_bytes;
    m->dst_bytes = pools[1] * case_region(s, 1, 1).page_bytes;
    m->src_img = xmalloc(layers * sizeof(*m->src_img));
    for (uint32_t l = 0; l < layers; l++) {
        m->src_img[l] = xmalloc(m->src_bytes);
        rng_fill(rng, m->src_img[l], m->src_bytes);
    }
    m->poison = xmalloc(m->dst_bytes);
    case_poison(m->poison, m->dst_bytes, 5);
    m->expect = xmalloc(layers * m->W * sizeof(*m->expect));
    expect(m);
    free(sp);
    free(dp);
}

void merge_free(merge_case_t *m)
{
    for (uint32_t i = 0; i < m->nreq; i++)
        kvr_gpu_relayout_destroy(m->rls[i]);
    for (uint32_t l = 0; l < m->layers; l++)
        free(m->src_img[l]);
    for (uint32_t k = 0; k < m->layers * m->W; k++)
        free(m->expect[k]);
    free(m->rls);
    free(m->src_img);
    free(m->expect);
    free(m->poison);
    memset(m, 0, sizeof(*m));
}

kvr_gpu_scatter_slot_t *merge_slots(const merge_case_t *m,
                                    const void *const *src, void *const *dst,
                                    size_t *n)
{
    kvr_gpu_scatter_slot_t *s =
        xmalloc((size_t)m->nreq * m->layers * m->W * sizeof(*s));
    size_t k = 0;
    for (uint32_t i = 0; i < m->nreq; i++)
        for (uint32_t r = 0; r < m->W; r++)
            for (uint32_t l = 0; l < m->layers; l++)
                s[k++] = (kvr_gpu_scatter_slot_t){i, r, src[l],
                                                  dst[l * m->W + r]};
    *n = k;
    return s;
}
