/* Every §2 formula against a brute-force simulation of DCP storage:
 * I-token chunks dealt round-robin to W ranks, each rank appending. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/layout.h"
#include "layout_math.h"

static const uint32_t BS[] = {1, 16, 64};
static const uint32_t WS[] = {1, 2, 3, 4, 8};

typedef struct {
    uint32_t *owner;
    uint64_t *local;
    uint64_t counts[8];
} sim_t;

static void simulate(uint64_t len, uint32_t I, uint32_t W, sim_t *s)
{
    memset(s->counts, 0, sizeof(s->counts));
    uint32_t r = 0;
    for (uint64_t g = 0; g < len; g++) {
        if (g > 0 && g % I == 0)
            r = (r + 1) % W;
        s->owner[g] = r;
        s->local[g] = s->counts[r]++;
    }
}

static kvr_layout_t dcp_layout(uint32_t bs, uint32_t W, uint32_t I)
{
    kvr_layout_t lay = KVR_LAYOUT_INIT;
    lay.block_size = bs;
    lay.dcp_size = W;
    lay.interleave = I;
    lay.tp = W;
    return lay;
}

static void check_case(uint32_t bs, uint32_t W, uint32_t I)
{
    kvr_layout_t lay = dcp_layout(bs, W, I);
    assert_int_equal(kvr_layout_check(&lay, NULL), KVR_OK);
    uint64_t V = (uint64_t)bs * W, maxlen = 3 * V + 4;
    sim_t s = {malloc(maxlen * sizeof(uint32_t)),
               malloc(maxlen * sizeof(uint64_t)),
               {0}};
    uint32_t *table = malloc((maxlen / V + 2) * sizeof(uint32_t));
    for (uint64_t b = 0; b < maxlen / V + 2; b++)
        table[b] = (uint32_t)(7 * b + 3); /* distinct, non-contiguous */
    simulate(maxlen, I, W, &s);
    for (uint64_t g = 0; g < maxlen; g++) {
        assert_int_equal(kvr_owner(&lay, g), s.owner[g]);
        assert_int_equal(kvr_local_index(&lay, g), s.local[g]);
        assert_int_equal(kvr_global_index(&lay, s.local[g], s.owner[g]), g);
        assert_int_equal(s.local[g] / bs, g / V);
        uint64_t vb = g % V;
        uint64_t alt = (uint64_t)table[g / V] * bs +
                       (vb / ((uint64_t)W * I)) * I + vb % I;
        assert_int_equal(kvr__dst_slot(table, g, bs, I, W), alt);
    }
    for (uint64_t L = 0; L <= maxlen; L++) {
        sim_t t = s;
        uint64_t sum = 0, longest = 0;
        memset(t.counts, 0, sizeof(t.counts));
        for (uint64_t g = 0; g < L; g++)
            t.counts[s.owner[g]]++;
        for (uint32_t r = 0; r < W; r++) {
            assert_int_equal(kvr_local_len(&lay, L, r), t.counts[r]);
            sum += t.counts[r];
            longest = t.counts[r] > longest ? t.counts[r] : longest;
        }
        assert_int_equal(sum, L);
        assert_int_equal(kvr_num_dst_blocks(&lay, L), (longest + bs - 1) / bs);
        assert_int_equal(kvr_num_dst_blocks(&lay, L), (L + V - 1) / V);
        assert_int_equal(kvr_num_src_blocks(&lay, L), (L + bs - 1) / bs);
    }
    free(s.owner);
    free(s.local);
    free(table);
}

static void test_formulas_match_brute_force(void **state)
{
    (void)state;
    for (size_t b = 0; b < sizeof(BS) / sizeof(BS[0]); b++)
        for (size_t w = 0; w < sizeof(WS) / sizeof(WS[0]); w++)
            for (uint32_t I = 1; I <= BS[b]; I++)
                if (BS[b] % I == 0)
                    check_case(BS[b], WS[w], I);
}

/* Slots on one rank are distinct and stay inside the rank's pages. */
static void test_slots_injective_per_rank(void **state)
{
    (void)state;
    kvr_layout_t lay = dcp_layout(16, 4, 1);
    uint32_t table[8] = {5, 0, 7, 2, 1, 6, 3, 4};
    for (uint32_t I = 1; I <= 16; I *= 2) {
        lay.interleave = I;
        for (uint32_t r = 0; r < 4; r++) {
            unsigned char seen[8 * 16] = {0};
            for (uint64_t g = 0; g < 8 * 64; g++) {
                if (kvr_owner(&lay, g) != r)
                    continue;
                uint64_t slot = kvr__dst_slot(table, g, 16, I, 4);
                assert_true(slot < sizeof(seen));
                assert_int_equal(seen[slot], 0);
                seen[slot] = 1;
            }
        }
    }
}

/* The preshuffled key layout is a bijection onto the key plane and keeps
 * 16-byte rows of one token contiguous. */
static void test_preshuffle_bijection(void **state)
{
    (void)state;
    const uint64_t P = 64, D = 128;
    unsigned char *seen = calloc(P * D, 1);
    for (uint64_t t = 0; t < P; t++)
        for (uint64_t d = 0; d < D; d++) {
            uint64_t off = kvr__index_key_off(t, d, D, 1);
            assert_true(off < P * D);
            assert_int_equal(seen[off], 0);
            seen[off] = 1;
            if (d % 16)
                assert_int_equal(off, kvr__index_key_off(t, d - 1, D, 1) + 1);
        }
    free(seen);
    assert_int_equal(kvr__index_key_off(3, 5, D, 0), 3 * D + 5);
    assert_int_equal(kvr_index_stride(128), 144);
    assert_int_equal(kvr__index_scale_off(5, P, D), P * D + 20);
    /* a source page's key plane is a prefix of whole 16-token groups */
    assert_int_equal(kvr__index_key_off(16, 0, D, 1), 16 * D);
}

/* Block counts of lengths near 2^64 (a peer's num_tokens): ceil(L / bs)
 * must not wrap to 0 blocks, and the W local lengths still sum to L. */
static void test_extreme_lengths(void **state)
{
    (void)state;
    kvr_layout_t lay = dcp_layout(64, 4, 1);
    const uint64_t lens[] = {UINT64_MAX,      UINT64_MAX - 1,   UINT64_MAX - 62,
                             UINT64_MAX - 63, UINT64_MAX - 255, 1ull << 63};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint64_t L = lens[i];
        assert_int_equal(kvr_num_src_blocks(&lay, L), L / 64 + (L % 64 != 0));
        assert_int_equal(kvr_num_dst_blocks(&lay, L), L / 256 + (L % 256 != 0));
        assert_true(kvr_num_src_blocks(&lay, L) >= (1ull << 57));
        uint64_t sum = 0;
        for (uint32_t r = 0; r < 4; r++)
            sum += kvr_local_len(&lay, L, r);
        assert_int_equal(sum, L);
    }
    assert_int_equal(kvr__ceil_div(UINT64_MAX, 1), UINT64_MAX);
    assert_int_equal(kvr__ceil_div(UINT64_MAX, UINT64_MAX), 1);
    assert_int_equal(kvr__ceil_div(0, 7), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formulas_match_brute_force),
        cmocka_unit_test(test_extreme_lengths),
        cmocka_unit_test(test_slots_injective_per_rank),
        cmocka_unit_test(test_preshuffle_bijection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
