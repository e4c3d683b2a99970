/* Demo deployment: configuration, synthetic requests, verification. */
#include "demo.h"
#include "demo_store.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "kvrelay/synth.h"
#include "layout_math.h"

const char demo_options_help[] =
    "layout and workload (the same on every process):\n"
    "  --block-size BS (64)  --dcp W (4)  --interleave I (1)\n"
    "  --replicate-index (default) | --sharded-index   --no-preshuffle\n"
    "  --pp STAGES (4)  --producer-tp T (1, or W_p)  --layers L (78)  "
    "--index-every K (3)\n"
    "  --producer-dcp W_p (1)  --producer-interleave I_p (1)  --tp T (W: "
    "decode ranks)\n"
    "  --producer-sharded-index (W_p > 1: needs I_p == bs; default "
    "replicated)\n"
    "  --model mla|gqa (gqa: --layers 32 of dense K/V, --kv-heads H (8) x\n"
    "    --head-dim D (128) x 2 bytes, head-sharded over TP; --hnd page "
    "order)\n"
    "  --index-dim D (128)\n"
    "  --token-bytes B (576)  --requests R (4)  --tokens N (3000)  --seed S "
    "(1)\n"
    "  --instances P (1 prefill instance of --pp stages; request i: i mod P)\n"
    "  --groups G (1 decode group of --dcp ranks; request i: i mod G)\n"
    "  --abort N (0; the consumer aborts every Nth request in flight)\n"
    "  --no-reuse (by default the last request reuses request 0's prefix)\n"
    "  --deadline-ms MS (30000)  --timeout SECONDS (120)\n"
    "  --transport auto|shm|tcp (auto)\n"
    "  --executor auto|direct|staged|gpu-direct (auto; CUDA KV: staged is\n"
    "    gpu-staged)\n"
    "  --staging-slots N (8)  --slot-bytes BYTES (4194304)\n"
    "  --key-file PATH (32-byte hex pre-shared key)  --insecure\n"
    "  --fault KIND:REQUEST_ID[@WHO]  (die-mid, refuse, wrong-nonce, "
    "dup-done:\n"
    "       push stage WHO; bad-blocks, die-assign, refuse-offer: serve rank\n"
    "       WHO (the router is rank 0); all if no @; store-enospc:*: every\n"
    "       chunk write fails, as on a full disk; REQUEST_ID * keys all)\n"
    "  --dump DIR (region images + manifest.json for `kvrelay inspect`)\n"
    "  --save-to DIR (stages save every request to a store while it is\n"
    "    pushed) | --load-from DIR (ranks load cached prefixes from it and\n"
    "    pull only the rest)  --chunk TOKENS (store chunk; bs * W)\n"
    "  --device host|cuda (demo: KV in GPU memory: gpu-direct through CUDA\n"
    "    IPC, or with --transport tcp gpu-staged or direct puts over a\n"
    "    CUDA-aware UCX; serve/push take --cuda-device N)\n"
    "  --verbose\n";

/* Names of the enum options, indexed by value; parsing and the argv a child
 * gets both read these. */
static const char *const tl_names[] = {"auto", "shm", "tcp"};
static const char *const exec_names[] = {"auto", "direct", "staged",
                                         "gpu-direct"};

void demo_cfg_init(demo_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->lay = (kvr_layout_t)KVR_LAYOUT_INIT;
    cfg->lay.dcp_size = 4;
    cfg->lay.tp = 0; /* --tp: W unless given */
    cfg->kv_heads = 8;
    cfg->head_dim = 128;
    cfg->lay.replicate_index = true;
    cfg->lay.producer_replicate_index = true;
    cfg->pp = 4;
    cfg->producer_tp = 1;
    cfg->layers = 78;
    cfg->index_every = 3;
    cfg->index_dim = 128;
    cfg->token_bytes = 576;
    cfg->requests = 4;
    cfg->instances = 1;
    cfg->groups = 1;
    cfg->tokens = 3000;
    cfg->seed = 1;
    cfg->reuse = true;
    cfg->deadline_ms = 30000;
    cfg->run_timeout_ms = 120000;
    cfg->staging_slots = 8;
    cfg->slot_bytes = 4u << 20;
    cfg->fault_target = -1;
    cfg->cuda_device = -1;
}

kvr_status_t demo_arm_fault(const demo_cfg_t *cfg, uint32_t who,
                            kvr_error_t *err)
{
    if (cfg->fault == NULL ||
        (cfg->fault_target >= 0 && (uint32_t)cfg->fault_target != who))
        return KVR_OK;
    /* "*": every key (store-enospc is keyed by chunk file names) */
    const char *key = strcmp(cfg->fault_key, "*") == 0 ? "" : cfg->fault_key;
    return kvr_failpoint_arm(cfg->fault, key, err);
}

static int parse_enum(const char *cmd, const char *name, const char *value,
                      const char *const *names, int n, int *out)
{
    for (int i = 0; i < n; i++)
        if (strcmp(value, names[i]) == 0) {
            *out = i;
            return 1;
        }
    cli_usage_error(cmd, "--%s: '%s' is not one of %s|%s%s%s", name, value,
                    names[0], names[1], n > 2 ? "|" : "",
                    n > 2 ? names[2] : "");
    return -1;
}

