/* `kvrelay serve`: one decode rank (a consumer agent) of decode group G;
 * rank 0 also hosts the group's router (router.h). Ranks load what the
 * router assigns (kvr_agent_recv naming the prefill instance and its head's
 * address), report RELEASED back to it, and verify every loaded request
 * against the synthetic source; one line per event on stdout for `kvrelay
 * demo` (README: serve's event lines). */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base_internal.h"
#include "commands.h"
#include "demo.h"
#include "demo_store.h"
#include "router.h"

static const char serve_usage[] =
    "usage: kvrelay serve --rank R [--group G] [--listen HOST:PORT]\n"
    "                     [--router HOST:PORT] [--expect REQUESTS] [options]\n"
    "One DCP decode rank of decode group G. Rank 0 hosts the group's router\n"
    "(block pool, prefix cache); other ranks join it with --router. Prints\n"
    "'listening PORT' first.\n";

typedef struct {
    uint32_t rank, group;
    bool have_rank;
    char listen[300];
    char router[300];
    uint32_t expect; /* 0: the group's share of --requests */
} serve_opts_t;

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

bool cli_parse_hostport(const char *text, char *host, size_t cap,
                        uint16_t *port)
{
    const char *colon = text ? strrchr(text, ':') : NULL;
    uint64_t p;
    if (colon == NULL || (size_t)(colon - text) >= cap || colon == text ||
        !cli_parse_u64(colon + 1, 0, 65535, &p))
        return false;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    *port = (uint16_t)p;
    return true;
}

static int serve_option(void *ctx, const char *name, const char *value)
{
    serve_opts_t *o = ctx;
    uint64_t v;
    if (strcmp(name, "rank") == 0 || strcmp(name, "expect") == 0 ||
        strcmp(name, "group") == 0) {
        if (!cli_parse_u64(value, 0, name[0] == 'g' ? 63 : 1u << 20, &v)) {
            cli_usage_error("serve", "--%s: '%s' is not a number", name, value);
            return -1;
        }
        if (name[0] == 'r')
            o->rank = (uint32_t)v, o->have_rank = true;
        else if (name[0] == 'g')
            o->group = (uint32_t)v;
        else
            o->expect = (uint32_t)v;
        return 1;
    }
    bool listen = strcmp(name, "listen") == 0;
    if (!listen && strcmp(name, "router") != 0)
        return 0;
    char host[256];
    uint16_t port;
    if (!cli_parse_hostport(value, host, sizeof(host), &port)) {
        cli_usage_error("serve", "--%s: '%s' is not HOST:PORT", name, value);
        return -1;
    }
    snprintf(listen ? o->listen : o->router, sizeof(o->listen), "%s", value);
    return 1;
}

/* One request this rank was assigned. */
typedef struct {
    bool used, loading, abort, abort_sent, released, pulling;
    uint32_t req;
    char id[RT_ID_MAX + 1];
    char producer[KVR_AGENT_INSTANCE_MAX + 1];
    char address[256];
    uint64_t tokens, computed, started_ns;
    uint32_t *dst;
    size_t ndst, have;
    bool loaded, verify, ended; /* ended: its LOADED or failure came */
    kvr_status_t status;
} lreq_t;

typedef struct {
    demo_cfg_t cfg;
    serve_opts_t o;
    char instance[KVR_AGENT_INSTANCE_MAX + 1];
    kvr_agent_t *agent;
    router_t *router;      /* rank 0 */
    char members[64][256]; /* rank 0: each rank's listener */
    kvr_region_desc_t descs[DEMO_MAX_LAYERS * 2];
    void *bases[DEMO_MAX_LAYERS * 2];
    void *mirrors[DEMO_MAX_LAYERS * 2]; /* host view (device: a copy) */
    uint32_t num_regions;
    uint32_t expect, loaded, verified, failed, aborted, released;
    uint32_t refused; /* known peers refused at handshake */
    char first_refusal[KVR_ERROR_MSG_MAX];
    char stop_why[KVR_ERROR_MSG_MAX + 64]; /* the run cannot complete: why */
    uint64_t bytes;
    json_t *dumped; /* rank 0 with --dump: the requests it loaded */
    lreq_t reqs[DEMO_MAX_REQUESTS];
    kvr_store_t *store; /* --load-from */
    kvr_store_conn_t *loader;
    bool die_pending; /* --fault die-assign fired: exit once loads ended */
} serve_t;

