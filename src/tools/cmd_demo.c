/* `kvrelay demo`: the main job on one machine. A supervisor starts W serve
 * ranks and PP push stages as child processes on 127.0.0.1, follows their
 * event lines, reaps every child under a deadline and prints the verified
 * summary. Exit 0 only if every child exited 0 and every request verified. */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "demo.h"

#define MAX_CHILDREN 128
#define MAX_ARGS 96

static const char demo_usage[] =
    "usage: kvrelay demo [--json] [options]\n"
    "Runs the headline case by default: PP4 prefill (78 layers split\n"
    "19/20/20/19, MLA 576 B/token, index D=128 on every third layer) into a\n"
    "W=4, I=1 decode group with a replicated index, 4 requests of ~3000\n"
    "tokens, the last reusing request 0's cached prefix. Ends with\n"
    "'verified R/R requests byte-exact, B bytes, X GB/s'.\n";

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
    uint32_t verified_ranks, loaded_ranks;
    uint64_t bytes, computed_blocks;
    uint64_t start_ns, end_ns; /* first WRITE_REQUEST out, last rank loaded */
    char failure[KVR_ERROR_MSG_MAX];
    bool sent;
} req_state_t;

typedef struct {
    kvr_demo_cfg_t cfg;
    bool json;
    child_t kids[MAX_CHILDREN];
    uint32_t num_kids;
    req_state_t reqs[KVR_DEMO_MAX_REQUESTS];
    uint64_t first_offer_ns, first_start_ns, last_load_ns;
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

static int spawn(demo_t *d, const char *name, char **args)
{
    int p[2];
    if (d->num_kids == MAX_CHILDREN || pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        close(p[1]);
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
    n += kvr_demo_cfg_args(&d->cfg, args + n, MAX_ARGS - n - 1);
    args[n] = NULL;
    return n;
}

static req_state_t *req_of(demo_t *d, const char *id)
{
    uint32_t r;
    if (!kvr_demo_parse_request_id(id, strlen(id), &r) || r >= d->cfg.requests)
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
    if (strcmp(verb, "offered") == 0 && sscanf(rest, "%llu %llu", &a, &b) == 2) {
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
    } else if (strcmp(verb, "verified") == 0 && q) {
        q->verified_ranks++;
        printf("  %-8s %s verified byte-exact (%u/%u ranks)\n", k->name, id,
               q->verified_ranks, d->cfg.lay.dcp_size);
    } else if (strcmp(verb, "sent") == 0 && q) {
        q->sent = true;
    } else if ((strcmp(verb, "failed") == 0 || strcmp(verb, "verify-failed") == 0 ||
                strcmp(verb, "send-failed") == 0) && q) {
        note_failure(q, k->name, rest);
        printf("  %-8s %s %s: %s\n", k->name, id, verb, rest);
    } else if (d->cfg.verbose) {
        printf("  %-8s %s\n", k->name, line);
    }
    fflush(stdout);
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
            printf("  %-8s exited with status %d\n", k->name, k->status);
    }
}

/* Pumps every child's output until `until` says stop or the deadline. */
static bool pump(demo_t *d, uint64_t deadline, int want_port_of, int *port)
{
    while (kvr_now_ns() < deadline) {
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
        if (want_port_of >= 0 && d->kids[want_port_of].eof)
            return false;
        if (want_port_of < 0 && open == 0)
            return true;
    }
    return false;
}

/* --device cuda: one GPU per process when there are PP + W of them (stage p
 * on GPU p, rank r on GPU PP + r); else producers on GPU 0 and decode ranks
 * on GPU 1 when there is one. */
static int child_device(const demo_t *d, bool consumer, uint32_t index)
{
    if (!d->cfg.use_cuda)
        return -1;
    int n = kvr_conn_cuda_devices();
    if (n >= (int)(d->cfg.pp + d->cfg.lay.dcp_size))
        return (int)(consumer ? d->cfg.pp + index : index);
    return consumer && n > 1 ? 1 : 0;
}

static int start_serve(demo_t *d, uint32_t rank, int leader_port, int *port)
{
    char extra[5][300], name[32];
    char *args[MAX_ARGS];
    snprintf(extra[0], sizeof(extra[0]), "--cuda-device=%d", child_device(d, true, rank));
    snprintf(extra[1], sizeof(extra[1]), "--rank=%u", rank);
    snprintf(extra[2], sizeof(extra[2]), "--listen=127.0.0.1:0");
    snprintf(extra[3], sizeof(extra[3]), "--expect=%u", d->cfg.requests);
    snprintf(extra[4], sizeof(extra[4]), "--leader=127.0.0.1:%d", leader_port);
    int skip = d->cfg.use_cuda ? 0 : 1;
    build_args(d, args, "serve", extra + skip, (rank > 0 ? 5 : 4) - skip);
    snprintf(name, sizeof(name), "rank %u", rank);
    int k = spawn(d, name, args);
    uint64_t deadline = kvr_now_ns() + 30000000000ull;
    if (k < 0 || !pump(d, deadline, k, port))
        return -1;
    return 0;
}

static int start_push(demo_t *d, uint32_t stage, uint32_t tp, const char *targets)
{
    char extra[4][300], name[32];
    char *args[MAX_ARGS];
    snprintf(extra[0], sizeof(extra[0]), "--cuda-device=%d", child_device(d, false, stage));
    snprintf(extra[1], sizeof(extra[1]), "--stage=%u", stage);
    snprintf(extra[2], sizeof(extra[2]), "--connect=%s", targets);
    snprintf(extra[3], sizeof(extra[3]), "--tp-rank=%u", tp);
    int skip = d->cfg.use_cuda ? 0 : 1;
    build_args(d, args, "push", extra + skip, 4 - skip);
    if (d->cfg.producer_tp > 1)
        snprintf(name, sizeof(name), "stage %u.%u", stage, tp);
    else
        snprintf(name, sizeof(name), "stage %u", stage);
    return spawn(d, name, args) < 0 ? -1 : 0;
}

static bool start_all(demo_t *d)
{
    char targets[300] = "";
    int leader = 0;
    for (uint32_t r = 0; r < d->cfg.lay.dcp_size; r++) {
        int port = 0;
        if (start_serve(d, r, leader, &port) != 0) {
            fprintf(stderr, "kvrelay demo: decode rank %u did not start\n", r);
            return false;
        }
        leader = r == 0 ? port : leader;
        size_t len = strlen(targets);
        snprintf(targets + len, sizeof(targets) - len, "%s127.0.0.1:%d",
                 r ? "," : "", port);
    }
    for (uint32_t p = 0; p < d->cfg.pp; p++)
        for (uint32_t t = 0; t < d->cfg.producer_tp; t++)
            if (start_push(d, p, t, targets) != 0) {
                fprintf(stderr, "kvrelay demo: prefill stage %u tp %u did not "
                        "start\n", p, t);
                return false;
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
    uint32_t verified;
    uint64_t bytes;
    double seconds, gbps;
    bool children_ok;
} totals_t;

static totals_t summarize(const demo_t *d)
{
    totals_t t = {0, 0, 0, 0, true};
    for (uint32_t r = 0; r < d->cfg.requests; r++) {
        t.verified += d->reqs[r].verified_ranks == d->cfg.lay.dcp_size &&
                      d->reqs[r].failure[0] == '\0';
        t.bytes += d->reqs[r].bytes;
    }
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

static void print_json(const demo_t *d, const totals_t *t)
{
    json_t *reqs = json_array(), *kids = json_array();
    for (uint32_t r = 0; r < d->cfg.requests; r++) {
        char id[32];
        kvr_demo_request_id(r, id, sizeof(id));
        const req_state_t *q = &d->reqs[r];
        double secs = q->end_ns > q->start_ns && q->start_ns
                          ? (double)(q->end_ns - q->start_ns) / 1e9 : 0;
        json_array_append_new(reqs, json_pack(
            "{s:s,s:I,s:I,s:I,s:I,s:I,s:b,s:s,s:f,s:f}", "id", id, "tokens",
            (json_int_t)kvr_demo_tokens(&d->cfg, r), "computed_blocks",
            (json_int_t)q->computed_blocks, "loaded_ranks",
            (json_int_t)q->loaded_ranks, "verified_ranks",
            (json_int_t)q->verified_ranks, "bytes", (json_int_t)q->bytes, "sent",
            q->sent, "failure", q->failure, "seconds", secs, "gbps",
            secs > 0 ? (double)q->bytes / secs / 1e9 : 0.0));
    }
    for (uint32_t i = 0; i < d->num_kids; i++)
        json_array_append_new(kids, json_pack("{s:s,s:i}", "name", d->kids[i].name,
                                              "exit", d->kids[i].status));
    json_t *root = json_pack("{s:o,s:o,s:I,s:I,s:f,s:f,s:b}", "requests", reqs,
                             "children", kids, "verified", (json_int_t)t->verified,
                             "bytes", (json_int_t)t->bytes, "seconds", t->seconds,
                             "gbps", t->gbps, "ok",
                             t->children_ok && t->verified == d->cfg.requests);
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
    uint32_t n = kvr_demo_region(&d->cfg, 0, false, NULL);
    for (uint32_t i = 0; i < n; i++) {
        kvr_region_desc_t s, t;
        char name[128];
        kvr_demo_region(&d->cfg, i, false, &s);
        kvr_demo_region(&d->cfg, i, true, &t);
        json_t *files = json_array();
        for (uint32_t r = 0; r < d->cfg.lay.dcp_size; r++) {
            kvr_demo_image_name(name, sizeof(name), (int)r, &t);
            json_array_append_new(files, json_string(name));
        }
        kvr_demo_image_name(name, sizeof(name), -1, &s);
        json_t *e = json_pack("{s:s,s:I,s:{s:I,s:I},s:{s:I,s:I},s:s,s:o}", "role",
                              kvr_role_name(s.role), "layer", (json_int_t)s.layer,
                              "src", "num_blocks", (json_int_t)s.num_blocks,
                              "page_bytes", (json_int_t)s.page_bytes, "dst",
                              "num_blocks", (json_int_t)t.num_blocks, "page_bytes",
                              (json_int_t)t.page_bytes, "src_file", name,
                              "dst_files", files);
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
    uint32_t *src = calloc(kvr_demo_src_pool(&d->cfg) + 1, sizeof(*src));
    json_array_foreach(reqs, i, q) {
        uint32_t r = 0;
        const char *id = json_string_value(json_object_get(q, "id"));
        if (src == NULL || id == NULL || !kvr_demo_parse_request_id(id, strlen(id), &r))
            continue;
        uint64_t N = kvr_demo_tokens(&d->cfg, r);
        kvr_demo_src_blocks(&d->cfg, r, src);
        json_object_set_new(q, "src_blocks",
                            u32_array(src, (size_t)kvr_num_src_blocks(&d->cfg.lay, N)));
        json_t *ids = json_array();
        for (uint64_t g = 0; g < N; g++)
            json_array_append_new(ids, json_integer(kvr_demo_token_id(&d->cfg, r, g)));
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
        "kvrelay-dump", "version", 1, "layout", "block_size", (json_int_t)l->block_size,
        "dcp", (json_int_t)l->dcp_size, "interleave", (json_int_t)l->interleave, "tp",
        (json_int_t)l->dcp_size, "producer_tp", (json_int_t)d->cfg.producer_tp,
        "replicate_index", l->replicate_index,
        "preshuffle", l->preshuffle, "seed", (json_int_t)d->cfg.seed, "regions",
        manifest_regions(d), "requests", manifest_requests(d));
    char path[4096];
    snprintf(path, sizeof(path), "%s/manifest.json", d->cfg.dump_dir);
    if (root == NULL || json_dump_file(root, path, JSON_COMPACT) != 0)
        fprintf(stderr, "kvrelay demo: cannot write %s\n", path);
    else
        printf("dump written to %s (kvrelay inspect %s)\n", d->cfg.dump_dir,
               d->cfg.dump_dir);
    json_decref(root);
}

static int demo_run(demo_t *d)
{
    printf("kvrelay demo: PP%u prefill (%u layers) -> W=%u I=%u decode, %s index, "
           "%u requests of ~%llu tokens over %s%s\n", d->cfg.pp, d->cfg.layers,
           d->cfg.lay.dcp_size, d->cfg.lay.interleave,
           d->cfg.lay.replicate_index ? "replicated" : "sharded", d->cfg.requests,
           (unsigned long long)d->cfg.tokens,
           d->cfg.tl == KVR_CONN_TL_TCP ? "UCX tcp" : d->cfg.tl == KVR_CONN_TL_SHM
                                                          ? "UCX shm" : "UCX",
           d->cfg.use_cuda ? " control, CUDA gpu-direct data (KV in GPU memory)" : "");
    fflush(stdout);
    uint64_t deadline = kvr_now_ns() +
                        ((uint64_t)d->cfg.run_timeout_ms + 20000ull) *
                            1000000ull;
    bool started = start_all(d);
    int unused = 0;
    if (started && !pump(d, deadline, -1, &unused))
        printf("kvrelay demo: children still running at the deadline; killing\n");
    kill_all(d);
    for (uint32_t i = 0; i < d->num_kids; i++)
        close(d->kids[i].fd);
    if (d->cfg.dump_dir != NULL)
        write_manifest(d);
    totals_t t = summarize(d);
    for (uint32_t r = 0; r < d->cfg.requests; r++)
        if (d->reqs[r].failure[0])
            printf("  req-%u FAILED: %s\n", r, d->reqs[r].failure);
    if (d->json)
        print_json(d, &t);
    printf("verified %u/%u requests byte-exact, %llu bytes, %.2f GB/s\n", t.verified,
           d->cfg.requests, (unsigned long long)t.bytes, t.gbps);
    return started && t.children_ok && t.verified == d->cfg.requests
               ? KVR_EXIT_OK : KVR_EXIT_FAILED;
}

int kvr_cmd_demo(int argc, char **argv)
{
    demo_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return KVR_EXIT_FAILED;
    kvr_demo_cfg_init(&d->cfg);
    static const char *const flags[] = {"json", NULL};
    int rc = kvr_demo_parse(argc, argv, &d->cfg, "demo", demo_usage, flags,
                            demo_option, d);
    if (rc < 0 && d->cfg.dump_dir != NULL && mkdir(d->cfg.dump_dir, 0755) != 0 &&
        errno != EEXIST)
        rc = kvr_tool_usage_error("demo", "--dump %s: %s", d->cfg.dump_dir,
                                  strerror(errno));
    if (rc < 0 && d->cfg.use_cuda && kvr_conn_cuda_devices() == 0)
        rc = kvr_tool_usage_error("demo", "--device cuda: no usable CUDA device "
                                  "(or kvrelay was built without CUDA)");
    if (rc < 0) {
        signal(SIGPIPE, SIG_IGN);
        rc = demo_run(d);
    }
    free(d);
    return rc;
}
