/* Offload identity (docs/design.md §9): canonical description, namespace key,
 * input checks and the chunk-aligned prefix. Golden values come from
 * Python: json.dumps(d, sort_keys=True, separators=(",", ":"),
 * ensure_ascii=True) and hashlib.blake2b(text, digest_size=16). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvrelay/completion.h"

static const char *const k_types[] = {"full", "shared", "full"};

static kvr_offload_desc_t base(void)
{
    kvr_offload_desc_t d = {
        .model_tag = "glm-5.2",
        .dtype = "fp8",
        .block_size = 64,
        .chunk_size = 256,
        .tp = 4,
        .dcp_size = 4,
        .interleave = 1,
        .replicate_index = true,
        .preshuffle = true,
        .indexer_types = k_types,
        .num_indexer_types = 3,
    };
    return d;
}

static void key_of(const kvr_offload_desc_t *d, char out[33])
{
    kvr_error_t err = {0};
    if (kvr_offload_key(d, out, &err) != KVR_OK)
        fail_msg("kvr_offload_key: %s", err.msg);
}

static void test_golden(void **state)
{
    (void)state;
    kvr_offload_desc_t d = base();
    char text[512];
    size_t len = 0;
    assert_int_equal(kvr_offload_canonical(&d, text, sizeof(text), &len, NULL),
                     KVR_OK);
    const char *want =
        "{\"block_size\":64,\"chunk_size\":256,\"dcp_interleave\":1,"
        "\"dcp_size\":4,\"index_preshuffle\":true,\"indexer_types\":[\"full\","
        "\"shared\",\"full\"],\"kv_cache_dtype\":\"fp8\",\"layout_version\":3,"
        "\"model\":\"glm-5.2\",\"replicated_index_cache\":true,\"schema\":"
        "\"kvrelay-page-namespace\",\"tp_size\":4}";
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    char key[33];
    key_of(&d, key);
    assert_string_equal(key, "2bc96a45246819dee77c79e340586ac0");
    /* non-ASCII and quotes are escaped, so the text stays unambiguous */
    d.model_tag = "m\xc3\xa9\"x";
    key_of(&d, key);
    assert_string_equal(key, "7ff14d51f1e736f17e2af74ee1ccbb48");
    /* escapes use lower-case hex as Python writes them; a literal "\u" in
     * the text is not an escape and keeps its case */
    d.model_tag = "a\\u00AB\xc3\xa9";
    assert_int_equal(kvr_offload_canonical(&d, text, sizeof(text), &len, NULL),
                     KVR_OK);
    assert_non_null(strstr(text, "\"model\":\"a\\\\u00AB\\u00e9\""));
    key_of(&d, key);
    assert_string_equal(key, "00adb019b194eb0429497a4090861762");
    d.model_tag = "x\xf0\x9f\x98\x80"; /* outside the BMP: a surrogate pair */
    key_of(&d, key);
    assert_string_equal(key, "c96951cd7567f823a7892b2cc3ea3ade");
    char ns[128];
    d = base();
    assert_int_equal(kvr_offload_namespace(&d, ns, sizeof(ns), NULL), KVR_OK);
    assert_string_equal(
        ns, "glm-5.2::kvrelay-page-v3-2bc96a45246819dee77c79e340586ac0");
}

static void test_sizing(void **state)
{
    (void)state;
    kvr_offload_desc_t d = base();
    kvr_error_t err = {0};
    size_t len = 0, len2 = 0;
    assert_int_equal(kvr_offload_canonical(&d, NULL, 0, &len, NULL), KVR_OK);
    char buf[512];
    memset(buf, 'z', sizeof(buf));
    assert_int_equal(kvr_offload_canonical(&d, buf, len, &len2, &err),
                     KVR_ERR_BUFFER_SMALL);
    assert_non_null(strstr(err.msg, "needs"));
    assert_int_equal(len2, 0);
    assert_int_equal(buf[0], 'z');
    assert_int_equal(kvr_offload_canonical(&d, buf, len + 1, &len2, NULL),
                     KVR_OK);
    assert_int_equal(len2, len);
    assert_int_equal(buf[len], '\0');
    char ns[20];
    assert_int_equal(kvr_offload_namespace(&d, ns, sizeof(ns), &err),
                     KVR_ERR_BUFFER_SMALL);
    assert_non_null(
        strstr(err.msg, "buffer of 20 bytes; the namespace needs 58"));
}

#define NVARIANTS 14

/* Any field that differs gives another key. */
static void test_every_field_matters(void **state)
{
    (void)state;
    static const char *const two[] = {"full", "shared"};
    static const char *const swapped[] = {"shared", "full", "full"};
    char keys[NVARIANTS][33];
    for (int v = 0; v < NVARIANTS; v++) {
        kvr_offload_desc_t d = base();
        switch (v) {
        case 1:
            d.model_tag = "glm-5.1";
            break;
        case 2:
            d.dtype = "bf16";
            break;
        case 3:
            d.block_size = 32;
            break;
        case 4:
            d.chunk_size = 512;
            break;
        case 5:
            d.tp = 8;
            break;
        case 6:
            d.dcp_size = 2;
            d.tp = 4;
            break;
        case 7:
            d.replicate_index = false;
            break;
        case 8:
            d.num_indexer_types = 2;
            d.indexer_types = two;
            break;
        case 9:
            d.indexer_types = swapped;
            break;
        case 10:
            d.num_indexer_types = 0;
            d.indexer_types = NULL;
            break;
        case 11:
            d.interleave = 2;
            break;
        case 12:
            d.preshuffle = false;
            break;
        case 13:
            d.dcp_size = 1;
            d.chunk_size = 256;
            break;
        default:
            break;
        }
        key_of(&d, keys[v]);
        for (int u = 0; u < v; u++)
            if (strcmp(keys[u], keys[v]) == 0)
                fail_msg("variants %d and %d share key %s", u, v, keys[v]);
    }
}

