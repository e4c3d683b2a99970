/* A partition ends on time: a producer agent and a consumer agent in two
 * network namespaces joined by a rate-limited veth pair (UCX over tcp, the
 * control link over the same veth), several requests moving, then the
 * link is cut (`ip link set down`) mid-transfer. Every request on both
 * sides must reach its terminal event by deadline plus grace (plus a
 * margin), and both agents must be destroyed promptly after. Needs root,
 * iproute2 with netns and tc tbf, and UCX; exits 77 (skipped) with the
 * reason otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvrelay/agent.h"

#define NREQ 4u
#define BS 16u
#define TOKEN_BYTES 4096u
#define TOKENS 1024u /* 64 blocks, 4 MiB a request */
#define POOL (NREQ * 64u)
#define DEADLINE_MS 6000u /* the transfer alone needs about 3.5 s */
#define GRACE_MS 1500u
#define MARGIN_MS 3000u /* a loaded 2-core machine */
#define DESTROY_MS 5000u
#define CUT_AFTER_MS 1200u
#define RATE "40mbit"
#define PORT "7419"

static char ns_p[32], ns_c[32];

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int sh(const char *fmt, ...)
{
    char cmd[512], line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    snprintf(line, sizeof(line), "%s >/dev/null 2>&1", cmd);
    int rc = system(line);
    if (rc != 0)
        printf("`%s` failed\n", cmd);
    return rc;
}

static void teardown(void)
{
    sh("ip netns del %s", ns_p);
    sh("ip netns del %s", ns_c);
}

static int setup(void)
{
    int id = (int)(getpid() % 100000);
    snprintf(ns_p, sizeof(ns_p), "kvrP%d", id);
    snprintf(ns_c, sizeof(ns_c), "kvrC%d", id);
    if (sh("ip netns add %s", ns_p) || sh("ip netns add %s", ns_c) ||
        sh("ip link add kvp%d type veth peer name kvc%d", id, id) ||
        sh("ip link set kvp%d netns %s", id, ns_p) ||
        sh("ip link set kvc%d netns %s", id, ns_c) ||
        sh("ip -n %s link set kvp%d name kvr0", ns_p, id) ||
        sh("ip -n %s link set kvc%d name kvr0", ns_c, id) ||
        sh("ip -n %s addr add 10.214.0.1/24 dev kvr0", ns_p) ||
        sh("ip -n %s addr add 10.214.0.2/24 dev kvr0", ns_c) ||
        sh("ip -n %s link set kvr0 up", ns_p) ||
        sh("ip -n %s link set kvr0 up", ns_c) ||
        sh("ip -n %s link set lo up", ns_p) ||
        sh("ip -n %s link set lo up", ns_c) ||
        sh("ip netns exec %s tc qdisc add dev kvr0 root tbf rate " RATE
           " burst 32kbit latency 400ms",
           ns_p))
        return 77;
    return 0;
}

/* As `ip netns exec` does: the namespace, and a /sys that shows it (UCX
 * lists devices from /sys/class/net). */
static int enter_netns(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 ||
        mount(name, "/sys", "sysfs", 0, NULL) != 0) {
        printf("cannot enter netns %s: %s\n", name, strerror(errno));
        return 77;
    }
    close(fd);
    setenv("UCX_NET_DEVICES", "kvr0", 1);
    return 0;
}

static kvr_agent_t *start_agent(bool producer)
{
    const char *name = producer ? "prefill" : "decode";
    kvr_agent_params_t p = KVR_AGENT_PARAMS_INIT;
    p.instance_id = name;
    p.instance_id_len = strlen(name);
    p.role = producer ? KVR_AGENT_PRODUCER : KVR_AGENT_CONSUMER;
    p.layout.block_size = BS;
    p.topo = (kvr_wire_topo_t){.pp_size = 1,
                               .tp_size = 1,
                               .dp_size = 1,
                               .layer_start = 0,
                               .layer_end = 1};
    p.listen = producer ? "10.214.0.1:" PORT : NULL;
    p.insecure = true; /* a veth of this test's own */
    p.tl = KVR_AGENT_TL_TCP;
    p.deadline_ms = DEADLINE_MS;
    p.grace_ms = GRACE_MS;
    p.lease_ms = 60000; /* the partition, not the lease, must end them */
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    if (kvr_agent_create(&p, &a, &err) != KVR_OK) {
        printf("kvr_agent_create: %s\n", err.msg);
        return NULL;
    }
    kvr_region_desc_t d = {.role = KVR_ROLE_MLA,
                           .layer = 0,
                           .num_blocks = POOL,
                           .page_bytes = BS * TOKEN_BYTES};
    void *base = NULL;
    if (kvr_agent_alloc_region(a, &d, 0, &base) != KVR_OK ||
        kvr_agent_start(a) != KVR_OK) {
        printf("%s agent: %s\n", name, kvr_agent_last_error(a));
        kvr_agent_destroy(a);
        return NULL;
    }
    return a;
}

static void table(uint32_t i, uint32_t *blocks)
{
    for (uint32_t k = 0; k < TOKENS / BS; k++)
        blocks[k] = i * (TOKENS / BS) + k;
}

/* Waits for `want` terminal events (kinds in mask), each request's time
 * of ending in ends[]; stops at until_ms. Returns how many came. */
