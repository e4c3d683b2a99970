/* Multi-process harness for the xfer tests and bench/xfer: one producer
 * (the parent) and W consumer processes over UCX, addresses and rkeys
 * exchanged over socketpairs, every wait bounded, children reaped with a
 * deadline and killed past it. */
#ifndef KVRELAY_XFER_HARNESS_H
#define KVRELAY_XFER_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvrelay/plan.h"
#include "kvrelay/xfer.h"

#define XH_MAX_RANKS 8
#define XH_CEILING 3 /* a round kind next to the executors: one large put */

typedef struct xh_config {
    kvr_xfer_tl_t tl;
    bool consumer_thread; /* consumers progress from a thread */
    bool dst_alloc;       /* consumer MLA regions allocated by UCX */
    uint32_t W, bs, I;
    uint64_t tokens;
    uint32_t token_bytes; /* MLA bytes per token */
    bool with_index;      /* add a replicated DSA index region (D = 128) */
    uint64_t slot_bytes;
    uint32_t num_slots;
    uint32_t timeout_ms;                         /* per round */
    const char *producer_netns, *consumer_netns; /* ip netns names or NULL */
    const char *net_devices;
    uint64_t seed;
} xh_config_t;

/* What both sides derive from the config: layout, region pairs, tables,
 * source bytes. */
typedef struct xh_fixture {
    kvr_layout_t lay;
    kvr_region_pair_t pairs[2];
    size_t num_pairs;
    uint32_t *src_blocks, *dst_blocks;
    kvr_request_t req;
    unsigned char *src[2]; /* producer regions, filled from the seed */
    uint64_t src_len[2], dst_len[2];
} xh_fixture_t;

int xh_fixture_init(const xh_config_t *cfg, xh_fixture_t *fx);
void xh_fixture_fini(xh_fixture_t *fx);

/* Round outcome as a consumer reports it. */
typedef struct xh_result {
    int32_t status; /* kvr_exec_recv */
    int32_t verify; /* kvr_verify_region over every region, or -1 if not run */
    char msg[300];
} xh_result_t;

typedef struct xh_session {
    xh_config_t cfg;
    xh_fixture_t fx;
    pid_t pids[XH_MAX_RANKS];
    int fds[XH_MAX_RANKS];
    kvr_transport_t *t;
    kvr_ep_t *eps[XH_MAX_RANKS];
    kvr_rmem_t *rmem[XH_MAX_RANKS][4]; /* mla, index, staging, scratch */
    kvr_plan_set_t *plans[XH_MAX_RANKS];
    kvr_plan_t *ceiling[XH_MAX_RANKS];
    unsigned char *ceiling_src;
    uint64_t next_tid;
    char error[512];
} xh_session_t;

/* Forks W consumers, connects to each. 0 on success, 77 when a network
 * namespace cannot be entered (reason in s->error), else 1. */
int xh_start(xh_session_t *s, const xh_config_t *cfg);
/* One round of `kind` (direct, staged or XH_CEILING) to every rank in
 * turn; consumers verify. secs[r] gets the producer's time for rank r.
 * Returns the first failing status (producer or consumer). */
kvr_status_t xh_round(xh_session_t *s, int kind, double *secs,
                      xh_result_t *results);
/* Measures the cost model against rank r (its scratch and staging). */
kvr_status_t xh_probe(xh_session_t *s, uint32_t r, kvr_cost_model_t *out);
/* The same with kvr_cost_probe_t.lean as given. */
kvr_status_t xh_probe_lean(xh_session_t *s, uint32_t r, bool lean,
                           kvr_cost_model_t *out);
/* Tells consumers to quit, reaps them (killing after timeout_ms), frees. */
int xh_stop(xh_session_t *s);

/* Producer-side segments of rank r for the executors. */
size_t xh_segs(xh_session_t *s, uint32_t r, int kind, kvr_xfer_seg_t *segs);

#endif
