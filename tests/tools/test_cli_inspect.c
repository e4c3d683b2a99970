/* `kvrelay inspect` on dumps this test builds itself: a correct transfer
 * (exit 0), deliberately mis-planned ones (exit 1, the wrong tokens named:
 * an MLA plan shifted by one token, one dropped MLA token, the historical
 * bug of moving index pages as 144-byte per-token windows), a source that is
 * not its declared synthetic data, and hostile manifests (exit 2, one line
 * naming the field). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "layout_math.h"
#include "test_inspect_cli.h"
#include "test_inspect_fixture.h"

static const char *kvr_bin;
static cli_result_t res;

/* Tokens each region checks: req-0 all 150, req-1 [64, 200). MLA: each on
 * its owner; the replicated index: on all 4 ranks. */
#define MLA_TOKENS (150 + 136)
#define INDEX_TOKENS (MLA_TOKENS * TD_W)

static json_t *inspect_json(const char *args, int want_status)
{
    char full[512];
    snprintf(full, sizeof(full), "--json %s", args);
    cli_run(kvr_bin, "inspect", full, &res);
    if (res.status != want_status)
        fail_msg("inspect %s exited %d, expected %d: %s", full, res.status,
                 want_status, res.err);
    json_error_t jerr;
    json_t *root = json_loads(res.out, 0, &jerr);
    if (root == NULL)
        fail_msg("not JSON (%s): %s", jerr.text, res.out);
    return root;
}

static json_int_t geti(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("no integer '%s'", key);
    return json_integer_value(v);
}

static const char *gets(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        fail_msg("no string '%s'", key);
    return json_string_value(v);
}

static json_t *region(json_t *root, size_t i)
{
    return json_array_get(json_object_get(root, "regions"), i);
}

static json_t *diff(json_t *root, size_t reg, size_t i)
{
    return json_array_get(json_object_get(region(root, reg), "diffs"), i);
}

static void make_dump(const char *dir, td_mutate_fn mutate, td_dump_t *keep)
{
    td_dump_t d;
    td_init(&d);
    td_transfer(&d, mutate);
    td_write(&d, dir);
    if (keep != NULL)
        *keep = d;
    else
        td_free(&d);
}

static void hex_of(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void test_clean(void **state)
{
    (void)state;
    make_dump("dump-good", NULL, NULL);
    json_t *r = inspect_json("dump-good", 0);
    assert_true(json_is_true(json_object_get(r, "clean")));
    assert_int_equal(geti(region(r, 0), "tokens_checked"), MLA_TOKENS);
    assert_int_equal(geti(region(r, 0), "source_checked"), MLA_TOKENS);
    assert_int_equal(geti(region(r, 1), "tokens_checked"), INDEX_TOKENS);
    assert_int_equal(geti(region(r, 1), "scales_checked"), INDEX_TOKENS);
    assert_int_equal(geti(region(r, 1), "scales_inconsistent"), 0);
    assert_int_equal(geti(json_object_get(r, "summary"), "tokens_wrong"), 0);
    json_decref(r);
    cli_run(kvr_bin, "inspect", "dump-good", &res);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "synthetic data, seed 7"));
    assert_non_null(
        strstr(res.out, "region 0 mla layer 3: 286 tokens checked, 0 wrong"));
    assert_non_null(strstr(res.out, "summary: clean"));
}

/* Every MLA run reads one token too far. */
static void shift_mla(const td_dump_t *d, size_t region_i, size_t req,
                      uint32_t rank, kvr_run_t **runs, size_t *n)
{
    (void)d, (void)req, (void)rank;
    for (size_t i = 0; region_i == 0 && i < *n; i++)
        (*runs)[i].src += TD_TB;
}

