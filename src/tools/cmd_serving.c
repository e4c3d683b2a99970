/* `kvrelay bench serving` (docs/performance.md): the supervisor. It forks
 * the prefill stages and decode ranks (each its own agent in its own
 * process, as `kvrelay demo` runs them), warms every link, then drives the
 * phases: a first (cold) ceiling, then --reps times each trace pass and
 * a ceiling (the same bytes as one transfer per (stage, rank) pair) right
 * after them, then the one-block round trips; it gathers the processes'
 * report lines, prints a table and writes the JSON. */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "serving.h"

#define MAX_KIDS 160
#define MAX_RUNS (SV_MAX_PASSES * SV_MAX_REPS) /* trace passes in a run */

typedef struct {
    pid_t pid;
    int ctl, out;
    bool consumer, eof;
    char buf[8192];
    size_t len;
} kid_t;

typedef struct {
    uint32_t loaded, verified;
    uint64_t bytes, loaded_ns, prefill_end_ns, ready_first_ns;
    char failure[400];
} rq_t;

#define SMALL_B2B "small" /* request ids and M lines of each kind */
#define SMALL_PACED "paced"

typedef struct {
    sv_cfg_t c;
    sv_trace_t t;
    kid_t kids[MAX_KIDS];
    uint32_t nkids, nprod;
    sv_role_t role; /* the addresses every child inherits */
    uint64_t deadline;
    /* phase bookkeeping */
    const char *want; /* the line prefix the phase waits for */
    uint32_t got;
    uint32_t pass, runs; /* run index: rep * passes + pass */
    uint64_t T0[MAX_RUNS];
    rq_t *rq[MAX_RUNS];
    uint32_t done_requests, layer_events[MAX_RUNS];
    uint64_t done_bytes, progress_ns;
    uint64_t ceil_start, ceil_end, ceil_bytes, ceil_best_ns, ceil_best_bytes;
    uint64_t ceil_ns[1 + SV_MAX_REPS]; /* [0]: cold, then one per rep */
    int ndev;
    bool ceil_ok;
    /* one-block round trips: [0] back to back (the figure of every
     * earlier file), [1] paced, each request alone (consumer_small) */
    uint64_t small_ns[2][SV_SMALL_REPS * 64];
    uint32_t nsmall[2];
    bool failed;
    char why[512];
    char last_addr[300]; /* the last "ready ADDR" */
    char command[4096];
} sup_t;

/* ---- processes ---- */

static void close_others(int keep1, int keep2)
{
    long max = sysconf(_SC_OPEN_MAX);
    for (int fd = 3; fd < (max > 0 && max < 4096 ? max : 4096); fd++)
        if (fd != keep1 && fd != keep2)
            close(fd);
}

static bool spawn(sup_t *s, bool consumer, uint32_t who, uint32_t rank,
                  uint32_t tp, int device)
{
    int c2p[2], p2c[2];
    if (s->nkids == MAX_KIDS || pipe(c2p) != 0)
        return false;
    if (pipe(p2c) != 0) {
        close(c2p[0]);
        close(c2p[1]);
        return false;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close_others(p2c[0], c2p[1]);
        FILE *out = fdopen(c2p[1], "w");
        s->role.consumer = consumer;
        s->role.who = who;
        s->role.rank = rank;
        s->role.tp = tp;
        s->role.cuda_device = device;
        int rc = out ? sv_child_run(&s->c, &s->t, &s->role, p2c[0], out)
                     : CLI_EXIT_FAILED;
        if (out)
            fclose(out);
        _exit(rc);
    }
    close(c2p[1]);
    close(p2c[0]);
    if (pid < 0) {
        close(c2p[0]);
        close(p2c[1]);
        return false;
    }
    s->kids[s->nkids++] = (kid_t){
        .pid = pid, .ctl = p2c[1], .out = c2p[0], .consumer = consumer};
    return true;
}

static void tell(sup_t *s, bool producers, bool consumers, const char *line)
{
    for (uint32_t i = 0; i < s->nkids; i++) {
        kid_t *k = &s->kids[i];
        if ((k->consumer ? consumers : producers) &&
            write(k->ctl, line, strlen(line)) < 0) {
            s->failed = true;
            snprintf(s->why, sizeof(s->why), "a child is gone (%s)",
                     strerror(errno));
        }
    }
}

/* ---- report lines ---- */

static void fail(sup_t *s, const char *fmt, const char *text)
{
    if (!s->failed)
        snprintf(s->why, sizeof(s->why), fmt, text);
    s->failed = true;
}