/* --fault KIND:REQUEST_ID[@WHO]: KIND names a failpoint. */
static int parse_fault(demo_cfg_t *cfg, const char *cmd, const char *value)
{
    const char *colon = strchr(value, ':');
    const char *at = colon ? strchr(colon, '@') : NULL;
    uint64_t target = 0;
    size_t idlen = colon ? (at ? (size_t)(at - colon - 1) : strlen(colon + 1))
                         : 0;
    bool target_ok = at == NULL || cli_parse_u64(at + 1, 0, 63, &target);
    char kinds[256] = "";
    const char *name;
    for (uint32_t k = 0; (name = kvr_failpoint_name(k)) != NULL; k++) {
        if (colon != NULL && target_ok &&
            strlen(name) == (size_t)(colon - value) &&
            strncmp(value, name, (size_t)(colon - value)) == 0 && idlen > 0 &&
            idlen < sizeof(cfg->fault_key)) {
            cfg->fault = name;
            snprintf(cfg->fault_key, sizeof(cfg->fault_key), "%.*s", (int)idlen,
                     colon + 1);
            cfg->fault_target = at ? (int)target : -1;
            return 1;
        }
        size_t used = strlen(kinds);
        snprintf(kinds + used, sizeof(kinds) - used, "%s%s", k ? ", " : "",
                 name);
    }
    cli_usage_error(cmd,
                    "--fault '%s': expected KIND:REQUEST_ID[@WHO], KIND one "
                    "of %s",
                    value, kinds);
    return -1;
}

typedef struct {
    const char *name;
    size_t offset;
    int width; /* 4 or 8 */
    uint64_t min, max;
} num_opt_t;

#define NUM(n, f, w, lo, hi)                                                   \
    {                                                                          \
        n, offsetof(demo_cfg_t, f), w, lo, hi                                  \
    }
static const num_opt_t num_opts[] = {
    NUM("block-size", lay.block_size, 4, 1, 1024),
    NUM("dcp", lay.dcp_size, 4, 1, 64),
    NUM("interleave", lay.interleave, 4, 1, 1024),
    NUM("pp", pp, 4, 1, 64),
    NUM("producer-tp", producer_tp, 4, 1, 64),
    NUM("producer-dcp", lay.producer_dcp, 4, 0, 64),
    NUM("producer-interleave", lay.producer_interleave, 4, 0, 1024),
    NUM("tp", lay.tp, 4, 0, 64),
    NUM("kv-heads", kv_heads, 4, 1, 256),
    NUM("head-dim", head_dim, 4, 1, 1024),
    NUM("layers", layers, 4, 1, DEMO_MAX_LAYERS),
    NUM("index-every", index_every, 4, 0, DEMO_MAX_LAYERS),
    NUM("index-dim", index_dim, 4, 16, 1024),
    NUM("token-bytes", token_bytes, 4, 1, 65536),
    NUM("requests", requests, 4, 1, DEMO_MAX_REQUESTS),
    NUM("instances", instances, 4, 1, 64),
    NUM("groups", groups, 4, 1, 64),
    NUM("abort", abort_every, 4, 0, DEMO_MAX_REQUESTS),
    NUM("tokens", tokens, 8, 1, 1u << 20),
    NUM("seed", seed, 8, 0, UINT64_MAX - 1),
    NUM("deadline-ms", deadline_ms, 4, 1, 3600000),
    NUM("staging-slots", staging_slots, 4, 1, 1024),
    NUM("slot-bytes", slot_bytes, 8, 4096, 1u << 30),
    NUM("chunk", chunk, 8, 0, 1u << 20),
};

static int number(demo_cfg_t *cfg, const char *cmd, const num_opt_t *o,
                  const char *value)
{
    uint64_t v;
    if (!cli_parse_u64(value, o->min, o->max, &v)) {
        cli_usage_error(cmd, "--%s: '%s' is not a number in [%llu, %llu]",
                        o->name, value, (unsigned long long)o->min,
                        (unsigned long long)o->max);
        return -1;
    }
    char *field = (char *)cfg + o->offset;
    if (o->width == 4)
        *(uint32_t *)(void *)field = (uint32_t)v;
    else
        *(uint64_t *)(void *)field = v;
    return 1;
}

/* gqa: 32 dense layers and no index, unless --layers / --index-every
 * were given before it. */
static void set_model(demo_cfg_t *cfg, bool gqa)
{
    cfg->gqa = gqa;
    if (gqa && cfg->layers == 78)
        cfg->layers = 32;
    if (gqa)
        cfg->index_every = 0;
}

kvr_layout_t demo_layout(const demo_cfg_t *cfg)
{
    kvr_layout_t lay = cfg->lay;
    lay.tp = demo_ranks(cfg);
    lay.producer_tp = demo_producer_tp(cfg);
    return lay;
}

uint32_t demo_ranks(const demo_cfg_t *cfg)
{
    return cfg->lay.tp ? cfg->lay.tp : cfg->lay.dcp_size;
}

