/* Handshake churn against long-lived agents (issue 15: "100 handshake
 * churns with no fd or RSS growth"): a keyed and an unkeyed producer agent
 * take 150 connections one after another, each a full handshake (a
 * consumer agent of matching key notifies the producer, which receives it,
 * then the consumer is destroyed), a handshake refused at AUTH (a wrong
 * key), or a connection aborted mid-handshake (half a frame header, or
 * closed before a byte). Afterwards the process holds no more file
 * descriptors than before, and (outside sanitizer builds, whose allocator
 * keeps freed memory in quarantine; LeakSanitizer checks those) its
 * resident memory grew by less than a generous bound. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN 1
#endif
#endif

#define CHURNS 150u
#define WARMUP 10u
#define RSS_BOUND_MB 48u

static const uint8_t KEY[KVR_WIRE_KEY_BYTES] =
    "kvrelay churn test key.........";
static const uint8_t WRONG[KVR_WIRE_KEY_BYTES] =
    "kvrelay churn wrong key........";

typedef struct {
    ah_model_t m;
    kvr_transport_t *hub;
    ah_agent_t keyed, open;
} fixture_t;

static uint32_t open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    uint32_t n = 0;
    assert_non_null(d);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static uint64_t rss_bytes(void)
{
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* The producer receives the notification (its handshake completed). */
static void expect_notified(ah_agent_t *prod)
{
    static kvr_agent_notify_t n;
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    while (ah_now_ms() < end) {
        if (kvr_agent_poll_notify(prod->agent, &n))
            return;
        struct pollfd p = {.fd = kvr_agent_event_fd(prod->agent),
                           .events = POLLIN};
        poll(&p, 1, 20);
    }
    fail_msg("no notification reached the producer");
}

/* A consumer agent holding `key` notifies `prod`; refused: its notify
 * must fail (the producer refused the handshake). */
static void churn_agent(fixture_t *f, ah_agent_t *prod, const uint8_t *key,
                        bool refused)
{
    kvr_agent_params_t p = ah_consumer_params(&f->m, f->hub, "churn", 0);
    p.key = key;
    p.connect_timeout_ms = AH_WAIT_MS;
    ah_agent_t c;
    ah_start(&f->m, &p, 0, false, &c);
    const char *peer = prod == &f->keyed ? "prefill-k" : "prefill-u";
    uint8_t hello[8] = "churn";
    assert_int_equal(kvr_agent_notify(c.agent, peer, strlen(peer),
                                      kvr_agent_address(prod->agent), hello,
                                      sizeof(hello)),
                     KVR_OK);
    if (refused)
        ah_wait(&c, "", KVR_AGENT_NOTIFY_FAILED, AH_WAIT_MS);
    else
        expect_notified(prod);
    ah_stop(&c);
}

/* A raw connection that sends `bytes` bytes of a frame header (0: none)
 * and closes. */
static void churn_raw(ah_agent_t *prod, size_t bytes)
{
    const char *addr = kvr_agent_address(prod->agent);
    struct sockaddr_in in = {
        .sin_family = AF_INET,
        .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
        .sin_port = htons((uint16_t)atoi(strrchr(addr, ':') + 1))};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&in, sizeof(in)), 0);
    static const uint8_t header[8] = {'K', 'V', 'R', 1, 2, 3, 4, 5};
    if (bytes > 0)
        assert_int_equal(send(fd, header, bytes, MSG_NOSIGNAL), (ssize_t)bytes);
    close(fd);
}

/* The producers' queues are emptied: refusals and notifications would
 * otherwise pile up as memory the test measures. */
static void drain(ah_agent_t *prod)
{
    static kvr_agent_notify_t n;
    kvr_agent_event_t e;
    while (kvr_agent_poll(prod->agent, &e))
        ;
    while (kvr_agent_poll_notify(prod->agent, &n))
        ;
}

static void churn(fixture_t *f, uint32_t i)
{
    drain(&f->keyed);
    drain(&f->open);
    switch (i % 5) {
    case 0:
        churn_agent(f, &f->keyed, KEY, false);
        break;
    case 1:
        churn_agent(f, &f->open, NULL, false);
        break;
    case 2:
        churn_agent(f, &f->keyed, WRONG, true);
        break;
    case 3:
        churn_raw(i % 2 ? &f->keyed : &f->open, 3);
        break;
    default:
        churn_raw(i % 2 ? &f->keyed : &f->open, 0);
        break;
    }
}

/* The agents closed every link of the churn: the count is back. */
static void expect_fds_back(uint32_t before)
{
    uint64_t end = ah_now_ms() + AH_WAIT_MS;
    uint32_t now = open_fds();
    while (now > before && ah_now_ms() < end) {
        usleep(20000);
        now = open_fds();
    }
    if (now > before)
        fail_msg("%u file descriptors open after %u churns, %u before", now,
                 CHURNS, before);
}

static void test_handshake_churn(void **state)
{
    fixture_t *f = *state;
    for (uint32_t i = 0; i < WARMUP; i++)
        churn(f, i);
    uint32_t fds = open_fds();
    uint64_t rss = rss_bytes();
    for (uint32_t i = 0; i < CHURNS; i++)
        churn(f, i);
    expect_fds_back(fds);
    uint64_t grown = rss_bytes() > rss ? rss_bytes() - rss : 0;
#ifndef ASAN
    if (grown > (uint64_t)RSS_BOUND_MB << 20)
        fail_msg("resident memory grew by %llu KiB over %u churns",
                 (unsigned long long)(grown >> 10), CHURNS);
#else
    (void)grown;
#endif
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->m = ah_model();
    f->hub = ah_hub();
    kvr_agent_params_t p = ah_producer_params(&f->m, f->hub, "prefill-k", 0, 1);
    p.key = KEY;
    ah_start(&f->m, &p, 0, false, &f->keyed);
    p = ah_producer_params(&f->m, f->hub, "prefill-u", 0, 1);
    ah_start(&f->m, &p, 0, false, &f->open);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    ah_stop(&f->keyed);
    ah_stop(&f->open);
    kvr_transport_destroy(f->hub);
    free(f);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_handshake_churn, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
