/* The demo's store (docs/store.md "In the demo"): push stages save their
 * layers of every request (--save-to), decode ranks load the cached
 * prefix before pulling the rest (--load-from). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "commands.h"
#include "demo_store.h"

const char *demo_store_dir(const demo_cfg_t *cfg)
{
    return cfg->save_to != NULL ? cfg->save_to : cfg->load_from;
}

uint64_t demo_chunk(const demo_cfg_t *cfg)
{
    return cfg->chunk != 0 ? cfg->chunk
                           : (uint64_t)cfg->lay.block_size * cfg->lay.dcp_size;
}

static bool load_dir_ok(const demo_cfg_t *cfg, const char *cmd)
{
    struct stat sb;
    if (stat(cfg->load_from, &sb) != 0) {
        cli_usage_error(cmd, "--load-from %s: %s", cfg->load_from,
                        strerror(errno));
        return false;
    }
    if (!S_ISDIR(sb.st_mode)) {
        cli_usage_error(cmd, "--load-from %s: not a directory", cfg->load_from);
        return false;
    }
    return true;
}

bool demo_store_check(const demo_cfg_t *cfg, const char *cmd)
{
    uint64_t v = (uint64_t)cfg->lay.block_size * cfg->lay.dcp_size;
    const char *why = NULL;
    if (cfg->chunk % v != 0) {
        cli_usage_error(cmd,
                        "--chunk %llu is not a multiple of --block-size * "
                        "--dcp = %llu",
                        (unsigned long long)cfg->chunk, (unsigned long long)v);
        return false;
    }
    if (cfg->save_to == NULL && cfg->load_from == NULL)
        return true;
    if (cfg->save_to != NULL && cfg->load_from != NULL)
        why = "--save-to and --load-from are two runs: give one";
    else if (cfg->use_cuda || cfg->cuda_device >= 0)
        why = "the store moves host memory: drop --device cuda";
    if (why != NULL) {
        cli_usage_error(cmd, "%s", why);
        return false;
    }
    return cfg->load_from == NULL || load_dir_ok(cfg, cmd);
}

/* The namespace: the demo's model (its seed is its weights) and every
 * region of the model at the canonical layout. */
static kvr_status_t demo_ns(const demo_cfg_t *cfg, uint8_t *ns,
                            kvr_error_t *err)
{
    char tag[64];
    snprintf(tag, sizeof tag, "kvrelay-demo-seed-%llu",
             (unsigned long long)cfg->seed);
    kvr_offload_desc_t d = {.model_tag = tag,
                            .dtype = "fp8",
                            .block_size = cfg->lay.block_size,
                            .chunk_size = demo_chunk(cfg),
                            .tp = 1,
                            .dcp_size = 1,
                            .interleave = 1};
    uint32_t n = demo_region(cfg, 0, false, 0, NULL);
    kvr_region_desc_t *r = calloc(n + 1, sizeof *r);
    if (r == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "namespace");
    for (uint32_t i = 0; i < n; i++)
        demo_region(cfg, i, false, 0, &r[i]);
    kvr_status_t s = kvr_store_namespace(&d, r, n, NULL, ns, err);
    free(r);
    return s;
}