static kvr_status_t setup_regions(serve_t *s, kvr_error_t *err)
{
    s->num_regions = demo_region(&s->cfg, 0, true, s->o.group, NULL);
    for (uint32_t i = 0; i < s->num_regions; i++) {
        demo_region(&s->cfg, i, true, s->o.group, &s->descs[i]);
        uint64_t len = kvr_region_bytes(&s->descs[i]);
        if (kvr_agent_alloc_region(s->agent, &s->descs[i], 0, &s->bases[i]) !=
            KVR_OK)
            return kvr_error_set(err, KVR_ERR_NO_MEMORY, "region %u: %s", i,
                                 kvr_agent_last_error(s->agent));
        s->mirrors[i] = s->cfg.cuda_device >= 0 ? calloc(1, len) : s->bases[i];
        if (s->mirrors[i] == NULL)
            return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no host mirror");
        memset(s->mirrors[i], 0, len);
        if (s->cfg.cuda_device >= 0 &&
            kvr_agent_copy(s->agent, s->bases[i], s->mirrors[i], len) != KVR_OK)
            return kvr_error_set(err, KVR_ERR_CUDA, "%s",
                                 kvr_agent_last_error(s->agent));
    }
    kvr_region_desc_t st = {.role = KVR_ROLE_STAGING,
                            .layer = 0,
                            .num_blocks = s->cfg.staging_slots + 1u,
                            .page_bytes = s->cfg.slot_bytes};
    void *base = NULL;
    kvr_status_t rc = kvr_agent_alloc_region(s->agent, &st, 0, &base);
    /* CUDA staging needs a UCX that moves CUDA memory; without one, CUDA
     * KV still moves gpu-direct on one host (not when tcp is forced) */
    if (rc == KVR_ERR_UNSUPPORTED && s->cfg.cuda_device >= 0 &&
        s->cfg.tl != KVR_AGENT_TL_TCP && s->cfg.exec != KVR_AGENT_EXEC_STAGED)
        return KVR_OK;
    if (rc != KVR_OK)
        return kvr_error_set(err, rc, "staging: %s",
                             kvr_agent_last_error(s->agent));
    return KVR_OK;
}

static kvr_status_t create_agent(serve_t *s, const uint8_t *key,
                                 kvr_error_t *err)
{
    kvr_wire_topo_t topo = {.pp_rank = 0,
                            .pp_size = 1,
                            .tp_rank = s->o.rank,
                            .tp_size = demo_ranks(&s->cfg),
                            .dp_rank = 0,
                            .dp_size = 1,
                            .layer_start = 0,
                            .layer_end = s->cfg.layers,
                            .dcp_rank = s->o.rank % s->cfg.lay.dcp_size};
    demo_instance_id(true, s->o.group, s->instance, sizeof(s->instance));
    kvr_agent_params_t p = demo_agent_params(&s->cfg, KVR_AGENT_CONSUMER, &topo,
                                             key, s->instance);
    p.listen = s->o.listen;
    kvr_status_t st = demo_arm_fault(&s->cfg, s->o.rank, err);
    return st == KVR_OK ? demo_agent_create(&s->cfg, &p, &s->agent, err) : st;
}

/* Device pages are checked through a fresh host copy. */
static void refresh_mirrors(serve_t *s)
{
    for (uint32_t i = 0; s->cfg.cuda_device >= 0 && i < s->num_regions; i++)
        kvr_agent_copy(s->agent, s->mirrors[i], s->bases[i],
                       kvr_region_bytes(&s->descs[i]));
}

static void free_mirrors(serve_t *s)
{
    for (uint32_t i = 0; s->cfg.cuda_device >= 0 && i < s->num_regions; i++)
        free(s->mirrors[i]);
}

