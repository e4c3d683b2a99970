#include "relayout_case.h"

#include <string.h>

#include "layout_math.h"

static const uint32_t MLA_UNITS[] = {576, 1152, 100, 6, 64};

static uint32_t random_divisor(uint64_t *rng, uint32_t n)
{
    uint32_t divs[64], k = 0;
    for (uint32_t d = 1; d <= n && k < 64; d++)
        if (n % d == 0)
            divs[k++] = d;
    return divs[rng_below(rng, k)];
}

case_shape_t case_random_shape(uint64_t *rng)
{
    static const uint32_t WS[] = {1, 2, 3, 4, 8};
    static const uint32_t BS[] = {4, 16, 64};
    case_shape_t s = {0};
    uint32_t pick = rng_below(rng, 20);
    s.role = pick < 10   ? KVR_ROLE_MLA
             : pick < 17 ? KVR_ROLE_INDEX
                         : KVR_ROLE_DENSE;
    s.W = WS[rng_below(rng, 5)];
    s.bs = s.role == KVR_ROLE_INDEX ? BS[1 + rng_below(rng, 2)]
                                    : BS[rng_below(rng, 3)];
    s.I = random_divisor(rng, s.bs);
    s.unit = MLA_UNITS[rng_below(rng, 5)];
    if (s.role == KVR_ROLE_DENSE)
        s.W = 1;
    if (s.role == KVR_ROLE_INDEX) {
        s.replicate = rng_below(rng, 3) != 0;
        s.preshuffle = rng_below(rng, 2);
        s.unit = s.preshuffle ? 16 * (1 + rng_below(rng, 8))
                              : 20 + rng_below(rng, 120);
        if (!s.replicate && s.W > 1)
            s.I = s.bs;
    }
    uint64_t V = (uint64_t)s.bs * s.W;
    s.tokens = rng_below(rng, 4) == 0 ? V * (1 + rng_below(rng, 4))
                                      : rng_below(rng, (uint32_t)(6 * V + 6));
    if (s.tokens > 0 && rng_below(rng, 3) == 0)
        s.computed = rng_below(rng, (uint32_t)((s.tokens - 1) / V + 1));
    return s;
}

/* The ids below `range` in random order (tables use a prefix). */
uint32_t *case_random_ids(uint64_t *rng, uint64_t range)
{
    uint32_t *all = xmalloc(range * sizeof(*all));
    for (uint64_t i = 0; i < range; i++)
        all[i] = (uint32_t)i;
    for (uint64_t i = range; i > 1; i--) {
        uint32_t j = rng_below(rng, (uint32_t)i), t = all[i - 1];
        all[i - 1] = all[j];
        all[j] = t;
    }
    return all;
}

kvr_region_desc_t case_region(const case_shape_t *s, int consumer,
                              uint64_t blocks)
{
    kvr_region_desc_t r = {0};
    r.role = s->role;
    r.num_blocks = blocks;
    if (s->role == KVR_ROLE_INDEX) {
        uint64_t P = consumer && s->replicate ? (uint64_t)s->bs * s->W : s->bs;
        r.index_dim = (uint32_t)s->unit;
        r.page_bytes = P * kvr_index_stride(r.index_dim);
    } else {
        r.page_bytes = s->bs * s->unit;
    }
    return r;
}

kvr_layout_t case_layout(const case_shape_t *s)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = s->bs;
    lay.dcp_size = s->W;
    lay.interleave = s->I;
    lay.tp = s->W;
    lay.producer_tp = s->W;
    lay.replicate_index = s->replicate;
    lay.preshuffle = s->preshuffle;
    return lay;
}

void case_make(relayout_case_t *c, const case_shape_t *s, uint64_t *rng)
{
    memset(c, 0, sizeof(*c));
    c->lay = case_layout(s);
    uint64_t V = (uint64_t)s->bs * s->W;
    size_t nsrc = kvr__ceil_div(s->tokens, s->bs) + rng_below(rng, 3);
    size_t ndst = kvr__ceil_div(s->tokens, V) + rng_below(rng, 3);
    c->src = case_region(s, 0, nsrc + 5);
    c->dst = case_region(s, 1, ndst + 4);
    c->src_blocks = case_random_ids(rng, c->src.num_blocks);
    c->dst_blocks = case_random_ids(rng, c->dst.num_blocks);
    c->req = (kvr_gpu_request_t){c->src_blocks, nsrc,      c->dst_blocks,
                                 ndst,          s->tokens, s->computed};
    c->src_bytes = c->src.num_blocks * c->src.page_bytes;
    c->dst_bytes = c->dst.num_blocks * c->dst.page_bytes;
    c->src_img = xmalloc(c->src_bytes);
    rng_fill(rng, c->src_img, c->src_bytes);
}