static void test_mla_shifted_by_one(void **state)
{
    (void)state;
    td_dump_t d;
    make_dump("dump-shift", shift_mla, &d);
    json_t *r = inspect_json("dump-shift", 1);
    assert_false(json_is_true(json_object_get(r, "clean")));
    assert_int_equal(geti(region(r, 0), "tokens_wrong"), MLA_TOKENS);
    assert_int_equal(geti(region(r, 1), "tokens_wrong"), 0);
    assert_int_equal(json_array_size(json_object_get(region(r, 0), "diffs")),
                     5);
    const td_request_t *q = &d.reqs[0];
    for (size_t i = 0; i < 5; i++) { /* rank 0 owns 0, 4, 8, 12, 16 */
        json_t *x = diff(r, 0, i);
        uint64_t g = 4 * i, byte = (uint64_t)geti(x, "byte");
        uint8_t want[TD_TB], got[TD_TB];
        char hex[2 * TD_TB + 1];
        assert_string_equal(gets(x, "kind"), "wrong");
        assert_string_equal(gets(x, "request"), "req-0");
        assert_int_equal(geti(x, "rank"), 0);
        assert_int_equal(geti(x, "token"), g);
        assert_string_equal(gets(x, "part"), "latent");
        kvr_synth_latent(TD_SEED, 3, g, q->tok[g], want, TD_TB);
        kvr_synth_latent(TD_SEED, 3, g + 1, q->tok[g + 1], got, TD_TB);
        assert_true(byte < TD_TB && want[byte] != got[byte]);
        hex_of(want + byte, 16 < TD_TB - byte ? 16 : TD_TB - byte, hex);
        assert_string_equal(gets(x, "expected"), hex);
        hex_of(got + byte, 16 < TD_TB - byte ? 16 : TD_TB - byte, hex);
        assert_string_equal(gets(x, "found"), hex);
        uint64_t slot = kvr__dst_slot(q->dst, g, TD_BS, 1, TD_W);
        assert_int_equal(geti(x, "dst_offset"), slot * TD_TB + byte);
        slot = kvr__src_slot(q->src, g, TD_BS);
        assert_int_equal(geti(x, "src_offset"), slot * TD_TB + byte);
    }
    json_decref(r);
    td_free(&d);
    cli_run(kvr_bin, "inspect", "--max-report 2 dump-shift", &res);
    assert_int_equal(res.status, 1);
    assert_non_null(strstr(res.out, "286 tokens checked, 286 wrong"));
    assert_non_null(strstr(res.out, "wrong token 0 (req-0, rank 0): latent"));
    assert_non_null(strstr(res.out, "wrong token 4 (req-0, rank 0): latent"));
    assert_null(strstr(res.out, "wrong token 8 "));
    assert_non_null(
        strstr(res.out, "summary: DIFFERENCES: 1 of 2 regions differ"));
}

/* The run that carries token 37 to its owner, rank 1, is missing. */
static void drop_token_37(const td_dump_t *d, size_t region_i, size_t req,
                          uint32_t rank, kvr_run_t **runs, size_t *n)
{
    uint64_t dst = kvr__dst_slot(d->reqs[0].dst, 37, TD_BS, 1, TD_W) * TD_TB;
    if (region_i != 0 || req != 0 || rank != 1)
        return;
    for (size_t i = 0; i < *n; i++)
        if ((*runs)[i].dst == dst) { /* I = 1: one run per token */
            (*runs)[i] = (*runs)[--*n];
            return;
        }
    fail_msg("no run carries token 37");
}

static void test_one_dropped_token(void **state)
{
    (void)state;
    make_dump("dump-drop", drop_token_37, NULL);
    json_t *r = inspect_json("dump-drop", 1);
    assert_int_equal(geti(region(r, 0), "tokens_wrong"), 1);
    json_t *x = diff(r, 0, 0);
    assert_int_equal(geti(x, "token"), 37);
    assert_int_equal(geti(x, "rank"), 1);
    assert_string_equal(gets(x, "found"), "00000000000000000000000000000000");
    assert_null(diff(r, 0, 1));
    json_decref(r);
}

/* The historical bug: index pages moved as 144-byte windows per token, as
 * if a window of the page were a token. */
static void index_windows(const td_dump_t *d, size_t region_i, size_t req,
                          uint32_t rank, kvr_run_t **runs, size_t *n)
{
    (void)rank;
    if (region_i != 1)
        return;
    const kvr_request_t *q = &d->reqs[req].req;
    const kvr_region_pair_t *p = &d->pairs[1];
    uint64_t C = kvr_index_stride(TD_D), V = TD_BS * TD_W;
    uint64_t first = q->num_computed_blocks * V;
    *runs = realloc(*runs, (q->num_tokens - first) * sizeof(**runs));
    *n = 0;
    for (uint64_t g = first; g < q->num_tokens; g++)
        (*runs)[(*n)++] = (kvr_run_t){
            q->src_blocks[g / TD_BS] * p->src.page_bytes + g % TD_BS * C,
            q->dst_blocks[g / V] * p->dst.page_bytes + g % V * C, C};
}