uint32_t demo_producer_tp(const demo_cfg_t *cfg)
{
    uint32_t Wp = kvr_producer_dcp(&cfg->lay);
    return cfg->producer_tp == 1 && Wp > 1 ? Wp : cfg->producer_tp;
}

uint32_t demo_plan_rank(const demo_cfg_t *cfg, bool consumer, uint32_t tp)
{
    if (cfg->gqa)
        return tp;
    return tp % (consumer ? cfg->lay.dcp_size : kvr_producer_dcp(&cfg->lay));
}

int demo_cfg_option(demo_cfg_t *cfg, const char *cmd, const char *name,
                    const char *value)
{
    for (size_t i = 0; i < sizeof(num_opts) / sizeof(num_opts[0]); i++)
        if (strcmp(name, num_opts[i].name) == 0)
            return number(cfg, cmd, &num_opts[i], value);
    int e = 0, rc = 1;
    if (strcmp(name, "replicate-index") == 0)
        cfg->lay.replicate_index = true;
    else if (strcmp(name, "sharded-index") == 0)
        cfg->lay.replicate_index = false;
    else if (strcmp(name, "no-preshuffle") == 0)
        cfg->lay.preshuffle = false;
    else if (strcmp(name, "hnd") == 0)
        cfg->hnd = true;
    else if (strcmp(name, "producer-sharded-index") == 0)
        cfg->lay.producer_replicate_index = false;
    else if (strcmp(name, "model") == 0) {
        static const char *const models[] = {"mla", "gqa"};
        rc = parse_enum(cmd, name, value, models, 2, &e);
        set_model(cfg, e == 1);
    } else if (strcmp(name, "no-reuse") == 0)
        cfg->reuse = false;
    else if (strcmp(name, "insecure") == 0)
        cfg->insecure = true;
    else if (strcmp(name, "verbose") == 0)
        cfg->verbose = true;
    else if (strcmp(name, "key-file") == 0)
        cfg->key_file = value;
    else if (strcmp(name, "dump") == 0)
        cfg->dump_dir = value;
    else if (strcmp(name, "save-to") == 0)
        cfg->save_to = value;
    else if (strcmp(name, "load-from") == 0)
        cfg->load_from = value;
    else if (strcmp(name, "device") == 0) {
        static const char *const kinds[] = {"host", "cuda"};
        rc = parse_enum(cmd, name, value, kinds, 2, &e);
        cfg->use_cuda = e == 1;
    } else if (strcmp(name, "cuda-device") == 0) {
        uint64_t d;
        if (!cli_parse_u64(value, 0, 63, &d)) {
            cli_usage_error(cmd, "--cuda-device: '%s' is not in [0, 63]",
                            value);
            return -1;
        }
        cfg->cuda_device = (int)d;
    } else if (strcmp(name, "fault") == 0)
        return parse_fault(cfg, cmd, value);
    else if (strcmp(name, "timeout") == 0) {
        uint64_t s;
        if (!cli_parse_u64(value, 1, 86400, &s)) {
            cli_usage_error(cmd, "--timeout: '%s' is not seconds in [1, 86400]",
                            value);
            return -1;
        }
        cfg->run_timeout_ms = (uint32_t)(s * 1000);
    } else if (strcmp(name, "transport") == 0) {
        rc = parse_enum(cmd, name, value, tl_names, 3, &e);
        cfg->tl = (kvr_agent_tl_t)e;
    } else if (strcmp(name, "executor") == 0) {
        rc = parse_enum(cmd, name, value, exec_names, 4, &e);
        cfg->exec = (kvr_agent_exec_t)e;
    } else
        return 0;
    return rc;
}

/* The model's layout and largest request as `kvrelay plan` sees them: every
 * region pair, the last request's source table and an identity
 * destination table, on rank 0 (the planner's rules do not depend on the
 * rank). Pair layouts (a sharded producer, a TP reshard) are checked per
 * pair by check_sources instead. */
static bool plan_check(const demo_cfg_t *cfg, const char *cmd)
{
    kvr_layout_t lay = demo_layout(cfg);
    uint32_t last = cfg->requests - 1, p = demo_instance_of(cfg, last);
    uint32_t g = demo_group_of(cfg, last);
    uint32_t n = demo_region(cfg, 0, false, p, NULL);
    uint64_t N = demo_tokens(cfg, last);
    size_t nsrc = (size_t)kvr_num_src_blocks(&lay, N);
    size_t ndst = (size_t)kvr_num_dst_blocks(&lay, N);
    kvr_region_pair_t *pairs = calloc(n, sizeof(*pairs));
    uint32_t *src = calloc(demo_src_pool(cfg, p) + 1, sizeof(*src));
    uint32_t *dst = calloc(ndst + 1, sizeof(*dst));
    bool ok = pairs && src && dst;
    if (!ok)
        cli_usage_error(cmd, "no memory to check the layout");
    for (uint32_t i = 0; ok && i < n; i++) {
        demo_region(cfg, i, false, p, &pairs[i].src);
        demo_region(cfg, i, true, g, &pairs[i].dst);
    }
    for (size_t j = 0; ok && j < ndst; j++)
        dst[j] = (uint32_t)j;
    if (ok) {
        demo_src_blocks(cfg, last, src);
        kvr_request_t req = {src, nsrc, dst, ndst, N, 0};
        ok = cli_check_plan(cmd, &lay, 0, pairs, n, &req, NULL);
    }
    free(pairs);
    free(src);
    free(dst);
    return ok;
}

