/* `kvrelay demo`: the main job on one machine. A supervisor starts G decode
 * groups of W serve ranks (rank 0 of each hosts the group's router) and P
 * prefill instances of PP push stages as child processes on 127.0.0.1,
 * follows their event lines, reaps every child under a deadline and prints
 * the verified summary. Exit 0 only if every child exited 0, every request
 * not aborted verified and every aborted one had its blocks released. */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "demo.h"
#include "demo_store.h"

#define MAX_CHILDREN 128
#define MAX_ARGS 96

static const char demo_usage[] =
    "usage: kvrelay demo [--json] [options]\n"
    "Runs the headline case by default: PP4 prefill (78 layers split\n"
    "19/20/20/19, MLA 576 B/token, index D=128 on every third layer) into a\n"
    "W=4, I=1 decode group with a replicated index, 4 requests of ~3000\n"
    "tokens, the last reusing request 0's cached prefix. --instances P and\n"
    "--groups G spread the requests over P prefill instances and G decode\n"
    "groups; --abort N aborts every Nth request while it moves. Ends with\n"
    "'verified V/R requests byte-exact, B bytes, X GB/s' (R: requests not\n"
    "aborted), after 'aborted A requests, blocks released' when A > 0.\n";

typedef struct {
    pid_t pid;
    int fd;
    char name[32];
    char buf[16384];
    size_t len;
    bool eof, exited;
    int status; /* exit code, or 128 + signal */
} child_t;

typedef struct {
    uint32_t verified_ranks, loaded_ranks, aborted_ranks;
    bool released;    /* the router freed its blocks */
    char outcome[32]; /* the router's outcome */
    uint64_t bytes, computed_blocks;
    uint64_t start_ns, end_ns; /* first WRITE_REQUEST out, last rank loaded */
    char failure[KVR_ERROR_MSG_MAX];
    bool sent;
} req_state_t;

typedef struct {
    demo_cfg_t cfg;
    bool json;
    FILE *out; /* human lines: stdout, or stderr under --json */
    child_t kids[MAX_CHILDREN];
    uint32_t num_kids;
    bool is_serve[MAX_CHILDREN];
    uint64_t serves_gone_ns; /* when the last serve exited */
    req_state_t reqs[DEMO_MAX_REQUESTS];
    uint64_t first_offer_ns, first_start_ns, last_load_ns;
    demo_tally_t *tally; /* --save-to / --load-from */
} demo_t;

static int demo_option(void *ctx, const char *name, const char *value)
{
    demo_t *d = ctx;
    (void)value;
    if (strcmp(name, "json") != 0)
        return 0;
    d->json = true;
    return 1;
}

/* SIGTERM / SIGINT: the supervisor kills and reaps every child, then exits
 * 128 + the signal. */
static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    got_signal = sig;
}

static void catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* In the child: die with the supervisor, even if it is SIGKILLed. */
static void child_setup(int out_fd, int unused_fd, pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    dup2(out_fd, STDOUT_FILENO);
    close(unused_fd);
    close(out_fd);
}

static int spawn(demo_t *d, const char *name, char **args)
{
    int p[2];
    if (d->num_kids == MAX_CHILDREN || pipe(p) != 0)
        return -1;
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        child_setup(p[1], p[0], parent);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(p[1]);
    child_t *k = &d->kids[d->num_kids++];
    memset(k, 0, sizeof(*k));
    k->pid = pid;
    k->fd = p[0];
    snprintf(k->name, sizeof(k->name), "%s", name);
    return (int)(d->num_kids - 1);
}

static int build_args(const demo_t *d, char **args, const char *cmd,
                      char extra[][300], int nextra)
{
    int n = 0;
    args[n++] = "kvrelay";
    args[n++] = (char *)cmd;
    for (int i = 0; i < nextra; i++)
        args[n++] = extra[i];
    n += demo_cfg_args(&d->cfg, args + n, MAX_ARGS - n - 1);
    args[n] = NULL;
    return n;
}

