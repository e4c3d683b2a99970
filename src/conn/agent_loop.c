/* The agent's progress loop: one epoll set (wake eventfd, timerfd, the
 * listening socket, every link) whose fd is kvr_agent_fd; one turn handles
 * commands, socket input, timers and a bounded amount of data movement. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "agent_internal.h"

/* epoll tags for the fixed fds; links are tagged by their kvr__alink_t. */
static char tag_wake, tag_timer, tag_listen, tag_local;

kvr_status_t kvr__loop_watch(kvr_agent_t *a, int fd, void *tag, bool out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0u),
                             .data.ptr = tag};
    if (epoll_ctl(a->epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0)
        return KVR_OK;
    if (errno == EEXIST && epoll_ctl(a->epoll_fd, EPOLL_CTL_MOD, fd, &ev) == 0)
        return KVR_OK;
    return KVR_ERR_IO;
}

void kvr__loop_unwatch(kvr_agent_t *a, int fd)
{
    if (fd >= 0)
        epoll_ctl(a->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
}

kvr_status_t kvr__loop_init(kvr_agent_t *a, kvr_error_t *err)
{
    a->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    a->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (a->epoll_fd < 0 || a->timer_fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "epoll/timerfd: %s",
                             strerror(errno));
    if (kvr__loop_watch(a, a->wake_fd, &tag_wake, false) != KVR_OK ||
        kvr__loop_watch(a, a->timer_fd, &tag_timer, false) != KVR_OK)
        return kvr_error_set(err, KVR_ERR_IO, "epoll_ctl: %s", strerror(errno));
    return KVR_OK;
}

void kvr__loop_fini(kvr_agent_t *a)
{
    if (a->listen_fd >= 0)
        close(a->listen_fd);
    if (a->local_fd >= 0)
        close(a->local_fd);
    if (a->timer_fd >= 0)
        close(a->timer_fd);
    if (a->epoll_fd >= 0)
        close(a->epoll_fd);
    free(a->stage_table);
}

/* "host:port" -> host, port. */
static kvr_status_t split(const char *spec, char *host, size_t cap,
                          uint16_t *port, kvr_error_t *err)
{
    const char *colon = strrchr(spec, ':');
    char *end = NULL;
    unsigned long p = colon ? strtoul(colon + 1, &end, 10) : 0;
    size_t n = colon ? (size_t)(colon - spec) : 0;
    if (colon == NULL || end == colon + 1 || *end != '\0' || p > 65535 ||
        n == 0 || n >= cap)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "address '%s' is not "
                             "host:port",
                             spec);
    memcpy(host, spec, n);
    host[n] = '\0';
    *port = (uint16_t)p;
    return KVR_OK;
}

static kvr_status_t start_listen(kvr_agent_t *a, kvr_error_t *err)
{
    char host[KVR_AGENT_ADDR_MAX - 8];
    uint16_t port = 0, bound = 0;
    kvr_status_t st = split(a->listen_spec, host, sizeof(host), &port, err);
    if (st == KVR_OK)
        st = kvr__tcp_listen(host, port, &a->listen_fd, &bound, err);
    if (st == KVR_OK && kvr__loop_watch(a, a->listen_fd, &tag_listen, false))
        st = kvr_error_set(err, KVR_ERR_IO, "epoll_ctl: %s", strerror(errno));
    if (st != KVR_OK)
        return st;
    if (a->advertise_spec[0])
        snprintf(a->address, sizeof(a->address), "%s", a->advertise_spec);
    else
        snprintf(a->address, sizeof(a->address), "%s:%u", host, bound);
    /* peers on this host dial the twin first (kvr__alink_dial) */
    st = kvr__local_listen(a->address, &a->local_fd, err);
    if (st == KVR_OK && a->local_fd >= 0 &&
        kvr__loop_watch(a, a->local_fd, &tag_local, false) != KVR_OK)
        st = kvr_error_set(err, KVR_ERR_IO, "epoll_ctl: %s", strerror(errno));
    return st;
}

/* The PP head's table of its instance's stages: itself first. */
static kvr_status_t init_stage_table(kvr_agent_t *a, kvr_error_t *err)
{
    const kvr_wire_topo_t *t = &a->p.topo;
    a->stage_table = calloc((size_t)t->pp_size * t->tp_size,
                            sizeof(*a->stage_table));
    if (a->stage_table == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_wire_stage_t *me = &a->stage_table[0];
    me->incarnation = a->incarnation;
    snprintf(me->address, sizeof(me->address), "%s", a->address);
    return KVR_OK;
}

kvr_status_t kvr__loop_start(kvr_agent_t *a, kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    if (a->listen_spec[0])
        st = start_listen(a, err);
    bool producer = a->p.role & KVR_AGENT_PRODUCER;
    bool head = a->p.topo.pp_rank == 0 && a->p.topo.tp_rank == 0;
    if (st == KVR_OK && producer && head)
        st = init_stage_table(a, err);
    a->join_retry_ns = kvr_now_ns();
    return st;
}

static void drain_fd(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof(v)) > 0)
        ;
}