/* The producer tp ranks some decode rank pulls from (bit t), or the
 * planner's refusal of the combination. */
static kvr_status_t all_sources(const demo_cfg_t *cfg, uint64_t *all,
                                kvr_error_t *err)
{
    kvr_layout_t lay = demo_layout(cfg);
    uint32_t n = demo_region(cfg, 0, true, 0, NULL);
    kvr_region_desc_t *regs = calloc(n + 1, sizeof(*regs));
    uint64_t mask = 0;
    kvr_status_t st = regs ? KVR_OK
                           : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint32_t i = 0; st == KVR_OK && i < n; i++)
        demo_region(cfg, i, true, 0, &regs[i]);
    *all = 0;
    for (uint32_t c = 0; st == KVR_OK && c < lay.tp; c++) {
        st = kvr_agent_sources(&lay, regs, n, true, c, &mask, err);
        *all |= mask;
    }
    free(regs);
    return st;
}

bool demo_stage_serves(const demo_cfg_t *cfg, uint32_t tp)
{
    uint64_t all = 0;
    return all_sources(cfg, &all, NULL) == KVR_OK && (all >> tp & 1);
}

/* Every decode rank's sources are planned: the planner's status names a
 * refused combination before any process starts. */
static bool check_sources(const demo_cfg_t *cfg, const char *cmd)
{
    uint64_t all = 0;
    kvr_error_t err = {0};
    if (all_sources(cfg, &all, &err) == KVR_OK)
        return true;
    cli_usage_error(cmd, "%s (%s)", err.msg, kvr_status_name(err.code));
    return false;
}

bool demo_cfg_check(const demo_cfg_t *cfg, const char *cmd)
{
    kvr_layout_t lay = demo_layout(cfg);
    kvr_error_t err = {0};
    if (kvr_layout_check(&lay, &err) != KVR_OK) {
        cli_usage_error(cmd, "%s", err.msg);
        return false;
    }
    if (cfg->pp > cfg->layers) {
        cli_usage_error(cmd, "--pp %u exceeds --layers %u", cfg->pp,
                        cfg->layers);
        return false;
    }
    if (cfg->dump_dir != NULL &&
        (cfg->gqa || !kvr_layout_producer_plain(&lay))) {
        cli_usage_error(cmd, "--dump writes MLA images of an unsharded "
                             "producer (no --model gqa, --producer-dcp)");
        return false;
    }
    if (cfg->dump_dir != NULL && (cfg->instances > 1 || cfg->groups > 1)) {
        cli_usage_error(cmd, "--dump writes the images of one instance and "
                             "one group: use --instances 1 --groups 1");
        return false;
    }
    if (cfg->exec == KVR_AGENT_EXEC_GPU_DIRECT &&
        !(cfg->use_cuda || cfg->cuda_device >= 0)) {
        cli_usage_error(cmd, "--executor gpu-direct needs KV in CUDA memory "
                             "(--device cuda)");
        return false;
    }
    if ((cfg->save_to != NULL || cfg->load_from != NULL) &&
        (cfg->gqa || !kvr_layout_producer_plain(&lay))) {
        cli_usage_error(cmd, "--save-to and --load-from store an unsharded "
                             "producer's MLA model (no --model gqa, "
                             "--producer-dcp)");
        return false;
    }
    if (!check_sources(cfg, cmd) || !demo_store_check(cfg, cmd))
        return false;
    bool heads_move = cfg->gqa && lay.tp != lay.producer_tp;
    return kvr_layout_producer_plain(&lay) && !heads_move
               ? plan_check(cfg, cmd)
               : true;
}