static req_state_t *req_of(demo_t *d, const char *id)
{
    uint32_t r;
    if (!demo_parse_request_id(id, strlen(id), &r) || r >= d->cfg.requests)
        return NULL;
    return &d->reqs[r];
}

static void note_failure(req_state_t *q, const char *who, const char *rest)
{
    if (q != NULL && q->failure[0] == '\0')
        snprintf(q->failure, sizeof(q->failure), "%s: %s", who, rest);
}

/* One event line of a child (see cmd_serve.c / cmd_push.c). */
static void on_line(demo_t *d, child_t *k, char *line)
{
    char verb[32] = "", id[64] = "";
    unsigned long long a = 0, b = 0, c = 0, e = 0;
    int used = 0;
    sscanf(line, "%31s %63s %n", verb, id, &used);
    const char *rest = used > 0 ? line + used : "";
    req_state_t *q = req_of(d, id);
    if (q != NULL && demo_tally_line(d->tally, d->out, k->name, verb,
                                     (uint32_t)(q - d->reqs), rest))
        return;
    if (strcmp(verb, "offered") == 0 &&
        sscanf(rest, "%llu %llu", &a, &b) == 2) {
        if (d->first_offer_ns == 0 || b < d->first_offer_ns)
            d->first_offer_ns = b;
    } else if (strcmp(verb, "loaded") == 0 && q &&
               sscanf(rest, "%llu %llu %llu %llu", &a, &b, &c, &e) == 4) {
        q->loaded_ranks++;
        q->bytes += a;
        q->computed_blocks = b;
        d->last_load_ns = c > d->last_load_ns ? c : d->last_load_ns;
        if (d->first_start_ns == 0 || e < d->first_start_ns)
            d->first_start_ns = e;
        q->end_ns = c > q->end_ns ? c : q->end_ns;
        q->start_ns = q->start_ns == 0 || e < q->start_ns ? e : q->start_ns;
    } else if (strcmp(verb, "aborted") == 0 && q) {
        q->aborted_ranks++;
        fprintf(d->out, "  %-8s %s aborted in flight\n", k->name, id);
    } else if (strcmp(verb, "released") == 0 && q) {
        q->released = true;
        snprintf(q->outcome, sizeof(q->outcome), "%.31s", rest);
        char *sp = strchr(q->outcome, ' ');
        if (sp != NULL)
            *sp = '\0';
        if (q->aborted_ranks > 0 || d->cfg.verbose)
            fprintf(d->out, "  %-8s %s blocks released (%s)\n", k->name, id,
                    rest);
    } else if (strcmp(verb, "verified") == 0 && q) {
        q->verified_ranks++;
        fprintf(d->out, "  %-8s %s verified byte-exact (%u/%u ranks)\n",
                k->name, id, q->verified_ranks, demo_ranks(&d->cfg));
    } else if (strcmp(verb, "sent") == 0 && q) {
        q->sent = true;
    } else if ((strcmp(verb, "failed") == 0 ||
                strcmp(verb, "verify-failed") == 0 ||
                strcmp(verb, "send-failed") == 0 ||
                strcmp(verb, "offer-refused") == 0) &&
               q) {
        note_failure(q, k->name, rest);
        fprintf(d->out, "  %-8s %s %s: %s\n", k->name, id, verb, rest);
    } else if (d->cfg.verbose) {
        fprintf(d->out, "  %-8s %s\n", k->name, line);
    }
    fflush(d->out);
}

