/* bench/xfer: direct vs staged vs one large put of the same bytes (the
 * ceiling), over UCX shared memory and TCP, for I in {1, 4, 16, 64},
 * 576-byte MLA tokens, W = 4 consumer processes, bs = 64. Prints a table
 * and writes JSON with every parameter. Run it from a release build. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "xfer_harness.h"

#define KINDS 3 /* ceiling, direct, staged */
#define MAX_REPS 64

typedef struct {
    int reps;
    uint64_t tokens;
    uint64_t slot_bytes;
    uint32_t num_slots;
    const char *out;
    bool only_shm, only_tcp;
    int probe_only; /* probes per cell, no rounds (model development) */
} opts_t;

typedef struct {
    double secs[KINDS][MAX_REPS]; /* all ranks, one after another */
    double pred_direct, pred_staged;
    kvr_exec_kind_t pick;
    uint64_t bytes, runs;
} cell_t;

static const char *const kind_names[KINDS] = {"ceiling", "direct", "staged"};
static const int kind_ids[KINDS] = {XH_CEILING, KVR_EXEC_DIRECT,
                                    KVR_EXEC_STAGED};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* min, median, max of n values (sorted copy). */
static void stats3(const double *v, int n, double out[3])
{
    double tmp[MAX_REPS];
    memcpy(tmp, v, (size_t)n * sizeof(*v));
    qsort(tmp, (size_t)n, sizeof(*tmp), cmp_double);
    out[0] = tmp[0];
    out[1] = n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
    out[2] = tmp[n - 1];
}

/* Staging geometry per transport (4 MiB each): on TCP every chunk costs a
 * flush round trip (~60 us), so chunks are larger; on shared memory small
 * chunks let the consumer unpack while the producer packs. */
static const uint64_t default_slot[] = {1u << 20, 256u << 10, 1u << 20};
static const uint32_t default_slots[] = {4, 16, 4};

static xh_config_t config(kvr_xfer_tl_t tl, uint32_t I, const opts_t *o)
{
    xh_config_t cfg = {
        .tl = tl,
        .W = 4,
        .bs = 64,
        .I = I,
        .tokens = o->tokens,
        .token_bytes = 576,
        .with_index = false,
        .slot_bytes = o->slot_bytes ? o->slot_bytes : default_slot[tl],
        .num_slots = o->num_slots ? o->num_slots : default_slots[tl],
        .timeout_ms = 60000,
        .seed = 1,
    };
    return cfg;
}

static int measure_cell(xh_session_t *s, const kvr_cost_model_t *model,
                        const opts_t *o, cell_t *c)
{
    double secs[XH_MAX_RANKS];
    for (int k = 0; k < KINDS; k++) /* warm-up: first touch of every page */
        if (xh_round(s, kind_ids[k], secs, NULL) != KVR_OK)
            return 1;
    for (int rep = 0; rep < o->reps; rep++)
        for (int k = 0; k < KINDS; k++) {
            kvr_status_t st = xh_round(s, kind_ids[k], secs, NULL);
            if (st != KVR_OK) {
                fprintf(stderr, "%s round failed: %s (%s)\n", kind_names[k],
                        kvr_status_name(st), s->error);
                return 1;
            }
            c->secs[k][rep] = 0;
            for (uint32_t r = 0; r < s->cfg.W; r++)
                c->secs[k][rep] += secs[r];
        }
    kvr_xfer_seg_t segs[2];
    c->bytes = c->runs = 0;
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        size_t n = xh_segs(s, r, KVR_EXEC_DIRECT, segs);
        c->bytes += kvr_xfer_stream_bytes(segs, n);
        c->runs += kvr_plan_num_runs(segs[0].plan);
        double td, ts;
        c->pick = kvr_cost_choose(model, KVR_EXEC_AUTO, segs, n,
                                  s->cfg.slot_bytes, &td, &ts);
        c->pred_direct += td;
        c->pred_staged += ts;
    }
    return 0;
}

