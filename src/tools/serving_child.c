/* `kvrelay bench serving`: the processes. A prefill stage opens its
 * instance's requests as they arrive and announces each layer group when
 * the simulated prefill reaches it; a decode rank loads its group's
 * requests as they arrive and verifies each one byte-exact before its
 * blocks are reused. Each obeys the supervisor's commands on `ctl` (one
 * line each) and reports on `out`; every time is kvr_now_ns (one clock
 * for every process of the host). */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "kvrelay/synth.h"
#include "serving.h"

#define MAX_REGIONS (DEMO_MAX_LAYERS * 2)
#define WAIT_SLICE_NS 100000000ull

enum { RQ_NONE, RQ_LOADING, RQ_LOADED, RQ_RELEASED, RQ_FAILED, RQ_FREE };

typedef struct {
    const sv_cfg_t *c;
    const sv_trace_t *t;
    const sv_role_t *role;
    FILE *out;
    int ctl;
    char ctl_buf[512];
    size_t ctl_len;
    kvr_agent_t *agent;
    char instance[KVR_AGENT_INSTANCE_MAX + 1];
    uint32_t lo, hi; /* a stage's layers */
    kvr_region_desc_t descs[MAX_REGIONS];
    void *bases[MAX_REGIONS], *mirrors[MAX_REGIONS];
    uint32_t nreg;
    uint32_t *table; /* producer: shared source table; consumer: ring */
    uint8_t *st;     /* per trace request: RQ_* */
    int32_t *owner;  /* consumer: ring position -> request, -1 free */
    uint32_t pass, outcomes, layer_events, failures;
    uint64_t loaded_ns, loaded_bytes; /* the last LOADED of a single load */
    bool loaded, released, load_failed;
    uint64_t deadline;
    sv_engine_t *engine; /* --prefill gpu */
    void **ends;         /* per trace request: its prefill's end mark */
} ch_t;

static uint64_t now_ns(void)
{
    return kvr_now_ns();
}

static bool parse_trace_id(const kvr_wire_id_t *id, uint32_t pass, uint32_t *i)
{
    char buf[64], want[16];
    if (id->len >= sizeof(buf))
        return false;
    memcpy(buf, id->bytes, id->len);
    buf[id->len] = '\0';
    snprintf(want, sizeof(want), "t%u-", pass);
    size_t n = strlen(want);
    uint64_t v;
    if (strncmp(buf, want, n) != 0 ||
        !cli_parse_u64(buf + n, 0, SV_MAX_REQUESTS - 1, &v))
        return false;
    *i = (uint32_t)v;
    return true;
}

/* ---- the consumer's verification ---- */

static void ring_table(const ch_t *h, uint64_t start, uint64_t n, uint32_t *out)
{
    for (uint64_t k = 0; k < n; k++)
        out[k] = h->table[start + k];
}

static void verify(ch_t *h, uint32_t i)
{
    uint64_t N = h->t->tokens[i], nv = sv_vblocks(h->c, N);
    uint32_t *dst = malloc((nv + 1) * sizeof(*dst));
    kvr_error_t err = {0};
    kvr_status_t s = dst ? KVR_OK : KVR_ERR_NO_MEMORY;
    for (uint32_t r = 0;
         s == KVR_OK && h->role->cuda_device >= 0 && r < h->nreg; r++)
        s = kvr_agent_copy(h->agent, h->mirrors[r], h->bases[r],
                           kvr_region_bytes(&h->descs[r]));
    if (s == KVR_OK) {
        ring_table(h, h->t->dst_start[i], nv, dst);
        /* every request reads the one shared source: request 0's tokens */
        demo_load_t ld = {0, N, dst, (size_t)nv};
        s = demo_verify(&h->c->d, h->role->rank, h->descs, h->mirrors, h->nreg,
                        &ld, &err);
    }
    fprintf(h->out, "V %u %u %s\n", h->pass, i,
            s == KVR_OK ? "ok" : (err.msg[0] ? err.msg : "no memory"));
    free(dst);
    h->st[i] = RQ_FREE;
}

/* Takes request i's ring positions: a released earlier request there is
 * verified first; false while one still loads. */