/* Reads what a child wrote; returns the port of a "listening" line, else 0. */
static int drain(demo_t *d, child_t *k)
{
    int port = 0;
    ssize_t n = read(k->fd, k->buf + k->len, sizeof(k->buf) - 1 - k->len);
    if (n <= 0) {
        k->eof = n == 0 || (errno != EINTR && errno != EAGAIN);
        return 0;
    }
    k->len += (size_t)n;
    char *nl;
    while ((nl = memchr(k->buf, '\n', k->len)) != NULL) {
        *nl = '\0';
        if (sscanf(k->buf, "listening %d", &port) != 1)
            on_line(d, k, k->buf);
        size_t used = (size_t)(nl - k->buf) + 1;
        memmove(k->buf, nl + 1, k->len - used);
        k->len -= used;
    }
    if (k->len == sizeof(k->buf) - 1)
        k->len = 0; /* an overlong line is dropped, never overflows */
    return port;
}

static void reap(demo_t *d, bool block)
{
    for (uint32_t i = 0; i < d->num_kids; i++) {
        child_t *k = &d->kids[i];
        int st;
        if (k->exited || waitpid(k->pid, &st, block ? 0 : WNOHANG) != k->pid)
            continue;
        k->exited = true;
        k->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (k->status != 0)
            fprintf(d->out, "  %-8s exited with status %d\n", k->name,
                    k->status);
    }
}

/* Once every decode rank exited, no pull or release can come: prefill
 * stages still waiting (for a rank that died, or a router that refused
 * them) get SIGTERM after a grace period and exit on their own. */
static void stop_orphans(demo_t *d)
{
    uint32_t serves = 0, serves_left = 0;
    for (uint32_t i = 0; i < d->num_kids; i++) {
        serves += d->is_serve[i];
        serves_left += d->is_serve[i] && !d->kids[i].exited;
    }
    if (serves == 0 || serves_left > 0)
        return;
    if (d->serves_gone_ns == 0)
        d->serves_gone_ns = kvr_now_ns();
    if (kvr_now_ns() - d->serves_gone_ns < 10000000000ull)
        return;
    for (uint32_t i = 0; i < d->num_kids; i++)
        if (!d->kids[i].exited && !d->kids[i].eof)
            kill(d->kids[i].pid, SIGTERM);
}

/* Pumps every child's output until `until` says stop or the deadline. */
static bool pump(demo_t *d, uint64_t deadline, int want_port_of, int *port)
{
    while (!got_signal && kvr_now_ns() < deadline) {
        struct pollfd fds[MAX_CHILDREN];
        uint32_t open = 0;
        for (uint32_t i = 0; i < d->num_kids; i++)
            fds[i] = (struct pollfd){.fd = d->kids[i].eof ? -1 : d->kids[i].fd,
                                     .events = POLLIN};
        poll(fds, d->num_kids, 50);
        for (uint32_t i = 0; i < d->num_kids; i++) {
            if (fds[i].revents) {
                int p = drain(d, &d->kids[i]);
                if ((int)i == want_port_of && p > 0) {
                    *port = p;
                    return true;
                }
            }
            open += !d->kids[i].eof;
        }
        reap(d, false);
        stop_orphans(d);
        if (want_port_of >= 0 && d->kids[want_port_of].eof)
            return false;
        if (want_port_of < 0 && open == 0)
            return true;
    }
    return false;
}

/* --device cuda: one GPU per process when there are enough (prefill
 * stages first, then decode ranks); else producers on GPU 0 and decode
 * ranks on GPU 1 when there is one. */
static int child_device(const demo_t *d, bool consumer, uint32_t index)
{
    if (!d->cfg.use_cuda)
        return -1;
    int n = kvr_agent_cuda_devices();
    uint32_t prod = d->cfg.instances * d->cfg.pp;
    if (n >= (int)(prod + d->cfg.groups * demo_ranks(&d->cfg)))
        return (int)(consumer ? prod + index : index);
    return consumer && n > 1 ? 1 : 0;
}