static void run_commands(kvr_agent_t *a)
{
    kvr__cmd_t *c = kvr__agent_take_commands(a);
    while (c != NULL) {
        kvr__cmd_t *n = c->next;
        if (c->kind <= KVR__CMD_SEND_ABORT)
            kvr__send_command(a, c);
        else if (c->kind == KVR__CMD_NOTIFY)
            kvr__notify_command(a, c);
        else
            kvr__recv_command(a, c);
        kvr__cmd_free(c);
        c = n;
    }
}

/* A syscall only when the time changed (or the timer fired since). */
static void arm_timer(kvr_agent_t *a, uint64_t at_ns)
{
    if (a->timer_armed && a->timer_at == at_ns)
        return;
    a->timer_armed = true;
    a->timer_at = at_ns;
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    if (at_ns != UINT64_MAX) {
        if (at_ns == 0)
            at_ns = 1;
        its.it_value.tv_sec = (time_t)(at_ns / 1000000000u);
        its.it_value.tv_nsec = (long)(at_ns % 1000000000u);
    }
    timerfd_settime(a->timer_fd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* EPOLLOUT only while a link has bytes queued (or is connecting). */
static void update_interest(kvr_agent_t *a)
{
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next) {
        if (l->state == KVR__LINK_CLOSED)
            continue;
        bool want = l->state == KVR__LINK_CONNECTING ||
                    (l->link != NULL && kvr__link_wants_write(l->link));
        if (want != l->epoll_out) {
            int fd = l->link ? l->link->fd : l->fd;
            if (kvr__loop_watch(a, fd, l, want) == KVR_OK)
                l->epoll_out = want;
        }
    }
}

static void handle_ready(kvr_agent_t *a, const struct epoll_event *ev, int n)
{
    for (int i = 0; i < n; i++) {
        void *tag = ev[i].data.ptr;
        if (tag == &tag_wake)
            drain_fd(a->wake_fd);
        else if (tag == &tag_timer) {
            drain_fd(a->timer_fd);
            a->timer_armed = false; /* it fired: set again even if equal */
        }
        else if (tag == &tag_listen)
            kvr__alink_accept(a, a->listen_fd);
        else if (tag == &tag_local)
            kvr__alink_accept(a, a->local_fd);
        else
            kvr__alink_on_io(a, tag, ev[i].events);
    }
}

static uint64_t run_timers(kvr_agent_t *a)
{
    uint64_t now = kvr_now_ns(), next = UINT64_MAX;
    /* kernels running or gates armed: their host functions wake the loop,
     * and this only bounds a miss */
    if (a->active != NULL || a->gate_head != NULL)
        next = now + KVR_AGENT_GPU_BACKSTOP_NS;
    kvr__alink_tick(a, now, &next);
    kvr__join_tick(a, now, &next);
    kvr__send_tick(a, now, &next);
    kvr__recv_tick(a, now, &next);
    return next;
}

/* A turn on the events ev[0..n) of one wait; returns the loop's next
 * timer. Who waits next decides what becomes of it (kvr__loop_turn arms
 * timer_fd, which kvr_agent_fd's pollers wait on; the progress thread and
 * a caller in kvr_agent_wait make it their next wait's timeout: a
 * timerfd_settime less per turn, 2-3 per one-block load and process). */
static uint64_t turn_on(kvr_agent_t *a, const struct epoll_event *ev, int n,
                        uint32_t timeout_ms)
{
    uint64_t start = kvr_now_ns(), t0 = kvr__ph_start(a);
    run_commands(a);
    if (n > 0)
        handle_ready(a, ev, n);
    run_commands(a);
    kvr__gates_poll(a);
    uint64_t budget = (uint64_t)timeout_ms * 1000000ull;
    if (budget > KVR_AGENT_TURN_WORK_NS || budget == 0)
        budget = KVR_AGENT_TURN_WORK_NS;
    kvr__send_work(a, start + budget);
    /* cost probes in steps: the loop never stalls on one (docs/agent.md) */
    bool probing = kvr__probe_work(a, start + budget);
    uint64_t next = run_timers(a);
    kvr__alink_reap(a);
    update_interest(a);
    if (kvr__agpu_cpu_work(a) || probing)
        kvr__agent_wake(a); /* more slices: the fd stays readable */
    kvr__ph_add(a, KVR__PH_TURN, t0);
    return next;
}

/* Waits until `until` (ns, absolute) at most: to the nanosecond where the
 * kernel has epoll_pwait2 (5.11; called directly, as glibc wraps it only
 * from 2.35), else to the next millisecond. */
static int wait_until(kvr_agent_t *a, struct epoll_event *ev, uint64_t until)
{
    uint64_t now = kvr_now_ns();
    uint64_t ns = until > now ? until - now : 0;
    long n = -1;
    errno = ENOSYS;
#ifdef SYS_epoll_pwait2
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    n = syscall(SYS_epoll_pwait2, a->epoll_fd, ev, 64, &ts, NULL, 0);
#endif
    if (n < 0 && errno == ENOSYS)
        n = epoll_wait(a->epoll_fd, ev, 64, (int)((ns + 999999u) / 1000000u));
    return (int)n;
}

/* One turn for whoever drives the loop, under turn_lock. The progress
 * thread (thread = true) waits for input without the lock, so a caller's
 * commands may have run meanwhile and a link an event names may be gone:
 * it polls again then. kvr__loop_turn's and kvr_agent_wait's callers wait
 * holding the lock. Returns the loop's next timer. */
static uint64_t drive(kvr_agent_t *a, uint64_t until, uint32_t timeout_ms,
                      bool thread)
{
    struct epoll_event ev[64];
    uint64_t seen = __atomic_load_n(&a->inline_turns, __ATOMIC_ACQUIRE);
    uint64_t t0 = thread ? kvr__ph_start(a) : 0;
    /* kernels just launched: watched (kvr__agpu_spin takes turn_lock) */
    int n = thread ? kvr__agpu_spin(a, ev, 64) : -1;
    uint64_t spun = t0 ? kvr_now_ns() - t0 : 0;
    /* the thread holds no lock here, so it may not walk the pulls: a
     * turn that left slices to do wrote the wake fd, and the wait returns */
    if (n < 0)
        n = wait_until(a, ev, !thread && kvr__agpu_cpu_work(a) ? 0 : until);
    if (thread) {
        pthread_mutex_lock(&a->turn_lock);
        kvr__ph_sum(a, KVR__PH_SPIN, spun); /* a->ph is the turn's */
        if (__atomic_load_n(&a->inline_turns, __ATOMIC_ACQUIRE) != seen)
            n = epoll_wait(a->epoll_fd, ev, 64, 0);
    }
    return turn_on(a, ev, n, timeout_ms);
}

void kvr__loop_turn(kvr_agent_t *a, uint32_t timeout_ms)
{
    arm_timer(a, drive(a, kvr_now_ns() + (uint64_t)timeout_ms * 1000000ull,
                       timeout_ms, false));
}

#define THREAD_WAIT_MAX_NS 100000000ull /* the stop flag is seen by then */

void kvr__loop_thread_turn(kvr_agent_t *a)
{
    uint64_t cap = kvr_now_ns() + THREAD_WAIT_MAX_NS;
    a->thread_wake = drive(a, a->thread_wake < cap ? a->thread_wake : cap, 0,
                           true);
    pthread_mutex_unlock(&a->turn_lock);
}

/* Before a waiting caller sleeps while its loads are in flight: up to
 * KVR_AGENT_WAIT_SPIN_NS of looking for input, yielding the core between
 * looks. An answer due within microseconds is then met by a running
 * thread instead of one woken from an idle core, which on a virtual
 * machine costs tens of microseconds; a thread that wants the core gets
 * it at each yield (docs/agent.md, kvr_agent_wait). */
static void spin_for_input(kvr_agent_t *a, uint64_t until)
{
    if (a->creqs == NULL || a->wait_spin_ns == 0)
        return;
    uint64_t stop = kvr_now_ns() + a->wait_spin_ns;
    if (stop > until)
        stop = until;
    struct epoll_event ev;
    while (epoll_wait(a->epoll_fd, &ev, 1, 0) == 0 && kvr_now_ns() < stop)
        sched_yield();
}

/* kvr_agent_wait's turns on the calling thread of an agent without a
 * progress thread, under turn_lock, until has_event(a) or `until` (ns):
 * kvr__loop_turn's, each waiting to the loop's next timer at most. Then
 * timer_fd, which kvr_agent_fd's pollers wait on, is set only if that
 * timer is sooner than the one it holds (one set later wakes them once
 * for nothing, and that turn sets it exactly): a load's deadline comes
 * later than the one before, so no timerfd_settime per load. */
void kvr__loop_wait_turns(kvr_agent_t *a, uint64_t until,
                          bool (*has_event)(kvr_agent_t *))
{
    uint64_t next = UINT64_MAX; /* a timer due now is on timer_fd */
    do {
        uint64_t by = next < until ? next : until;
        spin_for_input(a, by);
        next = drive(a, by, 0, false);
    } while (!has_event(a) && kvr_now_ns() < until);
    kvr__loop_after_inline(a, next);
}

/* Under turn_lock. A timer the sleeping thread's timeout would miss is
 * set on timer_fd, which wakes it. */
void kvr__loop_after_inline(kvr_agent_t *a, uint64_t timer_by_ns)
{
    update_interest(a);
    uint64_t by = a->timer_armed ? a->timer_at : UINT64_MAX;
    if (a->thread_running && a->thread_wake < by)
        by = a->thread_wake;
    if (timer_by_ns < by)
        arm_timer(a, timer_by_ns);
}