/* Rank 0 records each loaded request's destination table for the dump. */
static void note_dump(serve_t *s, const lreq_t *q)
{
    if (s->cfg.dump_dir == NULL || s->o.rank != 0)
        return;
    if (s->dumped == NULL)
        s->dumped = json_array();
    json_t *dst = json_array();
    for (size_t i = 0; i < q->ndst; i++)
        json_array_append_new(dst, json_integer(q->dst[i]));
    json_array_append_new(
        s->dumped, json_pack("{s:s,s:I,s:I,s:o}", "id", q->id, "num_tokens",
                             (json_int_t)q->tokens, "num_computed_blocks",
                             (json_int_t)q->computed, "dst_blocks", dst));
}

static void write_dump(serve_t *s)
{
    refresh_mirrors(s);
    for (uint32_t i = 0; i < s->num_regions; i++) {
        char name[128];
        demo_image_name(name, sizeof(name), (int)s->o.rank, &s->descs[i]);
        demo_write_file(s->cfg.dump_dir, name, s->mirrors[i],
                        kvr_region_bytes(&s->descs[i]));
    }
    if (s->dumped == NULL)
        return;
    char *text = json_dumps(s->dumped, JSON_COMPACT);
    if (text != NULL)
        demo_write_file(s->cfg.dump_dir, "requests-r0.json", text,
                        strlen(text));
    free(text);
    json_decref(s->dumped);
}

/* Verification waits until the run's last request is in (or the run
 * ends), so that checking gigabytes on the CPU never stalls the agent
 * while transfers are in flight, and the demo's rate is the transfer's.
 * Blocks of a loaded request are not reused within a demo (each group's
 * pool holds all its requests), so nothing is overwritten before it is
 * checked. */
static void verify_all(serve_t *s)
{
    kvr_error_t err = {0};
    refresh_mirrors(s);
    for (uint32_t i = 0; i < DEMO_MAX_REQUESTS; i++) {
        lreq_t *q = &s->reqs[i];
        if (!q->used || !q->verify)
            continue;
        demo_load_t ld = {q->req, q->tokens, q->dst, q->ndst};
        if (demo_verify(&s->cfg, demo_plan_rank(&s->cfg, true, s->o.rank),
                        s->descs, s->mirrors,
                        s->num_regions, &ld, &err) == KVR_OK) {
            s->verified++;
            printf("verified %s\n", q->id);
        } else {
            printf("verify-failed %s %s\n", q->id, err.msg);
        }
    }
    fflush(stdout);
}

static lreq_t *find_req(serve_t *s, const char *id)
{
    uint32_t r;
    if (!demo_parse_request_id(id, strlen(id), &r) || r >= s->cfg.requests)
        return NULL;
    return &s->reqs[r];
}

/* ---- talking to the router ---- */

static void handle_rank_msg(serve_t *s, const rt_msg_t *m);

static void to_router(serve_t *s, const rt_msg_t *m);

static void send_payload(serve_t *s, const char *peer, const char *address,
                         const rt_msg_t *m)
{
    static uint8_t buf[KVR_AGENT_NOTIFY_MAX];
    size_t len = rt_encode(m, buf);
    if (len == 0 || kvr_agent_notify(s->agent, peer, strlen(peer), address, buf,
                                     len) != KVR_OK)
        fprintf(stderr,
                "kvrelay serve: group %u rank %u: cannot notify %s: "
                "%s\n",
                s->o.group, s->o.rank, address,
                len ? kvr_agent_last_error(s->agent) : "message too large");
}

static void rt_to_rank(void *ctx, uint32_t rank, const rt_msg_t *m)
{
    serve_t *s = ctx;
    if (rank == 0)
        handle_rank_msg(s, m); /* the router's own rank */
    else
        send_payload(s, s->instance, s->members[rank], m);
}

static void rt_to_producer(void *ctx, const char *producer, const char *address,
                           const rt_msg_t *m)
{
    send_payload(ctx, producer, address, m);
}

static bool rt_aborts(void *ctx, const char *request)
{
    serve_t *s = ctx;
    uint32_t r;
    return demo_parse_request_id(request, strlen(request), &r) &&
           demo_aborts(&s->cfg, r);
}