static void child_name(const demo_t *d, bool consumer, uint32_t who, uint32_t r,
                       uint32_t tp, char *buf, size_t len)
{
    char pre[16] = "";
    if (consumer && d->cfg.groups > 1)
        snprintf(pre, sizeof(pre), "g%u ", who);
    if (!consumer && d->cfg.instances > 1)
        snprintf(pre, sizeof(pre), "p%u ", who);
    if (consumer)
        snprintf(buf, len, "%srank %u", pre, r);
    else if (demo_producer_tp(&d->cfg) > 1)
        snprintf(buf, len, "%sstage %u.%u", pre, r, tp);
    else
        snprintf(buf, len, "%sstage %u", pre, r);
}

/* Starts a child and, when port is not NULL, waits for its "listening"
 * line. */
static int start_child(demo_t *d, const char *cmd, bool consumer,
                       char extra[][300], int nextra, const char *name,
                       int *port)
{
    char *args[MAX_ARGS];
    int skip = d->cfg.use_cuda ? 0 : 1; /* extra[0]: --cuda-device */
    build_args(d, args, cmd, extra + skip, nextra - skip);
    int k = spawn(d, name, args);
    if (k < 0)
        return -1;
    d->is_serve[k] = consumer;
    uint64_t deadline = kvr_deadline_ns(60000);
    return port == NULL || pump(d, deadline, k, port) ? 0 : -1;
}

static int start_serve(demo_t *d, uint32_t g, uint32_t rank, int router,
                       int *port)
{
    char extra[6][300], name[32];
    snprintf(extra[0], sizeof(extra[0]), "--cuda-device=%d",
             child_device(d, true, g * demo_ranks(&d->cfg) + rank));
    snprintf(extra[1], sizeof(extra[1]), "--rank=%u", rank);
    snprintf(extra[2], sizeof(extra[2]), "--group=%u", g);
    snprintf(extra[3], sizeof(extra[3]), "--listen=127.0.0.1:0");
    snprintf(extra[4], sizeof(extra[4]), "--expect=%u",
             demo_count(&d->cfg, g, true));
    snprintf(extra[5], sizeof(extra[5]), "--router=127.0.0.1:%d", router);
    child_name(d, true, g, rank, 0, name, sizeof(name));
    return start_child(d, "serve", true, extra, rank > 0 ? 6 : 5, name, port);
}

static int start_push(demo_t *d, uint32_t p, uint32_t stage, uint32_t tp,
                      const char *routers, int head, int *port)
{
    char extra[5][300], name[32];
    snprintf(extra[0], sizeof(extra[0]), "--cuda-device=%d",
             child_device(d, false, p * d->cfg.pp + stage));
    snprintf(extra[1], sizeof(extra[1]), "--instance=%u", p);
    snprintf(extra[2], sizeof(extra[2]), "--stage=%u", stage);
    snprintf(extra[3], sizeof(extra[3]), "--tp-rank=%u", tp);
    if (head == 0)
        snprintf(extra[4], sizeof(extra[4]), "--routers=%s", routers);
    else
        snprintf(extra[4], sizeof(extra[4]), "--head=127.0.0.1:%d", head);
    child_name(d, false, p, stage, tp, name, sizeof(name));
    return start_child(d, "push", false, extra, 5, name, port);
}

/* A child that failed before every process started (a rank that could not
 * set up, or was killed) means the run cannot complete: start no more. A
 * child that exited 0 finished its part (a prefill instance whose requests
 * were all served while slow CUDA start-ups of later children ran). */
static bool child_gone(demo_t *d)
{
    reap(d, false);
    for (uint32_t i = 0; i < d->num_kids; i++)
        if (d->kids[i].exited && d->kids[i].status != 0) {
            fprintf(stderr,
                    "kvrelay demo: %s is gone (status %d) before every "
                    "process started; starting no more\n",
                    d->kids[i].name, d->kids[i].status);
            return true;
        }
    return got_signal != 0;
}

/* Decode groups first (rank 0, the router, then the ranks that join it),
 * then each prefill instance: its head, which offers to the routers, then
 * the stages that join the head. */
