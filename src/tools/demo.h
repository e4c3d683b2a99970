/* The demo deployment shared by `kvrelay serve`, `push` and `demo`: the
 * headline layout, the synthetic requests (a pure function of the seed, so
 * every process derives the same tables and token ids) and verification. */
#ifndef CLI_TOOLS_DEMO_H
#define CLI_TOOLS_DEMO_H

#include <stdbool.h>
#include <stdint.h>

#include "kvrelay/agent.h"
#include "kvrelay/base.h"

#define DEMO_MAX_REQUESTS 256u
#define DEMO_MAX_LAYERS 512u

typedef struct demo_cfg {
    kvr_layout_t lay;
    uint32_t pp;          /* producer stages */
    uint32_t producer_tp; /* producer TP ranks per stage */
    uint32_t layers;      /* model layers, all with an MLA region */
    uint32_t index_every; /* layers with layer % index_every == 0 have INDEX */
    uint32_t index_dim;
    uint32_t token_bytes;
    /* --model gqa (docs/design.md §18): head-sharded dense K/V regions,
     * one per layer, instead of MLA and index */
    bool gqa;
    uint32_t kv_heads, head_dim; /* --kv-heads (8), --head-dim (128) */
    bool hnd;                    /* --hnd page order (NHD by default) */
    uint32_t requests;
    uint32_t instances;   /* prefill instances (request i: i mod P) */
    uint32_t groups;      /* decode groups (request i: i mod G) */
    uint32_t abort_every; /* the consumer aborts every Nth request (0 no) */
    uint64_t tokens;
    uint64_t seed;
    bool reuse; /* the last request reuses request 0's prefix */
    uint32_t deadline_ms;
    uint32_t run_timeout_ms;
    kvr_agent_tl_t tl;
    kvr_agent_exec_t exec;
    uint32_t staging_slots;
    uint64_t slot_bytes;
    const char *key_file;
    bool insecure;
    const char *fault; /* --fault: a failpoint (docs/failpoints.md) or NULL */
    char fault_key[KVR_FAILPOINT_KEY_MAX]; /* the request id it acts on */
    int fault_target; /* rank (serve) or stage (push) it applies to; -1 all */
    bool verbose;
    const char *dump_dir; /* --dump DIR: region images and a manifest */
    bool use_cuda;        /* demo --device cuda */
    int cuda_device;      /* serve/push --cuda-device N; -1 host memory */

    /* the offload store (docs/store.md "In the demo") */
    const char *save_to;   /* --save-to DIR: stages save every request */
    const char *load_from; /* --load-from DIR: ranks load cached prefixes */
    uint64_t chunk;        /* --chunk: store chunk tokens (0: bs * W) */
} demo_cfg_t;

void demo_cfg_init(demo_cfg_t *cfg);
/* The layout every process uses: consumer TP (--tp, default W), producer
 * TP (--producer-tp, at least W_p) filled in. */
kvr_layout_t demo_layout(const demo_cfg_t *cfg);
/* Decode ranks per group (consumer TP) and producer tp ranks per stage. */
uint32_t demo_ranks(const demo_cfg_t *cfg);
uint32_t demo_producer_tp(const demo_cfg_t *cfg);
/* The rank a process plans and fills on: its tp rank for head-sharded
 * dense regions, its DCP rank (tp rank % W, or % W_p) otherwise. */
uint32_t demo_plan_rank(const demo_cfg_t *cfg, bool consumer, uint32_t tp);
/* Whether producer tp rank tp is a source of any decode rank (with more
 * producer replicas of a head than decode ranks taking it, some are not:
 * such a stage opens nothing and ends at once). */
bool demo_stage_serves(const demo_cfg_t *cfg, uint32_t tp);
/* Parses one shared option (long name without "--" and its value); returns
 * 1 if it was one, 0 if not, -1 (message printed) if its value is bad. */
int demo_cfg_option(demo_cfg_t *cfg, const char *cmd, const char *name,
                    const char *value);
/* Arms the --fault failpoint when it applies to this process (rank of a
 * serve or stage of a push). */
kvr_status_t demo_arm_fault(const demo_cfg_t *cfg, uint32_t who,
                            kvr_error_t *err);
/* Checks the whole configuration; prints one line and returns false if bad. */
bool demo_cfg_check(const demo_cfg_t *cfg, const char *cmd);
/* argv fragment reproducing cfg for a child process (static storage). */
int demo_cfg_args(const demo_cfg_t *cfg, char **argv, int max);
extern const char demo_options_help[];