static void to_router(serve_t *s, const rt_msg_t *m)
{
    if (s->router != NULL)
        router_released(s->router, 0, m);
    else
        send_payload(s, s->instance, s->o.router, m);
}

/* --load-from: the longest cached prefix present in every stage's part
 * (checksums checked before a byte lands), at most the prompt less one
 * token, so that the pull always has a rest; only the rest is pulled. A
 * prefix the router already holds (computed > 0) is not loaded again. */
static void load_cached(serve_t *s, lreq_t *q)
{
    size_t cap = demo_store_max_chunks(&s->cfg), n = 0;
    kvr_block_hash_t *chains = calloc(cap, sizeof *chains);
    kvr_error_t err = {0};
    kvr_status_t st = chains ? demo_store_chains(&s->cfg, q->req, chains, cap,
                                                 &n, &err)
                             : KVR_ERR_NO_MEMORY;
    kvr_store_load_req_t r = {.request_id = q->id,
                              .request_id_len = strlen(q->id),
                              .chains = chains,
                              .num_chains = n,
                              .dst_blocks = q->dst,
                              .num_dst_blocks = q->ndst,
                              .rank = s->o.rank,
                              .max_tokens = q->tokens - 1};
    uint64_t tokens = 0, bytes = 0;
    if (st == KVR_OK)
        st = kvr_store_conn_load(s->loader, &r, &tokens, &bytes, &err);
    free(chains);
    if (st != KVR_OK) { /* a failed load is a miss: the transfer moves all */
        printf("store-miss %s %s %s\n", q->id, kvr_status_name(st), err.msg);
        return;
    }
    q->computed = tokens / kvr_virtual_block(&s->cfg.lay);
    uint64_t landed = demo_rank_bytes(&s->cfg, s->o.rank, q->req, q->dst,
                                      q->ndst, tokens);
    printf("stored %s %llu %llu %llu\n", q->id, (unsigned long long)landed,
           (unsigned long long)tokens, (unsigned long long)bytes);
}

/* The last part of an ASSIGN came: load it. */
static void start_load(serve_t *s, lreq_t *q)
{
    /* a decode rank killed (docs/failpoints.md): at this ASSIGN, once the
     * loads it started before have ended, so that the fault hits this
     * request alone however the requests overlap on a loaded machine */
    if (kvr__failpoint(KVR__FP_DIE_ASSIGN, q->id, strlen(q->id))) {
        s->die_pending = true;
        return;
    }
    if (s->loader != NULL && q->computed == 0)
        load_cached(s, q);
    kvr_agent_recv_t r = {q->producer,   strlen(q->producer),
                          q->address,    q->id,
                          strlen(q->id), q->dst,
                          q->ndst,       q->tokens,
                          q->computed,   0,
                          false};
    q->started_ns = kvr_now_ns();
    q->loading = true;
    if (kvr_agent_recv(s->agent, &r) == KVR_OK)
        return;
    /* refused at the call: no event will come, so it ends here */
    printf("failed %s %s %s\n", q->id, "ERR_INVALID",
           kvr_agent_last_error(s->agent));
    s->failed++;
    s->released++;
    q->released = q->ended = true;
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m != NULL) {
        m->type = RT_RELEASED;
        snprintf(m->request, sizeof(m->request), "%s", q->id);
        m->status = KVR_ERR_INVALID;
        to_router(s, m);
        free(m);
    }
}

static void on_assign(serve_t *s, const rt_msg_t *m)
{
    lreq_t *q = find_req(s, m->request);
    if (q == NULL || q->loading || (q->used && q->ndst != m->total)) {
        printf("bad-assign %s\n", m->request);
        return;
    }
    if (!q->used) {
        memset(q, 0, sizeof(*q));
        q->used = true;
        demo_parse_request_id(m->request, strlen(m->request), &q->req);
        snprintf(q->id, sizeof(q->id), "%s", m->request);
        snprintf(q->producer, sizeof(q->producer), "%s", m->producer);
        snprintf(q->address, sizeof(q->address), "%s", m->address);
        q->tokens = m->tokens;
        q->computed = m->computed;
        q->abort = m->abort;
        q->ndst = m->total;
        q->dst = calloc(q->ndst + 1, sizeof(*q->dst));
        if (q->dst == NULL) {
            q->used = false;
            return;
        }
    }
    memcpy(q->dst + m->offset, m->ids, m->count * sizeof(*m->ids));
    q->have += m->count;
    if (q->have >= q->ndst)
        start_load(s, q);
}