static bool start_decode(demo_t *d, char *routers, size_t cap)
{
    for (uint32_t g = 0; g < d->cfg.groups; g++) {
        int router = 0;
        for (uint32_t r = 0; r < demo_ranks(&d->cfg); r++) {
            int port = 0;
            if (child_gone(d))
                return false;
            if (start_serve(d, g, r, router, &port) != 0) {
                fprintf(stderr,
                        "kvrelay demo: decode group %u rank %u did not "
                        "start\n",
                        g, r);
                return false;
            }
            router = r == 0 ? port : router;
        }
        size_t len = strlen(routers);
        snprintf(routers + len, cap - len, "%s127.0.0.1:%d", g ? "," : "",
                 router);
    }
    return true;
}

static bool start_all(demo_t *d)
{
    char routers[4096] = "";
    if (!start_decode(d, routers, sizeof(routers)))
        return false;
    for (uint32_t p = 0; p < d->cfg.instances; p++) {
        int head = 0;
        for (uint32_t st = 0; st < d->cfg.pp; st++)
            for (uint32_t t = 0; t < demo_producer_tp(&d->cfg); t++) {
                bool first = st == 0 && t == 0;
                if (child_gone(d) || start_push(d, p, st, t, routers, head,
                                                first ? &head : NULL) != 0) {
                    if (!got_signal)
                        fprintf(stderr,
                                "kvrelay demo: prefill instance %u "
                                "stage %u tp %u did not start\n",
                                p, st, t);
                    return false;
                }
            }
    }
    return true;
}

static void kill_all(demo_t *d)
{
    for (uint32_t i = 0; i < d->num_kids; i++)
        if (!d->kids[i].exited)
            kill(d->kids[i].pid, SIGKILL);
    reap(d, true);
}

typedef struct {
    uint32_t verified, aborted, expected, unreleased;
    uint64_t bytes;
    double seconds, gbps;
    bool children_ok;
} totals_t;

/* A request is aborted when a rank's abort took effect (one that ended
 * first was loaded, and is verified like any other). */
static totals_t summarize(const demo_t *d)
{
    totals_t t = {0, 0, 0, 0, 0, 0, 0, true};
    for (uint32_t r = 0; r < d->cfg.requests; r++) {
        const req_state_t *q = &d->reqs[r];
        if (q->aborted_ranks > 0) {
            t.aborted++;
            t.unreleased += !q->released;
            continue;
        }
        t.verified += q->verified_ranks == demo_ranks(&d->cfg) &&
                      q->failure[0] == '\0';
        t.bytes += q->bytes;
    }
    t.expected = d->cfg.requests - t.aborted;
    for (uint32_t i = 0; i < d->num_kids; i++)
        t.children_ok &= d->kids[i].exited && d->kids[i].status == 0;
    /* transfer time: first WRITE_REQUEST out to last request loaded, so
     * start-up (filling sources, stages still connecting) is not counted */
    uint64_t start = d->first_start_ns ? d->first_start_ns : d->first_offer_ns;
    if (d->last_load_ns > start && start > 0)
        t.seconds = (double)(d->last_load_ns - start) / 1e9;
    t.gbps = t.seconds > 0 ? (double)t.bytes / t.seconds / 1e9 : 0;
    return t;
}

static bool totals_ok(const totals_t *t)
{
    return t->children_ok && t->verified == t->expected && t->unreleased == 0;
}