static bool claim(ch_t *h, uint32_t i)
{
    uint64_t a = h->t->dst_start[i], nv = sv_vblocks(h->c, h->t->tokens[i]);
    for (uint64_t k = a; k < a + nv; k++) {
        int32_t o = h->owner[k];
        if (o < 0 || (uint32_t)o == i)
            continue;
        if (h->st[o] == RQ_RELEASED)
            verify(h, (uint32_t)o);
        else if (h->st[o] != RQ_FAILED && h->st[o] != RQ_FREE)
            return false;
    }
    for (uint64_t k = a; k < a + nv; k++)
        h->owner[k] = (int32_t)i;
    return true;
}

/* ---- events ---- */

static void on_trace_event(ch_t *h, const kvr_agent_event_t *e, uint32_t i)
{
    switch (e->kind) {
    case KVR_AGENT_LOADED:
        h->st[i] = RQ_LOADED;
        fprintf(h->out, "L %u %u %llu %llu\n", h->pass, i,
                (unsigned long long)now_ns(), (unsigned long long)e->bytes);
        break;
    case KVR_AGENT_LAYERS_LOADED:
        h->layer_events++;
        break;
    case KVR_AGENT_LOAD_FAILED:
    case KVR_AGENT_SEND_FAILED:
    case KVR_AGENT_SEND_EXPIRED:
        h->failures++;
        fprintf(h->out, "X %u %u %s: %s\n", h->pass, i,
                kvr_status_name(e->status), e->message);
        if (e->kind == KVR_AGENT_LOAD_FAILED)
            h->st[i] = RQ_FAILED;
        else
            h->outcomes++;
        break;
    case KVR_AGENT_RELEASED:
        h->st[i] = h->st[i] == RQ_LOADED ? RQ_RELEASED : RQ_FAILED;
        h->outcomes++;
        break;
    case KVR_AGENT_SENT:
        h->outcomes++;
        break;
    default:
        break;
    }
}

static void drain(ch_t *h)
{
    kvr_agent_event_t e;
    while (kvr_agent_poll(h->agent, &e)) {
        uint32_t i;
        if (parse_trace_id(&e.request, h->pass, &i) && i < h->t->n) {
            on_trace_event(h, &e, i);
            continue;
        }
        if (e.kind == KVR_AGENT_LOADED) {
            h->loaded = true;
            h->loaded_ns = now_ns();
            h->loaded_bytes = e.bytes;
        } else if (e.kind == KVR_AGENT_RELEASED) {
            h->released = true;
        } else if (e.kind == KVR_AGENT_LOAD_FAILED ||
                   e.kind == KVR_AGENT_SEND_FAILED) {
            h->load_failed = true;
            fprintf(h->out, "X - - %.*s %s: %s\n", (int)e.request.len,
                    e.request.bytes, kvr_status_name(e.status), e.message);
        }
    }
    fflush(h->out);
}

/* Sleeps until fd is readable or `until` (ns, absolute), then serves the
 * events queued; true when fd was readable. An agent without a progress
 * thread is driven meanwhile (a turn whenever its fd is readable). */
static bool sleep_on(ch_t *h, int fd, uint64_t until)
{
    bool drive = !h->c->decode_thread && h->role->consumer;
    struct pollfd p[2] = {{fd, POLLIN, 0},
                          {drive ? kvr_agent_fd(h->agent) : -1, POLLIN, 0}};
    uint64_t now = now_ns();
    uint64_t wait = until > now ? until - now : 0;
    struct timespec ts = {(time_t)(wait / 1000000000u),
                          (long)(wait % 1000000000u)};
    int n = ppoll(p, 2, &ts, NULL);
    if (n > 0 && (p[1].revents & POLLIN))
        kvr_agent_progress(h->agent, 0);
    drain(h);
    return n > 0 && (p[0].revents & (POLLIN | POLLHUP));
}

/* Sleeps until `until`, waking for events: on the agent's event fd, or,
 * driving an agent without a progress thread, running its loop meanwhile
 * (kvr_agent_wait), as an engine thread waiting for its loads would. */
static void wait_until(ch_t *h, uint64_t until)
{
    uint64_t now = now_ns();
    uint64_t us = until > now ? (until - now + 999u) / 1000u : 0;
    kvr_agent_wait(h->agent, us < UINT32_MAX ? (uint32_t)us : UINT32_MAX);
    drain(h);
}

/* Sleeps until a command comes (or `until`): between commands nothing
 * waits on an event (a producer's SENTs while the one-block requests
 * load), and a wake for each would take a core from the loads measured;
 * they are served after. */