static void progress(sup_t *s, bool last)
{
    uint64_t now = kvr_now_ns();
    if (!last && now - s->progress_ns < 200000000ull)
        return;
    s->progress_ns = now;
    uint32_t k = s->pass % s->c.passes, rep = s->pass / s->c.passes;
    fprintf(stderr,
            "\r  rep %u/%u pass %u/%u (%s): %u/%u requests loaded, %.2f GB%s",
            rep + 1, s->c.reps, k + 1, s->c.passes,
            s->c.stream[k] ? "stream" : "no-stream", s->done_requests, s->t.n,
            (double)s->done_bytes / 1e9, last ? "\n" : "   ");
    fflush(stderr);
}

static rq_t *trace_req(sup_t *s, unsigned pass, unsigned i)
{
    return pass < s->runs && i < s->t.n ? &s->rq[pass][i] : NULL;
}

static void on_loaded(sup_t *s, rq_t *q, unsigned long long ns,
                      unsigned long long bytes)
{
    q->bytes += bytes;
    q->loaded_ns = ns > q->loaded_ns ? ns : q->loaded_ns;
    if (++q->loaded == s->c.d.lay.dcp_size) {
        s->done_requests++;
        s->done_bytes += q->bytes;
        progress(s, false);
    }
}

static void on_line(sup_t *s, const char *line)
{
    unsigned pass, i, ok;
    unsigned long long a, b, bytes;
    char text[400];
    rq_t *q;
    if (s->want && strncmp(line, s->want, strlen(s->want)) == 0)
        s->got++;
    if (sscanf(line, "L %u %u %llu %llu", &pass, &i, &a, &b) == 4 &&
        (q = trace_req(s, pass, i)) != NULL)
        on_loaded(s, q, a, b);
    else if (sscanf(line, "P %u %u %llu", &pass, &i, &a) == 3 &&
             (q = trace_req(s, pass, i)) != NULL) {
        q->prefill_end_ns = a > q->prefill_end_ns ? a : q->prefill_end_ns;
        if (q->ready_first_ns == 0 || a < q->ready_first_ns)
            q->ready_first_ns = a;
    } else if (sscanf(line, "V %u %u %399[^\n]", &pass, &i, text) == 3 &&
               (q = trace_req(s, pass, i)) != NULL) {
        if (strcmp(text, "ok") == 0)
            q->verified++;
        else if (!q->failure[0])
            snprintf(q->failure, sizeof(q->failure), "%s", text);
    } else if (sscanf(line, "X %u %u %399[^\n]", &pass, &i, text) == 3 &&
               (q = trace_req(s, pass, i)) != NULL) {
        if (!q->failure[0])
            snprintf(q->failure, sizeof(q->failure), "%s", text);
    } else if (strncmp(line, "X ", 2) == 0) {
        fail(s, "%s", line + 2);
    } else if (sscanf(line, "D %u %*u %u", &pass, &i) == 2 &&
               pass < s->runs) {
        s->layer_events[pass] += i;
    } else if (sscanf(line, "C %u %llu %llu %u %llu", &i, &a, &b, &ok,
                      &bytes) == 5) {
        s->ceil_ok &= ok == 1;
        s->ceil_bytes += bytes;
        s->ceil_start = s->ceil_start == 0 || a < s->ceil_start ? a
                                                                : s->ceil_start;
        s->ceil_end = b > s->ceil_end ? b : s->ceil_end;
    } else if (sscanf(line, "M %15s %llu %u", text, &a, &ok) == 3) {
        int k = strcmp(text, SMALL_PACED) == 0;
        if (ok != 1)
            fail(s, "%s", "a one-block request did not load");
        else if (s->nsmall[k] < SV_SMALL_REPS * 64)
            s->small_ns[k][s->nsmall[k]++] = a;
    } else if (strncmp(line, "ready ", 6) == 0) {
        snprintf(s->last_addr, sizeof(s->last_addr), "%s", line + 6);
    } else if (strcmp(line, "warm-failed") == 0) {
        fail(s, "%s", "a warm-up load failed (see the lines above)");
    }
}

static void read_kid(sup_t *s, kid_t *k)
{
    ssize_t r = read(k->out, k->buf + k->len, sizeof(k->buf) - 1 - k->len);
    if (r <= 0) {
        if (r == 0 || errno != EINTR)
            k->eof = true;
        return;
    }
    k->len += (size_t)r;
    char *start = k->buf, *nl;
    while ((nl = memchr(start, '\n', k->len - (size_t)(start - k->buf)))) {
        *nl = '\0';
        on_line(s, start);
        start = nl + 1;
    }
    k->len -= (size_t)(start - k->buf);
    memmove(k->buf, start, k->len);
    if (k->len == sizeof(k->buf) - 1)
        k->len = 0; /* a line longer than the buffer: dropped */
}