static void print_json(const demo_t *d, const totals_t *t)
{
    json_t *reqs = json_array(), *kids = json_array();
    for (uint32_t r = 0; r < d->cfg.requests; r++) {
        char id[32];
        demo_request_id(r, id, sizeof(id));
        const req_state_t *q = &d->reqs[r];
        double secs = q->end_ns > q->start_ns && q->start_ns
                          ? (double)(q->end_ns - q->start_ns) / 1e9
                          : 0;
        json_t *e = json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:b,s:s,s:f,s:f}", "id",
                              id, "tokens", (json_int_t)demo_tokens(&d->cfg, r),
                              "computed_blocks", (json_int_t)q->computed_blocks,
                              "loaded_ranks", (json_int_t)q->loaded_ranks,
                              "verified_ranks", (json_int_t)q->verified_ranks,
                              "bytes", (json_int_t)q->bytes, "sent", q->sent,
                              "failure", q->failure, "seconds", secs, "gbps",
                              secs > 0 ? (double)q->bytes / secs / 1e9 : 0.0);
        json_object_set_new(e, "instance",
                            json_integer(demo_instance_of(&d->cfg, r)));
        json_object_set_new(e, "group",
                            json_integer(demo_group_of(&d->cfg, r)));
        json_object_set_new(e, "aborted", json_boolean(q->aborted_ranks > 0));
        json_object_set_new(e, "released", json_boolean(q->released));
        json_array_append_new(reqs, e);
    }
    for (uint32_t i = 0; i < d->num_kids; i++)
        json_array_append_new(kids,
                              json_pack("{s:s,s:i}", "name", d->kids[i].name,
                                        "exit", d->kids[i].status));
    json_t *root = json_pack(
        "{s:o,s:o,s:I,s:I,s:I,s:I,s:f,s:f,s:b}", "requests", reqs, "children",
        kids, "verified", (json_int_t)t->verified, "expected",
        (json_int_t)t->expected, "aborted", (json_int_t)t->aborted, "bytes",
        (json_int_t)t->bytes, "seconds", t->seconds, "gbps", t->gbps, "ok",
        totals_ok(t));
    demo_tally_json(d->tally, root);
    char *text = json_dumps(root, JSON_COMPACT);
    if (text != NULL)
        puts(text);
    free(text);
    json_decref(root);
}

static json_t *u32_array(const uint32_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *manifest_regions(const demo_t *d)
{
    json_t *regions = json_array();
    uint32_t n = demo_region(&d->cfg, 0, false, 0, NULL);
    for (uint32_t i = 0; i < n; i++) {
        kvr_region_desc_t s, t;
        char name[128];
        demo_region(&d->cfg, i, false, 0, &s);
        demo_region(&d->cfg, i, true, 0, &t);
        json_t *files = json_array();
        for (uint32_t r = 0; r < demo_ranks(&d->cfg); r++) {
            demo_image_name(name, sizeof(name), (int)r, &t);
            json_array_append_new(files, json_string(name));
        }
        demo_image_name(name, sizeof(name), -1, &s);
        json_t *e = json_pack(
            "{s:s,s:I,s:{s:I,s:I},s:{s:I,s:I},s:s,s:o}", "role",
            kvr_role_name(s.role), "layer", (json_int_t)s.layer, "src",
            "num_blocks", (json_int_t)s.num_blocks, "page_bytes",
            (json_int_t)s.page_bytes, "dst", "num_blocks",
            (json_int_t)t.num_blocks, "page_bytes", (json_int_t)t.page_bytes,
            "src_file", name, "dst_files", files);
        if (s.role == KVR_ROLE_INDEX) {
            json_object_set_new(e, "index_dim", json_integer(s.index_dim));
            json_object_set_new(e, "quant_block", json_integer(s.quant_block));
        }
        json_array_append_new(regions, e);
    }
    return regions;
}

/* Rank 0's loaded requests, completed with the tables every process derives
 * from the seed. */
static json_t *manifest_requests(const demo_t *d)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/requests-r0.json", d->cfg.dump_dir);
    json_t *reqs = json_load_file(path, 0, NULL), *q;
    size_t i;
    if (!json_is_array(reqs)) {
        json_decref(reqs);
        return json_array();
    }
    uint32_t *src = calloc(demo_src_pool(&d->cfg, 0) + 1, sizeof(*src));
    json_array_foreach(reqs, i, q)
    {
        uint32_t r = 0;
        const char *id = json_string_value(json_object_get(q, "id"));
        if (src == NULL || id == NULL ||
            !demo_parse_request_id(id, strlen(id), &r))
            continue;
        uint64_t N = demo_tokens(&d->cfg, r);
        demo_src_blocks(&d->cfg, r, src);
        json_object_set_new(
            q, "src_blocks",
            u32_array(src, (size_t)kvr_num_src_blocks(&d->cfg.lay, N)));
        json_t *ids = json_array();
        for (uint64_t g = 0; g < N; g++)
            json_array_append_new(ids,
                                  json_integer(demo_token_id(&d->cfg, r, g)));
        json_object_set_new(q, "token_ids", ids);
    }
    free(src);
    return reqs;
}

