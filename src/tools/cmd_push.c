/* `kvrelay push`: one prefill stage (producer). Fills its layers' source
 * pages with synthetic KV, connects to every decode rank; stage 0 (the PP
 * head) offers the requests to the decode leader. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "demo.h"
#include "kvrelay/synth.h"

static const char push_usage[] =
    "usage: kvrelay push --stage P --connect HOST:PORT[,HOST:PORT...] [options]\n"
    "One PP prefill stage. --connect lists the decode ranks (any order).\n";

#define MAX_RANKS 64

typedef struct {
    uint32_t stage;
    bool have_stage;
    uint32_t tp_rank; /* this process's producer tp rank */
    char hosts[MAX_RANKS][256];
    uint16_t ports[MAX_RANKS];
    uint32_t num_targets;
} push_opts_t;

static int parse_targets(push_opts_t *o, const char *value)
{
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", value);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (o->num_targets == MAX_RANKS ||
            !kvr_tool_parse_hostport(tok, o->hosts[o->num_targets], 256,
                                     &o->ports[o->num_targets])) {
            kvr_tool_usage_error("push", "--connect: '%s' is not HOST:PORT", tok);
            return -1;
        }
        o->num_targets++;
    }
    return 1;
}

static int push_option(void *ctx, const char *name, const char *value)
{
    push_opts_t *o = ctx;
    uint64_t v;
    if (strcmp(name, "connect") == 0)
        return parse_targets(o, value);
    if (strcmp(name, "tp-rank") == 0) {
        if (!kvr_tool_parse_u64(value, 0, 63, &v)) {
            kvr_tool_usage_error("push", "--tp-rank: '%s' is not in [0, 63]", value);
            return -1;
        }
        o->tp_rank = (uint32_t)v;
        return 1;
    }
    if (strcmp(name, "stage") != 0)
        return 0;
    if (!kvr_tool_parse_u64(value, 0, 63, &v)) {
        kvr_tool_usage_error("push", "--stage: '%s' is not a number in [0, 63]", value);
        return -1;
    }
    o->stage = (uint32_t)v;
    o->have_stage = true;
    return 1;
}

typedef struct {
    kvr_demo_cfg_t cfg;
    push_opts_t o;
    kvr_conn_t *conn;
    uint32_t start, end;
    uint32_t sent, failed, offered, next;
    kvr_region_desc_t descs[KVR_DEMO_MAX_LAYERS * 2];
    void *bases[KVR_DEMO_MAX_LAYERS * 2];
    void *mirrors[KVR_DEMO_MAX_LAYERS * 2]; /* host view (device: the fill) */
    uint32_t num_regions;
} push_t;

static kvr_status_t create_conn(push_t *s, const uint8_t *key, kvr_error_t *err)
{
    kvr_demo_stage_layers(&s->cfg, s->o.stage, &s->start, &s->end);
    kvr_wire_topo_t topo = {.pp_rank = s->o.stage, .pp_size = s->cfg.pp,
                            .tp_rank = s->o.tp_rank, .tp_size = s->cfg.producer_tp,
                            .dp_rank = 0, .dp_size = 1, .layer_start = s->start,
                            .layer_end = s->end, .dcp_rank = 0};
    kvr_conn_params_t p = kvr_demo_conn_params(&s->cfg, KVR_WIRE_PRODUCER,
                                               &topo, key);
    /* decode rank t is served by producer tp rank t % producer_tp */
    p.consumer_ranks = 0;
    for (uint32_t t = 0; t < s->cfg.lay.dcp_size; t++)
        p.consumer_ranks += t % s->cfg.producer_tp == s->o.tp_rank;
    kvr_status_t st = kvr_demo_arm_fault(&s->cfg, s->o.stage, err);
    return st == KVR_OK ? kvr_conn_create(&p, &s->conn, err) : st;
}