kvr_status_t demo_store_open(const demo_cfg_t *cfg,
                             const kvr_region_desc_t *descs, void *const *bases,
                             uint32_t num_regions, kvr_store_t **store,
                             kvr_store_conn_t **conn, kvr_error_t *err)
{
    uint8_t ns[KVR_STORE_NS_BYTES];
    uint32_t ends[DEMO_MAX_LAYERS], start;
    kvr_store_region_t *r = calloc(num_regions + 1, sizeof *r);
    if (r == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store regions");
    for (uint32_t i = 0; i < num_regions; i++)
        r[i] = (kvr_store_region_t){descs[i], bases[i]};
    for (uint32_t p = 0; p < cfg->pp; p++)
        demo_stage_layers(cfg, p, &start, &ends[p]);
    kvr_store_opts_t o = {.dir = demo_store_dir(cfg), .quick_scan = true};
    kvr_status_t s = demo_ns(cfg, ns, err);
    if (s == KVR_OK)
        s = kvr_store_open(&o, store, err);
    kvr_store_conn_params_t p = {.store = *store,
                                 .ns = ns,
                                 .block_size = cfg->lay.block_size,
                                 .chunk = demo_chunk(cfg),
                                 .lay = cfg->lay,
                                 .parts = cfg->pp,
                                 .part_ends = ends,
                                 .regions = r,
                                 .num_regions = num_regions,
                                 /* the head counts the PP quorum from the
                                    other stages' records in DIR */
                                 .remote_wait_ms = cfg->run_timeout_ms};
    p.lay.tp = p.lay.dcp_size;
    if (s == KVR_OK)
        s = kvr_store_conn_create(&p, conn, err);
    free(r);
    return s;
}

size_t demo_store_max_chunks(const demo_cfg_t *cfg)
{
    return (size_t)(demo_tokens(cfg, cfg->requests) / demo_chunk(cfg)) + 1;
}

kvr_status_t demo_store_chains(const demo_cfg_t *cfg, uint32_t req,
                               kvr_block_hash_t *out, size_t cap, size_t *num,
                               kvr_error_t *err)
{
    uint64_t N = demo_tokens(cfg, req);
    uint32_t *ids = calloc(N + 1, sizeof *ids);
    if (ids == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "token ids");
    for (uint64_t g = 0; g < N; g++)
        ids[g] = demo_token_id(cfg, req, g);
    kvr_status_t s = kvr_store_chains(ids, N, demo_chunk(cfg), out, cap, num,
                                      err);
    free(ids);
    return s;
}

/* ---- the supervisor's tally ------------------------------------------ */

typedef struct {
    bool saved;          /* the head's store connector answered its quorum */
    kvr_status_t status; /* the quorum's outcome */
    uint64_t saved_bytes, chunks;
    uint64_t store_bytes, store_tokens; /* summed over ranks */
    uint64_t read_bytes;                /* chunk payload read, all ranks */
    uint32_t loaded_ranks;
} tally_req_t;

struct demo_tally {
    const demo_cfg_t *cfg;
    tally_req_t req[DEMO_MAX_REQUESTS];
};

static bool open_save_dir(const demo_cfg_t *cfg)
{
    kvr_store_opts_t o = {.dir = cfg->save_to};
    kvr_store_t *st = NULL;
    kvr_error_t err = {0};
    if (kvr_store_open(&o, &st, &err) != KVR_OK) {
        cli_usage_error("demo", "--save-to %s: %s", cfg->save_to, err.msg);
        return false;
    }
    kvr_store_close(st);
    return true;
}

demo_tally_t *demo_tally_create(const demo_cfg_t *cfg, bool *ok)
{
    *ok = true;
    if (demo_store_dir(cfg) == NULL)
        return NULL;
    if (cfg->save_to != NULL && !open_save_dir(cfg)) {
        *ok = false;
        return NULL;
    }
    demo_tally_t *t = calloc(1, sizeof *t);
    if (t == NULL) {
        *ok = false;
        fprintf(stderr, "kvrelay demo: no memory for the store tally\n");
        return NULL;
    }
    t->cfg = cfg;
    return t;
}

void demo_tally_destroy(demo_tally_t *t)
{
    free(t);
}

/* "saved ID PART STATUS BYTES CHUNKS [MESSAGE]" of a stage. */
static void on_saved(demo_tally_t *t, FILE *out, const char *who, uint32_t r,
                     const char *rest)
{
    unsigned part = 0;
    char status[64] = "";
    unsigned long long bytes = 0, chunks = 0;
    int used = 0;
    if (sscanf(rest, "%u %63s %llu %llu %n", &part, status, &bytes, &chunks,
               &used) < 4)
        return;
    tally_req_t *q = &t->req[r];
    q->saved_bytes += bytes;
    q->chunks += chunks;
    if (strcmp(status, "OK") != 0)
        fprintf(out, "  %-8s req-%u save of part %u failed: %s %s\n", who, r,
                part, status, rest + used);
}

/* "quorum ID GENERATION STATUS [MESSAGE]" of the prefill head: its store
 * connector's answer once every stage's part answered (docs/store.md). */
static void on_quorum(demo_tally_t *t, FILE *out, const char *who, uint32_t r,
                      const char *rest)
{
    long long gen = 0;
    char status[64] = "";
    int used = 0;
    if (sscanf(rest, "%lld %63s %n", &gen, status, &used) < 2)
        return;
    tally_req_t *q = &t->req[r];
    q->saved = true;
    q->status = strcmp(status, "OK") == 0 ? KVR_OK : KVR_ERR_IO;
    if (q->status != KVR_OK)
        fprintf(out,
                "  %-8s req-%u (generation %lld) not saved by every "
                "stage: %s %s\n",
                who, r, gen, status, rest + used);
}

bool demo_tally_line(demo_tally_t *t, FILE *out, const char *who,
                     const char *verb, uint32_t req, const char *rest)
{
    if (t == NULL || req >= t->cfg->requests)
        return false;
    tally_req_t *q = &t->req[req];
    unsigned long long bytes = 0, tokens = 0, read = 0;
    if (strcmp(verb, "saved") == 0) {
        on_saved(t, out, who, req, rest);
    } else if (strcmp(verb, "quorum") == 0) {
        on_quorum(t, out, who, req, rest);
    } else if (strcmp(verb, "stored") == 0 &&
               sscanf(rest, "%llu %llu %llu", &bytes, &tokens, &read) == 3) {
        q->store_bytes += bytes;
        q->store_tokens += tokens;
        q->read_bytes += read;
        q->loaded_ranks++;
    } else if (strcmp(verb, "store-miss") == 0) {
        fprintf(out, "  %-8s req-%u store load failed (pulled whole): %s\n",
                who, req, rest);
    } else {
        return false;
    }
    return true;
}

bool demo_tally_print(const demo_tally_t *t, FILE *out, uint64_t transfer_bytes)
{
    if (t == NULL)
        return true;
    uint32_t saved = 0, hits = 0, n = t->cfg->requests;
    uint64_t sbytes = 0, chunks = 0, lbytes = 0, ltokens = 0, read = 0;
    for (uint32_t r = 0; r < n; r++) {
        const tally_req_t *q = &t->req[r];
        saved += q->saved && q->status == KVR_OK;
        sbytes += q->saved_bytes;
        chunks += q->chunks;
        hits += q->store_tokens > 0;
        lbytes += q->store_bytes;
        ltokens += q->store_tokens;
        read += q->read_bytes;
    }
    uint32_t W = t->cfg->lay.dcp_size;
    if (t->cfg->save_to != NULL) {
        fprintf(out,
                "saved %u/%u requests to %s (every stage's layers: the "
                "head's PP quorum), %llu bytes in %llu chunks\n",
                saved, n, t->cfg->save_to, (unsigned long long)sbytes,
                (unsigned long long)chunks);
        return saved == n;
    }
    fprintf(out,
            "from the store: %llu bytes into the ranks (%u/%u requests hit, "
            "%llu tokens of prefix each on average; %llu chunk bytes read and "
            "checksummed); by transfer: %llu bytes\n",
            (unsigned long long)lbytes, hits, n,
            (unsigned long long)(ltokens / W / (hits ? hits : 1)),
            (unsigned long long)read, (unsigned long long)transfer_bytes);
    return true;
}

void demo_tally_json(const demo_tally_t *t, void *json_root)
{
    if (t == NULL)
        return;
    json_t *reqs = json_object_get(json_root, "requests");
    uint64_t saved = 0, lbytes = 0;
    for (uint32_t r = 0; r < t->cfg->requests; r++) {
        const tally_req_t *q = &t->req[r];
        json_t *e = json_array_get(reqs, r);
        json_object_set_new(e, "saved",
                            json_boolean(q->saved && q->status == KVR_OK));
        json_object_set_new(e, "store_bytes",
                            json_integer((json_int_t)q->store_bytes));
        json_object_set_new(
            e, "store_tokens",
            json_integer((json_int_t)(q->store_tokens / t->cfg->lay.dcp_size)));
        saved += q->saved && q->status == KVR_OK;
        lbytes += q->store_bytes;
    }
    json_object_set_new(json_root, "saved", json_integer((json_int_t)saved));
    json_object_set_new(json_root, "store_bytes",
                        json_integer((json_int_t)lbytes));
}

uint64_t demo_rank_bytes(const demo_cfg_t *cfg, uint32_t rank, uint32_t req,
                         const uint32_t *dst, size_t ndst, uint64_t tokens)
{
    kvr_layout_t lay = cfg->lay;
    lay.tp = lay.dcp_size;
    lay.producer_tp = cfg->producer_tp;
    uint32_t p = demo_instance_of(cfg, req), g = demo_group_of(cfg, req);
    uint32_t n = demo_region(cfg, 0, false, p, NULL);
    kvr_region_pair_t *pairs = calloc(n + 1, sizeof *pairs);
    uint32_t *src = calloc(demo_src_pool(cfg, p) + 1, sizeof *src);
    uint64_t bytes = 0;
    kvr_plan_set_t *set = NULL;
    if (pairs != NULL && src != NULL && tokens > 0) {
        for (uint32_t i = 0; i < n; i++) {
            demo_region(cfg, i, false, p, &pairs[i].src);
            demo_region(cfg, i, true, g, &pairs[i].dst);
        }
        demo_src_blocks(cfg, req, src);
        kvr_request_t r = {src,    (size_t)kvr_num_src_blocks(&lay, tokens),
                           dst,    ndst,
                           tokens, 0};
        if (kvr_plan_set_create(&lay, rank, pairs, n, &r, &set, NULL) == KVR_OK)
            bytes = kvr_plan_set_total_bytes(set);
    }
    kvr_plan_set_destroy(set);
    free(pairs);
    free(src);
    return bytes;
}
