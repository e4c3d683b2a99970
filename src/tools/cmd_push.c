/* `kvrelay push`: one prefill stage (a producer agent) of prefill instance
 * P. "Prefill" fills its layers' source pages with the instance's
 * synthetic KV and opens every request of the instance (send_open +
 * send_ready); the PP head (stage 0, tp rank 0) then offers each request
 * to the router of the decode group that loads it (router.h), and every
 * stage serves the pulls that follow. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "demo.h"
#include "demo_store.h"
#include "kvrelay/synth.h"
#include "router.h"

static const char push_usage[] =
    "usage: kvrelay push --stage S [--instance P] [--tp-rank T]\n"
    "                    (--routers HOST:PORT[,HOST:PORT...] | --head "
    "HOST:PORT)\n"
    "                    [--listen HOST:PORT] [options]\n"
    "One PP prefill stage of prefill instance P. The PP head (stage 0, tp\n"
    "rank 0) lists the routers of the decode groups (group g's rank 0, in\n"
    "group order); every other stage names its head. Prints 'listening PORT'\n"
    "once its requests are open.\n";

#define MAX_GROUPS 64

typedef struct {
    uint32_t stage, instance, tp_rank;
    bool have_stage;
    char routers[MAX_GROUPS][300];
    uint32_t num_routers;
    char head[300];
    char listen[300];
} push_opts_t;

static int parse_routers(push_opts_t *o, const char *value)
{
    char buf[4096], host[256];
    uint16_t port;
    snprintf(buf, sizeof(buf), "%s", value);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (o->num_routers == MAX_GROUPS ||
            !cli_parse_hostport(tok, host, sizeof(host), &port)) {
            cli_usage_error("push", "--routers: '%s' is not HOST:PORT", tok);
            return -1;
        }
        snprintf(o->routers[o->num_routers++], sizeof(o->routers[0]), "%s",
                 tok);
    }
    return 1;
}

static int push_option(void *ctx, const char *name, const char *value)
{
    push_opts_t *o = ctx;
    uint64_t v;
    char host[256];
    uint16_t port;
    if (strcmp(name, "routers") == 0)
        return parse_routers(o, value);
    if (strcmp(name, "head") == 0 || strcmp(name, "listen") == 0) {
        if (!cli_parse_hostport(value, host, sizeof(host), &port)) {
            cli_usage_error("push", "--%s: '%s' is not HOST:PORT", name, value);
            return -1;
        }
        snprintf(name[0] == 'h' ? o->head : o->listen, sizeof(o->head), "%s",
                 value);
        return 1;
    }
    uint32_t *field = strcmp(name, "tp-rank") == 0    ? &o->tp_rank
                      : strcmp(name, "stage") == 0    ? &o->stage
                      : strcmp(name, "instance") == 0 ? &o->instance
                                                      : NULL;
    if (field == NULL)
        return 0;
    if (!cli_parse_u64(value, 0, 63, &v)) {
        cli_usage_error("push", "--%s: '%s' is not a number in [0, 63]", name,
                        value);
        return -1;
    }
    *field = (uint32_t)v;
    o->have_stage |= field == &o->stage;
    return 1;
}

typedef struct {
    demo_cfg_t cfg;
    push_opts_t o;
    char instance[KVR_AGENT_INSTANCE_MAX + 1];
    kvr_agent_t *agent;
    uint32_t start, end;
    uint32_t mine, sent, failed, canceled;
    bool fatal;
    char fatal_why[KVR_ERROR_MSG_MAX + 64];
    kvr_region_desc_t descs[DEMO_MAX_LAYERS * 2];
    void *bases[DEMO_MAX_LAYERS * 2];
    void *mirrors[DEMO_MAX_LAYERS * 2]; /* host view (device: the fill) */
    uint32_t num_regions;
    kvr_store_t *store; /* --save-to, on tp rank 0 of each stage */
    kvr_store_conn_t *saver;
    uint32_t released; /* requests whose send and save both completed */
    uint32_t quorums;  /* head: requests whose every stage's save answered */
    char members[MAX_GROUPS][256]; /* head: its other stages' listeners */
    uint32_t num_members;
} push_t;

static bool is_head(const push_t *s)
{
    return s->o.stage == 0 && s->o.tp_rank == 0;
}

