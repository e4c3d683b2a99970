/* Save from a PP4 producer (W_p = 1) into the store and load into consumer
 * ranks of any W, I and replication; every loaded byte checked with the
 * plan layer's verifier against the producer's own pages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "store_fixture.h"
#include "store_tmp.h"

/* The model and request of every test but test_index_widths, which runs
 * others (bs, index width, tokens) through the same code. */
static sf_model_t model = {
    .layers = 8, .pp = 4, .bs = 16, .tb = 576, .D = 128, .pool = 48};
static uint32_t ntok = 202; /* three full chunks and a tail */

#define BS (model.bs)
#define CHUNK (model.bs * 4u) /* loads into W = 1, 2 and 4 */
#define NTOK ntok
#define NTOK_MAX 530u
#define SEED 0x5eedull

typedef struct world {
    kvr_store_t *st;
    sf_side_t prod[4];
    uint32_t tokens[NTOK_MAX];
    kvr_block_hash_t chains[NTOK_MAX / 16];
    size_t num_chains;
    uint8_t ns[KVR_STORE_NS_BYTES];
} world_t;

static kvr_layout_t layout(uint32_t W, uint32_t I, bool repl, bool shuf)
{
    kvr_layout_t l = KVR_LAYOUT_INIT;
    l.block_size = BS;
    l.dcp_size = W;
    l.interleave = I;
    l.tp = W;
    l.producer_tp = 1;
    l.replicate_index = repl;
    l.preshuffle = shuf;
    return l;
}

static void namespace_of(const sf_model_t *m, uint8_t *ns)
{
    kvr_offload_desc_t d = {.model_tag = "test-dsa",
                            .dtype = "fp8",
                            .block_size = BS,
                            .chunk_size = CHUNK,
                            .tp = 4,
                            .dcp_size = 4,
                            .interleave = 1};
    kvr_region_desc_t r[SF_MAX_REGIONS];
    kvr_layout_t l = layout(1, 1, false, false);
    size_t n = sf_layer_regions(m, 0, m->layers, &l, false, r);
    kvr_error_t err;
    assert_int_equal(kvr_store_namespace(&d, r, n, "mtp:1", ns, &err), KVR_OK);
}

static kvr_store_io_t io_of(world_t *w, const sf_side_t *s, uint32_t part,
                            uint32_t rank)
{
    kvr_store_io_t io = {.ns = w->ns,
                         .part = part,
                         .block_size = BS,
                         .chunk = CHUNK,
                         .chains = w->chains,
                         .num_chains = w->num_chains,
                         .lay = &s->lay,
                         .rank = rank,
                         .regions = s->regions,
                         .num_regions = s->num_regions,
                         .blocks = s->blocks,
                         .num_blocks = s->num_blocks};
    return io;
}

/* Four PP stages of two layers each, filled and saved. */
static void world_init(world_t *w, bool shuf, kvr_store_opts_t *opts)
{
    memset(w, 0, sizeof *w);
    unsigned seed = 7;
    for (uint32_t i = 0; i < NTOK; i++)
        w->tokens[i] = 1000 + i * 7;
    kvr_error_t err;
    assert_int_equal(kvr_store_chains(w->tokens, NTOK, CHUNK, w->chains,
                                      NTOK / CHUNK, &w->num_chains, &err),
                     KVR_OK);
    assert_int_equal(w->num_chains, NTOK / CHUNK);
    namespace_of(&model, w->ns);
    assert_int_equal(kvr_store_open(opts, &w->st, &err), KVR_OK);
    kvr_layout_t pl = layout(1, 1, false, shuf);
    size_t nsrc = (NTOK + BS - 1) / BS;
    for (uint32_t p = 0; p < 4; p++) {
        sf_side_init(&w->prod[p], &model, &pl, false, 2 * p, 2 * p + 2, nsrc,
                     &seed);
        assert_int_equal(sf_fill(&w->prod[p], SEED, w->tokens, NTOK), KVR_OK);
        kvr_store_io_t io = io_of(w, &w->prod[p], p, 0);
        size_t saved = 0;
        kvr_status_t s = kvr_store_save(w->st, &io, &saved, &err);
        if (s != KVR_OK)
            fail_msg("save part %u: %s", p, err.msg);
        assert_int_equal(saved, w->num_chains);
    }
}

