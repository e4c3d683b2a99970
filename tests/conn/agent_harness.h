/* Several agents in one process over the loopback data transport (control
 * links on 127.0.0.1): a model with MLA and index regions, producer stages,
 * consumer ranks, requests with disjoint block tables, event logs and the
 * byte verifier. Built with AH_GPU_EMUL (kvr_agent_harness_emul), every
 * agent keeps its KV in CUDA memory of the emulated GPU path. */
#ifndef KVR_TEST_AGENT_HARNESS_H
#define KVR_TEST_AGENT_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrelay/agent.h"

#define AH_MAX_REGIONS 32
#define AH_MAX_EVENTS 4096
#define AH_MAX_BLOCKS 512

typedef struct ah_model {
    kvr_layout_t lay;
    uint32_t layers; /* MLA on every layer, INDEX on even ones */
    uint32_t index_dim;
    uint32_t token_bytes;
    uint32_t src_pool;      /* blocks per producer region */
    uint32_t dst_pool;      /* blocks per consumer region */
    uint32_t staging_slots; /* consumers: a STAGING region of this many */
    uint64_t slot_bytes;    /* slots of this size (0 slots: none) */
} ah_model_t;

typedef struct ah_agent {
    kvr_agent_t *agent;
    bool consumer;
    uint32_t rank; /* consumer: dcp rank; producer: pp rank */
    kvr_region_desc_t desc[AH_MAX_REGIONS];
    void *base[AH_MAX_REGIONS];
    bool consumer_only[AH_MAX_REGIONS];
    uint32_t n;
    kvr_agent_event_t *log;
    uint32_t nlog;
} ah_agent_t;

typedef struct ah_req {
    char id[48];
    uint32_t src[AH_MAX_BLOCKS];
    uint32_t nsrc;
    uint32_t dst[AH_MAX_BLOCKS];
    uint32_t ndst;
    uint64_t tokens, computed;
    uint32_t seq;
} ah_req_t;

/* bs 16, W 2, I 1, consumer tp 2, producer tp 1, replicated preshuffled
 * index of D 64, 4 layers, 96-byte latents. */
ah_model_t ah_model(void);
/* A loopback transport whose hub the agents join. */
kvr_transport_t *ah_hub(void);

/* Parameters for a producer stage (pp of pp_size, layers split evenly) or
 * a consumer rank (dcp rank = tp rank = rank). */
kvr_agent_params_t ah_producer_params(const ah_model_t *m, kvr_transport_t *hub,
                                      const char *instance, uint32_t pp,
                                      uint32_t pp_size);
kvr_agent_params_t ah_consumer_params(const ah_model_t *m, kvr_transport_t *hub,
                                      const char *instance, uint32_t rank);
/* Creates, registers regions (consumer: plus `extra` consumer-only MLA
 * layers after the model's, flagged when flag_extra) and starts. */
void ah_start(const ah_model_t *m, const kvr_agent_params_t *p, uint32_t extra,
              bool flag_extra, ah_agent_t *out);
void ah_stop(ah_agent_t *x);

/* Request i: source and destination blocks disjoint from those of other
 * requests (i mod 8 differs); at most 512 tokens with ah_model(). */
void ah_req(const ah_model_t *m, uint32_t i, uint64_t tokens, ah_req_t *r);
/* Fills the producer's regions with request r's synthetic KV. */
void ah_fill(const ah_model_t *m, ah_agent_t *prod, const ah_req_t *r);
void ah_open(ah_agent_t *prod, const ah_req_t *r, uint32_t lease_ms,
             uint32_t groups, bool ready);
void ah_recv(ah_agent_t *cons, const char *producer, const char *address,
             const ah_req_t *r, uint32_t deadline_ms);
/* ah_recv with kvr_agent_recv_t.stream set as asked. */
void ah_recv_stream(ah_agent_t *cons, const char *producer, const char *address,
                    const ah_req_t *r, uint32_t deadline_ms, bool stream);

/* Moves queued events into the log. */
void ah_collect(ah_agent_t *x);
/* Waits until the log holds kind for request id (any producer); returns
 * it or fails the test at the deadline. */
const kvr_agent_event_t *ah_wait(ah_agent_t *x, const char *id,
                                 kvr_agent_event_kind_t kind, uint32_t ms);
uint32_t ah_count(const ah_agent_t *x, const char *id,
                  kvr_agent_event_kind_t kind);
/* Lets ms pass, collecting events. */
void ah_settle(ah_agent_t *const *xs, uint32_t n, uint32_t ms);

/* Every byte the consumer rank should hold, from the stages' sources. */
void ah_verify(const ah_model_t *m, ah_agent_t *const *stages,
               uint32_t num_stages, const ah_agent_t *cons, const ah_req_t *r);
uint64_t ah_now_ms(void);
/* A listener on 127.0.0.1 that never accepts (connections complete, no
 * HELLO is ever answered); its address in addr. Returns its fd. */
int ah_silent_listener(char *addr, size_t cap);

/* ---- worlds: up to two producer instances and one decode group ---- */

#define AH_WAIT_MS 20000

typedef void (*ah_tweak_t)(kvr_agent_params_t *p);

typedef struct world {
    ah_model_t m;
    kvr_transport_t *hub;
    ah_agent_t prod[2][4]; /* [instance][pp stage] */
    uint32_t pp[2];
    ah_agent_t cons[2]; /* one decode group, dcp ranks 0 and 1 */
} world_t;

world_t *world_new(void);
void world_free(world_t *w);
void start_instance(world_t *w, uint32_t k, const char *name, uint32_t pp,
                    ah_tweak_t tweak);
void start_group(world_t *w, uint32_t extra, bool flag);
void start_group_tweaked(world_t *w, uint32_t extra, bool flag,
                         ah_tweak_t tweak);
const char *head_addr(world_t *w, uint32_t k);
ah_agent_t *const *stages_of(world_t *w, uint32_t k);
void expect_loaded(world_t *w, uint32_t k, const ah_req_t *r);
const kvr_agent_event_t *expect_failed(ah_agent_t *c, const char *id,
                                       kvr_status_t st);
void fill_all(world_t *w, uint32_t k, const ah_req_t *r);
void open_all(world_t *w, uint32_t k, const ah_req_t *r, uint32_t lease_ms,
              bool ready);
void recv_all(world_t *w, uint32_t k, const char *name, const ah_req_t *r,
              uint32_t deadline_ms);
/* xPyD: a PP2 instance "prefill-a" and a PP1 "prefill-b" (both tweaked)
 * feed one group (tweaked) two requests at once; both verified. The world
 * is returned for more checks. */
world_t *two_instances_loaded(ah_tweak_t tweak);
/* Both ranks of the group released r: exactly one loaded and one failed
 * (fail_msg otherwise); returns the failed rank. */
uint32_t one_rank_failed(world_t *w, const ah_req_t *r);

#endif