/* Strings cannot run into each other or into the array's separators. */
static void test_unambiguous(void **state)
{
    (void)state;
    static const char *const ab[] = {"a", "b"};
    static const char *const a_b[] = {"a,b"};
    static const char *const quoted[] = {"a\",\"b"};
    const char *const *arrs[] = {ab, a_b, quoted};
    const size_t counts[] = {2, 1, 1};
    char keys[5][33];
    for (int i = 0; i < 3; i++) {
        kvr_offload_desc_t d = base();
        d.indexer_types = arrs[i];
        d.num_indexer_types = counts[i];
        key_of(&d, keys[i]);
    }
    kvr_offload_desc_t d = base();
    d.model_tag = "ab";
    d.dtype = "c";
    key_of(&d, keys[3]);
    d.model_tag = "a";
    d.dtype = "bc";
    key_of(&d, keys[4]);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < i; j++)
            assert_string_not_equal(keys[i], keys[j]);
}

static void expect_bad(const kvr_offload_desc_t *d, kvr_status_t code,
                       const char *needle)
{
    kvr_error_t err = {0};
    char key[33] = "untouched";
    assert_int_equal(kvr_offload_key(d, key, &err), code);
    assert_int_equal(err.code, code);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    assert_string_equal(key, "untouched");
}

static void test_invalid(void **state)
{
    (void)state;
    static const char *const holes[] = {"full", NULL};
    static const char *const empty[] = {""};
    char longtag[300];
    memset(longtag, 'm', sizeof(longtag) - 1);
    longtag[sizeof(longtag) - 1] = '\0';
    kvr_offload_desc_t d = base();
    d.model_tag = "";
    expect_bad(&d, KVR_ERR_INVALID, "model tag is empty");
    d.model_tag = NULL;
    expect_bad(&d, KVR_ERR_INVALID, "model tag is empty");
    d.model_tag = longtag;
    expect_bad(&d, KVR_ERR_INVALID, "model tag longer than 256 bytes");
    d.model_tag = "bad\ntag";
    expect_bad(&d, KVR_ERR_INVALID, "control byte 0x0a at 3");
    d.model_tag = "bad\xff";
    expect_bad(&d, KVR_ERR_INVALID, "not valid UTF-8");
    d = base();
    d.dtype = "";
    expect_bad(&d, KVR_ERR_INVALID, "dtype is empty");
    d = base();
    d.chunk_size = 100;
    expect_bad(
        &d, KVR_ERR_CHUNK_SIZE,
        "chunk size 100 is not a positive multiple of bs * W = 64 * 4 = 256");
    d.chunk_size = 0;
    expect_bad(&d, KVR_ERR_CHUNK_SIZE, "chunk size 0");
    d.chunk_size = 64; /* a multiple of bs but not of bs * W */
    expect_bad(&d, KVR_ERR_CHUNK_SIZE, "chunk size 64");
    d = base();
    d.block_size = 0;
    expect_bad(&d, KVR_ERR_BLOCK_SIZE, "block size 0");
    d = base();
    d.dcp_size = 0;
    expect_bad(&d, KVR_ERR_DCP_LT1, "DCP size 0");
    d = base();
    d.tp = 6;
    expect_bad(&d, KVR_ERR_TP_NOT_DIVISIBLE, "TP size 6");
    d = base();
    d.interleave = 3;
    expect_bad(&d, KVR_ERR_INTERLEAVE_NOT_DIVISOR, "interleave 3");
    d = base();
    d.indexer_types = holes;
    d.num_indexer_types = 2;
    expect_bad(&d, KVR_ERR_INVALID, "indexer type of layer 1 is empty");
    d.indexer_types = empty;
    d.num_indexer_types = 1;
    expect_bad(&d, KVR_ERR_INVALID, "indexer type of layer 0 is empty");
    d.indexer_types = NULL;
    expect_bad(&d, KVR_ERR_INVALID, "NULL array");
    d.indexer_types = k_types;
    d.num_indexer_types = KVR_OFFLOAD_MAX_LAYERS + 1;
    expect_bad(&d, KVR_ERR_INVALID, "4097 indexer types (max 4096)");
    expect_bad(NULL, KVR_ERR_INVALID, "NULL");
}

static void aligned(int64_t hit, uint64_t chunk, uint64_t want)
{
    uint64_t got = 12345;
    assert_int_equal(kvr_offload_aligned_prefix(hit, chunk, &got, NULL),
                     KVR_OK);
    assert_int_equal(got, want);
}

static void test_aligned_prefix(void **state)
{
    (void)state;
    aligned(-5, 256, 0);
    aligned(INT64_MIN, 256, 0);
    aligned(0, 256, 0);
    aligned(255, 256, 0);
    aligned(256, 256, 256);
    aligned(1000, 256, 768);
    aligned(1024, 256, 1024);
    aligned(7, 1, 7);
    aligned(INT64_MAX, 256, (uint64_t)INT64_MAX / 256 * 256);
    kvr_error_t err = {0};
    uint64_t out = 9;
    assert_int_equal(kvr_offload_aligned_prefix(1000, 0, &out, &err),
                     KVR_ERR_CHUNK_SIZE);
    assert_non_null(strstr(err.msg, "chunk size 0"));
    assert_int_equal(out, 9);
    assert_int_equal(kvr_offload_aligned_prefix(1000, 256, NULL, &err),
                     KVR_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_sizing),
        cmocka_unit_test(test_every_field_matters),
        cmocka_unit_test(test_unambiguous),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_aligned_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