static kvr_status_t create_agent(push_t *s, const uint8_t *key,
                                 kvr_error_t *err)
{
    demo_stage_layers(&s->cfg, s->o.stage, &s->start, &s->end);
    kvr_wire_topo_t topo = {.pp_rank = s->o.stage,
                            .pp_size = s->cfg.pp,
                            .tp_rank = s->o.tp_rank,
                            .tp_size = demo_producer_tp(&s->cfg),
                            .dp_rank = 0,
                            .dp_size = 1,
                            .layer_start = s->start,
                            .layer_end = s->end,
                            .dcp_rank = demo_plan_rank(&s->cfg, false,
                                                       s->o.tp_rank)};
    if (s->cfg.gqa) /* head-sharded: the producer has no DCP */
        topo.dcp_rank = 0;
    demo_instance_id(false, s->o.instance, s->instance, sizeof(s->instance));
    kvr_agent_params_t p = demo_agent_params(&s->cfg, KVR_AGENT_PRODUCER, &topo,
                                             key, s->instance);
    p.listen = s->o.listen;
    p.bootstrap = is_head(s) ? NULL : s->o.head;
    kvr_status_t st = demo_arm_fault(&s->cfg, s->o.stage, err);
    return st == KVR_OK ? demo_agent_create(&s->cfg, &p, &s->agent, err) : st;
}

/* This stage's layers, filled with its instance's synthetic KV. */
static kvr_status_t fill_region(push_t *s, const kvr_region_desc_t *d,
                                uint32_t *src, uint32_t *ids, kvr_error_t *err)
{
    void *base = NULL;
    if (kvr_agent_alloc_region(s->agent, d, 0, &base) != KVR_OK)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "%s",
                             kvr_agent_last_error(s->agent));
    void *host = s->cfg.cuda_device >= 0 ? calloc(1, kvr_region_bytes(d))
                                         : base;
    if (host == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no host buffer");
    memset(host, 0, kvr_region_bytes(d));
    s->descs[s->num_regions] = *d;
    s->mirrors[s->num_regions] = host;
    s->bases[s->num_regions++] = base;
    kvr_status_t st = KVR_OK;
    for (uint32_t r = 0; st == KVR_OK && r < s->cfg.requests; r++) {
        if (demo_instance_of(&s->cfg, r) != s->o.instance)
            continue;
        uint64_t N = demo_tokens(&s->cfg, r);
        demo_src_blocks(&s->cfg, r, src);
        for (uint64_t g = 0; g < N; g++)
            ids[g] = demo_token_id(&s->cfg, r, g);
        kvr_layout_t lay = demo_layout(&s->cfg);
        st = kvr_synth_fill_source_rank(
            &lay, d, demo_plan_rank(&s->cfg, false, s->o.tp_rank), s->cfg.seed,
            src, kvr_num_src_blocks(&s->cfg.lay, N), ids, N, host, err);
    }
    if (st == KVR_OK && host != base &&
        kvr_agent_copy(s->agent, base, host, kvr_region_bytes(d)) != KVR_OK)
        st = kvr_error_set(err, KVR_ERR_CUDA, "%s",
                           kvr_agent_last_error(s->agent));
    return st;
}

static kvr_status_t fill_regions(push_t *s, kvr_error_t *err)
{
    uint32_t n = demo_region(&s->cfg, 0, false, s->o.instance, NULL);
    uint32_t *src = calloc(demo_src_pool(&s->cfg, s->o.instance) + 1,
                           sizeof(*src));
    uint32_t *ids = calloc(demo_tokens(&s->cfg, s->cfg.requests) + 1,
                           sizeof(*ids));
    kvr_status_t st = src && ids ? KVR_OK : KVR_ERR_NO_MEMORY;
    for (uint32_t i = 0; st == KVR_OK && i < n; i++) {
        kvr_region_desc_t d;
        demo_region(&s->cfg, i, false, s->o.instance, &d);
        if (d.layer >= s->start && d.layer < s->end)
            st = fill_region(s, &d, src, ids, err);
    }
    free(src);
    free(ids);
    return st;
}

/* --save-to: the stage's layers of request r go to the store while the
 * request is pushed; its sources stay held until both completed. */