int demo_cfg_args(const demo_cfg_t *cfg, char **argv, int max)
{
    static char vals[32][40];
    static char fault[128];
    int n = 0, v = 0;
    for (size_t i = 0;
         i < sizeof(num_opts) / sizeof(num_opts[0]) && n + 2 < max; i++) {
        const char *field = (const char *)cfg + num_opts[i].offset;
        uint64_t x = num_opts[i].width == 4
                         ? *(const uint32_t *)(const void *)field
                         : *(const uint64_t *)(const void *)field;
        snprintf(vals[v], sizeof(vals[v]), "--%s=%llu", num_opts[i].name,
                 (unsigned long long)x);
        argv[n++] = vals[v++];
    }
    argv[n++] = cfg->lay.replicate_index ? "--replicate-index"
                                         : "--sharded-index";
    if (!cfg->lay.preshuffle)
        argv[n++] = "--no-preshuffle";
    if (cfg->gqa)
        argv[n++] = "--model=gqa";
    if (cfg->hnd)
        argv[n++] = "--hnd";
    if (!cfg->lay.producer_replicate_index)
        argv[n++] = "--producer-sharded-index";
    if (!cfg->reuse)
        argv[n++] = "--no-reuse";
    if (cfg->insecure)
        argv[n++] = "--insecure";
    if (cfg->verbose)
        argv[n++] = "--verbose";
    snprintf(vals[v], sizeof(vals[v]), "--timeout=%u",
             cfg->run_timeout_ms / 1000);
    argv[n++] = vals[v++];
    snprintf(vals[v], sizeof(vals[v]), "--transport=%s", tl_names[cfg->tl]);
    argv[n++] = vals[v++];
    snprintf(vals[v], sizeof(vals[v]), "--executor=%s", exec_names[cfg->exec]);
    argv[n++] = vals[v++];
    if (cfg->key_file != NULL) {
        argv[n++] = "--key-file";
        argv[n++] = (char *)cfg->key_file;
    }
    if (cfg->dump_dir != NULL) {
        argv[n++] = "--dump";
        argv[n++] = (char *)cfg->dump_dir;
    }
    if (demo_store_dir(cfg) != NULL) {
        argv[n++] = cfg->save_to ? "--save-to" : "--load-from";
        argv[n++] = (char *)demo_store_dir(cfg);
    }
    if (cfg->fault != NULL) {
        int len = snprintf(fault, sizeof(fault), "--fault=%s:%s", cfg->fault,
                           cfg->fault_key);
        if (cfg->fault_target >= 0 && len > 0 && (size_t)len < sizeof(fault))
            snprintf(fault + len, sizeof(fault) - (size_t)len, "@%d",
                     cfg->fault_target);
        argv[n++] = fault;
    }
    return n;
}

/* PP split: the remainder goes to the middle stages (78 / 4: 19 20 20 19). */
void demo_stage_layers(const demo_cfg_t *cfg, uint32_t stage, uint32_t *start,
                       uint32_t *end)
{
    uint32_t base = cfg->layers / cfg->pp, rem = cfg->layers % cfg->pp;
    uint32_t first_extra = (cfg->pp - rem) / 2, s = 0;
    for (uint32_t i = 0; i < stage; i++)
        s += base + (i >= first_extra && i < first_extra + rem);
    *start = s;
    *end = s + base + (stage >= first_extra && stage < first_extra + rem);
}

uint64_t demo_tokens(const demo_cfg_t *cfg, uint32_t req)
{
    return cfg->tokens + (uint64_t)req * 97u;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The reusing request starts with request 0's first half (whole virtual
 * blocks), so the leader's prefix cache hits. */
uint32_t demo_token_id(const demo_cfg_t *cfg, uint32_t req, uint64_t pos)
{
    uint64_t V = kvr_virtual_block(&cfg->lay);
    uint64_t shared = (cfg->tokens / 2) / V * V;
    if (demo_reuses(cfg, req) && pos < shared)
        req = 0;
    return (
        uint32_t)(mix(mix(cfg->seed ^ 0x70ce) ^ ((uint64_t)req << 40) ^ pos) %
                  151000u);
}

void demo_request_id(uint32_t req, char *buf, size_t len)
{
    snprintf(buf, len, "req-%u", req);
}

bool demo_parse_request_id(const char *bytes, size_t len, uint32_t *req)
{
    char buf[32];
    uint64_t v;
    if (len < 5 || len >= sizeof(buf) || memcmp(bytes, "req-", 4) != 0)
        return false;
    memcpy(buf, bytes + 4, len - 4);
    buf[len - 4] = '\0';
    if (!cli_parse_u64(buf, 0, DEMO_MAX_REQUESTS - 1, &v))
        return false;
    *req = (uint32_t)v;
    return true;
}

uint32_t demo_instance_of(const demo_cfg_t *cfg, uint32_t req)
{
    return req % cfg->instances;
}

bool demo_reuses(const demo_cfg_t *cfg, uint32_t req)
{
    return cfg->reuse && req > 0 && req + 1 == cfg->requests;
}

uint32_t demo_group_of(const demo_cfg_t *cfg, uint32_t req)
{
    return demo_reuses(cfg, req) ? demo_group_of(cfg, 0) : req % cfg->groups;
}

uint32_t demo_count(const demo_cfg_t *cfg, uint32_t who, bool by_group)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < cfg->requests; r++)
        n += (by_group ? demo_group_of(cfg, r) : demo_instance_of(cfg, r)) ==
             who;
    return n;
}

bool demo_aborts(const demo_cfg_t *cfg, uint32_t req)
{
    return cfg->abort_every > 0 && (req + 1) % cfg->abort_every == 0;
}

void demo_instance_id(bool consumer, uint32_t who, char *buf, size_t len)
{
    snprintf(buf, len, "%s-%u", consumer ? "decode" : "prefill", who);
}

/* Each instance's pool holds its own requests' blocks, each group's pool
 * its own requests' blocks. */
static uint32_t src_base(const demo_cfg_t *cfg, uint32_t req)
{
    uint32_t b = 0, p = demo_instance_of(cfg, req);
    for (uint32_t i = 0; i < req; i++)
        if (demo_instance_of(cfg, i) == p)
            b += (uint32_t)kvr_num_src_blocks(&cfg->lay, demo_tokens(cfg, i));
    return b;
}

