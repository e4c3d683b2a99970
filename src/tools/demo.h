/* The demo deployment shared by `kvrelay serve`, `push` and `demo`: the
 * headline layout, the synthetic requests (a pure function of the seed, so
 * every process derives the same tables and token ids) and verification. */
#ifndef KVRELAY_TOOLS_DEMO_H
#define KVRELAY_TOOLS_DEMO_H

#include <stdbool.h>
#include <stdint.h>

#include "kvrelay/conn.h"

#define KVR_DEMO_MAX_REQUESTS 256u
#define KVR_DEMO_MAX_LAYERS 512u

typedef struct kvr_demo_cfg {
    kvr_layout_t lay;
    uint32_t pp;           /* producer stages */
    uint32_t producer_tp;  /* producer TP ranks per stage */
    uint32_t layers;       /* model layers, all with an MLA region */
    uint32_t index_every;  /* layers with layer % index_every == 0 have INDEX */
    uint32_t index_dim;
    uint32_t token_bytes;
    uint32_t requests;
    uint64_t tokens;
    uint64_t seed;
    bool reuse;            /* the last request reuses request 0's prefix */
    uint32_t deadline_ms;
    uint32_t run_timeout_ms;
    kvr_conn_tl_t tl;
    kvr_conn_exec_t exec;
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
} kvr_demo_cfg_t;

void kvr_demo_cfg_init(kvr_demo_cfg_t *cfg);
/* Parses one shared option (long name without "--" and its value); returns
 * 1 if it was one, 0 if not, -1 (message printed) if its value is bad. */
int kvr_demo_option(kvr_demo_cfg_t *cfg, const char *cmd, const char *name,
                    const char *value);
/* Arms the --fault failpoint when it applies to this process (rank of a
 * serve or stage of a push). */
kvr_status_t kvr_demo_arm_fault(const kvr_demo_cfg_t *cfg, uint32_t who,
                                kvr_error_t *err);
/* Checks the whole configuration; prints one line and returns false if bad. */
bool kvr_demo_cfg_check(const kvr_demo_cfg_t *cfg, const char *cmd);
/* argv fragment reproducing cfg for a child process (static storage). */
int kvr_demo_cfg_args(const kvr_demo_cfg_t *cfg, char **argv, int max);
extern const char kvr_demo_options_help[];

void kvr_demo_stage_layers(const kvr_demo_cfg_t *cfg, uint32_t stage,
                           uint32_t *start, uint32_t *end);
uint64_t kvr_demo_tokens(const kvr_demo_cfg_t *cfg, uint32_t req);
uint32_t kvr_demo_token_id(const kvr_demo_cfg_t *cfg, uint32_t req, uint64_t pos);
void kvr_demo_request_id(uint32_t req, char *buf, size_t len);
bool kvr_demo_parse_request_id(const char *bytes, size_t len, uint32_t *req);
/* Source block table of a request (ceil(N/bs) ids) and the pool size. */
void kvr_demo_src_blocks(const kvr_demo_cfg_t *cfg, uint32_t req, uint32_t *out);
uint32_t kvr_demo_src_pool(const kvr_demo_cfg_t *cfg);
uint32_t kvr_demo_dst_pool(const kvr_demo_cfg_t *cfg);
/* Region i of the model on one side (MLA regions first, then INDEX); returns
 * the number of regions when desc is NULL. */
uint32_t kvr_demo_region(const kvr_demo_cfg_t *cfg, uint32_t i, bool consumer,
                         kvr_region_desc_t *desc);
/* Connector parameters every demo process derives from the configuration. */
kvr_conn_params_t kvr_demo_conn_params(const kvr_demo_cfg_t *cfg,
                                       kvr_wire_side_t side,
                                       const kvr_wire_topo_t *topo,
                                       const uint8_t *key);
kvr_status_t kvr_demo_load_key(const kvr_demo_cfg_t *cfg, uint8_t *key,
                               bool *have, kvr_error_t *err);
/* Verifies a loaded request on one rank against the synthetic source: every
 * token the rank holds, at the position the layout math gives; index scales
 * against their keys. */
kvr_status_t kvr_demo_verify(const kvr_demo_cfg_t *cfg, uint32_t rank,
                             const kvr_region_desc_t *descs, void *const *bases,
                             uint32_t num_regions, const kvr_conn_event_t *ev,
                             kvr_error_t *err);



/* Parses argv: shared options plus the command's own (own returns 1 if it
 * took the option, 0 if unknown, -1 on a bad value). own_flags lists the
 * command's options that take no value. Returns -1 to go on, else the exit
 * code (0 after --help). */
typedef int (*kvr_demo_own_fn)(void *ctx, const char *name, const char *value);
int kvr_demo_parse(int argc, char **argv, kvr_demo_cfg_t *cfg, const char *cmd,
                   const char *usage, const char *const *own_flags,
                   kvr_demo_own_fn own, void *ctx);
/* Dump files (docs/dump-format.md): "src-L003-mla.bin" (rank < 0) or
 * "dst-r1-L003-mla.bin". */
void kvr_demo_image_name(char *buf, size_t len, int rank,
                         const kvr_region_desc_t *d);
/* Writes len bytes to DIR/name; false with a message on stderr. */
bool kvr_demo_write_file(const char *dir, const char *name, const void *data,
                         uint64_t len);
#endif