/* The router could not place a request of this group: it ended here. */
static void on_refuse(serve_t *s, const rt_msg_t *m)
{
    lreq_t *q = find_req(s, m->request);
    if (q == NULL || q->used)
        return;
    memset(q, 0, sizeof(*q));
    q->used = q->released = true;
    snprintf(q->id, sizeof(q->id), "%s", m->request);
    s->failed++;
    s->released++;
    printf("failed %s %s %s\n", q->id, kvr_status_name((kvr_status_t)m->status),
           m->text);
}

static void handle_rank_msg(serve_t *s, const rt_msg_t *m)
{
    if (m->type == RT_ASSIGN) {
        on_assign(s, m);
    } else if (m->type == RT_REFUSE) {
        on_refuse(s, m);
    } else if (m->type == RT_STOP) {
        snprintf(s->stop_why, sizeof(s->stop_why), "%s", m->text);
    }
}

static void on_notify(serve_t *s, const kvr_agent_notify_t *n)
{
    rt_msg_t *m = malloc(sizeof(*m));
    if (m == NULL)
        return;
    bool ours = n->sender.len == strlen(s->instance) &&
                memcmp(n->sender.bytes, s->instance, n->sender.len) == 0;
    if (!rt_decode(n->payload, n->len, m)) {
        printf("bad-notify %.*s\n", (int)n->sender.len, n->sender.bytes);
    } else if (s->router != NULL && m->type == RT_OFFER) {
        snprintf(m->address, sizeof(m->address), "%s", n->sender_address);
        snprintf(m->producer, sizeof(m->producer), "%.*s", (int)n->sender.len,
                 n->sender.bytes);
        router_offer(s->router, m);
    } else if (s->router != NULL && ours && m->type == RT_JOIN &&
               n->sender_topo.tp_rank < 64) {
        snprintf(s->members[n->sender_topo.tp_rank], sizeof(s->members[0]),
                 "%s", n->sender_address);
        router_join(s->router, n->sender_topo.tp_rank);
        printf("joined %u %s\n", n->sender_topo.tp_rank, n->sender_address);
    } else if (s->router != NULL && ours && m->type == RT_RELEASED) {
        router_released(s->router, n->sender_topo.tp_rank, m);
    } else if (s->router == NULL && ours) {
        handle_rank_msg(s, m);
    }
    free(m);
    fflush(stdout);
}

/* ---- agent events ---- */

/* The refusal is logged here too, not only by the side that dialled. */
static void note_refusal(serve_t *s, const kvr_agent_event_t *e)
{
    bool known = e->bytes != 0;
    char peer[KVR_AGENT_INSTANCE_MAX + 1] = "?";
    if (e->peer.len > 0)
        snprintf(peer, sizeof(peer), "%.*s", (int)e->peer.len, e->peer.bytes);
    printf("refused %s %s %s %s\n", peer, known ? "known" : "unknown",
           kvr_status_name(e->status), e->message);
    fprintf(stderr,
            "kvrelay serve: group %u rank %u: handshake with %s peer "
            "%s failed: %s\n",
            s->o.group, s->o.rank, known ? "a" : "an unauthenticated", peer,
            e->message);
    /* only a peer we talk to at all counts: one without the key must not
     * be able to stop a keyed serve */
    if (known && s->refused++ == 0)
        snprintf(s->first_refusal, sizeof(s->first_refusal), "%s", e->message);
}