static bool wait_ctl(ch_t *h, uint64_t until)
{
    return sleep_on(h, h->ctl, until);
}

/* The next command line from the supervisor (events served meanwhile);
 * false when the supervisor is gone or past the run's deadline. */
static bool next_cmd(ch_t *h, char *line, size_t cap)
{
    for (;;) {
        char *nl = memchr(h->ctl_buf, '\n', h->ctl_len);
        if (nl != NULL) {
            size_t n = (size_t)(nl - h->ctl_buf);
            snprintf(line, cap, "%.*s", (int)n, h->ctl_buf);
            memmove(h->ctl_buf, nl + 1, h->ctl_len - n - 1);
            h->ctl_len -= n + 1;
            return true;
        }
        if (now_ns() > h->deadline)
            return false;
        if (!wait_ctl(h, now_ns() + WAIT_SLICE_NS))
            continue;
        size_t room = sizeof(h->ctl_buf) - 1 - h->ctl_len;
        if (h->ctl_len >= sizeof(h->ctl_buf) - 1 || room == 0)
            return false; /* a command line longer than the buffer */
        ssize_t r = read(h->ctl, h->ctl_buf + h->ctl_len, room);
        if (r <= 0 && !(r < 0 && errno == EINTR))
            return false;
        h->ctl_len += r > 0 ? (size_t)r : 0;
    }
}

/* ---- set-up ---- */

static kvr_status_t add_region(ch_t *h, const kvr_region_desc_t *d,
                               kvr_error_t *err)
{
    void *base = NULL;
    if (h->nreg == MAX_REGIONS ||
        kvr_agent_alloc_region(h->agent, d, 0, &base) != KVR_OK)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "region: %s",
                             kvr_agent_last_error(h->agent));
    uint64_t len = kvr_region_bytes(d);
    void *host = h->role->cuda_device >= 0 ? calloc(1, len) : base;
    if (host == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no host mirror");
    memset(host, 0, len);
    h->descs[h->nreg] = *d;
    h->bases[h->nreg] = base;
    h->mirrors[h->nreg++] = host;
    return KVR_OK;
}

/* Request 0's synthetic KV (the content every request carries) into the
 * source blocks: the shared table's prefix once, or each request's own
 * stretch with distinct sources. */
static kvr_status_t fill_source(ch_t *h, const kvr_region_desc_t *d,
                                const uint32_t *ids, void *base,
                                kvr_error_t *err)
{
    const sv_trace_t *t = h->t;
    const kvr_layout_t *lay = &h->c->d.lay;
    uint64_t seed = h->c->d.seed;
    if (t->src_at == NULL)
        return kvr_synth_fill_source(lay, d, seed, h->table,
                                     kvr_num_src_blocks(lay, t->src_tokens),
                                     ids, t->src_tokens, base, err);
    kvr_status_t st = KVR_OK;
    for (uint32_t i = 0; st == KVR_OK && i < t->n; i++)
        if (demo_instance_of(&h->c->d, i) == h->role->who)
            st = kvr_synth_fill_source(
                lay, d, seed, h->table + t->src_at[i],
                kvr_num_src_blocks(lay, t->tokens[i]), ids, t->tokens[i],
                base, err);
    return st;
}

/* This stage's layers over the source table, filled with request 0's
 * synthetic KV up to the longest length anything reads. */
static kvr_status_t producer_regions(ch_t *h, kvr_error_t *err)
{
    const sv_cfg_t *c = h->c;
    uint32_t pool = sv_src_pool(h->t, c), n = demo_region(&c->d, 0, 0, 0, 0);
    uint64_t N = h->t->src_tokens;
    uint32_t *ids = malloc((N + 1) * sizeof(*ids));
    h->table = malloc((pool + 1) * sizeof(*h->table));
    if (ids == NULL || h->table == NULL) {
        free(ids);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    }
    sv_pages(c, false, pool, c->d.seed, h->table);
    for (uint64_t g = 0; g < N; g++)
        ids[g] = demo_token_id(&c->d, 0, g);
    kvr_status_t st = KVR_OK;
    for (uint32_t i = 0; st == KVR_OK && i < n; i++) {
        kvr_region_desc_t d;
        demo_region(&c->d, i, false, 0, &d);
        d.num_blocks = pool;
        if (d.layer < h->lo || d.layer >= h->hi)
            continue;
        st = add_region(h, &d, err);
        if (st == KVR_OK)
            st = fill_source(h, &d, ids, h->mirrors[h->nreg - 1], err);
        if (st == KVR_OK && h->role->cuda_device >= 0 &&
            kvr_agent_copy(h->agent, h->bases[h->nreg - 1],
                           h->mirrors[h->nreg - 1], kvr_region_bytes(&d)))
            st = kvr_error_set(err, KVR_ERR_CUDA, "%s",
                               kvr_agent_last_error(h->agent));
    }
    free(ids);
    return st;
}