/* --probe-only: the picks a fresh probe makes in this cell. */
static void predict(xh_session_t *s, const kvr_cost_model_t *model,
                    const char *tl, uint32_t I)
{
    kvr_xfer_seg_t segs[2];
    double td = 0, ts = 0;
    for (uint32_t r = 0; r < s->cfg.W; r++) {
        size_t n = xh_segs(s, r, KVR_EXEC_DIRECT, segs);
        double d, st;
        kvr_cost_choose(model, KVR_EXEC_AUTO, segs, n, s->cfg.slot_bytes, &d,
                        &st);
        td += d;
        ts += st;
    }
    printf("  %s I=%u predicted direct %.2f ms staged %.2f ms: %s\n", tl, I,
           td * 1e3, ts * 1e3, ts < td ? "staged" : "direct");
}

static json_t *model_json(const kvr_cost_model_t *m, double probe_s)
{
    json_t *pts = json_array();
    for (uint32_t i = 0; i < m->points && i < KVR_COST_POINTS; i++)
        json_array_append_new(
            pts,
            json_pack("{s:f,s:f,s:f,s:f,s:f}", "bytes", m->point_bytes[i],
                      "put_s", m->put_at[i], "copy_s", m->copy_at[i],
                      "unpack_s", m->unpack_at[i], "stage_s", m->stage_at[i]));
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:b,s:f,s:o,s:f}", "put_s", m->put_s,
                     "put_Bps", m->put_Bps, "chunk_s", m->chunk_s, "stage_Bps",
                     m->stage_Bps, "copy_Bps", m->copy_Bps, "mapped", m->mapped,
                     "rtt_s", m->rtt_s, "points", pts, "probe_wall_s", probe_s);
}

static void print_model(const char *tl, const kvr_cost_model_t *m,
                        double probe_s)
{
    printf("%s model (probe %.1f ms): rtt %.1f us, chunk %.2f us, put %.2f "
           "GB/s, stage %.2f GB/s, mapped %d\n"
           "  bytes/put/copy/unpack/stage us:",
           tl, probe_s * 1e3, m->rtt_s * 1e6, m->chunk_s * 1e6,
           m->put_Bps / 1e9, m->stage_Bps / 1e9, m->mapped);
    for (uint32_t i = 0; i < m->points && i < KVR_COST_POINTS; i++)
        printf(" %.0f/%.2f/%.2f/%.2f/%.1f", m->point_bytes[i],
               m->put_at[i] * 1e6, m->copy_at[i] * 1e6, m->unpack_at[i] * 1e6,
               m->stage_at[i] * 1e6);
    printf("\n");
}

/* Ratios to the ceiling per repetition: t(ceiling) / t(kind). */
static json_t *cell_json(const xh_config_t *cfg, const cell_t *c, int reps,
                         bool *pick_ok, const char *tl)
{
    json_t *j = json_pack("{s:s,s:i,s:I,s:I,s:s,s:f,s:f}", "transport", tl, "I",
                          cfg->I, "bytes", (json_int_t)c->bytes, "runs",
                          (json_int_t)c->runs, "pick", kvr_exec_name(c->pick),
                          "predicted_direct_s", c->pred_direct,
                          "predicted_staged_s", c->pred_staged);
    double med[KINDS];
    for (int k = 0; k < KINDS; k++) {
        double ratio[MAX_REPS], st[3], rt[3];
        for (int r = 0; r < reps; r++)
            ratio[r] = c->secs[0][r] / c->secs[k][r];
        stats3(c->secs[k], reps, st);
        stats3(ratio, reps, rt);
        med[k] = st[1];
        json_t *secs = json_array();
        for (int r = 0; r < reps; r++)
            json_array_append_new(secs, json_real(c->secs[k][r]));
        json_object_set_new(
            j, kind_names[k],
            json_pack("{s:o,s:[f,f,f],s:[f,f,f],s:f}", "seconds", secs,
                      "seconds_min_median_max", st[0], st[1], st[2],
                      "ratio_to_ceiling_min_median_max", rt[0], rt[1], rt[2],
                      "GBps_median", (double)c->bytes / st[1] / 1e9));
    }
    double best = med[1] < med[2] ? med[1] : med[2];
    *pick_ok = med[c->pick] <= 1.10 * best;
    json_object_set_new(j, "pick_within_10pct", json_boolean(*pick_ok));
    return j;
}