static uint32_t wait_ends(kvr_agent_t *a, uint32_t mask, uint64_t *ends,
                          uint64_t until_ms)
{
    uint32_t got = 0;
    while (got < NREQ && now_ms() < until_ms) {
        struct pollfd p = {.fd = kvr_agent_event_fd(a), .events = POLLIN};
        poll(&p, 1, 50);
        kvr_agent_event_t e;
        while (kvr_agent_poll(a, &e)) {
            if (!(mask & (1u << e.kind)))
                continue;
            unsigned i = 0;
            sscanf((const char *)e.request.bytes, "req-%u", &i);
            printf("  %s req-%u %s after %llu ms: %s\n",
                   kvr_agent_event_name(e.kind), i, kvr_status_name(e.status),
                   (unsigned long long)(now_ms() - ends[NREQ]), e.message);
            if (i < NREQ && ends[i] == 0) {
                ends[i] = now_ms();
                got++;
            }
        }
    }
    return got;
}

/* A child's whole life: its agent, its requests, their ends, its destroy.
 * ends[NREQ] holds the start; the consumer's start is when it asked. */
static int child(bool producer, int ready_fd, int go_fd)
{
    int rc = enter_netns(producer ? ns_p : ns_c);
    if (rc != 0)
        return rc;
    kvr_agent_t *a = start_agent(producer);
    if (a == NULL)
        return 77;
    uint32_t blocks[TOKENS / BS];
    char id[16];
    uint64_t ends[NREQ + 1] = {0};
    char c = 0;
    if (!producer && read(go_fd, &c, 1) != 1)
        return 1;
    ends[NREQ] = now_ms();
    for (uint32_t i = 0; i < NREQ; i++) {
        snprintf(id, sizeof(id), "req-%u", i);
        table(i, blocks);
        kvr_status_t st;
        if (producer) {
            kvr_agent_send_t s = {id,     strlen(id), blocks, TOKENS / BS,
                                  TOKENS, 0,          1};
            st = kvr_agent_send_open(a, &s);
            if (st == KVR_OK)
                st = kvr_agent_send_ready(a, id, strlen(id), 0, 1, NULL);
        } else {
            kvr_agent_recv_t q = {"prefill",   7,          "10.214.0.1:" PORT,
                                  id,          strlen(id), blocks,
                                  TOKENS / BS, TOKENS,     0,
                                  0,           false};
            st = kvr_agent_recv(a, &q);
        }
        if (st != KVR_OK) {
            printf("request %u: %s\n", i, kvr_agent_last_error(a));
            return 1;
        }
    }
    if (write(ready_fd, "r", 1) != 1)
        return 1;
    /* the producer's requests end when their pulls do: by the consumer's
     * deadline plus grace, counted from the consumer's ask, which comes
     * after this start */
    uint32_t mask = producer ? (1u << KVR_AGENT_SENT) |
                                   (1u << KVR_AGENT_SEND_FAILED) |
                                   (1u << KVR_AGENT_SEND_EXPIRED)
                             : 1u << KVR_AGENT_RELEASED;
    uint64_t bound = DEADLINE_MS + GRACE_MS + MARGIN_MS;
    uint32_t got = wait_ends(a, mask, ends, ends[NREQ] + bound + 20000);
    uint64_t t = now_ms();
    kvr_agent_destroy(a);
    uint64_t destroy = now_ms() - t;
    rc = got == NREQ ? 0 : 1;
    for (uint32_t i = 0; i < NREQ; i++)
        if (ends[i] == 0 || ends[i] - ends[NREQ] > bound) {
            printf("%s req-%u: ended %s (bound %llu ms)\n",
                   producer ? "producer" : "consumer", i,
                   ends[i] ? "late" : "never", (unsigned long long)bound);
            rc = 1;
        }
    printf("%s: %u of %u requests ended, destroy took %llu ms\n",
           producer ? "producer" : "consumer", got, NREQ,
           (unsigned long long)destroy);
    if (destroy > DESTROY_MS)
        rc = 1;
    return rc;
}

static pid_t spawn(bool producer, int ready_fd, int go_fd)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        _exit(child(producer, ready_fd, go_fd));
    }
    return pid;
}

static int reap(pid_t pid, uint64_t until_ms)
{
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_ms() > until_ms) {
            printf("child %d still alive: killed\n", (int)pid);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 1;
        }
        usleep(20000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static bool wait_byte(int fd, uint32_t ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    return poll(&p, 1, (int)ms) == 1 && read(fd, &c, 1) == 1;
}

static int run(void)
{
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0)
        return 1;
    pid_t prod = spawn(true, ready[1], go[0]);
    if (!wait_byte(ready[0], 20000)) {
        printf("the producer did not start\n");
        return reap(prod, now_ms() + 1000) == 77 ? 77 : 1;
    }
    pid_t cons = spawn(false, ready[1], go[0]);
    if (write(go[1], "g", 1) != 1 || !wait_byte(ready[0], 20000)) {
        printf("the consumer did not start\n");
        reap(prod, now_ms());
        return reap(cons, now_ms() + 1000) == 77 ? 77 : 1;
    }
    usleep(CUT_AFTER_MS * 1000u);
    printf("cutting the link\n");
    fflush(stdout);
    sh("ip -n %s link set kvr0 down", ns_p);
    uint64_t until = now_ms() + DEADLINE_MS + GRACE_MS + MARGIN_MS +
                     DESTROY_MS + 20000;
    int rc_c = reap(cons, until), rc_p = reap(prod, until);
    return rc_c == 77 || rc_p == 77 ? 77 : rc_c || rc_p;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (geteuid() != 0) {
        printf("SKIP: network namespaces need root\n");
        return 77;
    }
    int rc = setup();
    if (rc == 0)
        rc = run();
    teardown();
    printf("%s\n", rc == 0    ? "1 passed, 0 failed"
                   : rc == 77 ? "skipped"
                              : "0 passed, 1 failed");
    return rc;
}