static kvr_status_t consumer_regions(ch_t *h, kvr_error_t *err)
{
    const sv_cfg_t *c = h->c;
    uint32_t pool = (uint32_t)h->t->pool_vblocks;
    uint32_t n = demo_region(&c->d, 0, true, 0, NULL);
    h->table = malloc((pool + 1) * sizeof(*h->table));
    h->owner = malloc((pool + 1) * sizeof(*h->owner));
    if (h->table == NULL || h->owner == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    sv_pages(c, true, pool, c->d.seed ^ 0xd57u, h->table);
    for (uint32_t k = 0; k < pool; k++)
        h->owner[k] = -1;
    kvr_status_t st = KVR_OK;
    for (uint32_t i = 0; st == KVR_OK && i < n; i++) {
        kvr_region_desc_t d;
        demo_region(&c->d, i, true, 0, &d);
        d.num_blocks = pool;
        st = add_region(h, &d, err);
    }
    kvr_region_desc_t s = {.role = KVR_ROLE_STAGING,
                           .num_blocks = c->d.staging_slots + 1u,
                           .page_bytes = c->d.slot_bytes};
    void *base = NULL;
    if (st == KVR_OK && h->role->cuda_device < 0 &&
        kvr_agent_alloc_region(h->agent, &s, 0, &base) != KVR_OK)
        st = kvr_error_set(err, KVR_ERR_NO_MEMORY, "staging: %s",
                           kvr_agent_last_error(h->agent));
    return st;
}

static kvr_status_t create(ch_t *h, kvr_error_t *err)
{
    const sv_role_t *r = h->role;
    const sv_cfg_t *c = h->c;
    kvr_wire_topo_t topo = {0, 1, 0, 1, 0, 1, 0, 1, 0};
    if (r->consumer) {
        uint32_t W = c->d.lay.dcp_size;
        topo = (kvr_wire_topo_t){.pp_size = 1,
                                 .tp_rank = r->rank,
                                 .tp_size = W,
                                 .dp_size = 1,
                                 .layer_end = c->d.layers,
                                 .dcp_rank = r->rank};
    } else {
        demo_stage_layers(&c->d, r->rank, &h->lo, &h->hi);
        topo = (kvr_wire_topo_t){.pp_rank = r->rank,
                                 .pp_size = c->d.pp,
                                 .tp_rank = r->tp,
                                 .tp_size = c->d.producer_tp,
                                 .dp_size = 1,
                                 .layer_start = h->lo,
                                 .layer_end = h->hi};
    }
    demo_instance_id(r->consumer, r->who, h->instance, sizeof(h->instance));
    demo_cfg_t d = c->d;
    d.cuda_device = r->cuda_device;
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool keyed = false;
    kvr_status_t st = demo_load_key(&c->d, key, &keyed, err);
    if (st != KVR_OK)
        return st;
    kvr_agent_params_t p = demo_agent_params(
        &d, r->consumer ? KVR_AGENT_CONSUMER : KVR_AGENT_PRODUCER, &topo,
        keyed ? key : NULL, h->instance);
    bool head = !r->consumer && r->rank == 0 && r->tp == 0;
    p.listen = r->consumer ? NULL : "127.0.0.1:0";
    p.progress_thread = !r->consumer || c->decode_thread;
    p.bootstrap = r->consumer || head ? NULL : r->heads[r->who];
    st = demo_agent_create(&c->d, &p, &h->agent, err);
    if (st == KVR_OK)
        st = r->consumer ? consumer_regions(h, err) : producer_regions(h, err);
    if (st == KVR_OK && kvr_agent_start(h->agent) != KVR_OK)
        st = kvr_error_set(err, KVR_ERR_IO, "start: %s",
                           kvr_agent_last_error(h->agent));
    if (st == KVR_OK && !r->consumer && c->prefill_gpu) {
        h->ends = calloc(h->t->n + 1, sizeof(*h->ends));
        st = h->ends ? sv_engine_create(r->cuda_device, &h->engine, err)
                     : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    }
    return st;
}

/* ---- the producer ---- */

/* Trace request i (UINT32_MAX: the ceiling; warm-up and one-block
 * requests read request 0's blocks) with its source table (sv_src_table;
 * only destination ids must be distinct). */
static bool open_request(ch_t *h, const char *id, uint32_t i, uint64_t tokens,
                         bool all_ready)
{
    const kvr_layout_t *lay = &h->c->d.lay;
    uint64_t n = kvr_num_src_blocks(lay, tokens);
    uint32_t *src = malloc((n + 1) * sizeof(*src));
    if (src != NULL)
        sv_src_table(h->t, h->table, i, n, src);
    kvr_agent_send_t o = {id, strlen(id), src, (size_t)n, tokens, 0, 1};
    bool ok = src != NULL && kvr_agent_send_open(h->agent, &o) == KVR_OK &&
              (!all_ready ||
               kvr_agent_send_ready(h->agent, id, strlen(id), h->lo, h->hi,
                                    NULL) == KVR_OK);
    free(src);
    if (!ok)
        fprintf(h->out, "X - - %s open: %s\n", id,
                kvr_agent_last_error(h->agent));
    return ok;
}

/* Announces request i's layer groups whose simulated prefill is over;
 * returns when the next one is due (UINT64_MAX: all announced). */
static uint64_t announce(ch_t *h, uint32_t i, uint32_t *next_layer, uint64_t T0)
{
    const sv_cfg_t *c = h->c;
    char id[32];
    sv_request_id(id, sizeof(id), "t", h->pass, i);
    while (*next_layer < h->hi) {
        uint32_t end = *next_layer + c->layer_group;
        if (end > h->hi || h->t->layer_ns[i] == 0)
            end = h->hi; /* nothing to wait for: one call */
        uint64_t at = T0 + sv_layer_ready(c, h->t, i, h->role->rank, end - 1);
        uint64_t now = now_ns(); /* these layers' prefill ends now */
        if (now < at)
            return at;
        if (kvr_agent_send_ready(h->agent, id, strlen(id), *next_layer, end,
                                 NULL) != KVR_OK)
            fprintf(h->out, "X %u %u ready: %s\n", h->pass, i,
                    kvr_agent_last_error(h->agent));
        *next_layer = end;
        if (end == h->hi)
            fprintf(h->out, "P %u %u %llu\n", h->pass, i,
                    (unsigned long long)now);
    }
    return UINT64_MAX;
}

/* The prefill's end as the host learns it: looked for in a spin from
 * shortly before it is due until it is seen (a wait for a host function
 * would add its own latency to every gap measured, and a look given up
 * and taken again later stamps the end late: on a GPU shared in time
 * slices it passed while this thread slept). Nothing else of this stage
 * waits meanwhile: its next request's compute queues behind this one on
 * the engine's stream anyway. */
#define END_SPIN_AHEAD_NS 200000ull

static void engine_failed(ch_t *h, uint32_t i, const kvr_error_t *err)
{
    fprintf(h->out, "X %u %u prefill on the GPU: %s\n", h->pass, i,
            err->msg);
}

/* --prefill gpu, stage start: every layer group's compute queued on the
 * engine, and each handed over with the event recorded after it at once,
 * as an engine running ahead of its GPU does; then the end's mark. */
static void queue_prefill(ch_t *h, uint32_t i, const char *id)
{
    const sv_cfg_t *c = h->c;
    kvr_error_t err = {0};
    kvr_status_t st = KVR_OK;
    for (uint32_t l = h->lo; st == KVR_OK && l < h->hi; l += c->layer_group) {
        uint32_t end = l + c->layer_group < h->hi ? l + c->layer_group : h->hi;
        void *ev = NULL;
        st = sv_engine_step(h->engine, (end - l) * h->t->layer_ns[i], &ev, &err);
        if (st == KVR_OK &&
            kvr_agent_send_ready(h->agent, id, strlen(id), l, end, ev))
            st = kvr_error_set(&err, KVR_ERR_INVALID, "ready: %s",
                               kvr_agent_last_error(h->agent));
    }
    if (st == KVR_OK)
        st = sv_engine_mark(h->engine, h->role->cuda_device, &h->ends[i], &err);
    if (st != KVR_OK)
        engine_failed(h, i, &err);
}

/* --prefill gpu: request i's groups queued at its stage start, and its
 * end reported once seen; when to look again (UINT64_MAX: done). */
static uint64_t announce_gpu(ch_t *h, uint32_t i, uint32_t *next_layer,
                             uint64_t T0)
{
    const sv_trace_t *t = h->t;
    if (*next_layer < h->hi) {
        uint64_t start = T0 + t->stage_start[(size_t)i * h->c->d.pp +
                                             h->role->rank];
        if (now_ns() < start)
            return start;
        char id[32];
        sv_request_id(id, sizeof(id), "t", h->pass, i);
        *next_layer = h->hi;
        queue_prefill(h, i, id);
    }
    if (h->ends[i] == NULL)
        return UINT64_MAX;
    uint64_t due = T0 + sv_layer_ready(h->c, t, i, h->role->rank, h->hi - 1);
    if (now_ns() + END_SPIN_AHEAD_NS < due)
        return due - END_SPIN_AHEAD_NS;
    bool done = false;
    kvr_error_t err = {0};
    while (sv_engine_passed(h->ends[i], &done, &err) == KVR_OK && !done &&
           now_ns() < h->deadline)
        ;
    if (!done && err.msg[0] == '\0')
        kvr_error_set(&err, KVR_ERR_TIMEOUT, "not over by the run's deadline");
    if (done)
        fprintf(h->out, "P %u %u %llu\n", h->pass, i,
                (unsigned long long)now_ns());
    else
        engine_failed(h, i, &err);
    sv_engine_unmark(h->ends[i]);
    h->ends[i] = NULL;
    return UINT64_MAX;
}

static void producer_pass(ch_t *h, uint64_t T0)
{
    const sv_trace_t *t = h->t;
    uint32_t *next = calloc(t->n + 1, sizeof(*next)), mine = 0, first = 0;
    bool *opened = calloc(t->n + 1, sizeof(*opened));
    for (uint32_t i = 0; i < t->n; i++)
        mine += demo_instance_of(&h->c->d, i) == h->role->who;
    h->outcomes = 0;
    while (next && opened && h->outcomes < mine && now_ns() < h->deadline) {
        uint64_t due = now_ns() + WAIT_SLICE_NS;
        for (uint32_t i = first; i < t->n; i++) {
            if (demo_instance_of(&h->c->d, i) != h->role->who)
                continue;
            if (!opened[i] && now_ns() < T0 + t->arrival[i]) {
                due = T0 + t->arrival[i] < due ? T0 + t->arrival[i] : due;
                break; /* arrivals are in order */
            }
            if (!opened[i]) {
                char id[32];
                sv_request_id(id, sizeof(id), "t", h->pass, i);
                opened[i] = true;
                next[i] = h->lo;
                if (!open_request(h, id, i, t->tokens[i], false))
                    h->outcomes++;
            }
            uint64_t at = h->engine ? announce_gpu(h, i, &next[i], T0)
                                    : announce(h, i, &next[i], T0);
            due = at < due ? at : due;
            first += first == i && at == UINT64_MAX;
        }
        wait_until(h, due);
    }
    fprintf(h->out, "D %u %u\n", h->pass, h->failures);
    free(next);
    free(opened);
}

/* ---- the consumer ---- */

static bool load(ch_t *h, uint32_t instance, const char *id, uint64_t tokens,
                 uint64_t ring_at, bool stream)
{
    uint64_t nv = sv_vblocks(h->c, tokens);
    uint32_t *dst = malloc((nv + 1) * sizeof(*dst));
    char prod[KVR_AGENT_INSTANCE_MAX + 1];
    demo_instance_id(false, instance, prod, sizeof(prod));
    if (dst == NULL)
        return false;
    ring_table(h, ring_at, nv, dst);
    kvr_agent_recv_t r = {.producer_id = prod,
                          .producer_id_len = strlen(prod),
                          .producer_address = h->role->heads[instance],
                          .request_id = id,
                          .request_id_len = strlen(id),
                          .dst_blocks = dst,
                          .num_dst_blocks = (size_t)nv,
                          .num_tokens = tokens,
                          .stream = stream};
    bool ok = kvr_agent_recv(h->agent, &r) == KVR_OK;
    if (!ok)
        fprintf(h->out, "X - - %s recv: %s\n", id,
                kvr_agent_last_error(h->agent));
    free(dst);
    return ok;
}

/* One load alone (ceiling, small, warm-up): LOADED (its time) then
 * RELEASED, within the load deadline. */
static bool load_one(ch_t *h, uint32_t instance, const char *id,
                     uint64_t tokens, uint64_t ring_at)
{
    h->loaded = h->released = h->load_failed = false;
    if (!load(h, instance, id, tokens, ring_at, false))
        return false;
    uint64_t end = now_ns() + (uint64_t)h->c->d.deadline_ms * 2000000ull;
    while (!h->released && now_ns() < end)
        wait_until(h, end);
    return h->loaded && !h->load_failed;
}

static void consumer_pass(ch_t *h, uint64_t T0, bool stream)
{
    const sv_trace_t *t = h->t;
    uint32_t mine = 0, next = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        h->st[i] = RQ_NONE;
        mine += demo_group_of(&h->c->d, i) == h->role->who;
    }
    h->outcomes = 0;
    while (h->outcomes < mine && now_ns() < h->deadline) {
        uint64_t due = now_ns() + WAIT_SLICE_NS;
        for (; next < t->n; next++) {
            if (demo_group_of(&h->c->d, next) != h->role->who)
                continue;
            if (now_ns() < T0 + t->arrival[next]) {
                due = T0 + t->arrival[next];
                break;
            }
            if (!claim(h, next))
                break; /* its blocks are still loading: wait for events */
            char id[32];
            sv_request_id(id, sizeof(id), "t", h->pass, next);
            h->st[next] = RQ_LOADING;
            if (!load(h, demo_instance_of(&h->c->d, next), id, t->tokens[next],
                      t->dst_start[next], stream)) {
                h->st[next] = RQ_FAILED;
                h->outcomes++;
            }
        }
        wait_until(h, due);
    }
    for (uint32_t i = 0; i < t->n; i++)
        if (h->st[i] == RQ_RELEASED)
            verify(h, i);
    for (uint64_t k = 0; k < t->pool_vblocks; k++)
        h->owner[k] = -1;
    fprintf(h->out, "D %u %u %u\n", h->pass, h->failures, h->layer_events);
}