/* Reads report lines until n lines starting with `want` came (or a child
 * is gone, or the run's deadline). */
static bool await(sup_t *s, const char *want, uint32_t n)
{
    s->want = want;
    s->got = 0;
    while (s->got < n && !s->failed) {
        struct pollfd p[MAX_KIDS];
        for (uint32_t i = 0; i < s->nkids; i++)
            p[i] = (struct pollfd){s->kids[i].eof ? -1 : s->kids[i].out, POLLIN,
                                   0};
        int r = poll(p, s->nkids, 100);
        for (uint32_t i = 0; r > 0 && i < s->nkids; i++)
            if (p[i].revents & (POLLIN | POLLHUP | POLLERR))
                read_kid(s, &s->kids[i]);
        for (uint32_t i = 0; i < s->nkids && !s->failed; i++)
            if (s->kids[i].eof)
                fail(s, "%s",
                     "a child process ended early (see its message "
                     "above)");
        if (kvr_now_ns() > s->deadline)
            fail(s, "%s", "the run passed --timeout");
    }
    s->want = NULL;
    return !s->failed;
}

/* ---- start-up ---- */

static int device_of(const sup_t *s, uint32_t index, int ndev)
{
    return s->c.d.use_cuda ? (int)(index % (uint32_t)ndev) : -1;
}

/* Heads first (their addresses are the other stages' bootstrap and the
 * ranks' dial address), then the other stages, then the decode ranks. */
static bool start_all(sup_t *s, int ndev)
{
    const demo_cfg_t *d = &s->c.d;
    uint32_t index = 0;
    for (uint32_t p = 0; p < d->instances; p++) {
        if (!spawn(s, false, p, 0, 0, device_of(s, index++, ndev)) ||
            !await(s, "ready", 1))
            return false;
        snprintf(s->role.heads[p], sizeof(s->role.heads[p]), "%s",
                 s->last_addr);
    }
    for (uint32_t p = 0; p < d->instances; p++)
        for (uint32_t st = 0; st < d->pp; st++)
            for (uint32_t tp = 0; tp < d->producer_tp; tp++) {
                if (st + tp == 0)
                    continue;
                if (!spawn(s, false, p, st, tp, device_of(s, index++, ndev)))
                    return false;
            }
    s->nprod = s->nkids;
    for (uint32_t g = 0; g < d->groups; g++)
        for (uint32_t r = 0; r < d->lay.dcp_size; r++)
            if (!spawn(s, true, g, r, 0, device_of(s, index++, ndev)))
                return false;
    return await(s, "ready", s->nkids - d->instances);
}