static kvr_status_t save_request(push_t *s, uint32_t r, const char *id,
                                 const uint32_t *src, kvr_error_t *err)
{
    size_t cap = demo_store_max_chunks(&s->cfg), n = 0;
    kvr_block_hash_t *chains = calloc(cap, sizeof *chains);
    if (chains == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "chains");
    kvr_status_t st = demo_store_chains(&s->cfg, r, chains, cap, &n, err);
    kvr_store_save_req_t q = {.request_id = id,
                              .request_id_len = strlen(id),
                              .chains = chains,
                              .num_chains = n,
                              .src_blocks = src,
                              .num_src_blocks = (size_t)kvr_num_src_blocks(
                                  &s->cfg.lay, demo_tokens(&s->cfg, r))};
    if (st == KVR_OK)
        st = kvr_store_conn_save(s->saver, &q, err);
    free(chains);
    return st;
}

/* Prefill is over for every request of the instance: open it on this
 * stage with this stage's own source table, all its layers ready. */
static kvr_status_t open_all(push_t *s, kvr_error_t *err)
{
    uint32_t *src = calloc(demo_src_pool(&s->cfg, s->o.instance) + 1,
                           sizeof(*src));
    kvr_status_t st = src ? KVR_OK : KVR_ERR_NO_MEMORY;
    bool serves = demo_stage_serves(&s->cfg, s->o.tp_rank);
    for (uint32_t r = 0; st == KVR_OK && serves && r < s->cfg.requests; r++) {
        if (demo_instance_of(&s->cfg, r) != s->o.instance)
            continue;
        char id[32];
        demo_request_id(r, id, sizeof(id));
        uint64_t N = demo_tokens(&s->cfg, r);
        demo_src_blocks(&s->cfg, r, src);
        kvr_agent_send_t o = {
            id, strlen(id), src, (size_t)kvr_num_src_blocks(&s->cfg.lay, N),
            N,  0,          1};
        if (kvr_agent_send_open(s->agent, &o) != KVR_OK ||
            kvr_agent_send_ready(s->agent, id, strlen(id), s->start, s->end,
                                 NULL) != KVR_OK)
            st = kvr_error_set(err, KVR_ERR_INVALID, "%s: %s", id,
                               kvr_agent_last_error(s->agent));
        if (st == KVR_OK && s->saver != NULL)
            st = save_request(s, r, id, src, err);
        s->mine++;
    }
    free(src);
    return st;
}

/* The head offers request r to its group's router, with the prefix hashes
 * of the prompt's whole virtual blocks (at most RT_HASH_MAX). */
static void offer(push_t *s, uint32_t r, rt_msg_t *m, uint32_t *prompt)
{
    static uint8_t buf[KVR_AGENT_NOTIFY_MAX];
    uint64_t N = demo_tokens(&s->cfg, r), V = kvr_virtual_block(&s->cfg.lay);
    uint64_t hashed = N / V < RT_HASH_MAX ? N / V * V : RT_HASH_MAX * V;
    memset(m, 0, sizeof(*m));
    m->type = RT_OFFER;
    demo_request_id(r, m->request, sizeof(m->request));
    snprintf(m->producer, sizeof(m->producer), "%s", s->instance);
    snprintf(m->address, sizeof(m->address), "%s", kvr_agent_address(s->agent));
    m->tokens = N;
    for (uint64_t g = 0; g < hashed; g++)
        prompt[g] = demo_token_id(&s->cfg, r, g);
    size_t nh = 0;
    if (hashed > 0)
        kvr_prefix_hashes(NULL, prompt, hashed, V, m->hashes, RT_HASH_MAX, &nh,
                          NULL);
    m->num_hashes = (uint32_t)nh;
    uint32_t g = demo_group_of(&s->cfg, r);
    char router[KVR_AGENT_INSTANCE_MAX + 1];
    demo_instance_id(true, g, router, sizeof(router));
    size_t len = rt_encode(m, buf);
    if (len > 0 && kvr_agent_notify(s->agent, router, strlen(router),
                                    s->o.routers[g], buf, len) == KVR_OK) {
        printf("offered %s %llu %llu\n", m->request, (unsigned long long)N,
               (unsigned long long)kvr_now_ns());
    } else {
        printf("send-failed %s ERR_INVALID offer: %s\n", m->request,
               kvr_agent_last_error(s->agent));
        s->failed++;
    }
    fflush(stdout);
}