static void consumer_ceiling(ch_t *h, uint32_t rep)
{
    const sv_cfg_t *c = h->c;
    uint32_t P = c->d.instances, G = c->d.groups, share = (P + G - 1) / G;
    for (uint32_t p = 0; p < P; p++) {
        if (p % G != h->role->who)
            continue;
        char id[32];
        sv_request_id(id, sizeof(id), "ceil", p, rep);
        uint64_t at = (p / G) * (h->t->pool_vblocks / share);
        uint64_t start = now_ns();
        bool ok = load_one(h, p, id, h->t->ceiling_tokens, at);
        fprintf(h->out, "C %u %llu %llu %d %llu\n", p,
                (unsigned long long)start, (unsigned long long)h->loaded_ns, ok,
                (unsigned long long)h->loaded_bytes);
    }
    fprintf(h->out, "D ceiling\n");
}

/* Round trips of one-block requests from instance 0, reported together
 * at the end: a line per round trip would wake the supervisor between
 * them, on the cores the next one needs. Paced (T0 != 0): request k is
 * asked by every rank at T0 + k * SV_SMALL_PACE_NS, the round trip of a
 * request that finds the links idle; else each rank asks for the next as
 * soon as its last is released (the ranks drift apart, and about four
 * loads of two requests are in flight at any time). */