static void test_index_as_token_windows(void **state)
{
    (void)state;
    make_dump("dump-windows", index_windows, NULL);
    json_t *r = inspect_json("dump-windows", 1);
    assert_int_equal(geti(region(r, 0), "tokens_wrong"), 0);
    json_t *idx = region(r, 1);
    assert_true(geti(idx, "tokens_wrong") > INDEX_TOKENS / 2);
    assert_true(geti(idx, "scales_inconsistent") > INDEX_TOKENS / 2);
    /* Token 0's keys survive (a preshuffled 16-token group has the same
     * offsets in both pages) but its scale is some other window's bytes:
     * keys and scale no longer belong together. */
    json_t *x = diff(r, 1, 0);
    assert_int_equal(geti(x, "token"), 0);
    assert_string_equal(gets(x, "part"), "scale");
    json_t *s = NULL;
    size_t i;
    json_array_foreach(json_object_get(idx, "diffs"), i,
                       s) if (strcmp(gets(s, "kind"), "scale") == 0) break;
    assert_non_null(s);
    assert_int_equal(geti(s, "token"), 0);
    assert_int_equal(geti(s, "dst_offset"),
                     TD_BS * TD_W * TD_D); /* scale plane */
    json_decref(r);
    cli_run(kvr_bin, "inspect", "dump-windows", &res);
    assert_non_null(strstr(res.out, "wrong token 0 (req-0, rank 0): scale"));
    assert_non_null(
        strstr(res.out, "scale/key mismatch 0 (req-0, rank 0): scale"));
    /* Without the synthetic declaration only the byte diff remains. */
    r = inspect_json("--no-synthetic dump-windows", 1);
    assert_int_equal(geti(region(r, 1), "scales_checked"), 0);
    assert_int_equal(geti(region(r, 1), "source_checked"), 0);
    json_decref(r);
}

/* A faithful transfer of a source that is not the declared data. */
static void test_source_not_synthetic(void **state)
{
    (void)state;
    td_dump_t d;
    td_init(&d);
    uint64_t slot = kvr__src_slot(d.reqs[1].src, 100, TD_BS);
    d.src[0][slot * TD_TB + 5] ^= 0x40;
    td_transfer(&d, NULL);
    td_write(&d, "dump-source");
    td_free(&d);
    json_t *r = inspect_json("dump-source", 1);
    assert_int_equal(geti(region(r, 0), "tokens_wrong"), 0);
    assert_int_equal(geti(region(r, 0), "source_wrong"), 1);
    json_t *x = diff(r, 0, 0);
    assert_string_equal(gets(x, "kind"), "source");
    assert_string_equal(gets(x, "request"), "req-1");
    assert_int_equal(geti(x, "token"), 100);
    assert_int_equal(geti(x, "byte"), 5);
    assert_int_equal(geti(x, "src_offset"), slot * TD_TB + 5);
    json_decref(r);
    /* a wrong seed makes every source token wrong */
    r = inspect_json("--seed 8 dump-source", 1);
    assert_int_equal(geti(region(r, 1), "source_wrong"), MLA_TOKENS);
    json_decref(r);
}

/* ---- hostile manifests: exit 2, one line naming the field ---- */

typedef void (*edit_fn)(json_t *root);

static json_t *at(json_t *root, const char *list, size_t i)
{
    return json_array_get(json_object_get(root, list), i);
}

static void e_format(json_t *m)
{
    json_object_set_new(m, "format", json_string("x"));
}
static void e_version(json_t *m)
{
    json_object_set_new(m, "version", json_integer(2));
}
static void e_dcp(json_t *m)
{
    json_object_set_new(json_object_get(m, "layout"), "dcp", json_integer(0));
}
static void e_interleave(json_t *m)
{
    json_object_set_new(json_object_get(m, "layout"), "interleave",
                        json_integer(3));
}
static void e_bool(json_t *m)
{
    json_object_set_new(json_object_get(m, "layout"), "preshuffle",
                        json_integer(1));
}
static void e_files(json_t *m)
{
    json_array_remove(json_object_get(at(m, "regions", 0), "dst_files"), 3);
}
static void e_escape(json_t *m)
{
    json_object_set_new(at(m, "regions", 0), "src_file",
                        json_string("../x.bin"));
}
static void e_missing(json_t *m)
{
    json_array_set_new(json_object_get(at(m, "regions", 1), "dst_files"), 2,
                       json_string("missing.bin"));
}
static void e_huge(json_t *m)
{
    json_t *src = json_object_get(at(m, "regions", 0), "src");
    json_object_set_new(src, "num_blocks", json_integer(1ll << 32));
    json_object_set_new(src, "page_bytes", json_integer(1ll << 40));
}
static void e_size(json_t *m)
{
    json_object_set_new(json_object_get(at(m, "regions", 0), "dst"),
                        "num_blocks", json_integer(9));
}
static void e_tokens_page(json_t *m)
{
    json_t *r = at(m, "regions", 0);
    json_object_set_new(json_object_get(r, "src"), "page_bytes",
                        json_integer(1000));
}
static void e_role(json_t *m)
{
    json_object_set_new(at(m, "regions", 1), "role", json_string("dense"));
}
static void e_dim(json_t *m)
{
    json_object_set_new(at(m, "regions", 1), "index_dim", json_string("x"));
}
static void e_block(json_t *m)
{
    json_array_set_new(json_object_get(at(m, "requests", 0), "src_blocks"), 2,
                       json_integer(99));
}
static void e_neg(json_t *m)
{
    json_object_set_new(at(m, "requests", 0), "num_tokens", json_integer(-1));
}
static void e_token_ids(json_t *m)
{
    json_array_remove(json_object_get(at(m, "requests", 0), "token_ids"), 0);
}
static void e_computed(json_t *m)
{
    json_object_set_new(at(m, "requests", 0), "num_computed_blocks",
                        json_integer(5));
}
static void e_short(json_t *m)
{
    json_object_set_new(at(m, "requests", 1), "num_tokens", json_integer(2000));
    json_object_del(at(m, "requests", 1), "token_ids");
}
static void e_regions(json_t *m)
{
    json_object_set_new(m, "regions", json_string("x"));
}