uint32_t demo_src_pool(const demo_cfg_t *cfg, uint32_t instance)
{
    uint32_t b = 0;
    for (uint32_t i = 0; i < cfg->requests; i++)
        if (demo_instance_of(cfg, i) == instance)
            b += (uint32_t)kvr_num_src_blocks(&cfg->lay, demo_tokens(cfg, i));
    return b + 7;
}

uint32_t demo_dst_pool(const demo_cfg_t *cfg, uint32_t group)
{
    uint32_t b = 0;
    for (uint32_t i = 0; i < cfg->requests; i++)
        if (demo_group_of(cfg, i) == group)
            b += (uint32_t)kvr_num_dst_blocks(&cfg->lay, demo_tokens(cfg, i));
    return b + 3;
}

/* Request tables are slices of one seeded permutation of the pool, so
 * block ids are scattered but identical on every stage. */
void demo_src_blocks(const demo_cfg_t *cfg, uint32_t req, uint32_t *out)
{
    uint32_t pool = demo_src_pool(cfg, demo_instance_of(cfg, req));
    uint32_t base = src_base(cfg, req);
    uint32_t n = (uint32_t)kvr_num_src_blocks(&cfg->lay, demo_tokens(cfg, req));
    uint32_t *perm = malloc(pool * sizeof(*perm));
    if (perm == NULL)
        return;
    for (uint32_t i = 0; i < pool; i++)
        perm[i] = i;
    uint64_t s = cfg->seed;
    for (uint32_t i = pool; i > 1; i--) {
        s = mix(s);
        uint32_t j = (uint32_t)(s % i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    memcpy(out, perm + base, n * sizeof(*out));
    free(perm);
}

uint32_t demo_region(const demo_cfg_t *cfg, uint32_t i, bool consumer,
                     uint32_t who, kvr_region_desc_t *desc)
{
    uint32_t nidx = cfg->index_every ? (cfg->layers + cfg->index_every - 1) /
                                           cfg->index_every
                                     : 0;
    if (desc == NULL)
        return cfg->layers + nidx;
    kvr_region_desc_t d = {0};
    d.num_blocks = consumer ? demo_dst_pool(cfg, who) : demo_src_pool(cfg, who);
    if (i < cfg->layers && cfg->gqa) {
        kvr_layout_t lay = demo_layout(cfg);
        d.role = KVR_ROLE_DENSE;
        d.layer = i;
        d.heads = cfg->kv_heads;
        d.head_dim = cfg->head_dim;
        d.elem_bytes = 2;
        d.kv_planes = 2;
        d.hnd = cfg->hnd;
        d.page_bytes = kvr_dense_page_bytes(&lay, &d, consumer);
    } else if (i < cfg->layers) {
        d.role = KVR_ROLE_MLA;
        d.layer = i;
        d.page_bytes = (uint64_t)cfg->lay.block_size * cfg->token_bytes;
    } else {
        d.role = KVR_ROLE_INDEX;
        d.layer = (i - cfg->layers) * cfg->index_every;
        d.index_dim = d.quant_block = cfg->index_dim;
        d.page_bytes = kvr_index_page_tokens(&cfg->lay, consumer) *
                       kvr_index_stride(cfg->index_dim);
    }
    *desc = d;
    return cfg->layers + nidx;
}

kvr_agent_params_t demo_agent_params(const demo_cfg_t *cfg,
                                     kvr_agent_role_t role,
                                     const kvr_wire_topo_t *topo,
                                     const uint8_t *key,
                                     const char *instance_id)
{
    kvr_agent_params_t p = KVR_AGENT_PARAMS_INIT;
    p.instance_id = instance_id;
    p.instance_id_len = strlen(instance_id);
    p.role = role;
    p.layout = demo_layout(cfg);
    p.topo = *topo;
    p.key = key;
    p.insecure = cfg->insecure;
    p.tl = cfg->tl;
    p.executor = cfg->exec;
    p.deadline_ms = cfg->deadline_ms;
    /* sources stay for the whole run: a lease is not what ends a demo */
    p.lease_ms = cfg->run_timeout_ms < KVR_WIRE_DEADLINE_MAX_MS
                     ? cfg->run_timeout_ms
                     : KVR_WIRE_DEADLINE_MAX_MS;
    p.idle_close_ms = cfg->run_timeout_ms;
    p.connect_timeout_ms = 10000;
    /* an accepted link gets as long for its handshake as a dialler waits:
     * a demo runs dozens of processes on few cores */
    p.handshake_timeout_ms = p.connect_timeout_ms;
    p.cuda_device = cfg->cuda_device;
    return p;
}

/* Keys are the options' names: a refusal ("settings differ: requests=4 vs
 * requests=2") names the option to fix. */
static void settings_text(const demo_cfg_t *cfg, char *buf, size_t len)
{
    snprintf(buf, len,
             "requests=%u tokens=%llu seed=%llu reuse=%s layers=%u "
             "index-every=%u pp=%u instances=%u groups=%u abort=%u",
             cfg->requests, (unsigned long long)cfg->tokens,
             (unsigned long long)cfg->seed, cfg->reuse ? "yes" : "no",
             cfg->layers, cfg->index_every, cfg->pp, cfg->instances,
             cfg->groups, cfg->abort_every);
}

kvr_status_t demo_agent_create(const demo_cfg_t *cfg,
                               const kvr_agent_params_t *p, kvr_agent_t **agent,
                               kvr_error_t *err)
{
    char text[KVR_WIRE_TEXT_MAX + 1];
    kvr_status_t st = kvr_agent_create(p, agent, err);
    if (st != KVR_OK)
        return st;
    settings_text(cfg, text, sizeof(text));
    st = kvr_agent_set_settings(*agent, text);
    if (st != KVR_OK)
        return kvr_error_set(err, st, "%s", kvr_agent_last_error(*agent));
    return KVR_OK;
}

kvr_status_t demo_load_key(const demo_cfg_t *cfg, uint8_t *key, bool *have,
                           kvr_error_t *err)
{
    *have = false;
    if (cfg->key_file == NULL)
        return KVR_OK;
    kvr_status_t st = kvr_wire_key_load(cfg->key_file, key, err);
    *have = st == KVR_OK;
    return st;
}

static kvr_status_t mismatch(kvr_error_t *err, const kvr_region_desc_t *d,
                             uint32_t rank, uint64_t g, const char *part,
                             const uint8_t *want, const uint8_t *got, size_t n,
                             uint64_t off)
{
    size_t i = 0;
    while (i < n && want[i] == got[i])
        i++;
    return kvr_error_set(err, KVR_ERR_VERIFY,
                         "%s layer %u rank %u: token %llu %s byte %zu at dst "
                         "offset %llu: expected 0x%02x found 0x%02x",
                         kvr_role_name(d->role), d->layer, rank,
                         (unsigned long long)g, part, i,
                         (unsigned long long)(off + i), want[i], got[i]);
}

static kvr_status_t verify_index_token(const demo_cfg_t *cfg, uint32_t rank,
                                       const kvr_region_desc_t *d,
                                       const uint8_t *base,
                                       const demo_load_t *ev, uint64_t g,
                                       uint32_t tok, kvr_error_t *err)
{
    const kvr_layout_t *lay = &cfg->lay;
    uint64_t bs = lay->block_size, W = lay->dcp_size, V = bs * W,
             D = d->index_dim;
    bool repl = lay->replicate_index;
    uint64_t td = repl ? g % V : kvr__local(g, lay->interleave, W) % bs;
    uint64_t P = repl ? V : bs;
    const uint8_t *page = base + (uint64_t)ev->dst[g / V] * d->page_bytes;
    uint8_t key[1024], got[1024];
    kvr_synth_index_key(cfg->seed, d->layer, g, tok, key, (uint32_t)D);
    for (uint64_t i = 0; i < D; i++)
        got[i] = page[kvr__index_key_off(td, i, D, lay->preshuffle)];
    if (memcmp(key, got, D) != 0)
        return mismatch(err, d, rank, g, "key", key, got, D,
                        (uint64_t)(page - base) +
                            kvr__index_key_off(td, 0, D, lay->preshuffle));
    float want = kvr_synth_index_scale(key, (uint32_t)D);
    uint64_t so = kvr__index_scale_off(td, P, D);
    if (memcmp(&want, page + so, 4) != 0)
        return mismatch(err, d, rank, g, "scale", (const uint8_t *)&want,
                        page + so, 4, (uint64_t)(page - base) + so);
    return KVR_OK;
}

/* Dense K/V on tp rank `rank`: every head it holds of every token. */
static kvr_status_t verify_dense(const demo_cfg_t *cfg, uint32_t rank,
                                 uint32_t req, const kvr_region_desc_t *d,
                                 const uint8_t *base, const demo_load_t *ev,
                                 kvr_error_t *err)
{
    kvr_layout_t lay = demo_layout(cfg);
    uint32_t *ids = malloc((ev->num_tokens + 1) * sizeof(*ids));
    if (ids == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint64_t g = 0; g < ev->num_tokens; g++)
        ids[g] = demo_token_id(cfg, req, g);
    kvr_status_t st = kvr_synth_check_dense(&lay, d, rank, cfg->seed, ev->dst,
                                            ev->ndst, ids, 0, ev->num_tokens,
                                            base, err);
    free(ids);
    return st;
}

static kvr_status_t verify_region(const demo_cfg_t *cfg, uint32_t rank,
                                  uint32_t req, const kvr_region_desc_t *d,
                                  const uint8_t *base, const demo_load_t *ev,
                                  kvr_error_t *err)
{
    const kvr_layout_t *lay = &cfg->lay;
    uint64_t bs = lay->block_size, I = lay->interleave, W = lay->dcp_size;
    uint8_t want[65536];
    if (d->role == KVR_ROLE_DENSE)
        return verify_dense(cfg, rank, req, d, base, ev, err);
    for (uint64_t g = 0; g < ev->num_tokens; g++) {
        bool owned = kvr__owner(g, I, W) == rank;
        uint32_t tok = demo_token_id(cfg, req, g);
        kvr_status_t st = KVR_OK;
        if (d->role == KVR_ROLE_MLA && owned) {
            uint64_t off = kvr__dst_slot(ev->dst, g, bs, I, W) *
                           cfg->token_bytes;
            kvr_synth_latent(cfg->seed, d->layer, g, tok, want,
                             cfg->token_bytes);
            if (memcmp(want, base + off, cfg->token_bytes) != 0)
                st = mismatch(err, d, rank, g, "latent", want, base + off,
                              cfg->token_bytes, off);
        } else if (d->role == KVR_ROLE_INDEX &&
                   (lay->replicate_index || owned)) {
            st = verify_index_token(cfg, rank, d, base, ev, g, tok, err);
        }
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

/* The verifier reads every page it checks: ids must be inside the region. */
static kvr_status_t check_ids(const uint32_t *ids, uint64_t n,
                              const kvr_region_desc_t *d, kvr_error_t *err)
{
    for (uint64_t i = 0; i < n; i++)
        if (ids[i] >= d->num_blocks)
            return kvr_error_set(err, KVR_ERR_BLOCK_RANGE,
                                 "destination block "
                                 "id %u outside %s layer %u's %llu blocks",
                                 ids[i], kvr_role_name(d->role), d->layer,
                                 (unsigned long long)d->num_blocks);
    return KVR_OK;
}

kvr_status_t demo_verify(const demo_cfg_t *cfg, uint32_t rank,
                         const kvr_region_desc_t *descs, void *const *bases,
                         uint32_t num_regions, const demo_load_t *ev,
                         kvr_error_t *err)
{
    uint64_t need = kvr_num_dst_blocks(&cfg->lay, ev->num_tokens);
    if (ev->ndst < need || cfg->token_bytes > 65536)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%llu tokens need %llu "
                             "destination blocks, the table has %zu",
                             (unsigned long long)ev->num_tokens,
                             (unsigned long long)need, ev->ndst);
    for (uint32_t i = 0; i < num_regions; i++) {
        kvr_status_t st = check_ids(ev->dst, need, &descs[i], err);
        if (st == KVR_OK)
            st = verify_region(cfg, rank, ev->req, &descs[i], bases[i], ev,
                               err);
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

static bool in_list(const char *const *list, const char *name)
{
    for (size_t i = 0; list != NULL && list[i] != NULL; i++)
        if (strcmp(list[i], name) == 0)
            return true;
    return false;
}

static const char *const shared_flags[] = {"replicate-index",
                                           "hnd",
                                           "producer-sharded-index",
                                           "sharded-index",
                                           "no-preshuffle",
                                           "no-reuse",
                                           "insecure",
                                           "verbose",
                                           NULL};

static int one_option(int argc, char **argv, int *i, demo_cfg_t *cfg,
                      const char *cmd, const char *const *own_flags,
                      demo_own_fn own, void *ctx)
{
    char name[64];
    const char *arg = argv[*i] + 2, *eq = strchr(arg, '='), *value = NULL;
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    if (len >= sizeof(name))
        return cli_usage_error(cmd, "unknown option '%s'", argv[*i]);
    memcpy(name, arg, len);
    name[len] = '\0';
    bool flag = in_list(shared_flags, name) || in_list(own_flags, name);
    if (!flag && eq)
        value = eq + 1;
    else if (!flag && *i + 1 < argc)
        value = argv[++*i];
    else if (!flag)
        return cli_usage_error(cmd, "option '--%s' needs a value", name);
    int rc = own ? own(ctx, name, value) : 0;
    if (rc == 0)
        rc = demo_cfg_option(cfg, cmd, name, value);
    if (rc == 0)
        return cli_usage_error(cmd, "unknown option '--%s' (see --help)", name);
    return rc < 0 ? CLI_EXIT_USAGE : -1;
}

int demo_parse(int argc, char **argv, demo_cfg_t *cfg, const char *cmd,
               const char *usage, const char *const *own_flags, demo_own_fn own,
               void *ctx)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            fputs(demo_options_help, stdout);
            return CLI_EXIT_OK;
        }
        if (strncmp(argv[i], "--", 2) != 0)
            return cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        int rc = one_option(argc, argv, &i, cfg, cmd, own_flags, own, ctx);
        if (rc >= 0)
            return rc;
    }
    return demo_cfg_check(cfg, cmd) ? -1 : CLI_EXIT_USAGE;
}

void demo_image_name(char *buf, size_t len, int rank,
                     const kvr_region_desc_t *d)
{
    if (rank < 0)
        snprintf(buf, len, "src-L%03u-%s.bin", d->layer,
                 kvr_role_name(d->role));
    else
        snprintf(buf, len, "dst-r%d-L%03u-%s.bin", rank, d->layer,
                 kvr_role_name(d->role));
}

bool demo_write_file(const char *dir, const char *name, const void *data,
                     uint64_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    bool ok = f != NULL && fwrite(data, 1, len, f) == len;
    if (f != NULL && fclose(f) != 0)
        ok = false;
    if (!ok)
        fprintf(stderr, "kvrelay: cannot write %s\n", path);
    return ok;
}