static void print_row(const char *tl, uint32_t I, const json_t *cell)
{
    printf("%-4s %3u", tl, I);
    for (int k = 1; k < KINDS; k++) {
        json_t *r = json_object_get(json_object_get(cell, kind_names[k]),
                                    "ratio_to_ceiling_min_median_max");
        printf("  %5.2f/%5.2f/%5.2f", json_real_value(json_array_get(r, 0)),
               json_real_value(json_array_get(r, 1)),
               json_real_value(json_array_get(r, 2)));
    }
    json_t *c = json_object_get(json_object_get(cell, "ceiling"),
                                "GBps_median");
    printf("  %7.3f  %-6s %s\n", json_real_value(c),
           json_string_value(json_object_get(cell, "pick")),
           json_is_true(json_object_get(cell, "pick_within_10pct")) ? "yes"
                                                                    : "NO");
}

static int run_transport(kvr_xfer_tl_t tl, const opts_t *o, json_t *cells,
                         json_t *models, int *wrong)
{
    static const uint32_t Is[] = {1, 4, 16, 64};
    const char *name = tl == KVR_XFER_TL_SHM ? "shm" : "tcp";
    kvr_cost_model_t model = {0};
    for (size_t i = 0; i < sizeof(Is) / sizeof(Is[0]); i++) {
        xh_config_t cfg = config(tl, Is[i], o);
        xh_session_t s;
        cell_t cell = {0};
        if (xh_start(&s, &cfg) != 0) {
            fprintf(stderr, "start %s I=%u: %s\n", name, Is[i], s.error);
            xh_stop(&s);
            return 1;
        }
        /* one probe per transport, as a connection makes (the connector
         * probes once at set-up) */
        int rc = 0, probes = o->probe_only ? o->probe_only : i == 0;
        for (int k = 0; rc == 0 && k < probes; k++) {
            uint64_t t0 = kvr_now_ns();
            rc = xh_probe(&s, 0, &model) != KVR_OK;
            double probe_s = (double)(kvr_now_ns() - t0) * 1e-9;
            if (rc == 0 && (o->probe_only || i == 0))
                print_model(name, &model, probe_s);
            if (rc == 0 && i == 0 && k == 0)
                json_object_set_new(models, name, model_json(&model, probe_s));
            if (rc == 0 && o->probe_only)
                predict(&s, &model, name, Is[i]);
        }
        if (rc == 0 && o->probe_only) {
            xh_stop(&s);
            continue;
        }
        if (rc == 0)
            rc = measure_cell(&s, &model, o, &cell);
        if (xh_stop(&s) != 0 || rc != 0) {
            fprintf(stderr, "%s I=%u failed: %s\n", name, Is[i], s.error);
            return 1;
        }
        bool ok;
        json_t *j = cell_json(&cfg, &cell, o->reps, &ok, name);
        *wrong += !ok;
        print_row(name, Is[i], j);
        json_array_append_new(cells, j);
    }
    return 0;
}