void demo_stage_layers(const demo_cfg_t *cfg, uint32_t stage, uint32_t *start,
                       uint32_t *end);
uint64_t demo_tokens(const demo_cfg_t *cfg, uint32_t req);
uint32_t demo_token_id(const demo_cfg_t *cfg, uint32_t req, uint64_t pos);
void demo_request_id(uint32_t req, char *buf, size_t len);
bool demo_parse_request_id(const char *bytes, size_t len, uint32_t *req);
/* Which prefill instance prefills request req (req mod P) and which decode
 * group loads it (req mod G; the prefix-reusing request goes where request
 * 0's prefix is cached: the group of request 0). */
uint32_t demo_instance_of(const demo_cfg_t *cfg, uint32_t req);
uint32_t demo_group_of(const demo_cfg_t *cfg, uint32_t req);
/* Whether request req reuses request 0's prefix (the last one, unless
 * --no-reuse). */
bool demo_reuses(const demo_cfg_t *cfg, uint32_t req);
/* Requests of instance p (group g when by_group). */
uint32_t demo_count(const demo_cfg_t *cfg, uint32_t who, bool by_group);
/* Whether the consumer aborts request req (--abort N: every Nth). */
bool demo_aborts(const demo_cfg_t *cfg, uint32_t req);
/* Instance ids: "prefill-P" and "decode-G". */
void demo_instance_id(bool consumer, uint32_t who, char *buf, size_t len);
/* Source block table of a request (ceil(N/bs) ids) and the pool size of
 * its instance; destination pool of a group. */
void demo_src_blocks(const demo_cfg_t *cfg, uint32_t req, uint32_t *out);
uint32_t demo_src_pool(const demo_cfg_t *cfg, uint32_t instance);
uint32_t demo_dst_pool(const demo_cfg_t *cfg, uint32_t group);
/* Region i of the model on one side (MLA regions first, then INDEX), with
 * the pool of instance / group `who`; returns the number of regions when
 * desc is NULL. */
uint32_t demo_region(const demo_cfg_t *cfg, uint32_t i, bool consumer,
                     uint32_t who, kvr_region_desc_t *desc);
/* Agent parameters every demo process derives from the configuration
 * (instance_id: a buffer that outlives the call). */
kvr_agent_params_t demo_agent_params(const demo_cfg_t *cfg,
                                     kvr_agent_role_t role,
                                     const kvr_wire_topo_t *topo,
                                     const uint8_t *key,
                                     const char *instance_id);
/* kvr_agent_create, then the settings serve and push must agree on beyond
 * the layout (the workload every process derives its requests from), sent
 * in HELLO so that a mismatch is refused at handshake naming the option. */
kvr_status_t demo_agent_create(const demo_cfg_t *cfg,
                               const kvr_agent_params_t *p, kvr_agent_t **agent,
                               kvr_error_t *err);
kvr_status_t demo_load_key(const demo_cfg_t *cfg, uint8_t *key, bool *have,
                           kvr_error_t *err);
/* A request loaded on one rank: what verification needs. */
typedef struct demo_load {
    uint32_t req;
    uint64_t num_tokens;
    const uint32_t *dst;
    size_t ndst;
} demo_load_t;
/* Verifies a loaded request on one rank against the synthetic source: every
 * token the rank holds, at the position the layout math gives; index scales
 * against their keys. */
kvr_status_t demo_verify(const demo_cfg_t *cfg, uint32_t rank,
                         const kvr_region_desc_t *descs, void *const *bases,
                         uint32_t num_regions, const demo_load_t *ld,
                         kvr_error_t *err);

/* Parses argv: shared options plus the command's own (own returns 1 if it
 * took the option, 0 if unknown, -1 on a bad value). own_flags lists the
 * command's options that take no value. Returns -1 to go on, else the exit
 * code (0 after --help). */
typedef int (*demo_own_fn)(void *ctx, const char *name, const char *value);
int demo_parse(int argc, char **argv, demo_cfg_t *cfg, const char *cmd,
               const char *usage, const char *const *own_flags, demo_own_fn own,
               void *ctx);
/* Dump files (docs/dump-format.md): "src-L003-mla.bin" (rank < 0) or
 * "dst-r1-L003-mla.bin". */
void demo_image_name(char *buf, size_t len, int rank,
                     const kvr_region_desc_t *d);
/* Writes len bytes to DIR/name; false with a message on stderr. */
bool demo_write_file(const char *dir, const char *name, const void *data,
                     uint64_t len);
#endif