static void stop_all(sup_t *s)
{
    tell(s, true, true, "quit\n");
    uint64_t end = kvr_now_ns() + 20000000000ull;
    uint32_t left = s->nkids;
    while (left > 0 && kvr_now_ns() < end) {
        left = 0;
        for (uint32_t i = 0; i < s->nkids; i++) {
            int status;
            if (s->kids[i].pid > 0 &&
                waitpid(s->kids[i].pid, &status, WNOHANG) == 0) {
                left++;
                continue;
            }
            if (s->kids[i].pid > 0 &&
                (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
                fail(s, "%s", "a child process exited with an error");
            s->kids[i].pid = 0;
        }
        if (left > 0) {
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
    }
    for (uint32_t i = 0; i < s->nkids; i++) {
        if (s->kids[i].pid > 0) {
            kill(s->kids[i].pid, SIGKILL);
            waitpid(s->kids[i].pid, NULL, 0);
            fail(s, "%s", "a child process did not exit; killed");
        }
        close(s->kids[i].ctl);
        close(s->kids[i].out);
    }
}

/* ---- phases ---- */

/* One-block requests of one kind (their ids' prefix): opened, then
 * loaded paced from T0 (or back to back: T0 = 0). */
static bool small(sup_t *s, const char *kind, uint64_t T0, uint32_t ncons)
{
    char line[96];
    snprintf(line, sizeof(line), "small %s 0\n", kind);
    tell(s, true, false, line);
    if (!await(s, "opened", s->nprod))
        return false;
    snprintf(line, sizeof(line), "small %s %llu\n", kind,
             (unsigned long long)T0);
    tell(s, false, true, line);
    return await(s, "D small", ncons);
}

/* One ceiling transfer: each instance's one large request, loaded by its
 * group. rep 0 is cold (it maps the pages every pass writes); each later
 * one follows a repetition's passes. */
static bool ceiling(sup_t *s, uint32_t rep)
{
    char line[64];
    snprintf(line, sizeof(line), "ceiling %u\n", rep);
    s->ceil_start = s->ceil_end = s->ceil_bytes = 0;
    tell(s, true, false, line);
    if (!await(s, "opened", s->nprod))
        return false;
    tell(s, false, true, line);
    if (!await(s, "D ceiling", s->nkids - s->nprod))
        return false;
    uint64_t ns = s->ceil_end > s->ceil_start ? s->ceil_end - s->ceil_start : 0;
    s->ceil_ns[rep] = ns;
    if (ns > 0 && (s->ceil_best_ns == 0 || ns < s->ceil_best_ns)) {
        s->ceil_best_ns = ns;
        s->ceil_best_bytes = s->ceil_bytes;
    }
    return true;
}

static bool run_phases(sup_t *s)
{
    uint32_t ncons = s->nkids - s->nprod;
    char line[128];
    tell(s, true, false, "warm\n");
    if (!await(s, "opened", s->nprod))
        return false;
    tell(s, false, true, "warm\n");
    if (!await(s, "warmed", ncons))
        return false;
    /* the first ceiling also maps every page the passes write through the
     * producers' mappings (first touches cost as much as the copy) */
    s->ceil_ok = true;
    if (!ceiling(s, 0))
        return false;
    /* the trace is measured as often as the ceiling, each ceiling right
     * after its repetition's passes (the machine as they found it) */
    for (uint32_t rep = 0; rep < s->c.reps; rep++) {
        for (uint32_t k = 0; k < s->c.passes; k++) {
            uint32_t run = rep * s->c.passes + k;
            s->pass = run;
            s->done_requests = 0;
            s->done_bytes = 0;
            s->T0[run] = kvr_now_ns() + 50000000ull;
            snprintf(line, sizeof(line), "go %llu %u\n",
                     (unsigned long long)s->T0[run], run);
            tell(s, true, true, line);
            bool ok = await(s, "D ", s->nkids);
            progress(s, true);
            if (!ok)
                return false;
        }
        if (!ceiling(s, rep + 1))
            return false;
    }
    return small(s, SMALL_B2B, 0, ncons) &&
           (SV_SMALL_PACE_NS == 0 ||
            small(s, SMALL_PACED, kvr_now_ns() + 50000000ull, ncons));
}

/* ---- the report ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of n values (sorted here). */
static double pct(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    size_t k = (size_t)(p / 100.0 * (double)n + 0.999999);
    return v[k == 0 ? 0 : (k > n ? n - 1 : k - 1)];
}

typedef struct {
    double agg, secs, gap[3], transfer_p50, whole_p50;
    uint64_t bytes;
    uint32_t verified;
} pass_sum_t;

static json_t *pass_json(const sup_t *s, uint32_t k, double ceiling,
                         pass_sum_t *o)
{
    const rq_t *rq = s->rq[k];
    uint64_t T0 = s->T0[k], last = T0;
    json_t *reqs = json_array();
    double *gaps = calloc(s->t.n + 1, sizeof(double));
    double *xfer = calloc(s->t.n + 1, sizeof(double));
    double *whole = calloc(s->t.n + 1, sizeof(double));
    size_t n = gaps && xfer && whole ? s->t.n : 0, m = 0;
    memset(o, 0, sizeof(*o));
    for (uint32_t i = 0; i < s->t.n; i++) {
        const rq_t *q = &rq[i];
        bool ok = q->verified == s->c.d.lay.dcp_size && !q->failure[0];
        o->verified += ok;
        o->bytes += q->bytes;
        last = q->loaded_ns > last ? q->loaded_ns : last;
        double gap = ((double)q->loaded_ns - (double)q->prefill_end_ns) / 1e6;
        double tr = ((double)q->loaded_ns - (double)q->ready_first_ns) / 1e6;
        /* its bytes alone at the ceiling's rate: the whole transfer with
         * nothing hidden behind the prefill */
        double all = ceiling > 0 ? (double)q->bytes / ceiling / 1e6 : 0;
        /* a request some rank never loaded has no gap: left out of the
         * percentiles, null in its record */
        bool loaded = q->loaded == s->c.d.lay.dcp_size;
        if (n > 0 && loaded) {
            gaps[m] = gap;
            xfer[m] = tr;
            whole[m] = all;
            m++;
        }
        json_t *e = json_pack(
            "{s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o,s:f,s:b,s:s}", "index",
            (json_int_t)i, "tokens", (json_int_t)s->t.tokens[i], "bytes",
            (json_int_t)q->bytes, "arrival_ns", (json_int_t)s->t.arrival[i],
            "prefill_end_ns", (json_int_t)(q->prefill_end_ns - T0), "loaded_ns",
            loaded ? json_integer((json_int_t)(q->loaded_ns - T0))
                   : json_null(),
            "gap_ms", loaded ? json_real(gap) : json_null(), "transfer_ms",
            loaded ? json_real(tr) : json_null(), "whole_transfer_ms", all,
            "verified", ok, "failure", q->failure);
        json_array_append_new(reqs, e);
    }
    uint64_t first = T0 + (s->t.n ? s->t.arrival[0] : 0);
    o->secs = last > first ? (double)(last - first) / 1e9 : 0;
    o->agg = o->secs > 0 ? (double)o->bytes / o->secs / 1e9 : 0;
    o->gap[0] = pct(gaps, m, 50);
    o->gap[1] = pct(gaps, m, 90);
    o->gap[2] = pct(gaps, m, 99);
    o->transfer_p50 = pct(xfer, m, 50);
    o->whole_p50 = pct(whole, m, 50);
    free(gaps);
    free(xfer);
    free(whole);
    return json_pack("{s:b,s:f,s:f,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:o}",
                     "stream", s->c.stream[k % s->c.passes], "aggregate_GBps",
                     o->agg,
                     "ratio", ceiling > 0 ? o->agg / ceiling : 0.0, "bytes",
                     (json_int_t)o->bytes, "seconds", o->secs, "gap_ms_p50",
                     o->gap[0], "gap_ms_p90", o->gap[1], "gap_ms_p99",
                     o->gap[2], "transfer_ms_p50", o->transfer_p50,
                     "whole_transfer_ms_p50", o->whole_p50, "verified",
                     (json_int_t)o->verified, "layer_events",
                     (json_int_t)s->layer_events[k], "requests", reqs);
}

static json_t *machine_json(int ndev)
{
    struct utsname u;
    char host[256] = "", date[64] = "";
    time_t now = time(NULL);
    struct tm tm;
    gethostname(host, sizeof(host) - 1);
    if (gmtime_r(&now, &tm))
        strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm);
    bool un = uname(&u) == 0;
    double load[3] = {0, 0, 0}; /* others' work on the machine skews rates */
    if (getloadavg(load, 3) != 3)
        load[0] = load[1] = load[2] = -1;
    return json_pack("{s:s,s:I,s:s,s:s,s:i,s:[f,f,f]}", "host", host, "cpus",
                     (json_int_t)sysconf(_SC_NPROCESSORS_ONLN), "kernel",
                     un ? u.release : "", "date", date, "cuda_devices", ndev,
                     "loadavg", load[0], load[1], load[2]);
}

static const char *dist_text(const sv_cfg_t *c, char *buf, size_t len)
{
    if (c->dist == SV_DIST_FIXED)
        snprintf(buf, len, "fixed:%llu", (unsigned long long)c->dist_a);
    else if (c->dist == SV_DIST_UNIFORM)
        snprintf(buf, len, "uniform:%llu:%llu", (unsigned long long)c->dist_a,
                 (unsigned long long)c->dist_b);
    else
        snprintf(buf, len, "file (%u lengths)", c->file_n);
    return buf;
}

static json_t *params_json(const sup_t *s)
{
    const demo_cfg_t *d = &s->c.d;
    char dist[64];
    static const char *const tl[] = {"auto", "shm", "tcp"};
    static const char *const ex[] = {"auto", "direct", "staged"};
    json_t *p = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:s,s:f,s:I,s:I,s:s,s:s,"
        "s:s}",
        "instances", (json_int_t)d->instances, "groups", (json_int_t)d->groups,
        "pp", (json_int_t)d->pp, "dcp", (json_int_t)d->lay.dcp_size,
        "interleave", (json_int_t)d->lay.interleave, "block_size",
        (json_int_t)d->lay.block_size, "layers", (json_int_t)d->layers,
        "token_bytes", (json_int_t)d->token_bytes, "requests",
        (json_int_t)s->c.requests, "rate", s->c.rate, "tokens_dist",
        dist_text(&s->c, dist, sizeof(dist)), "prefill_us_per_layer_per_ktoken",
        s->c.prefill_us, "layer_group", (json_int_t)s->c.layer_group,
        "pool_tokens",
        (json_int_t)(s->t.pool_vblocks * kvr_virtual_block(&d->lay)),
        "transport", tl[d->tl], "executor", ex[d->exec], "device",
        d->use_cuda ? "cuda" : "host");
    json_object_set_new(p, "replicate_index",
                        json_boolean(d->lay.replicate_index));
    json_object_set_new(p, "index_every", json_integer(d->index_every));
    json_object_set_new(p, "sources", json_string(s->c.distinct_src
                                                      ? "distinct"
                                                      : "shared"));
    json_object_set_new(p, "pages", json_string(sv_pages_name(&s->c)));
    json_object_set_new(p, "reps", json_integer(s->c.reps));
    json_object_set_new(p, "decode_progress",
                        json_string(s->c.decode_thread ? "thread" : "wait"));
    json_object_set_new(p, "prefill",
                        json_string(s->c.prefill_gpu ? "gpu" : "host"));
    return p;
}

static void print_table(const sup_t *s, const pass_sum_t *ps, double ceiling,
                        const double *small_p50)
{
    const demo_cfg_t *d = &s->c.d;
    char dist[64];
    printf("kvrelay bench serving: %u x PP%u (%u layers) -> %u x W=%u I=%u, "
           "%u requests %s, rate %g/s, prefill %g us/layer/ktoken%s\n",
           d->instances, d->pp, d->layers, d->groups, d->lay.dcp_size,
           d->lay.interleave, s->c.requests,
           dist_text(&s->c, dist, sizeof(dist)), s->c.rate, s->c.prefill_us,
           s->c.prefill_gpu ? " (on the GPU)" : "");
    printf("%-24s", "");
    for (uint32_t k = 0; k < s->c.passes; k++)
        printf("%14s", s->c.stream[k] ? "stream" : "no-stream");
    printf("\n%-24s", "aggregate GB/s");
    for (uint32_t k = 0; k < s->c.passes; k++)
        printf("%14.3f", ps[k].agg);
    printf("\n%-24s", "ratio to ceiling");
    for (uint32_t k = 0; k < s->c.passes; k++)
        printf("%14.3f", ceiling > 0 ? ps[k].agg / ceiling : 0);
    static const char *const names[] = {"gap ms p50", "gap ms p90",
                                        "gap ms p99"};
    for (int g = 0; g < 3; g++) {
        printf("\n%-24s", names[g]);
        for (uint32_t k = 0; k < s->c.passes; k++)
            printf("%14.3f", ps[k].gap[g]);
    }
    printf("\n%-24s", "transfer ms p50");
    for (uint32_t k = 0; k < s->c.passes; k++)
        printf("%14.3f", ps[k].transfer_p50);
    printf("\n%-24s", "whole transfer ms p50");
    for (uint32_t k = 0; k < s->c.passes; k++)
        printf("%14.3f", ps[k].whole_p50);
    printf("\n%-24s", "verified");
    for (uint32_t k = 0; k < s->c.passes; k++)
        printf("%10u/%-3u", ps[k].verified, s->t.n);
    printf("\nceiling %.3f GB/s (%.1f MB per instance as one transfer per "
           "stage-rank pair; median of %u, each after its rep's passes)\n",
           ceiling, (double)s->ceil_best_bytes / d->instances / 1e6,
           s->c.reps);
    printf("one-block request round trip p50 %.1f us (%u samples); each "
           "request alone %.1f us (%u)\n",
           small_p50[0], s->nsmall[0], small_p50[1], s->nsmall[1]);
}

static double rate(uint64_t bytes, uint64_t ns)
{
    return ns ? (double)bytes / (double)ns : 0;
}

/* The warm ceilings (one per rep), each as GB/s, and their median. */
static double ceilings(const sup_t *s, double *each)
{
    double v[SV_MAX_REPS];
    for (uint32_t r = 0; r < s->c.reps; r++)
        v[r] = each[r] = rate(s->ceil_best_bytes, s->ceil_ns[r + 1]);
    return pct(v, s->c.reps, 50);
}

/* Pass k of every rep: the median rep's record (its requests and gaps),
 * with every rep's aggregate, its ratio to the ceiling measured right
 * after it, its length and its gap percentiles (whether a slow rep was
 * slow throughout or in a few requests). */
static json_t *pass_reps(const sup_t *s, uint32_t k, double ceiling,
                         const double *ceil_each, pass_sum_t *o)
{
    json_t *rec[SV_MAX_REPS], *aggs = json_array(), *ratios = json_array();
    json_t *secs = json_array(), *g50 = json_array(), *g99 = json_array();
    pass_sum_t sum[SV_MAX_REPS];
    double agg[SV_MAX_REPS];
    for (uint32_t r = 0; r < s->c.reps; r++) {
        rec[r] = pass_json(s, r * s->c.passes + k, ceiling, &sum[r]);
        agg[r] = sum[r].agg;
        json_array_append_new(aggs, json_real(sum[r].agg));
        json_array_append_new(
            ratios, json_real(ceil_each[r] > 0 ? sum[r].agg / ceil_each[r] : 0));
        json_array_append_new(secs, json_real(sum[r].secs));
        json_array_append_new(g50, json_real(sum[r].gap[0]));
        json_array_append_new(g99, json_real(sum[r].gap[2]));
    }
    double mid = pct(agg, s->c.reps, 50);
    uint32_t pick = 0;
    for (uint32_t r = 0; r < s->c.reps; r++)
        if (sum[r].agg == mid)
            pick = r;
    *o = sum[pick];
    for (uint32_t r = 0; r < s->c.reps; r++) {
        o->verified = sum[r].verified < o->verified ? sum[r].verified
                                                    : o->verified;
        if (r != pick)
            json_decref(rec[r]);
    }
    json_object_set_new(rec[pick], "rep", json_integer(pick));
    json_object_set_new(rec[pick], "aggregate_GBps_each", aggs);
    json_object_set_new(rec[pick], "ratio_each", ratios);
    json_object_set_new(rec[pick], "seconds_each", secs);
    json_object_set_new(rec[pick], "gap_ms_p50_each", g50);
    json_object_set_new(rec[pick], "gap_ms_p99_each", g99);
    return rec[pick];
}

static int report(sup_t *s, FILE *json_file)
{
    pass_sum_t ps[SV_MAX_PASSES];
    uint64_t cb = s->ceil_best_bytes;
    double ceil_each[SV_MAX_REPS];
    double ceiling = ceilings(s, ceil_each);
    double small[2][SV_SMALL_REPS * 64], small_p50[2];
    json_t *sm[2] = {json_array(), json_array()};
    for (int k = 0; k < 2; k++) {
        for (uint32_t i = 0; i < s->nsmall[k]; i++) {
            small[k][i] = (double)s->small_ns[k][i] / 1e3;
            json_array_append_new(sm[k], json_real(small[k][i]));
        }
        small_p50[k] = pct(small[k], s->nsmall[k], 50);
    }
    json_t *runs = json_array(), *ce = json_array();
    bool ok = !s->failed && s->ceil_ok;
    for (uint32_t k = 0; k < s->c.passes; k++) {
        json_array_append_new(runs,
                              pass_reps(s, k, ceiling, ceil_each, &ps[k]));
        ok &= ps[k].verified == s->t.n;
    }
    for (uint32_t r = 0; r < s->c.reps; r++)
        json_array_append_new(ce, json_real(ceil_each[r]));
    /* the last pass (streaming with --stream both) is the headline */
    json_t *root = json_deep_copy(json_array_get(runs, s->c.passes - 1));
    json_object_set_new(root, "bench", json_string("serving"));
    json_object_set_new(root, "command", json_string(s->command));
    json_object_set_new(root, "machine", machine_json(s->ndev));
    json_object_set_new(root, "params", params_json(s));
    json_object_set_new(root, "reps", json_integer(s->c.reps));
    json_object_set_new(root, "ceiling_GBps", json_real(ceiling));
    json_object_set_new(root, "ceiling_GBps_each", ce);
    /* the fastest ceiling of the run, cold one included (the definition
     * before --reps: compare old files with ratio_to_best_ceiling) */
    double best = rate(cb, s->ceil_best_ns);
    json_object_set_new(root, "ceiling_GBps_best", json_real(best));
    json_object_set_new(root, "ratio_to_best_ceiling",
                        json_real(best > 0 ? ps[s->c.passes - 1].agg / best
                                           : 0));
    json_object_set_new(root, "ceiling_bytes", json_integer((json_int_t)cb));
    json_object_set_new(root, "ceiling_seconds",
                        json_real(ceiling > 0 ? (double)cb / ceiling / 1e9
                                              : 0));
    json_t *secs = json_array();
    for (uint32_t r = 0; r <= s->c.reps; r++)
        json_array_append_new(secs, json_real((double)s->ceil_ns[r] / 1e9));
    json_object_set_new(root, "ceiling_seconds_each", secs);
    /* issue 17's one-block figure: each rank's loads back to back */
    json_object_set_new(root, "small_request_us_p50", json_real(small_p50[0]));
    json_object_set_new(root, "small_request_us", sm[0]);
    json_object_set_new(root, "small_paced_us_p50", json_real(small_p50[1]));
    json_object_set_new(root, "small_paced_us", sm[1]);
    /* issue 17's streaming target: the streaming gap against the whole
     * transfer of the same requests without streaming */
    if (s->c.passes == 2 && ps[0].whole_p50 > 0)
        json_object_set_new(root, "stream_gap_p50_over_whole_transfer_p50",
                            json_real(ps[1].gap[0] / ps[0].whole_p50));
    json_object_set_new(root, "runs", runs);
    json_object_set_new(root, "ok", json_boolean(ok));
    print_table(s, ps, ceiling, small_p50);
    for (uint32_t k = 0; k < s->runs; k++)
        for (uint32_t i = 0; i < s->t.n; i++)
            if (s->rq[k][i].failure[0])
                printf("  rep %u pass %u request %u FAILED: %s\n",
                       k / s->c.passes, k % s->c.passes, i,
                       s->rq[k][i].failure);
    int rc = ok ? CLI_EXIT_OK : CLI_EXIT_FAILED;
    if (json_file != NULL && (json_dumpf(root, json_file, JSON_INDENT(1)) ||
                              fputc('\n', json_file) == EOF))
        rc = CLI_EXIT_FAILED;
    json_decref(root);
    return rc;
}

/* ---- the command ---- */

/* CUDA is asked in a child: the supervisor forks the ranks later, and a
 * CUDA context does not survive fork. */
static int cuda_devices(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(kvr_agent_cuda_devices() & 0x7f);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return 0;
    return WEXITSTATUS(status);
}

static void remember_command(sup_t *s, int argc, char **argv)
{
    size_t len = 0;
    for (int i = 0; i < argc && len < sizeof(s->command) - 2; i++)
        len += (size_t)snprintf(s->command + len, sizeof(s->command) - len,
                                "%s%s", i ? " " : "kvrelay bench ", argv[i]);
}

static int setup(sup_t *s, int argc, char **argv, FILE **json_file, int *ndev)
{
    int rc = sv_parse(argc, argv, &s->c);
    if (rc >= 0)
        return rc;
    if (s->c.json_path && (*json_file = fopen(s->c.json_path, "w")) == NULL)
        return cli_usage_error("bench serving", "--json %s: %s", s->c.json_path,
                               strerror(errno));
    *ndev = s->ndev = s->c.d.use_cuda ? cuda_devices() : 0;
    if (s->c.d.use_cuda && *ndev == 0)
        return cli_usage_error("bench serving",
                               "--device cuda: no usable CUDA device (or "
                               "kvrelay was built without CUDA)");
    if (!sv_trace_build(&s->c, &s->t))
        return CLI_EXIT_USAGE;
    s->runs = s->c.passes * s->c.reps;
    for (uint32_t k = 0; k < s->runs; k++)
        if ((s->rq[k] = calloc(s->t.n + 1, sizeof(rq_t))) == NULL)
            return CLI_EXIT_FAILED;
    remember_command(s, argc, argv);
    return -1;
}

int cli_cmd_bench_serving(int argc, char **argv)
{
    sup_t *s = calloc(1, sizeof(*s));
    FILE *json_file = NULL;
    int ndev = 0;
    if (s == NULL)
        return CLI_EXIT_FAILED;
    int rc = setup(s, argc, argv, &json_file, &ndev);
    if (rc < 0) {
        s->deadline = kvr_now_ns() +
                      (uint64_t)s->c.d.run_timeout_ms * 1000000ull;
        signal(SIGPIPE, SIG_IGN);
        bool ran = start_all(s, ndev) && run_phases(s);
        stop_all(s);
        if (!ran || s->failed)
            fprintf(stderr, "kvrelay bench serving: %s\n", s->why);
        rc = report(s, json_file);
    }
    if (json_file != NULL && fclose(json_file) != 0)
        rc = CLI_EXIT_FAILED;
    if (json_file != NULL && rc != CLI_EXIT_OK)
        remove(s->c.json_path);
    for (uint32_t k = 0; k < MAX_RUNS; k++)
        free(s->rq[k]);
    sv_trace_free(&s->t);
    sv_cfg_free(&s->c);
    free(s);
    return rc;
}