static void offer_all(push_t *s)
{
    rt_msg_t *m = malloc(sizeof(*m));
    uint32_t *prompt = calloc(RT_HASH_MAX * kvr_virtual_block(&s->cfg.lay) + 1,
                              sizeof(*prompt));
    for (uint32_t r = 0; m && prompt && r < s->cfg.requests; r++)
        if (demo_instance_of(&s->cfg, r) == s->o.instance)
            offer(s, r, m, prompt);
    free(m);
    free(prompt);
}

static void stop_with(push_t *s, const char *what, const kvr_agent_event_t *e)
{
    if (!s->fatal)
        snprintf(s->fatal_why, sizeof(s->fatal_why), "%s: %s", what,
                 e->message);
    s->fatal = true;
}

static void on_event(push_t *s, const kvr_agent_event_t *e)
{
    int idl = (int)e->request.len;
    const char *id = (const char *)e->request.bytes;
    uint32_t r = 0;
    bool abort_wanted = demo_parse_request_id(id, e->request.len, &r) &&
                        demo_aborts(&s->cfg, r);
    if (s->saver != NULL &&
        (e->kind == KVR_AGENT_SENT || e->kind == KVR_AGENT_SEND_FAILED ||
         e->kind == KVR_AGENT_SEND_EXPIRED))
        kvr_store_conn_send_done(s->saver, id, e->request.len, e->status, NULL);
    if (e->kind == KVR_AGENT_SENT) {
        s->sent++;
        printf("sent %.*s\n", idl, id);
    } else if (e->kind == KVR_AGENT_SEND_FAILED ||
               e->kind == KVR_AGENT_SEND_EXPIRED) {
        /* the consumer's abort of a request it was asked to abort */
        bool canceled = abort_wanted && e->status == KVR_ERR_CANCELED;
        s->canceled += canceled;
        s->failed += !canceled;
        printf("send-%s %.*s %s %s\n", canceled ? "canceled" : "failed", idl,
               id, kvr_status_name(e->status), e->message);
    } else if (e->kind == KVR_AGENT_NOTIFY_FAILED) {
        printf("notify-failed %.*s %s %s\n", (int)e->peer.len, e->peer.bytes,
               kvr_status_name(e->status), e->message);
        stop_with(s,
                  is_head(s) ? "an offer could not reach its router"
                             : "its head could not be reached",
                  e);
    } else if (e->kind == KVR_AGENT_PEER_REFUSED) {
        printf("refused %.*s %s %s %s\n", e->peer.len ? (int)e->peer.len : 1,
               e->peer.len ? (const char *)e->peer.bytes : "?",
               e->bytes ? "known" : "unknown", kvr_status_name(e->status),
               e->message);
        if (e->bytes != 0)
            stop_with(s, "handshake refused", e);
    }
    fflush(stdout);
}

static void send_msg(push_t *s, const char *address, const rt_msg_t *m)
{
    static uint8_t buf[KVR_AGENT_NOTIFY_MAX];
    size_t len = rt_encode(m, buf);
    if (len > 0)
        kvr_agent_notify(s->agent, s->instance, strlen(s->instance), address,
                         buf, len);
}

/* The head passes what only it hears (a router's REFUSE, its own stop) on
 * to the stages that joined it: no stage waits for pulls that will never
 * come until its lease. */
static void tell_stages(push_t *s, const rt_msg_t *m)
{
    for (uint32_t i = 0; is_head(s) && i < s->num_members; i++)
        send_msg(s, s->members[i], m);
}

static void on_join(push_t *s, const kvr_agent_notify_t *n)
{
    for (uint32_t i = 0; i < s->num_members; i++)
        if (strcmp(s->members[i], n->sender_address) == 0)
            return;
    if (s->num_members < MAX_GROUPS && n->sender_address[0] != '\0')
        snprintf(s->members[s->num_members++], sizeof(s->members[0]), "%s",
                 n->sender_address);
}