static void world_free(world_t *w)
{
    for (int p = 0; p < 4; p++)
        sf_side_free(&w->prod[p]);
    kvr_store_close(w->st);
}

/* The regions of consumer side c that belong to PP stage p (layers 2p,
 * 2p+1), as a side view sharing c's memory and table. */
static sf_side_t part_view(const sf_side_t *c, uint32_t p)
{
    sf_side_t v = *c;
    v.num_regions = 0;
    for (size_t i = 0; i < c->num_regions; i++)
        if (c->regions[i].desc.layer / 2 == p)
            v.regions[v.num_regions++] = c->regions[i];
    return v;
}

static void verify_rank(const world_t *w, const sf_side_t *c, uint32_t rank,
                        uint64_t tokens)
{
    kvr_error_t err;
    if (sf_verify_rank(w->prod, 2, c, rank, tokens, &err) != KVR_OK)
        fail_msg("W=%u I=%u repl=%d rank %u: %s", c->lay.dcp_size,
                 c->lay.interleave, c->lay.replicate_index, rank, err.msg);
}

static void load_case(world_t *w, uint32_t W, uint32_t I, bool repl, bool shuf)
{
    kvr_layout_t cl = layout(W, I, repl, shuf);
    size_t ndst = (NTOK + BS * W - 1) / (BS * W);
    unsigned seed = 11 * W + I + repl;
    for (uint32_t r = 0; r < W; r++) {
        sf_side_t c;
        sf_side_init(&c, &model, &cl, true, 0, model.layers, ndst, &seed);
        for (uint32_t p = 0; p < 4; p++) {
            sf_side_t v = part_view(&c, p);
            kvr_store_io_t io = io_of(w, &v, p, r);
            uint64_t got = 0;
            kvr_error_t err;
            if (kvr_store_load(w->st, &io, &got, &err) != KVR_OK)
                fail_msg("load W=%u I=%u repl=%d rank %u part %u: %s", W, I,
                         repl, r, p, err.msg);
            assert_int_equal(got, (NTOK / CHUNK) * CHUNK);
        }
        verify_rank(w, &c, r, (NTOK / CHUNK) * CHUNK);
        sf_side_free(&c);
    }
}

static void run_all(bool shuf, kvr_store_opts_t *opts)
{
    world_t w;
    world_init(&w, shuf, opts);
    load_case(&w, 1, 1, false, shuf);
    load_case(&w, 1, BS, false, shuf);
    load_case(&w, 2, 1, true, shuf);
    load_case(&w, 2, BS, true, shuf);
    load_case(&w, 2, BS, false, shuf);
    load_case(&w, 4, 1, true, shuf);
    load_case(&w, 4, BS, false, shuf);
    load_case(&w, 4, BS, true, shuf);
    world_free(&w);
}

static void test_host_preshuffled(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.host_bytes = 64u << 20, .verify_host = true};
    run_all(true, &o);
}

static void test_host_plain(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.host_bytes = 64u << 20};
    run_all(false, &o);
}

static char tmpdir[ST_DIR_MAX];

static void make_dir(void)
{
    assert_true(st_tmpdir_make(tmpdir, "store"));
}

static void remove_dir(void)
{
    assert_true(st_tmpdir_remove(tmpdir));
}

/* Disk only: every load reads, checks and scatters from the files. */
static void test_disk_only(void **state)
{
    (void)state;
    make_dir();
    kvr_store_opts_t o = {.dir = tmpdir};
    run_all(true, &o);
    remove_dir();
}

/* A prefix hit: chunk 1 missing gives a one-chunk load; another namespace
 * is never hit. */
