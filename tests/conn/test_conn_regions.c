/* Region registration on a connector (kvr_conn_add_region): the region
 * limit is an error that writes nothing past regions[], and a failed
 * allocation is KVR_ERR_NO_MEMORY with the connector as it was. White box:
 * it looks at struct kvr_conn (conn_internal.h). Linked with
 * --wrap=malloc,calloc,realloc to fail kvrelay's own allocations; needs UCX
 * (a connector's transport), exit 77 without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conn_internal.h"
#include "oom_wrap.h"

static unsigned char g_page[4096];

static kvr_conn_t *consumer(void)
{
    kvr_conn_params_t p = KVR_CONN_PARAMS_INIT;
    p.layout.block_size = 16;
    p.tl = KVR_CONN_TL_TCP;
    kvr_conn_t *c = NULL;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_conn_create(&p, &c, &err);
    if (st == KVR_ERR_UNSUPPORTED || st == KVR_ERR_TRANSPORT) {
        printf("SKIP: no connector here: %s\n", err.msg);
        exit(77);
    }
    assert_int_equal(st, KVR_OK);
    return c;
}

static kvr_region_desc_t other_region(uint32_t layer)
{
    kvr_region_desc_t d = {.role = KVR_ROLE_OTHER,
                           .layer = layer,
                           .num_blocks = 1,
                           .page_bytes = 64};
    return d;
}

/* The element one past regions[] overlaps the fields behind it; the test
 * fills them with a pattern that must survive the refused add. */
static void test_region_limit_writes_nothing_past_the_end(void **state)
{
    (void)state;
    kvr_conn_t *c = consumer();
    for (uint32_t i = 0; i < KVR_CONN_MAX_REGIONS; i++) {
        kvr_region_desc_t d = other_region(i);
        assert_int_equal(kvr_conn_add_region(c, &d, g_page), KVR_OK);
    }
    size_t end = offsetof(struct kvr_conn, regions) + sizeof(c->regions);
    size_t dev = end + offsetof(kvr__region_t, device);
    size_t peers = offsetof(struct kvr_conn, peers);
    /* the pattern covers what regions[MAX].device/owned would hit */
    assert_true(dev >= peers && dev + 2 <= peers + sizeof(c->peers));
    memset(c->peers, 0xa5, sizeof(c->peers)); /* no peer yet: unread */

    kvr_region_desc_t d = other_region(KVR_CONN_MAX_REGIONS);
    assert_int_equal(kvr_conn_add_region(c, &d, g_page), KVR_ERR_NO_SPACE);
    assert_non_null(strstr(kvr_conn_last_error(c), "more than 1024 regions"));
    const unsigned char *b = (const unsigned char *)c->peers;
    for (size_t i = 0; i < sizeof(c->peers); i++)
        if (b[i] != 0xa5)
            fail_msg("byte %zu behind regions[] changed to 0x%02x",
                     offsetof(struct kvr_conn, peers) + i - end, b[i]);
    assert_int_equal(c->num_regions, KVR_CONN_MAX_REGIONS);
    memset(c->peers, 0, sizeof(c->peers));
    kvr_conn_destroy(c);
}

/* Every allocation of adding a STAGING region fails in turn: the add says
 * KVR_ERR_NO_MEMORY and leaves no region, no staging and no slot table
 * behind; a retry succeeds. */
static void test_staging_allocation_failures(void **state)
{
    (void)state;
    kvr_region_desc_t d = {.role = KVR_ROLE_STAGING,
                           .num_blocks = 8,
                           .page_bytes = sizeof(g_page) / 8};
    for (long n = 0;; n++) {
        kvr_conn_t *c = consumer();
        oom_arm(n);
        kvr_status_t st = kvr_conn_add_region(c, &d, g_page);
        oom_disarm();
        if (!oom_fired()) {
            assert_int_equal(st, KVR_OK);
            assert_true(n > 1); /* registration and slot table allocate */
            assert_int_equal(c->staging_idx, 0);
            assert_non_null(c->slot_busy);
            kvr_conn_destroy(c);
            return;
        }
        if (st != KVR_ERR_NO_MEMORY)
            fail_msg("allocation %ld failed: status %s, want ERR_NO_MEMORY", n,
                     kvr_status_name(st));
        assert_int_equal(c->num_regions, 0);
        assert_int_equal(c->staging_idx, -1);
        assert_null(c->slot_busy);
        assert_int_equal(kvr_conn_add_region(c, &d, g_page), KVR_OK);
        assert_int_equal(c->staging_idx, 0);
        assert_non_null(c->slot_busy);
        kvr_conn_destroy(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_region_limit_writes_nothing_past_the_end),
        cmocka_unit_test(test_staging_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