/* This stage's layers, filled with every request's synthetic KV. */
static kvr_status_t fill_regions(push_t *s, kvr_error_t *err)
{
    uint32_t n = kvr_demo_region(&s->cfg, 0, false, NULL);
    uint32_t *src = calloc(kvr_demo_src_pool(&s->cfg) + 1, sizeof(*src));
    uint32_t *ids = calloc(kvr_demo_tokens(&s->cfg, s->cfg.requests) + 1, sizeof(*ids));
    kvr_status_t st = src && ids ? KVR_OK : KVR_ERR_NO_MEMORY;
    for (uint32_t i = 0; st == KVR_OK && i < n; i++) {
        kvr_region_desc_t d;
        kvr_demo_region(&s->cfg, i, false, &d);
        if (d.layer < s->start || d.layer >= s->end)
            continue;
        void *base = NULL;
        if (kvr_conn_alloc_region(s->conn, &d, &base) != KVR_OK) {
            st = kvr_error_set(err, KVR_ERR_NO_MEMORY, "%s", kvr_conn_last_error(s->conn));
            break;
        }
        void *host = s->cfg.cuda_device >= 0 ? calloc(1, kvr_region_bytes(&d)) : base;
        if (host == NULL) {
            st = kvr_error_set(err, KVR_ERR_NO_MEMORY, "no host buffer");
            break;
        }
        memset(host, 0, kvr_region_bytes(&d));
        s->descs[s->num_regions] = d;
        s->mirrors[s->num_regions] = host;
        s->bases[s->num_regions++] = base;
        for (uint32_t r = 0; st == KVR_OK && r < s->cfg.requests; r++) {
            uint64_t N = kvr_demo_tokens(&s->cfg, r);
            kvr_demo_src_blocks(&s->cfg, r, src);
            for (uint64_t g = 0; g < N; g++)
                ids[g] = kvr_demo_token_id(&s->cfg, r, g);
            st = kvr_synth_fill_source(&s->cfg.lay, &d, s->cfg.seed, src,
                                       kvr_num_src_blocks(&s->cfg.lay, N), ids, N,
                                       host, err);
        }
        if (st == KVR_OK && host != base &&
            kvr_conn_copy(s->conn, base, host, kvr_region_bytes(&d)) != KVR_OK)
            st = kvr_error_set(err, KVR_ERR_CUDA, "%s", kvr_conn_last_error(s->conn));
    }
    free(src);
    free(ids);
    return st;
}

static kvr_status_t offer(push_t *s, uint32_t r)
{
    char id[32];
    kvr_demo_request_id(r, id, sizeof(id));
    uint64_t N = kvr_demo_tokens(&s->cfg, r);
    size_t nsrc = (size_t)kvr_num_src_blocks(&s->cfg.lay, N);
    uint32_t *src = calloc(kvr_demo_src_pool(&s->cfg) + 1, sizeof(*src));
    uint32_t *prompt = calloc(N + 1, sizeof(*prompt));
    kvr_status_t st = src && prompt ? KVR_OK : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK) {
        kvr_demo_src_blocks(&s->cfg, r, src);
        for (uint64_t g = 0; g < N; g++)
            prompt[g] = kvr_demo_token_id(&s->cfg, r, g);
        kvr_conn_offer_t o = {id, strlen(id), 1000u + r, N, src, nsrc, prompt, N};
        st = kvr_conn_offer(s->conn, &o);
    }
    if (st == KVR_OK) {
        printf("offered %s %llu %llu\n", id, (unsigned long long)N,
               (unsigned long long)kvr_now_ns());
        s->offered++;
    } else {
        printf("send-failed %s %s %s\n", id, kvr_status_name(st),
               kvr_conn_last_error(s->conn));
        s->failed++;
    }
    fflush(stdout);
    free(src);
    free(prompt);
    return st;
}

/* The PP head offers every request but the prefix-reusing one at once; that
 * one waits until the others finished, so its prefix is cached. */
static void offer_due(push_t *s)
{
    if (s->o.stage != 0 || s->o.tp_rank != 0) /* the PP head offers */
        return;
    uint32_t last = s->cfg.requests - 1;
    bool hold = s->cfg.reuse && s->cfg.requests > 1;
    while (s->next < (hold ? last : s->cfg.requests))
        offer(s, s->next++);
    if (hold && s->next == last && s->sent + s->failed >= last)
        offer(s, s->next++);
}

