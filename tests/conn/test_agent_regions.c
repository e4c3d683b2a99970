/* Region registration on an agent (kvr_agent_add_region), the guarantees
 * issue 13 asked of the old connector: the region limit is an error that
 * writes nothing past regions[], and a failed allocation is
 * KVR_ERR_NO_MEMORY with the agent as it was (no region, no staging, no
 * slot table), so a retry succeeds. White box: it looks at struct
 * kvr_agent (agent_internal.h). Linked with --wrap=malloc,calloc,realloc to
 * fail kvrelay's own allocations; the data plane is the in-process loopback
 * transport. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent_harness.h"
#include "agent_internal.h"
#include "oom_wrap.h"

static unsigned char g_page[4096];

static kvr_agent_t *consumer(kvr_transport_t *hub)
{
    ah_model_t m = ah_model();
    kvr_agent_params_t p = ah_consumer_params(&m, hub, "decode", 0);
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    if (kvr_agent_create(&p, &a, &err) != KVR_OK)
        fail_msg("create: %s", err.msg);
    return a;
}

static kvr_region_desc_t other_region(uint32_t layer)
{
    kvr_region_desc_t d = {.role = KVR_ROLE_OTHER,
                           .layer = layer,
                           .num_blocks = 1,
                           .page_bytes = 64};
    return d;
}

/* What follows regions[] in the agent is filled with a pattern that must
 * survive the refused add. */
static void test_region_limit_writes_nothing_past_the_end(void **state)
{
    (void)state;
    kvr_transport_t *hub = ah_hub();
    kvr_agent_t *a = consumer(hub);
    for (uint32_t i = 0; i < KVR_AGENT_MAX_REGIONS; i++) {
        kvr_region_desc_t d = other_region(i);
        if (kvr_agent_add_region(a, &d, g_page, 0) != KVR_OK)
            fail_msg("region %u: %s", i, kvr_agent_last_error(a));
    }
    assert_true(offsetof(struct kvr_agent, order) >=
                offsetof(struct kvr_agent, regions) + sizeof(a->regions));
    memset(a->order, 0xa5, sizeof(a->order)); /* filled only at start */

    kvr_region_desc_t d = other_region(KVR_AGENT_MAX_REGIONS);
    assert_int_equal(kvr_agent_add_region(a, &d, g_page, 0), KVR_ERR_NO_SPACE);
    assert_non_null(strstr(kvr_agent_last_error(a), "more than 1024 regions"));
    void *base = NULL;
    assert_int_equal(kvr_agent_alloc_region(a, &d, 0, &base), KVR_ERR_NO_SPACE);
    assert_null(base);
    const unsigned char *b = (const unsigned char *)a->order;
    for (size_t i = 0; i < sizeof(a->order); i++)
        if (b[i] != 0xa5)
            fail_msg("byte %zu of order[] changed to 0x%02x", i, b[i]);
    assert_int_equal(a->num_regions, KVR_AGENT_MAX_REGIONS);
    kvr_agent_destroy(a);
    kvr_transport_destroy(hub);
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
    kvr_transport_t *hub = ah_hub();
    for (long n = 0;; n++) {
        kvr_agent_t *a = consumer(hub);
        oom_arm(n);
        kvr_status_t st = kvr_agent_add_region(a, &d, g_page, 0);
        oom_disarm();
        if (!oom_fired()) {
            assert_int_equal(st, KVR_OK);
            assert_true(n >= 1); /* the slot table allocates */
            assert_int_equal(a->staging, 0);
            assert_non_null(a->slot_busy);
            kvr_agent_destroy(a);
            break;
        }
        if (st != KVR_ERR_NO_MEMORY)
            fail_msg("allocation %ld failed: status %s, want ERR_NO_MEMORY", n,
                     kvr_status_name(st));
        assert_int_equal(a->num_regions, 0);
        assert_int_equal(a->staging, -1);
        assert_null(a->slot_busy);
        assert_int_equal(kvr_agent_add_region(a, &d, g_page, 0), KVR_OK);
        assert_int_equal(a->staging, 0);
        assert_non_null(a->slot_busy);
        kvr_agent_destroy(a);
    }
    kvr_transport_destroy(hub);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_region_limit_writes_nothing_past_the_end),
        cmocka_unit_test(test_staging_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