static void on_outcome(serve_t *s, lreq_t *q, const kvr_agent_event_t *e)
{
    q->status = e->status;
    q->ended = true;
    if (e->kind == KVR_AGENT_LOADED) {
        q->loaded = q->verify = true;
        s->loaded++;
        s->bytes += e->bytes;
        printf("loaded %s %llu %llu %llu %llu\n", q->id,
               (unsigned long long)e->bytes, (unsigned long long)q->computed,
               (unsigned long long)kvr_now_ns(),
               (unsigned long long)q->started_ns);
        note_dump(s, q);
    } else if (q->abort && e->status == KVR_ERR_CANCELED) {
        s->aborted++;
        printf("aborted %s\n", q->id);
    } else {
        s->failed++;
        printf("failed %s %s %s\n", q->id, kvr_status_name(e->status),
               e->message);
    }
}

static void on_event(serve_t *s, const kvr_agent_event_t *e)
{
    char id[RT_ID_MAX + 1];
    snprintf(id, sizeof(id), "%.*s", (int)e->request.len, e->request.bytes);
    lreq_t *q = find_req(s, id);
    if (e->kind == KVR_AGENT_PEER_REFUSED) {
        note_refusal(s, e);
    } else if (e->kind == KVR_AGENT_NOTIFY_FAILED) {
        printf("notify-failed %.*s %s %s\n", (int)e->peer.len, e->peer.bytes,
               kvr_status_name(e->status), e->message);
        if (s->router == NULL)
            snprintf(s->stop_why, sizeof(s->stop_why),
                     "the router is "
                     "unreachable: %s",
                     e->message);
    } else if (q != NULL && q->used &&
               (e->kind == KVR_AGENT_LOADED ||
                e->kind == KVR_AGENT_LOAD_FAILED)) {
        on_outcome(s, q, e);
    } else if (q != NULL && q->used && e->kind == KVR_AGENT_RELEASED) {
        q->released = true;
        s->released++;
        rt_msg_t *m = calloc(1, sizeof(*m));
        if (m != NULL) {
            m->type = RT_RELEASED;
            snprintf(m->request, sizeof(m->request), "%s", q->id);
            m->status = (uint32_t)q->status;
            to_router(s, m);
            free(m);
        }
    }
    fflush(stdout);
}

/* Loads being set up are watched: the transfer time counts from when the
 * pull went out (PULLING), and --abort's requests are aborted then, while
 * their bytes move (an abort before the pull would tell the producer
 * nothing); one that ended first is not aborted. True while some load is
 * not pulling yet, so the loop looks again soon. */
static bool watch_loads(serve_t *s)
{
    bool pending = false;
    for (uint32_t i = 0; i < DEMO_MAX_REQUESTS; i++) {
        lreq_t *q = &s->reqs[i];
        bool want_abort = q->abort && !q->abort_sent;
        if (!q->used || !q->loading || q->released ||
            (q->pulling && !want_abort))
            continue;
        kvr_agent_req_status_t st;
        if (kvr_agent_status(s->agent, q->producer, strlen(q->producer), q->id,
                             strlen(q->id), &st) != KVR_OK ||
            st.recv >= KVR_RECV_QUARANTINE) {
            q->abort_sent = q->pulling = true; /* ended (or ending) by itself */
            continue;
        }
        if (st.recv == KVR_RECV_PULLING && !q->pulling) {
            q->pulling = true;
            q->started_ns = kvr_now_ns();
        }
        pending |= !q->pulling;
        if (want_abort && q->pulling &&
            kvr_agent_recv_abort(s->agent, q->producer, strlen(q->producer),
                                 q->id, strlen(q->id)) == KVR_OK)
            q->abort_sent = true;
    }
    return pending;
}

/* ---- the loop ---- */

static bool finished(const serve_t *s)
{
    if (s->released < s->expect)
        return false;
    return s->router == NULL || router_done(s->router) >= s->expect;
}

/* A refusal of a peer we talk to means this run cannot complete: rank 0
 * tells its group, every rank stops. */
static bool refused_out(serve_t *s)
{
    if (s->refused == 0 && s->stop_why[0] == '\0')
        return false;
    if (s->refused > 0 && s->stop_why[0] == '\0')
        snprintf(s->stop_why, sizeof(s->stop_why),
                 "%u peer(s) refused at "
                 "handshake (first: %s)",
                 s->refused, s->first_refusal);
    return true;
}