/* The router could not place an offer: this stage stops serving it. */
static void on_notify(push_t *s, const kvr_agent_notify_t *n)
{
    rt_msg_t *m = malloc(sizeof(*m));
    bool ours = n->sender.len == strlen(s->instance) &&
                memcmp(n->sender.bytes, s->instance, n->sender.len) == 0;
    if (m == NULL || !rt_decode(n->payload, n->len, m)) {
        free(m);
        return;
    }
    if (m->type == RT_REFUSE || m->type == RT_FAILED) {
        printf("%s %s %s %s\n",
               m->type == RT_REFUSE ? "offer-refused" : "group-failed",
               m->request, kvr_status_name((kvr_status_t)m->status), m->text);
        kvr_agent_send_abort(s->agent, m->request, strlen(m->request));
        tell_stages(s, m);
    } else if (m->type == RT_JOIN && ours && is_head(s)) {
        on_join(s, n);
    } else if (m->type == RT_STOP && ours && !is_head(s)) {
        snprintf(s->fatal_why, sizeof(s->fatal_why), "%s", m->text);
        s->fatal = true;
    }
    free(m);
}

/* Store events: a part saved (a line for the demo), the PP quorum of a
 * save (the head's connector counts it from the other stages' records in
 * the store directory: "quorum ID GENERATION STATUS [MESSAGE]"), sources
 * released. */
static void on_store_event(push_t *s, const kvr_store_event_t *e)
{
    int idl = (int)e->request_len;
    if (e->kind == KVR_STORE_RELEASE) {
        s->released++;
    } else if (e->kind == KVR_STORE_PART_SAVED) {
        printf("saved %.*s %u %s %llu %llu %s\n", idl, (const char *)e->request,
               e->part, kvr_status_name(e->status),
               (unsigned long long)e->bytes, (unsigned long long)e->chunks,
               e->message);
    } else if (e->kind == KVR_STORE_SAVED) {
        s->quorums++;
        printf("quorum %.*s %lld %s %s\n", idl, (const char *)e->request,
               (long long)e->generation, kvr_status_name(e->status),
               e->message);
    }
}

/* Whether the store still owes this stage events: a release per request,
 * and on the head every request's quorum. */
static bool store_pending(const push_t *s)
{
    if (s->saver == NULL)
        return false;
    return s->released < s->mine || (is_head(s) && s->quorums < s->mine);
}

static volatile sig_atomic_t push_stop;

static void on_push_signal(int sig)
{
    (void)sig;
    push_stop = 1;
}

static void pump(push_t *s, int ms)
{
    struct pollfd p[2] = {
        {.fd = kvr_agent_event_fd(s->agent), .events = POLLIN},
        {.fd = kvr_store_conn_event_fd(s->saver), .events = POLLIN}};
    poll(p, s->saver ? 2 : 1, ms);
    kvr_agent_event_t e;
    while (kvr_agent_poll(s->agent, &e))
        on_event(s, &e);
    kvr_store_event_t se;
    while (s->saver != NULL && kvr_store_conn_poll(s->saver, &se))
        on_store_event(s, &se);
    kvr_agent_notify_t *n = malloc(sizeof(*n));
    while (n != NULL && kvr_agent_poll_notify(s->agent, n))
        on_notify(s, n);
    free(n);
}

/* A stage joins its head (RT_JOIN, from its listener), so that the head
 * can pass refusals and its stop on. */
static void join_head(push_t *s)
{
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m != NULL && !is_head(s)) {
        m->type = RT_JOIN;
        send_msg(s, s->o.head, m);
    }
    free(m);
}

static void tell_stages_stop(push_t *s)
{
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m != NULL) {
        m->type = RT_STOP;
        snprintf(m->text, sizeof(m->text), "the head stopped: %.200s",
                 s->fatal_why);
        tell_stages(s, m);
    }
    free(m);
}