static void on_event(push_t *s, const kvr_conn_event_t *e)
{
    int idl = (int)e->request_id.len;
    const char *id = (const char *)e->request_id.bytes;
    if (e->kind == KVR_EVENT_SENT) {
        s->sent++;
        printf("sent %.*s\n", idl, id);
    } else if (e->kind == KVR_EVENT_SEND_FAILED) {
        s->failed++;
        printf("send-failed %.*s %s %s\n", idl, id, kvr_status_name(e->status),
               e->message);
    } else if (e->kind == KVR_EVENT_PEER_LOST) {
        printf("peer-lost %u %s %s\n", e->peer_rank, kvr_status_name(e->status),
               e->message);
    }
    fflush(stdout);
}

static volatile sig_atomic_t push_stop;

static void on_push_signal(int sig)
{
    (void)sig;
    push_stop = 1;
}

static int push_loop(push_t *s)
{
    uint64_t end = kvr_now_ns() + (uint64_t)s->cfg.run_timeout_ms * 1000000ull;
    while (!push_stop && s->sent + s->failed < s->cfg.requests &&
           kvr_now_ns() < end) {
        offer_due(s);
        kvr_conn_progress(s->conn, 20);
        kvr_conn_event_t e;
        while (kvr_conn_poll_event(s->conn, &e))
            on_event(s, &e);
    }
    for (int i = 0; i < 10; i++)
        kvr_conn_progress(s->conn, 5);
    for (uint32_t i = 0; s->cfg.dump_dir != NULL && i < s->num_regions; i++) {
        char name[128];
        kvr_demo_image_name(name, sizeof(name), -1, &s->descs[i]);
        kvr_demo_write_file(s->cfg.dump_dir, name, s->mirrors[i],
                            kvr_region_bytes(&s->descs[i]));
    }
    printf("summary stage=%u sent=%u failed=%u\n", s->o.stage, s->sent, s->failed);
    fflush(stdout);
    return s->sent == s->cfg.requests ? KVR_EXIT_OK : KVR_EXIT_FAILED;
}

static int push_run(push_t *s)
{
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool have_key = false;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_demo_load_key(&s->cfg, key, &have_key, &err);
    if (st != KVR_OK)
        return kvr_tool_usage_error("push", "--key-file: %s", err.msg);
    st = create_conn(s, have_key ? key : NULL, &err);
    if (st == KVR_OK)
        st = fill_regions(s, &err);
    for (uint32_t i = 0; st == KVR_OK && i < s->o.num_targets; i++)
        if (kvr_conn_connect(s->conn, s->o.hosts[i], s->o.ports[i], 10000) != KVR_OK)
            st = kvr_error_set(&err, KVR_ERR_PEER_DEAD, "%s",
                               kvr_conn_last_error(s->conn));
    int rc = st == KVR_OK ? push_loop(s) : KVR_EXIT_FAILED;
    if (st != KVR_OK)
        fprintf(stderr, "kvrelay push: stage %u: %s\n", s->o.stage, err.msg);
    for (uint32_t i = 0; s->cfg.cuda_device >= 0 && i < s->num_regions; i++)
        free(s->mirrors[i]);
    kvr_conn_destroy(s->conn);
    return rc;
}

int kvr_cmd_push(int argc, char **argv)
{
    push_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVR_EXIT_FAILED;
    kvr_demo_cfg_init(&s->cfg);
    int rc = kvr_demo_parse(argc, argv, &s->cfg, "push", push_usage, NULL,
                            push_option, &s->o);
    if (rc < 0 && !s->o.have_stage)
        rc = kvr_tool_usage_error("push", "--stage is required");
    if (rc < 0 && s->o.stage >= s->cfg.pp)
        rc = kvr_tool_usage_error("push", "--stage %u out of range [0, %u)",
                                  s->o.stage, s->cfg.pp);
    if (rc < 0 && s->o.tp_rank >= s->cfg.producer_tp)
        rc = kvr_tool_usage_error("push", "--tp-rank %u out of range [0, %u)",
                                  s->o.tp_rank, s->cfg.producer_tp);
    if (rc < 0 && s->o.num_targets != s->cfg.lay.dcp_size)
        rc = kvr_tool_usage_error("push", "--connect lists %u decode ranks, "
                                  "--dcp is %u", s->o.num_targets, s->cfg.lay.dcp_size);
    if (rc < 0) {
        signal(SIGTERM, on_push_signal);
        signal(SIGPIPE, SIG_IGN);
        rc = push_run(s);
    }
    free(s);
    return rc;
}