static void test_partial_hit_and_namespace(void **state)
{
    (void)state;
    make_dir();
    kvr_store_opts_t o = {.dir = tmpdir};
    world_t w;
    world_init(&w, true, &o);
    char cmd[256], name[KVR_STORE_NAME_MAX];
    kvr_chunk_key_t k = {.chain = w.chains[1], .part = 0};
    memcpy(k.ns, w.ns, sizeof k.ns);
    (void)name;
    kvr_store_close(w.st);
    /* remove chunk 1 of part 0 by its name pattern (second chain hash) */
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", w.chains[1].bytes[i]);
    snprintf(cmd, sizeof cmd, "rm %s/*-%s-p0.kvc", tmpdir, hex);
    assert_int_equal(system(cmd), 0);
    kvr_error_t err;
    assert_int_equal(kvr_store_open(&o, &w.st, &err), KVR_OK);
    assert_false(kvr_store_contains(w.st, &k));
    kvr_layout_t cl = layout(2, 1, true, true);
    unsigned seed = 3;
    sf_side_t c;
    sf_side_init(&c, &model, &cl, true, 0, model.layers,
                 (NTOK + 2 * BS - 1) / (2 * BS), &seed);
    sf_side_t v = part_view(&c, 0);
    kvr_store_io_t io = io_of(&w, &v, 0, 1);
    uint64_t got = 99;
    assert_int_equal(kvr_store_load(w.st, &io, &got, &err), KVR_OK);
    assert_int_equal(got, CHUNK);
    /* another namespace: a different model geometry */
    sf_model_t other = model;
    other.tb = 1152;
    uint8_t ns2[KVR_STORE_NS_BYTES];
    namespace_of(&other, ns2);
    assert_memory_not_equal(ns2, w.ns, sizeof ns2);
    io.ns = ns2;
    assert_int_equal(kvr_store_load(w.st, &io, &got, &err), KVR_OK);
    assert_int_equal(got, 0);
    sf_side_free(&c);
    world_free(&w);
    remove_dir();
}

/* Chunk 1 of part 0 (layers 0 and 1) is canonical: token-major latents,
 * unshuffled index keys then scales, whatever the producer's preshuffle. */
static void check_canonical(world_t *w)
{
    kvr_chunk_key_t k = {.chain = w->chains[1], .part = 0};
    memcpy(k.ns, w->ns, sizeof k.ns);
    uint64_t tb = model.tb, D = model.D, len = 0;
    uint64_t want = 8 + 3 * 16 + CHUNK * (2 * tb + D + 4);
    uint8_t *buf = malloc(want), ref[1152];
    assert_true(tb <= sizeof ref && D <= sizeof ref);
    kvr_error_t err;
    assert_int_equal(kvr_store_get(w->st, &k, buf, want, &len, &err), KVR_OK);
    assert_int_equal(len, want);
    const uint8_t *mla = buf + 56, *idx = mla + CHUNK * tb;
    for (uint64_t t = 0; t < CHUNK; t++) {
        uint64_t g = CHUNK + t;
        kvr_synth_latent(SEED, 0, g, w->tokens[g], ref, tb);
        assert_memory_equal(mla + t * tb, ref, tb);
        kvr_synth_index_key(SEED, 0, g, w->tokens[g], ref, (uint32_t)D);
        uint64_t page = t / BS, in = t % BS;
        const uint8_t *pg = idx + page * BS * (D + 4);
        assert_memory_equal(pg + in * D, ref, D);
        float sc = kvr_synth_index_scale(ref, (uint32_t)D), got;
        memcpy(&got, pg + BS * D + 4 * in, 4);
        assert_true(got == sc);
    }
    free(buf);
}

static void test_canonical_bytes(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.host_bytes = 64u << 20};
    world_t w;
    world_init(&w, true, &o);
    check_canonical(&w);
    world_free(&w);
}

/* Index key planes of other sizes through the preshuffled path: a plane
 * smaller than the move's staging buffer (bs 48), one several times its
 * size with groups that do not fill it (D 320), and groups larger than it
 * (D 1024); saved, the chunk checked canonical, and loaded into W = 1
 * and 2, checked byte-exact. */
static void test_index_widths(void **state)
{
    (void)state;
    const sf_model_t keep = model;
    const uint32_t keep_ntok = ntok;
    const struct {
        uint32_t bs, D, ntok;
    } cases[] = {{48, 128, 400}, {64, 320, 530}, {16, 1024, 202}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        model.bs = cases[i].bs;
        model.D = cases[i].D;
        ntok = cases[i].ntok;
        kvr_store_opts_t o = {.host_bytes = 64u << 20};
        world_t w;
        world_init(&w, true, &o);
        check_canonical(&w);
        load_case(&w, 1, 1, false, true);
        load_case(&w, 2, 1, true, true);
        load_case(&w, 2, BS, false, true);
        world_free(&w);
    }
    model = keep;
    ntok = keep_ntok;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_preshuffled),
        cmocka_unit_test(test_host_plain),
        cmocka_unit_test(test_disk_only),
        cmocka_unit_test(test_partial_hit_and_namespace),
        cmocka_unit_test(test_canonical_bytes),
        cmocka_unit_test(test_index_widths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