static void write_manifest(const demo_t *d)
{
    const kvr_layout_t *l = &d->cfg.lay;
    json_t *root = json_pack(
        "{s:s,s:i,s:{s:I,s:I,s:I,s:I,s:I,s:b,s:b},s:I,s:o,s:o}", "format",
        "kvrelay-dump", "version", 1, "layout", "block_size",
        (json_int_t)l->block_size, "dcp", (json_int_t)l->dcp_size, "interleave",
        (json_int_t)l->interleave, "tp", (json_int_t)l->dcp_size, "producer_tp",
        (json_int_t)demo_producer_tp(&d->cfg), "replicate_index",
        l->replicate_index, "preshuffle", l->preshuffle, "seed",
        (json_int_t)d->cfg.seed, "regions", manifest_regions(d), "requests",
        manifest_requests(d));
    char path[4096];
    snprintf(path, sizeof(path), "%s/manifest.json", d->cfg.dump_dir);
    if (root == NULL || json_dump_file(root, path, JSON_COMPACT) != 0)
        fprintf(stderr, "kvrelay demo: cannot write %s\n", path);
    else
        fprintf(d->out, "dump written to %s (kvrelay inspect %s)\n",
                d->cfg.dump_dir, d->cfg.dump_dir);
    json_decref(root);
}

/* What the regions are: MLA with its index, or --model gqa's K/V heads. */
static void model_label(const demo_cfg_t *c, char *out, size_t cap)
{
    if (c->gqa)
        snprintf(out, cap, "GQA %u KV heads x %u (%s) from producer TP%u",
                 c->kv_heads, c->head_dim, c->hnd ? "HND" : "NHD",
                 demo_producer_tp(c));
    else if (kvr_producer_dcp(&c->lay) > 1)
        snprintf(out, cap, "%s index, from a producer of W=%u I=%u",
                 c->lay.replicate_index ? "replicated" : "sharded",
                 kvr_producer_dcp(&c->lay), kvr_producer_interleave(&c->lay));
    else
        snprintf(out, cap, "%s index",
                 c->lay.replicate_index ? "replicated" : "sharded");
}

/* How CUDA KV moves: CUDA IPC unless the network path is forced
 * (docs/agent.md, GPU executors). */
static const char *cuda_label(const demo_cfg_t *c)
{
    if (!c->use_cuda)
        return "";
    if (c->tl != KVR_AGENT_TL_TCP)
        return " control, CUDA gpu-direct data (KV in GPU memory)";
    return c->exec == KVR_AGENT_EXEC_STAGED
               ? " control, CUDA gpu-staged data (KV in GPU memory)"
               : " control, CUDA data by the cost model's pick (KV in GPU "
                 "memory)";
}

