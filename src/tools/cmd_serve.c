/* `kvrelay serve`: one decode rank (consumer); rank 0 is the decode leader.
 * Verifies every loaded request against the synthetic source and reports
 * one line per event on stdout for `kvrelay demo`. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "commands.h"
#include "demo.h"

static const char serve_usage[] =
    "usage: kvrelay serve --rank R [--listen HOST:PORT] [--leader HOST:PORT]\n"
    "                     [--expect REQUESTS] [options]\n"
    "One DCP decode rank. Rank 0 leads (block pool, prefix cache); other\n"
    "ranks dial it with --leader. Prints 'listening PORT' first.\n";

typedef struct {
    uint32_t rank;
    bool have_rank;
    char listen_host[256];
    uint16_t listen_port;
    char leader_host[256];
    uint16_t leader_port;
    uint32_t expect;
} serve_opts_t;

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

bool kvr_tool_parse_hostport(const char *text, char *host, size_t cap,
                             uint16_t *port)
{
    const char *colon = text ? strrchr(text, ':') : NULL;
    uint64_t p;
    if (colon == NULL || (size_t)(colon - text) >= cap || colon == text ||
        !kvr_tool_parse_u64(colon + 1, 0, 65535, &p))
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
    if (strcmp(name, "rank") == 0 || strcmp(name, "expect") == 0) {
        if (!kvr_tool_parse_u64(value, 0, 1u << 20, &v)) {
            kvr_tool_usage_error("serve", "--%s: '%s' is not a number", name, value);
            return -1;
        }
        if (name[0] == 'r')
            o->rank = (uint32_t)v, o->have_rank = true;
        else
            o->expect = (uint32_t)v;
        return 1;
    }
    bool listen = strcmp(name, "listen") == 0;
    if (!listen && strcmp(name, "leader") != 0)
        return 0;
    if (!kvr_tool_parse_hostport(value, listen ? o->listen_host : o->leader_host,
                                 sizeof(o->listen_host),
                                 listen ? &o->listen_port : &o->leader_port)) {
        kvr_tool_usage_error("serve", "--%s: '%s' is not HOST:PORT", name, value);
        return -1;
    }
    return 1;
}

typedef struct {
    kvr_demo_cfg_t cfg;
    serve_opts_t o;
    kvr_conn_t *conn;
    kvr_region_desc_t descs[KVR_DEMO_MAX_LAYERS * 2];
    void *bases[KVR_DEMO_MAX_LAYERS * 2];
    void *mirrors[KVR_DEMO_MAX_LAYERS * 2]; /* host view (device: a copy) */
    uint32_t num_regions;
    uint32_t loaded, verified, failed, group_done;
    uint64_t bytes;
    json_t *dumped; /* rank 0 with --dump: the requests it loaded */
    kvr_conn_event_t pending[KVR_DEMO_MAX_REQUESTS]; /* loaded, not yet verified */
    uint32_t num_pending;
} serve_t;

static kvr_status_t setup_regions(serve_t *s, kvr_error_t *err)
{
    s->num_regions = kvr_demo_region(&s->cfg, 0, true, NULL);
    for (uint32_t i = 0; i < s->num_regions; i++) {
        kvr_demo_region(&s->cfg, i, true, &s->descs[i]);
        uint64_t len = kvr_region_bytes(&s->descs[i]);
        if (kvr_conn_alloc_region(s->conn, &s->descs[i], &s->bases[i]) != KVR_OK)
            return kvr_error_set(err, KVR_ERR_NO_MEMORY, "region %u: %s", i,
                                 kvr_conn_last_error(s->conn));
        s->mirrors[i] = s->cfg.cuda_device >= 0 ? calloc(1, len) : s->bases[i];
        if (s->mirrors[i] == NULL)
            return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no host mirror");
        memset(s->mirrors[i], 0, len);
        if (s->cfg.cuda_device >= 0 &&
            kvr_conn_copy(s->conn, s->bases[i], s->mirrors[i], len) != KVR_OK)
            return kvr_error_set(err, KVR_ERR_CUDA, "%s", kvr_conn_last_error(s->conn));
    }
    if (s->cfg.staging_slots == 0)
        return KVR_OK;
    kvr_region_desc_t st = {.role = KVR_ROLE_STAGING, .layer = 0,
                            .num_blocks = s->cfg.staging_slots + 1u,
                            .page_bytes = s->cfg.slot_bytes};
    void *base = NULL;
    if (kvr_conn_alloc_region(s->conn, &st, &base) != KVR_OK)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "staging: %s",
                             kvr_conn_last_error(s->conn));
    return KVR_OK;
}