static void consumer_small(ch_t *h, const char *kind, uint64_t T0)
{
    uint64_t took[SV_SMALL_REPS];
    bool ok[SV_SMALL_REPS];
    uint32_t n = h->role->who == 0 ? SV_SMALL_REPS : 0;
    for (uint32_t k = 0; k < n; k++) {
        char id[32];
        sv_request_id(id, sizeof(id), kind, k, 0);
        uint64_t at = T0 + k * SV_SMALL_PACE_NS;
        while (T0 != 0 && now_ns() < at)
            wait_until(h, at);
        uint64_t start = now_ns();
        ok[k] = load_one(h, 0, id, h->c->d.lay.block_size, 0);
        took[k] = h->loaded_ns - start;
    }
    for (uint32_t k = 0; k < n; k++)
        fprintf(h->out, "M %s %llu %d\n", kind, (unsigned long long)took[k],
                ok[k]);
    fprintf(h->out, "D small\n");
}

static void consumer_warm(ch_t *h)
{
    bool ok = true;
    for (uint32_t p = 0; p < h->c->d.instances; p++) {
        char id[32];
        sv_request_id(id, sizeof(id), "warm", h->role->who, 0);
        ok &= load_one(h, p, id, h->c->d.lay.block_size, 0);
    }
    fprintf(h->out, "%s\n", ok ? "warmed" : "warm-failed");
}

