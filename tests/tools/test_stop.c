/* A stopped process ends nothing but what it touches (issue 15 items 2 and
 * 6): two prefill instances (PP 2) and two decode groups (DCP 2) run as
 * real `kvrelay push`/`serve` processes, and one of them is SIGSTOPped for
 * longer than the request deadline, in one test a decode rank of group 0,
 * in the other a stage of instance 0. Every other process must exit, 0 or
 * 1 and never crashed, within deadline plus grace (plus the router's slack
 * and a margin for a loaded machine) after the stop, far below --timeout;
 * the requests the stopped process does not take part in verify on every
 * rank. The stopped process is continued at the end; one that still
 * waits (a stage whose head is gone waits for its lease) is killed.
 *
 * Requests: request i comes from instance i mod 2; requests 0, 2 and 3
 * (the last one reuses request 0's prefix, so it goes where that prefix is
 * cached) load into group 0, request 1 into group 1. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_inspect_cli.h"

static const char *kvr_bin;

/* The agent's default grace, and the router's slack for a silent rank
 * (cmd_serve.c): the healthy processes end within DEADLINE_S + GRACE_S +
 * SLACK_S; MARGIN_S is for a loaded 2-core machine under ASan, never a
 * speed requirement. --timeout is far beyond, so waiting the run out is
 * told apart. */
#define DEADLINE_S 6
#define GRACE_S 5
#define SLACK_S 3
#define MARGIN_S 30
#define TIMEOUT_S 400
#define STR_(x) #x
#define STR(x) STR_(x)
#define ARGS                                                                   \
    "--instances 2 --groups 2 --requests 4 --tokens 300 --layers 4 --pp 2 "    \
    "--dcp 2 --deadline-ms " STR(DEADLINE_S) "000 --timeout " STR(TIMEOUT_S)

enum { G0R0, G0R1, G1R0, G1R1, P0S0, P0S1, P1S0, P1S1, NPROC };
static const char *names[NPROC] = {"g0r0", "g0r1", "g1r0", "g1r1",
                                   "p0s0", "p0s1", "p1s0", "p1s1"};

typedef struct {
    pid_t pid;
    int status; /* -1 while running */
    double exited_s;
} proc_t;

static proc_t procs[NPROC];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void output(int who, char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof(path), "stop_%s.txt", names[who]);
    cli_slurp(path, buf, cap);
}

/* Starts `kvrelay CMD ARGS EXTRA` as process `who`, its output in
 * stop_<name>.txt; returns the port of its "listening" line. */
static int start(int who, const char *cmd, const char *fmt, ...)
{
    char extra[512], line[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(extra, sizeof(extra), fmt, ap);
    va_end(ap);
    snprintf(line, sizeof(line), "exec %s %s " ARGS " %s >stop_%s.txt 2>&1",
             kvr_bin, cmd, extra, names[who]);
    char path[64];
    snprintf(path, sizeof(path), "stop_%s.txt", names[who]);
    remove(path); /* a port from an earlier test is never read */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    procs[who] = (proc_t){pid, -1, 0};
    char out[4096];
    int port = 0;
    for (int ms = 0; ms < 120000 && port == 0; ms += 10) {
        output(who, out, sizeof(out));
        char *l = strstr(out, "listening ");
        if (l != NULL)
            port = atoi(l + 10);
        else
            sleep_ms(10);
    }
    if (port == 0)
        fail_msg("%s never listened: %s", names[who], out);
    return port;
}

/* Waits until `who`'s output holds `text` (bounded). */
static void wait_text(int who, const char *text)
{
    char out[16384];
    for (int ms = 0; ms < 120000; ms += 10) {
        output(who, out, sizeof(out));
        if (strstr(out, text) != NULL)
            return;
        sleep_ms(10);
    }
    fail_msg("%s never said \"%s\": %s", names[who], text, out);
}

static void start_decode(int router_port[2])
{
    for (int g = 0; g < 2; g++) {
        router_port[g] = start(g ? G1R0 : G0R0, "serve", "--rank 0 --group %d",
                               g);
        start(g ? G1R1 : G0R1, "serve",
              "--rank 1 --group %d --router 127.0.0.1:%d", g, router_port[g]);
    }
    wait_text(G0R0, "joined 1");
    wait_text(G1R0, "joined 1");
}

/* Starts instance p's head, then its stage 1; stop_stage1: SIGSTOP the
 * stage as soon as it listens (before or after it joined its head: both
 * must end on time). */
static void start_prefill(int p, const int router_port[2], bool stop_stage1)
{
    int head = start(p ? P1S0 : P0S0, "push",
                     "--instance %d --stage 0 --routers "
                     "127.0.0.1:%d,127.0.0.1:%d",
                     p, router_port[0], router_port[1]);
    start(p ? P1S1 : P0S1, "push",
          "--instance %d --stage 1 --head 127.0.0.1:%d", p, head);
    if (stop_stage1)
        assert_int_equal(kill(procs[p ? P1S1 : P0S1].pid, SIGSTOP), 0);
}

/* Reaps every process but `stopped` until all exited or `limit_s` after
 * t0; then continues `stopped` and waits for it too. */
static void reap_all(int stopped, double t0, double limit_s)
{
    int left = NPROC - 1;
    while (left > 0 && now_s() - t0 < limit_s + 60) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        for (int i = 0; pid > 0 && i < NPROC; i++)
            if (procs[i].pid == pid) {
                procs[i].status = st;
                procs[i].exited_s = now_s() - t0;
                left -= i != stopped;
            }
        if (pid <= 0)
            sleep_ms(20);
    }
    kill(procs[stopped].pid, SIGCONT);
    double cont = now_s();
    for (int i = 0; i < NPROC; i++) {
        if (procs[i].status != -1)
            continue;
        while (waitpid(procs[i].pid, &procs[i].status, WNOHANG) == 0 &&
               now_s() - cont < (i == stopped ? DEADLINE_S + GRACE_S : 60))
            sleep_ms(20);
        if (procs[i].status != -1)
            continue;
        kill(procs[i].pid, SIGKILL);
        waitpid(procs[i].pid, &procs[i].status, 0);
        /* the stopped one may find every peer gone and wait for its
         * lease (a stage whose head exited cannot tell "done" from
         * "dead"): it is killed, as a stalled process would be */
        if (i != stopped)
            fail_msg("%s did not exit in time", names[i]);
        procs[i].status = 0;
    }
    for (int i = 0; i < NPROC; i++) {
        char out[16384];
        output(i, out, sizeof(out));
        int st = procs[i].status;
        if (!WIFEXITED(st) || WEXITSTATUS(st) > 1)
            fail_msg("%s ended with status 0x%x: %s", names[i], st, out);
        if (i != stopped && procs[i].exited_s > limit_s)
            fail_msg("%s exited %.1f s after the stop, past %.0f s: %s",
                     names[i], procs[i].exited_s, limit_s, out);
    }
}