static void tell_group_stop(serve_t *s)
{
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return;
    m->type = RT_STOP;
    snprintf(m->text, sizeof(m->text), "rank 0: %.200s", s->stop_why);
    for (uint32_t r = 1; r < demo_ranks(&s->cfg); r++)
        if (s->members[r][0] != '\0')
            send_payload(s, s->instance, s->members[r], m);
    free(m);
}

/* --fault die-assign: the exit it put off, once no load is in flight. */
static void die_when_idle(const serve_t *s)
{
    if (!s->die_pending)
        return;
    for (uint32_t i = 0; i < DEMO_MAX_REQUESTS; i++)
        if (s->reqs[i].used && s->reqs[i].loading && !s->reqs[i].ended)
            return;
    kvr__failpoint_exit();
}

static void pump(serve_t *s, int ms)
{
    struct pollfd p = {.fd = kvr_agent_event_fd(s->agent), .events = POLLIN};
    poll(&p, 1, ms);
    kvr_agent_notify_t *n = malloc(sizeof(*n));
    while (n != NULL && kvr_agent_poll_notify(s->agent, n))
        on_notify(s, n);
    free(n);
    kvr_agent_event_t e;
    while (kvr_agent_poll(s->agent, &e))
        on_event(s, &e);
    if (s->router != NULL)
        router_tick(s->router);
    die_when_idle(s);
}

static void join_router(serve_t *s)
{
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m != NULL) {
        m->type = RT_JOIN;
        send_payload(s, s->instance, s->o.router, m);
        free(m);
    }
}

static int serve_loop(serve_t *s)
{
    uint64_t end = kvr_deadline_ns(s->cfg.run_timeout_ms);
    if (s->router == NULL)
        join_router(s);
    bool stopped = false;
    while (!stop_requested && !finished(s) && kvr_now_ns() < end &&
           !(stopped = refused_out(s)))
        pump(s, watch_loads(s) ? 1 : 20);
    if (stopped && s->router != NULL)
        tell_group_stop(s);
    for (int i = 0; i < 5; i++) /* the last RELEASEs and notifications out */
        pump(s, 5);
    verify_all(s);
    if (s->cfg.dump_dir != NULL)
        write_dump(s);
    printf("summary group=%u rank=%u loaded=%u verified=%u failed=%u "
           "aborted=%u bytes=%llu%s\n",
           s->o.group, s->o.rank, s->loaded, s->verified, s->failed, s->aborted,
           (unsigned long long)s->bytes, finished(s) ? "" : " (incomplete)");
    if (s->router != NULL)
        printf("pool group=%u blocks_in_use=%u\n", s->o.group,
               router_blocks_in_use(s->router));
    fflush(stdout);
    if (stopped)
        fprintf(stderr,
                "kvrelay serve: group %u rank %u: the run cannot "
                "complete: %s\n",
                s->o.group, s->o.rank, s->stop_why);
    bool ok = finished(s) && s->failed == 0 && s->verified == s->loaded &&
              s->loaded + s->aborted == s->expect &&
              (s->router == NULL || (router_blocks_in_use(s->router) == 0 &&
                                     router_failed(s->router) == 0));
    return ok ? CLI_EXIT_OK : CLI_EXIT_FAILED;
}

/* Past a rank's deadline plus grace, its RELEASED had time to travel: a
 * rank still silent then is stalled or dead. */
#define SERVE_ROUTER_SLACK_MS 3000u

/* Rank 0: the group's router, told which requests the group expects from
 * which prefill instance, so that an OFFER lost on the way is noticed, and
 * which one reuses request 0's prefix, so that it is placed after it
 * whatever order the instances' OFFERs come in. */
