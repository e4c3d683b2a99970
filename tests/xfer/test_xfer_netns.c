/* UCX over TCP between two network namespaces joined by a veth pair: the
 * producer in one, W = 2 consumers in the other, I in {1, bs}, both
 * executors, every byte verified. Needs root and `ip netns`; exits 77
 * (skipped) with the reason when the kernel or the tools refuse. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "xfer_harness.h"

static char ns_a[32], ns_b[32];

static int sh(const char *cmd)
{
    char line[512];
    snprintf(line, sizeof(line), "%s >/dev/null 2>&1", cmd);
    return system(line);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "ip netns del %s", ns_a);
    sh(cmd);
    snprintf(cmd, sizeof(cmd), "ip netns del %s", ns_b);
    sh(cmd);
}

/* Both ends are named kvr0 inside their namespace so one UCX_NET_DEVICES
 * value serves both sides. */
static int setup(void)
{
    const char *fmt[] = {
        "ip netns add %1$s",
        "ip netns add %2$s",
        "ip link add kva%3$d type veth peer name kvb%3$d",
        "ip link set kva%3$d netns %1$s",
        "ip link set kvb%3$d netns %2$s",
        "ip -n %1$s link set kva%3$d name kvr0",
        "ip -n %2$s link set kvb%3$d name kvr0",
        "ip -n %1$s addr add 10.213.0.1/24 dev kvr0",
        "ip -n %2$s addr add 10.213.0.2/24 dev kvr0",
        "ip -n %1$s link set kvr0 up",
        "ip -n %2$s link set kvr0 up",
        "ip -n %1$s link set lo up",
        "ip -n %2$s link set lo up",
    };
    int id = (int)(getpid() % 100000);
    snprintf(ns_a, sizeof(ns_a), "kvrA%d", id);
    snprintf(ns_b, sizeof(ns_b), "kvrB%d", id);
    for (size_t i = 0; i < sizeof(fmt) / sizeof(fmt[0]); i++) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), fmt[i], ns_a, ns_b, id);
        if (sh(cmd) != 0) {
            printf("SKIP: `%s` failed (needs root, iproute2 and netns "
                   "support)\n",
                   cmd);
            return 77;
        }
    }
    return 0;
}

static int run(uint32_t I)
{
    xh_config_t cfg = {
        .tl = KVR_XFER_TL_TCP,
        .W = 2,
        .bs = 64,
        .I = I,
        .token_bytes = 576,
        .with_index = true,
        .slot_bytes = 64 * 1024,
        .num_slots = 3,
        .timeout_ms = 20000,
        .seed = 3,
        .tokens = 64 * 2 * 4 + 9,
        .producer_netns = ns_a,
        .consumer_netns = ns_b,
        .net_devices = "kvr0",
    };
    xh_session_t s;
    int rc = xh_start(&s, &cfg);
    if (rc != 0)
        printf("%s: %s\n", rc == 77 ? "SKIP" : "FAIL", s.error);
    const int kinds[] = {KVR_EXEC_DIRECT, KVR_EXEC_STAGED};
    for (int k = 0; k < 2 && rc == 0; k++) {
        xh_result_t res[XH_MAX_RANKS];
        kvr_status_t st = xh_round(&s, kinds[k], NULL, res);
        printf("netns I=%u %s: %s %s\n", I, kvr_exec_name(kinds[k]),
               kvr_status_name(st), st == KVR_OK ? "" : s.error);
        rc = st != KVR_OK;
    }
    if (xh_stop(&s) != 0 && rc == 0)
        rc = 1;
    return rc;
}

int main(void)
{
    if (geteuid() != 0) {
        printf("SKIP: network namespaces need root\n");
        return 77;
    }
    int rc = setup();
    if (rc == 0)
        rc = run(1);
    if (rc == 0)
        rc = run(64);
    teardown();
    printf("%s\n", rc == 0    ? "1 passed, 0 failed"
                   : rc == 77 ? "skipped"
                              : "0 passed, 1 failed");
    return rc;
}