static void expect_in(int who, const char *text)
{
    char out[16384];
    output(who, out, sizeof(out));
    if (strstr(out, text) == NULL)
        fail_msg("%s lacks \"%s\": %s", names[who], text, out);
}

static void expect_exit(int who, int code)
{
    if (WEXITSTATUS(procs[who].status) != code) {
        char out[16384];
        output(who, out, sizeof(out));
        fail_msg("%s exited %d, not %d: %s", names[who],
                 WEXITSTATUS(procs[who].status), code, out);
    }
}

static const double limit_s = DEADLINE_S + GRACE_S + SLACK_S + MARGIN_S;

/* Rank 1 of group 0 stops once it joined its router, before any offer:
 * group 0's requests fail (rank 0 loads its part, the router counts rank
 * 1 silent and refuses what comes after), group 1's request verifies, and
 * every stage ends its group-0 requests instead of holding them to the
 * lease. */
static void test_rank_stopped(void **state)
{
    (void)state;
    int routers[2];
    start_decode(routers);
    assert_int_equal(kill(procs[G0R1].pid, SIGSTOP), 0);
    double t0 = now_s();
    start_prefill(0, routers, false);
    start_prefill(1, routers, false);
    reap_all(G0R1, t0, limit_s);
    expect_in(G1R0, "verified req-1");
    expect_in(G1R1, "verified req-1");
    expect_exit(G1R0, 0);
    expect_exit(G1R1, 0);
    expect_in(G0R0, "rank-silent req-0 1");
    expect_exit(G0R0, 1);
    expect_in(P1S0, "sent req-1");
    expect_in(P1S1, "sent req-1");
    for (int i = G0R0; i < NPROC; i++) {
        char out[16384];
        output(i, out, sizeof(out));
        if (strstr(out, "(incomplete)") != NULL && i != G0R1)
            fail_msg("%s waited its run out: %s", names[i], out);
    }
}

/* Stage 1 of instance 0 stops as soon as it listens: instance 0's
 * requests fail on group 0, instance 1's requests verify, on group 1 and
 * on group 0 (request 3 shares group 0 with the failing ones). */
static void test_stage_stopped(void **state)
{
    (void)state;
    int routers[2];
    start_decode(routers);
    double t0 = now_s();
    start_prefill(0, routers, true);
    start_prefill(1, routers, false);
    reap_all(P0S1, t0, limit_s);
    expect_in(G0R0, "assigned req-3");
    for (int i = G0R0; i <= G0R1; i++) {
        expect_in(i, "verified req-3");
        expect_in(i, "failed req-0");
    }
    expect_in(G1R0, "verified req-1");
    expect_in(G1R1, "verified req-1");
    expect_exit(G1R0, 0);
    expect_exit(G1R1, 0);
    expect_exit(P1S0, 0);
    expect_exit(P1S1, 0);
    expect_exit(P0S0, 1);
}

/* A failed test leaves nothing running. */
static int kill_left(void **state)
{
    (void)state;
    for (int i = 0; i < NPROC; i++)
        if (procs[i].pid > 0 && procs[i].status == -1) {
            kill(procs[i].pid, SIGKILL);
            kill(procs[i].pid, SIGCONT);
            waitpid(procs[i].pid, &procs[i].status, 0);
        }
    memset(procs, 0, sizeof(procs));
    return 0;
}

int main(int argc, char **argv)
{
    kvr_bin = argc > 1 ? argv[1] : "kvrelay";
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_rank_stopped, kill_left),
        cmocka_unit_test_teardown(test_stage_stopped, kill_left),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