static json_t *params_json(const opts_t *o)
{
    xh_config_t cfg = config(KVR_XFER_TL_SHM, 1, o);
    xh_config_t tcp = config(KVR_XFER_TL_TCP, 1, o);
    struct utsname u;
    uname(&u);
    return json_pack(
        "{s:i,s:i,s:I,s:i,s:I,s:i,s:I,s:i,s:i,s:[i,i,i,i],s:s,s:s,s:s,s:s,s:s,"
        "s:i,s:s,s:s,s:s,s:s}",
        "W", cfg.W, "bs", cfg.bs, "tokens", (json_int_t)cfg.tokens,
        "token_bytes", cfg.token_bytes, "slot_bytes_shm",
        (json_int_t)cfg.slot_bytes, "num_slots_shm", cfg.num_slots,
        "slot_bytes_tcp", (json_int_t)tcp.slot_bytes, "num_slots_tcp",
        tcp.num_slots, "repetitions", o->reps, "I", 1, 4, 16, 64,
        "destination_memory", "registered (emulated puts)", "staging_memory",
        "UCX-allocated (UCP_MEM_MAP_ALLOCATE)", "consumer_progress",
        "caller (inside kvr_exec_recv)", "timing",
        "producer wall time of all W ranks, one after another, each up to the "
        "consumer's last ack (staged) or the flushed DONE (direct, ceiling); "
        "one warm-up round per kind first; consumers verify after timing",
        "ucx_version", ucp_get_version_string(), "cpus",
        (int)sysconf(_SC_NPROCESSORS_ONLN), "kernel", u.release, "build",
        KVR_BUILD_TYPE, "ucx_tcp",
        "UCX_TLS=tcp TX_SEG_SIZE=256K RX_SEG_SIZE=1M", "cost_probe",
        "kvr_cost_measure once per transport (in its I = 1 session, against "
        "rank 0: 4 MiB registered scratch, the UCX-allocated staging); that "
        "model picks for every I, as a connection's probe at set-up does");
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.reps = 5, .tokens = 65536};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            o->reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
            o->tokens = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--slot-kib") == 0 && i + 1 < argc)
            o->slot_bytes = strtoull(argv[++i], NULL, 10) << 10;
        else if (strcmp(argv[i], "--slots") == 0 && i + 1 < argc)
            o->num_slots = (uint32_t)atoi(argv[++i]);
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            o->out = argv[++i];
        else if (strcmp(argv[i], "--probe-only") == 0 && i + 1 < argc)
            o->probe_only = atoi(argv[++i]);
        else if (strcmp(argv[i], "--shm-only") == 0)
            o->only_shm = true;
        else if (strcmp(argv[i], "--tcp-only") == 0)
            o->only_tcp = true;
        else {
            fprintf(stderr,
                    "usage: %s [--reps N] [--tokens N] [--slot-kib K] "
                    "[--slots N] [--out FILE] [--shm-only|--tcp-only] "
                    "[--probe-only N]\n",
                    argv[0]);
            return 2;
        }
    }
    return o->reps < 1 || o->reps > MAX_REPS || o->tokens == 0 ||
                   o->num_slots > 64
               ? 2
               : 0;
}

int main(int argc, char **argv)
{
    opts_t o;
    if (parse(argc, argv, &o) != 0)
        return 2;
    char date[32], path[256];
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
    snprintf(path, sizeof(path), "bench/results/xfer-%s.json", date);
    json_t *cells = json_array(), *models = json_object();
    int wrong = 0, rc = 0;
    printf("ratio to ceiling min/median/max; ceiling GB/s median; pick\n");
    printf("tl     I   direct              staged              ceiling  pick   "
           "right\n");
    if (!o.only_tcp)
        rc = run_transport(KVR_XFER_TL_SHM, &o, cells, models, &wrong);
    if (rc == 0 && !o.only_shm)
        rc = run_transport(KVR_XFER_TL_TCP, &o, cells, models, &wrong);
    json_t *doc = json_pack("{s:s,s:s,s:o,s:o,s:o,s:i}", "bench", "xfer",
                            "date", date, "params", params_json(&o),
                            "cost_models", models, "cells", cells,
                            "wrong_picks", wrong);
    const char *out = o.out ? o.out : path;
    if (o.probe_only) {
        json_decref(doc);
        return rc;
    }
    if (rc == 0 && json_dump_file(doc, out, JSON_INDENT(2)) != 0)
        rc = 1;
    if (rc == 0)
        printf("wrote %s; wrong picks: %d\n", out, wrong);
    json_decref(doc);
    return rc;
}