static kvr_status_t create_conn(serve_t *s, const uint8_t *key, kvr_error_t *err)
{
    kvr_wire_topo_t topo = {.pp_rank = 0, .pp_size = 1, .tp_rank = s->o.rank,
                            .tp_size = s->cfg.lay.dcp_size, .dp_rank = 0,
                            .dp_size = 1, .layer_start = 0,
                            .layer_end = s->cfg.layers, .dcp_rank = s->o.rank};
    kvr_conn_params_t p = kvr_demo_conn_params(&s->cfg, KVR_WIRE_CONSUMER,
                                               &topo, key);
    kvr_status_t st = kvr_demo_arm_fault(&s->cfg, s->o.rank, err);
    return st == KVR_OK ? kvr_conn_create(&p, &s->conn, err) : st;
}

/* Device pages are checked through a fresh host copy. */
static void refresh_mirrors(serve_t *s)
{
    for (uint32_t i = 0; s->cfg.cuda_device >= 0 && i < s->num_regions; i++)
        kvr_conn_copy(s->conn, s->mirrors[i], s->bases[i],
                      kvr_region_bytes(&s->descs[i]));
}

static void free_mirrors(serve_t *s)
{
    for (uint32_t i = 0; s->cfg.cuda_device >= 0 && i < s->num_regions; i++)
        free(s->mirrors[i]);
}

/* Rank 0 records each loaded request's destination table for the dump. */
static void note_dump(serve_t *s, const kvr_conn_event_t *e)
{
    if (s->cfg.dump_dir == NULL || s->o.rank != 0)
        return;
    if (s->dumped == NULL)
        s->dumped = json_array();
    json_t *dst = json_array();
    for (size_t i = 0; i < e->num_dst_blocks; i++)
        json_array_append_new(dst, json_integer(e->dst_blocks[i]));
    json_array_append_new(s->dumped, json_pack(
        "{s:s%,s:I,s:I,s:o}", "id", (const char *)e->request_id.bytes,
        (size_t)e->request_id.len, "num_tokens", (json_int_t)e->num_tokens,
        "num_computed_blocks", (json_int_t)e->num_computed_blocks,
        "dst_blocks", dst));
}

static void write_dump(serve_t *s)
{
    refresh_mirrors(s);
    for (uint32_t i = 0; i < s->num_regions; i++) {
        char name[128];
        kvr_demo_image_name(name, sizeof(name), (int)s->o.rank, &s->descs[i]);
        kvr_demo_write_file(s->cfg.dump_dir, name, s->mirrors[i],
                            kvr_region_bytes(&s->descs[i]));
    }
    if (s->dumped == NULL)
        return;
    char *text = json_dumps(s->dumped, JSON_COMPACT);
    if (text != NULL)
        kvr_demo_write_file(s->cfg.dump_dir, "requests-r0.json", text, strlen(text));
    free(text);
    json_decref(s->dumped);
}

/* Verification waits until the run's last expected request is in (or the
 * run ends), so that checking gigabytes on the CPU never stalls the event
 * loop while transfers are in flight, and the demo's rate is the transfer's.
 * Blocks are not reused within a demo (the pool holds every request), so
 * nothing is overwritten before it is checked. */
static void keep_for_verify(serve_t *s, const kvr_conn_event_t *e)
{
    if (s->num_pending == KVR_DEMO_MAX_REQUESTS)
        return;
    kvr_conn_event_t *k = &s->pending[s->num_pending++];
    *k = *e;
    uint32_t *dst = malloc((e->num_dst_blocks + 1) * sizeof(*dst));
    if (dst != NULL && e->num_dst_blocks > 0) /* an empty table may be NULL */
        memcpy(dst, e->dst_blocks, e->num_dst_blocks * sizeof(*dst));
    k->dst_blocks = dst;
    k->num_dst_blocks = dst ? e->num_dst_blocks : 0;
    k->src_blocks = NULL;
    k->num_src_blocks = 0;
}

static void verify_pending(serve_t *s)
{
    kvr_error_t err = {0};
    refresh_mirrors(s);
    for (uint32_t i = 0; i < s->num_pending; i++) {
        const kvr_conn_event_t *e = &s->pending[i];
        int idl = (int)e->request_id.len;
        const char *id = (const char *)e->request_id.bytes;
        if (kvr_demo_verify(&s->cfg, s->o.rank, s->descs, s->mirrors,
                            s->num_regions, e, &err) == KVR_OK) {
            s->verified++;
            printf("verified %.*s\n", idl, id);
        } else {
            printf("verify-failed %.*s %s\n", idl, id, err.msg);
        }
        free((void *)e->dst_blocks);
    }
    s->num_pending = 0;
    fflush(stdout);
}