static kvr_status_t create_router(serve_t *s, kvr_error_t *err)
{
    router_ops_t ops = {s, rt_to_rank, rt_to_producer, rt_aborts};
    kvr_agent_params_t p = demo_agent_params(&s->cfg, KVR_AGENT_CONSUMER,
                                             &(kvr_wire_topo_t){0}, NULL, "");
    uint32_t timeout = s->cfg.deadline_ms + p.grace_ms + SERVE_ROUTER_SLACK_MS;
    s->router = router_create(&s->cfg.lay, demo_ranks(&s->cfg),
                              demo_dst_pool(&s->cfg, s->o.group), timeout,
                              &ops);
    if (s->router == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY,
                             "no memory for the router");
    for (uint32_t r = 0; r < s->cfg.requests && r < DEMO_MAX_REQUESTS; r++) {
        char id[32], first[32], producer[KVR_AGENT_INSTANCE_MAX + 1];
        if (demo_group_of(&s->cfg, r) != s->o.group)
            continue;
        demo_request_id(r, id, sizeof(id));
        demo_instance_id(false, demo_instance_of(&s->cfg, r), producer,
                         sizeof(producer));
        router_expect(s->router, id, producer);
        demo_request_id(0, first, sizeof(first));
        if (demo_reuses(&s->cfg, r)) /* it may be offered before req-0 */
            router_reuses(s->router, id, first);
    }
    return KVR_OK;
}

static kvr_status_t start(serve_t *s, kvr_error_t *err)
{
    if (s->o.rank == 0 && create_router(s, err) != KVR_OK)
        return err->code;
    if (kvr_agent_start(s->agent) != KVR_OK)
        return kvr_error_set(err, KVR_ERR_IO, "%s",
                             kvr_agent_last_error(s->agent));
    const char *addr = kvr_agent_address(s->agent);
    const char *colon = strrchr(addr, ':');
    printf("listening %s\n", colon ? colon + 1 : "0");
    fflush(stdout);
    return KVR_OK;
}

static int serve_run(serve_t *s)
{
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool have_key = false;
    kvr_error_t err = {0};
    kvr_status_t st = demo_load_key(&s->cfg, key, &have_key, &err);
    if (st != KVR_OK)
        return cli_usage_error("serve", "--key-file: %s", err.msg);
    s->expect = s->o.expect ? s->o.expect
                            : demo_count(&s->cfg, s->o.group, true);
    st = create_agent(s, have_key ? key : NULL, &err);
    if (st == KVR_OK)
        st = setup_regions(s, &err);
    if (st == KVR_OK && s->cfg.load_from != NULL)
        st = demo_store_open(&s->cfg, s->descs, s->mirrors, s->num_regions,
                             &s->store, &s->loader, &err);
    if (st == KVR_OK)
        st = start(s, &err);
    int rc = st == KVR_OK ? serve_loop(s) : CLI_EXIT_FAILED;
    if (st != KVR_OK)
        fprintf(stderr, "kvrelay serve: group %u rank %u: %s\n", s->o.group,
                s->o.rank, err.msg);
    kvr_agent_destroy(s->agent);
    kvr_store_conn_destroy(s->loader);
    kvr_store_close(s->store);
    router_destroy(s->router);
    free_mirrors(s);
    for (uint32_t i = 0; i < DEMO_MAX_REQUESTS; i++)
        free(s->reqs[i].dst);
    return rc;
}

int cli_cmd_serve(int argc, char **argv)
{
    serve_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CLI_EXIT_FAILED;
    demo_cfg_init(&s->cfg);
    snprintf(s->o.listen, sizeof(s->o.listen), "127.0.0.1:0");
    int rc = demo_parse(argc, argv, &s->cfg, "serve", serve_usage, NULL,
                        serve_option, &s->o);
    if (rc < 0 && !s->o.have_rank)
        rc = cli_usage_error("serve", "--rank is required");
    if (rc < 0 && s->o.rank >= demo_ranks(&s->cfg))
        rc = cli_usage_error("serve", "--rank %u out of range [0, %u)",
                             s->o.rank, demo_ranks(&s->cfg));
    if (rc < 0 && s->o.group >= s->cfg.groups)
        rc = cli_usage_error("serve", "--group %u out of range [0, %u)",
                             s->o.group, s->cfg.groups);
    if (rc < 0 && s->o.rank > 0 && s->o.router[0] == '\0')
        rc = cli_usage_error("serve",
                             "rank %u needs --router HOST:PORT (its "
                             "group's rank 0)",
                             s->o.rank);
    if (rc < 0) {
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
        signal(SIGPIPE, SIG_IGN);
        rc = serve_run(s);
    }
    free(s);
    return rc;
}
