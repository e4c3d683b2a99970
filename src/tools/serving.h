/* `kvrelay bench serving`: a trace of requests through real agents in
 * separate processes (docs/performance.md). The configuration, the trace
 * (arrivals, lengths, the simulated prefill's layer times) and the block
 * tables are pure functions of the options, so every process derives the
 * same ones; the supervisor only says when each phase starts. */
#ifndef CLI_TOOLS_SERVING_H
#define CLI_TOOLS_SERVING_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "demo.h"

#define SV_MAX_REQUESTS 4096u
#define SV_MAX_PASSES 2u
#define SV_MAX_REPS 9u /* repetitions of the passes, each with a ceiling */
#ifndef SV_SMALL_REPS /* profiling builds may set more */
#define SV_SMALL_REPS 40u
#endif
/* One-block requests paced this far apart: each finds the system idle
 * (every rank's load and the stages' releases of the one before done);
 * profiling builds may set 0, no paced requests */
#ifndef SV_SMALL_PACE_NS
#define SV_SMALL_PACE_NS 2000000ull
#endif

typedef enum { SV_DIST_FIXED, SV_DIST_UNIFORM, SV_DIST_FILE } sv_dist_t;

typedef struct sv_cfg {
    demo_cfg_t d; /* layout, model, instances, groups, transport, seed */
    uint32_t requests;
    double rate;       /* Poisson arrivals per second; 0: all at once */
    sv_dist_t dist;
    uint64_t dist_a, dist_b; /* fixed:A, uniform:A:B */
    uint64_t *file_tokens;   /* a file of lengths, used cyclically */
    uint32_t file_n;
    double prefill_us;    /* simulated prefill: µs per layer per 1k tokens */
    uint32_t layer_group; /* layers per send_ready */
    bool stream[SV_MAX_PASSES]; /* one trace pass per entry */
    uint32_t passes;
    uint32_t reps; /* the passes and a ceiling after them, this often */
    uint64_t pool_tokens; /* destination pool per group; 0: every request's */
    bool distinct_src;    /* each request its own source blocks */
    /* block tables in address order, not shuffled: the source's, the
     * destination's */
    bool sorted_src, sorted_dst;
    /* decode ranks run their agent's progress thread and wait on its event
     * fd; else (host KV: the default) they have none and drive the agent
     * in their waits (kvr_agent_wait) */
    bool decode_thread;
    bool decode_progress_set;
    /* --prefill gpu: the simulated prefill is compute on each stage's GPU,
     * its layer groups handed over with CUDA events ahead of it */
    bool prefill_gpu;
    const char *json_path;
} sv_cfg_t;

/* The trace: every time is ns after the pass's start (T0). */
typedef struct sv_trace {
    uint32_t n;
    uint64_t *tokens;
    uint64_t *arrival;     /* request reaches prefill (and its decode group) */
    uint64_t *stage_start; /* [n * pp]: stage s starts request i's layers */
    uint64_t *layer_ns;    /* per layer of request i */
    uint64_t *dst_start;   /* position in its group's destination ring */
    uint64_t pool_vblocks; /* destination ring per group, virtual blocks */
    uint64_t src_tokens;   /* tokens the shared source table covers */
    uint64_t *src_at;      /* distinct sources: request i's first block */
    uint64_t src_blocks;   /* blocks of each instance's source table */
    uint64_t ceiling_tokens;
    uint64_t total_tokens;
} sv_trace_t;

/* Parses argv (demo's shared options plus the bench's own); -1 to go on,
 * else the exit code (2 naming the bad value). */
int sv_parse(int argc, char **argv, sv_cfg_t *cfg);
void sv_cfg_free(sv_cfg_t *cfg);
/* Builds the trace; false with a message on stderr (exit 2). */
bool sv_trace_build(const sv_cfg_t *cfg, sv_trace_t *t);
void sv_trace_free(sv_trace_t *t);

/* When layer `layer` (global) of request i is ready on its stage. */
uint64_t sv_layer_ready(const sv_cfg_t *cfg, const sv_trace_t *t, uint32_t i,
                        uint32_t stage, uint32_t layer);
/* The prefill's end: the last stage's last layer. */
uint64_t sv_prefill_end(const sv_cfg_t *cfg, const sv_trace_t *t, uint32_t i);
/* Virtual blocks a request of n tokens takes. */
uint64_t sv_vblocks(const sv_cfg_t *cfg, uint64_t n);
/* The shared source table (a seeded permutation of the instance's pool,
 * every request reads a prefix of it) and the group's destination ring. */
uint32_t sv_src_pool(const sv_trace_t *t, const sv_cfg_t *cfg);
/* The source blocks request i reads (n of them) into out: its own stretch
 * of the table with distinct sources, else the shared prefix. i ==
 * UINT32_MAX: the ceiling, which reads the trace's blocks in turn. */
void sv_src_table(const sv_trace_t *t, const uint32_t *table, uint32_t i,
                  uint64_t n, uint32_t *out);
void sv_perm(uint32_t n, uint64_t seed, uint32_t *out);
/* A pool's block order: sv_perm, or 0..n-1 where --pages sorts that side
 * (the consumer's pool: the destination). */
void sv_pages(const sv_cfg_t *c, bool consumer, uint32_t n, uint64_t seed,
              uint32_t *out);
/* --pages' value for c. */
const char *sv_pages_name(const sv_cfg_t *c);

/* Request ids: "t<pass>-<i>" for the trace, else "<kind>-<a>-<b>":
 * "ceil-<instance>-<rep>", "small-<k>-0", "warm-<group>-0". */
void sv_request_id(char *buf, size_t len, const char *kind, uint32_t a,
                   uint32_t b);

/* The processes (serving_child.c): run one stage or one rank until the
 * supervisor's "quit" (ctl: its commands; out: its report lines). */
typedef struct sv_role {
    bool consumer;
    uint32_t who;  /* instance or group */
    uint32_t rank; /* stage or decode rank */
    uint32_t tp;   /* producer tp rank */
    int cuda_device;
    char heads[64][300]; /* each instance's head address (consumers, and
                            non-head stages: their bootstrap) */
} sv_role_t;
int sv_child_run(const sv_cfg_t *cfg, const sv_trace_t *t,
                 const sv_role_t *role, int ctl, FILE *out);

/* --prefill gpu's engine (serving_gpu.c): a stream of the stage's GPU and
 * the event its layer groups are handed over with. step: ns of compute
 * queued, then the event recorded after it (*event, the engine's, for
 * send_ready). mark: a new event recorded after everything queued, polled
 * with passed, freed with unmark. Refused in a build without CUDA
 * (sv_engine_built false). */
typedef struct sv_engine sv_engine_t;
bool sv_engine_built(void);
kvr_status_t sv_engine_create(int device, sv_engine_t **out, kvr_error_t *err);
void sv_engine_destroy(sv_engine_t *e);
kvr_status_t sv_engine_step(sv_engine_t *e, uint64_t ns, void **event,
                            kvr_error_t *err);
kvr_status_t sv_engine_mark(sv_engine_t *e, int device, void **mark,
                            kvr_error_t *err);
kvr_status_t sv_engine_passed(void *mark, bool *done, kvr_error_t *err);
void sv_engine_unmark(void *mark);

#endif