/* ---- commands ---- */

static void producer_open_all(ch_t *h, const char *kind, uint32_t n,
                              uint64_t tokens)
{
    for (uint32_t k = 0; k < n; k++) {
        char id[32];
        sv_request_id(id, sizeof(id), kind, k, 0);
        open_request(h, id, 0, tokens, true);
    }
    fprintf(h->out, "opened\n");
}

static void command(ch_t *h, const char *line)
{
    unsigned long long T0 = 0;
    unsigned pass = 0;
    char kind[16];
    bool prod = !h->role->consumer;
    uint64_t bs = h->c->d.lay.block_size;
    if (sscanf(line, "go %llu %u", &T0, &pass) == 2) {
        h->pass = pass;
        h->failures = h->layer_events = 0;
        if (prod)
            producer_pass(h, T0);
        else
            consumer_pass(h, T0, h->c->stream[pass % h->c->passes]);
    } else if (strcmp(line, "warm") == 0) {
        if (prod)
            producer_open_all(h, "warm", h->c->d.groups, bs);
        else
            consumer_warm(h);
    } else if (sscanf(line, "ceiling %u", &pass) == 1) {
        char id[32];
        if (prod) { /* one request, named after this instance */
            sv_request_id(id, sizeof(id), "ceil", h->role->who, pass);
            open_request(h, id, UINT32_MAX, h->t->ceiling_tokens, true);
            fprintf(h->out, "opened\n");
        } else {
            consumer_ceiling(h, pass);
        }
    } else if (sscanf(line, "small %15s %llu", kind, &T0) == 2) {
        if (prod)
            producer_open_all(h, kind, h->role->who == 0 ? SV_SMALL_REPS : 0,
                              bs);
        else
            consumer_small(h, kind, T0);
    }
    fflush(h->out);
}