void case_free(relayout_case_t *c)
{
    free(c->src_blocks);
    free(c->dst_blocks);
    free(c->src_img);
    memset(c, 0, sizeof(*c));
}

/* Every key byte and the scale of the bs tokens of source page j, at token
 * position `at` of a destination page of P tokens. */
static void expect_index_page(const relayout_case_t *c, uint64_t j,
                              unsigned char *dp, uint64_t at, uint64_t P)
{
    uint64_t bs = c->lay.block_size, D = c->src.index_dim;
    int pre = c->lay.preshuffle;
    const unsigned char *sp = c->src_img +
                              c->req.src_blocks[j] * c->src.page_bytes;
    for (uint64_t t = 0; t < bs; t++) {
        for (uint64_t d = 0; d < D; d++)
            dp[kvr__index_key_off(at + t, d, D, pre)] =
                sp[kvr__index_key_off(t, d, D, pre)];
        memcpy(dp + kvr__index_scale_off(at + t, P, D),
               sp + kvr__index_scale_off(t, bs, D), 4);
    }
}

static void expect_index(const relayout_case_t *c, uint32_t rank,
                         unsigned char *dst_img)
{
    uint64_t bs = c->lay.block_size, W = c->lay.dcp_size;
    uint64_t end = kvr__ceil_div(c->req.num_tokens, bs);
    for (uint64_t j = c->req.num_computed_blocks * W; j < end; j++) {
        unsigned char *dp = dst_img +
                            c->req.dst_blocks[j / W] * c->dst.page_bytes;
        if (c->lay.replicate_index)
            expect_index_page(c, j, dp, (j % W) * bs, bs * W);
        else if (kvr__owner(j * bs, c->lay.interleave, W) == rank)
            expect_index_page(c, j, dp, 0, bs);
    }
}

/* Whole pages (W == 1, not MLA or INDEX), the slack past N included. */
static void expect_pages(const relayout_case_t *c, unsigned char *dst_img)
{
    uint64_t end = kvr__ceil_div(c->req.num_tokens, c->lay.block_size);
    for (uint64_t j = c->req.num_computed_blocks; j < end; j++)
        memcpy(dst_img + c->req.dst_blocks[j] * c->dst.page_bytes,
               c->src_img + c->req.src_blocks[j] * c->src.page_bytes,
               c->src.page_bytes);
}

void case_expect(const relayout_case_t *c, uint32_t rank,
                 unsigned char *dst_img)
{
    uint64_t bs = c->lay.block_size, W = c->lay.dcp_size, I = c->lay.interleave;
    uint64_t N = c->req.num_tokens, first = c->req.num_computed_blocks * bs * W;
    if (c->src.role == KVR_ROLE_INDEX) {
        expect_index(c, rank, dst_img);
        return;
    }
    if (c->src.role != KVR_ROLE_MLA) {
        expect_pages(c, dst_img);
        return;
    }
    uint64_t tb = c->src.page_bytes / bs;
    for (uint64_t g = first; g < N; g++)
        if (kvr__owner(g, I, W) == rank)
            memcpy(dst_img + kvr__dst_slot(c->req.dst_blocks, g, bs, I, W) * tb,
                   c->src_img + kvr__src_slot(c->req.src_blocks, g, bs) * tb,
                   tb);
}

void case_poison(unsigned char *img, uint64_t bytes, uint32_t salt)
{
    for (uint64_t i = 0; i < bytes; i++)
        img[i] = (unsigned char)(i * 131 + salt * 71 + 0x5a);
}

const char *case_name(const case_shape_t *s, char *buf, size_t n)
{
    snprintf(buf, n, "%s bs=%u W=%u I=%u unit=%llu N=%llu k=%llu%s%s",
             kvr_role_name(s->role), s->bs, s->W, s->I,
             (unsigned long long)s->unit, (unsigned long long)s->tokens,
             (unsigned long long)s->computed,
             s->role == KVR_ROLE_INDEX && s->replicate ? " replicated" : "",
             s->role == KVR_ROLE_INDEX && s->preshuffle ? " preshuffled" : "");
    return buf;
}