static int push_loop(push_t *s)
{
    uint64_t end = kvr_deadline_ns(s->cfg.run_timeout_ms);
    if (is_head(s))
        offer_all(s);
    else
        join_head(s);
    while (!push_stop && !s->fatal &&
           (s->sent + s->failed + s->canceled < s->mine || store_pending(s)) &&
           kvr_now_ns() < end)
        pump(s, 20);
    if (s->fatal)
        tell_stages_stop(s);
    pump(s, 5);
    if (s->fatal)
        fprintf(stderr, "kvrelay push: instance %u stage %u: %s\n",
                s->o.instance, s->o.stage, s->fatal_why);
    for (uint32_t i = 0; s->cfg.dump_dir != NULL && i < s->num_regions; i++) {
        char name[128];
        demo_image_name(name, sizeof(name), -1, &s->descs[i]);
        demo_write_file(s->cfg.dump_dir, name, s->mirrors[i],
                        kvr_region_bytes(&s->descs[i]));
    }
    printf("summary instance=%u stage=%u sent=%u failed=%u canceled=%u\n",
           s->o.instance, s->o.stage, s->sent, s->failed, s->canceled);
    fflush(stdout);
    return !s->fatal && s->sent + s->canceled == s->mine ? CLI_EXIT_OK
                                                         : CLI_EXIT_FAILED;
}

static int push_run(push_t *s)
{
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool have_key = false;
    kvr_error_t err = {0};
    kvr_status_t st = demo_load_key(&s->cfg, key, &have_key, &err);
    if (st != KVR_OK)
        return cli_usage_error("push", "--key-file: %s", err.msg);
    st = create_agent(s, have_key ? key : NULL, &err);
    if (st == KVR_OK)
        st = fill_regions(s, &err);
    if (st == KVR_OK && kvr_agent_start(s->agent) != KVR_OK)
        st = kvr_error_set(&err, KVR_ERR_IO, "%s",
                           kvr_agent_last_error(s->agent));
    if (st == KVR_OK && s->cfg.save_to != NULL && s->o.tp_rank == 0)
        st = demo_store_open(&s->cfg, s->descs, s->mirrors, s->num_regions,
                             &s->store, &s->saver, &err);
    if (st == KVR_OK)
        st = open_all(s, &err);
    if (st == KVR_OK) {
        const char *colon = strrchr(kvr_agent_address(s->agent), ':');
        printf("listening %s\n", colon ? colon + 1 : "0");
        fflush(stdout);
    }
    int rc = st == KVR_OK ? push_loop(s) : CLI_EXIT_FAILED;
    if (st != KVR_OK)
        fprintf(stderr, "kvrelay push: instance %u stage %u: %s\n",
                s->o.instance, s->o.stage, err.msg);
    kvr_agent_destroy(s->agent);
    kvr_store_conn_destroy(s->saver);
    kvr_store_close(s->store);
    for (uint32_t i = 0; s->cfg.cuda_device >= 0 && i < s->num_regions; i++)
        free(s->mirrors[i]);
    return rc;
}

static int check_opts(push_t *s)
{
    if (!s->o.have_stage)
        return cli_usage_error("push", "--stage is required");
    if (s->o.stage >= s->cfg.pp)
        return cli_usage_error("push", "--stage %u out of range [0, %u)",
                               s->o.stage, s->cfg.pp);
    if (s->o.tp_rank >= demo_producer_tp(&s->cfg))
        return cli_usage_error("push", "--tp-rank %u out of range [0, %u)",
                               s->o.tp_rank, demo_producer_tp(&s->cfg));
    if (s->o.instance >= s->cfg.instances)
        return cli_usage_error("push", "--instance %u out of range [0, %u)",
                               s->o.instance, s->cfg.instances);
    if (is_head(s) && s->o.num_routers != s->cfg.groups)
        return cli_usage_error("push",
                               "--routers lists %u routers, --groups "
                               "is %u",
                               s->o.num_routers, s->cfg.groups);
    if (!is_head(s) && s->o.head[0] == '\0')
        return cli_usage_error("push",
                               "stage %u tp %u needs --head HOST:PORT "
                               "(its instance's stage 0)",
                               s->o.stage, s->o.tp_rank);
    return -1;
}

int cli_cmd_push(int argc, char **argv)
{
    push_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CLI_EXIT_FAILED;
    demo_cfg_init(&s->cfg);
    snprintf(s->o.listen, sizeof(s->o.listen), "127.0.0.1:0");
    int rc = demo_parse(argc, argv, &s->cfg, "push", push_usage, NULL,
                        push_option, &s->o);
    if (rc < 0)
        rc = check_opts(s);
    if (rc < 0) {
        signal(SIGTERM, on_push_signal);
        signal(SIGINT, on_push_signal);
        signal(SIGPIPE, SIG_IGN);
        rc = push_run(s);
    }
    free(s);
    return rc;
}