static const struct {
    edit_fn edit;
    const char *needle;
} hostile[] = {
    {e_format, "manifest format: not \"kvrelay-dump\""},
    {e_version, "manifest version: not an integer in [1, 1]"},
    {e_dcp, "manifest layout.dcp: not an integer in [1, 4096]"},
    {e_interleave, "interleave 3"},
    {e_bool, "manifest layout.preshuffle: not true or false"},
    {e_files, "regions[0].dst_files: 3 files for W=4"},
    {e_escape, "'../x.bin' is not a plain file name"},
    {e_missing, "missing.bin: cannot open"},
    {e_huge, "regions[0].src: 4294967296 blocks x 1099511627776 bytes exceeds"},
    {e_size, "bytes, the manifest says 9 blocks"},
    {e_tokens_page,
     "page bytes 1000 is not a positive multiple of block size 16"},
    {e_role, "regions[1].role: not \"mla\" or \"index\""},
    {e_dim, "regions[1].index_dim: not an integer"},
    {e_block, "request 'req-0', region 0 (mla layer 3): source block id 99"},
    {e_neg, "requests[0].num_tokens: not an integer"},
    {e_token_ids, "requests[0].token_ids: 149 ids for 150 tokens"},
    {e_computed, "num_computed_blocks 5"},
    {e_short, "2000 tokens need 125 source"},
    {e_regions, "manifest regions: not an array"},
};

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_hostile_manifests(void **state)
{
    (void)state;
    make_dump("dump-hostile", NULL, NULL);
    json_error_t jerr;
    for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
        json_t *m = json_load_file("dump-good/manifest.json", 0, &jerr);
        assert_non_null(m);
        hostile[i].edit(m);
        assert_int_equal(json_dump_file(m, "dump-hostile/manifest.json", 0), 0);
        json_decref(m);
        cli_expect_usage(kvr_bin, "inspect", "dump-hostile", hostile[i].needle,
                         &res);
    }
    write_text("dump-hostile/manifest.json", "{\"format\": ");
    cli_expect_usage(kvr_bin, "inspect", "dump-hostile", "line 1", &res);
    write_text("dump-hostile/manifest.json", "[]");
    cli_expect_usage(kvr_bin, "inspect", "dump-hostile", "not an object", &res);
    cli_expect_usage(kvr_bin, "inspect", "no-such-dump", "no such file", &res);
}

static void test_usage(void **state)
{
    (void)state;
    cli_expect_usage(kvr_bin, "inspect", "", "DIR is required", &res);
    cli_expect_usage(kvr_bin, "inspect", "a b", "one dump directory expected",
                     &res);
    cli_expect_usage(kvr_bin, "inspect", "--max-report 0 a",
                     "--max-report: '0'", &res);
    cli_expect_usage(kvr_bin, "inspect", "--seed 1 --no-synthetic a",
                     "exclude each other", &res);
    cli_expect_usage(kvr_bin, "inspect", "--wat a", "'--wat'", &res);
    cli_run(kvr_bin, "inspect", "--help", &res);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "usage: kvrelay inspect"));
}

int main(int argc, char **argv)
{
    kvr_bin = argc > 1 ? argv[1] : "kvrelay";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean),
        cmocka_unit_test(test_mla_shifted_by_one),
        cmocka_unit_test(test_one_dropped_token),
        cmocka_unit_test(test_index_as_token_windows),
        cmocka_unit_test(test_source_not_synthetic),
        cmocka_unit_test(test_hostile_manifests),
        cmocka_unit_test(test_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