static void on_event(serve_t *s, const kvr_conn_event_t *e)
{
    int idl = (int)e->request_id.len;
    const char *id = (const char *)e->request_id.bytes;
    switch (e->kind) {
    case KVR_EVENT_LOADED:
        s->loaded++;
        s->bytes += e->bytes;
        printf("loaded %.*s %llu %llu %llu %llu\n", idl, id,
               (unsigned long long)e->bytes,
               (unsigned long long)e->num_computed_blocks,
               (unsigned long long)kvr_now_ns(),
               (unsigned long long)e->started_ns);
        note_dump(s, e);
        keep_for_verify(s, e);
        break;
    case KVR_EVENT_LOAD_FAILED:
        s->failed++;
        printf("failed %.*s %s %s\n", idl, id, kvr_status_name(e->status), e->message);
        break;
    case KVR_EVENT_GROUP_DONE:
        s->group_done++;
        printf("group-done %.*s %s\n", idl, id, kvr_status_name(e->status));
        break;
    case KVR_EVENT_PEER_LOST:
        printf("peer-lost %u %s %s\n", e->peer_rank, kvr_status_name(e->status),
               e->message);
        break;
    default:
        break;
    }
    fflush(stdout);
}

static bool finished(const serve_t *s)
{
    if (s->o.expect == 0 || s->loaded + s->failed < s->o.expect)
        return false;
    return s->o.rank != 0 || s->group_done >= s->o.expect;
}

static int serve_loop(serve_t *s)
{
    uint64_t end = kvr_now_ns() + (uint64_t)s->cfg.run_timeout_ms * 1000000ull;
    while (!stop_requested && !finished(s) && kvr_now_ns() < end) {
        kvr_conn_progress(s->conn, 20);
        kvr_conn_event_t e;
        while (kvr_conn_poll_event(s->conn, &e))
            on_event(s, &e);
    }
    /* let RELEASEs and the last frames drain */
    for (int i = 0; i < 10; i++)
        kvr_conn_progress(s->conn, 5);
    verify_pending(s);
    if (s->cfg.dump_dir != NULL)
        write_dump(s);
    printf("summary rank=%u loaded=%u verified=%u failed=%u bytes=%llu%s\n",
           s->o.rank, s->loaded, s->verified, s->failed,
           (unsigned long long)s->bytes, finished(s) ? "" : " (incomplete)");
    fflush(stdout);
    bool ok = finished(s) && s->verified == s->o.expect;
    return ok ? KVR_EXIT_OK : KVR_EXIT_FAILED;
}

static int serve_run(serve_t *s)
{
    uint8_t key[KVR_WIRE_KEY_BYTES];
    bool have_key = false;
    kvr_error_t err = {0};
    kvr_status_t st = kvr_demo_load_key(&s->cfg, key, &have_key, &err);
    if (st != KVR_OK)
        return kvr_tool_usage_error("serve", "--key-file: %s", err.msg);
    st = create_conn(s, have_key ? key : NULL, &err);
    if (st == KVR_OK)
        st = setup_regions(s, &err);
    uint16_t port = 0;
    if (st == KVR_OK && kvr_conn_listen(s->conn, s->o.listen_host, s->o.listen_port,
                                        &port) != KVR_OK)
        st = kvr_error_set(&err, KVR_ERR_IO, "%s", kvr_conn_last_error(s->conn));
    if (st == KVR_OK) {
        printf("listening %u\n", port);
        fflush(stdout);
    }
    if (st == KVR_OK && s->o.rank > 0 &&
        kvr_conn_connect(s->conn, s->o.leader_host, s->o.leader_port, 10000) != KVR_OK)
        st = kvr_error_set(&err, KVR_ERR_PEER_DEAD, "leader: %s",
                           kvr_conn_last_error(s->conn));
    int rc = st == KVR_OK ? serve_loop(s) : KVR_EXIT_FAILED;
    if (st != KVR_OK)
        fprintf(stderr, "kvrelay serve: rank %u: %s\n", s->o.rank, err.msg);
    free_mirrors(s);
    kvr_conn_destroy(s->conn);
    return rc;
}

int kvr_cmd_serve(int argc, char **argv)
{
    serve_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVR_EXIT_FAILED;
    kvr_demo_cfg_init(&s->cfg);
    snprintf(s->o.listen_host, sizeof(s->o.listen_host), "127.0.0.1");
    int rc = kvr_demo_parse(argc, argv, &s->cfg, "serve", serve_usage, NULL,
                            serve_option, &s->o);
    if (rc < 0 && !s->o.have_rank)
        rc = kvr_tool_usage_error("serve", "--rank is required");
    if (rc < 0 && s->o.rank >= s->cfg.lay.dcp_size)
        rc = kvr_tool_usage_error("serve", "--rank %u out of range [0, %u)",
                                  s->o.rank, s->cfg.lay.dcp_size);
    if (rc < 0 && s->o.rank > 0 && s->o.leader_host[0] == '\0')
        rc = kvr_tool_usage_error("serve", "rank %u needs --leader HOST:PORT",
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