static int demo_run(demo_t *d)
{
    char prod[48] = "", cons[48] = "", model[96], ranks[48];
    if (d->cfg.instances > 1)
        snprintf(prod, sizeof(prod), "%u x ", d->cfg.instances);
    if (d->cfg.groups > 1)
        snprintf(cons, sizeof(cons), "%u x ", d->cfg.groups);
    model_label(&d->cfg, model, sizeof(model));
    if (d->cfg.gqa) /* heads over TP ranks: W and I do not apply */
        snprintf(ranks, sizeof(ranks), "TP%u", demo_ranks(&d->cfg));
    else
        snprintf(ranks, sizeof(ranks), "W=%u I=%u", demo_ranks(&d->cfg),
                 d->cfg.lay.interleave);
    fprintf(d->out,
            "kvrelay demo: %sPP%u prefill (%u layers) -> %s%s "
            "decode, %s, %u requests of ~%llu tokens over %s%s\n",
            prod, d->cfg.pp, d->cfg.layers, cons, ranks, model, d->cfg.requests,
            (unsigned long long)d->cfg.tokens,
            d->cfg.tl == KVR_AGENT_TL_TCP   ? "UCX tcp"
            : d->cfg.tl == KVR_AGENT_TL_SHM ? "UCX shm"
                                            : "UCX",
            cuda_label(&d->cfg));
    fflush(d->out);
    uint64_t deadline = kvr_now_ns() +
                        ((uint64_t)d->cfg.run_timeout_ms + 20000ull) *
                            1000000ull;
    bool started = start_all(d);
    int unused = 0;
    if (started && !pump(d, deadline, -1, &unused))
        fprintf(
            d->out,
            "kvrelay demo: children still running at the deadline; killing\n");
    kill_all(d);
    for (uint32_t i = 0; i < d->num_kids; i++)
        close(d->kids[i].fd);
    if (got_signal) {
        fprintf(stderr,
                "kvrelay demo: signal %d: every child killed and reaped\n",
                (int)got_signal);
        return 128 + (int)got_signal;
    }
    if (d->cfg.dump_dir != NULL)
        write_manifest(d);
    totals_t t = summarize(d);
    for (uint32_t r = 0; r < d->cfg.requests; r++)
        if (d->reqs[r].failure[0])
            fprintf(d->out, "  req-%u FAILED: %s\n", r, d->reqs[r].failure);
    if (d->json)
        print_json(d, &t);
    if (t.aborted > 0 && t.unreleased == 0)
        fprintf(d->out, "aborted %u requests, blocks released\n", t.aborted);
    else if (t.aborted > 0)
        fprintf(d->out, "aborted %u requests, blocks of %u not released\n",
                t.aborted, t.unreleased);
    fprintf(d->out,
            "verified %u/%u requests byte-exact, %llu bytes, %.2f GB/s\n",
            t.verified, t.expected, (unsigned long long)t.bytes, t.gbps);
    bool store_ok = demo_tally_print(d->tally, d->out, t.bytes);
    return started && totals_ok(&t) && store_ok ? CLI_EXIT_OK : CLI_EXIT_FAILED;
}

int cli_cmd_demo(int argc, char **argv)
{
    demo_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return CLI_EXIT_FAILED;
    demo_cfg_init(&d->cfg);
    static const char *const flags[] = {"json", NULL};
    int rc = demo_parse(argc, argv, &d->cfg, "demo", demo_usage, flags,
                        demo_option, d);
    if (rc < 0 && d->cfg.dump_dir != NULL &&
        mkdir(d->cfg.dump_dir, 0755) != 0 && errno != EEXIST)
        rc = cli_usage_error("demo", "--dump %s: %s", d->cfg.dump_dir,
                             strerror(errno));
    if (rc < 0 && d->cfg.use_cuda && kvr_agent_cuda_devices() == 0)
        rc = cli_usage_error("demo", "--device cuda: no usable CUDA device "
                                     "(or kvrelay was built without CUDA)");
    bool store_ok = true;
    if (rc < 0)
        d->tally = demo_tally_create(&d->cfg, &store_ok);
    if (!store_ok)
        rc = CLI_EXIT_USAGE;
    if (rc < 0) {
        d->out = d->json ? stderr : stdout;
        catch_signals();
        rc = demo_run(d);
    }
    demo_tally_destroy(d->tally);
    free(d);
    return rc;
}