int sv_child_run(const sv_cfg_t *c, const sv_trace_t *t, const sv_role_t *role,
                 int ctl, FILE *out)
{
    ch_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return CLI_EXIT_FAILED;
    *h = (ch_t){.c = c, .t = t, .role = role, .out = out, .ctl = ctl};
    h->deadline = now_ns() + (uint64_t)c->d.run_timeout_ms * 1000000ull;
    h->st = calloc(t->n + 1, 1);
    kvr_error_t err = {0};
    kvr_status_t st = h->st ? create(h, &err) : KVR_ERR_NO_MEMORY;
    int rc = CLI_EXIT_FAILED;
    if (st == KVR_OK) {
        fprintf(out, "ready %s\n", kvr_agent_address(h->agent));
        fflush(out);
        char line[512];
        while (next_cmd(h, line, sizeof(line)) && strcmp(line, "quit") != 0)
            command(h, line);
        rc = strcmp(line, "quit") == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILED;
    } else {
        fprintf(stderr, "kvrelay bench serving: %s %u/%u: %s\n",
                role->consumer ? "decode group" : "prefill instance", role->who,
                role->rank, err.msg);
    }
    kvr_agent_destroy(h->agent);
    for (uint32_t i = 0; h->ends != NULL && i < t->n; i++)
        sv_engine_unmark(h->ends[i]);
    sv_engine_destroy(h->engine);
    free(h->ends);
    for (uint32_t r = 0; role->cuda_device >= 0 && r < h->nreg; r++)
        free(h->mirrors[r]);
    free(h->table);
    free(h->owner);
    free(h->st);
    free(h);
    return rc;
}
