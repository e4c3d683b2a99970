/* Where an agent's progress thread spends its time, per phase, for
 * profiling the GPU path without the debug log (docs/performance.md):
 * with KVR_AGENT_PHASES set, each phase's time and count are summed over
 * a window of activity (a new one starts after 20 ms without a pull or a
 * load) and the window is printed to stderr when the next starts and when
 * the agent ends; unset, a phase costs one branch. Summed under the
 * agent's turn lock, as the rest of a turn's state. */
#ifndef KVRELAY_CONN_AGENT_PHASES_H
#define KVRELAY_CONN_AGENT_PHASES_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    KVR__PH_TURN,    /* a whole turn of the loop (handling and work) */
    KVR__PH_PULL,    /* a WRITE_REQUEST handled, its launch included */
    KVR__PH_PLAN,    /* the producer's pair plans of a pull */
    KVR__PH_CHOOSE,  /* the executor's choice */
    KVR__PH_TABLES,  /* relayout tables made (kvr__agpu_prepare) */
    KVR__PH_LAUNCH,  /* kernels launched (kvr__gpu_job_start) */
    KVR__PH_NOTIFY,  /* the completion's wake queued */
    KVR__PH_REAP,    /* completed kernels seen and their pulls answered */
    KVR__PH_RECV,    /* the consumer's start of a load */
    KVR__PH_SPIN,    /* the thread polling kernels (kvr__agpu_spin) */
    KVR__PH_COUNT
} kvr__ph_t;

typedef struct {
    bool on;
    uint64_t ns[KVR__PH_COUNT], n[KVR__PH_COUNT];
    uint64_t first_ns, last_ns; /* the window's first and last activity */
    uint64_t pulls, jobs, job_pulls, bytes;
    /* a stream's kernels run in launch order: job j runs from the later
     * of its launch and job j-1's completion to its own, as seen */
    uint64_t gpu_busy_ns, gpu_last_done_ns, launch_first_ns, launch_last_ns;
    uint32_t window;
} kvr__phases_t;

struct kvr_agent;

/* kvr_now_ns when profiling, else 0 (nothing is summed). */
uint64_t kvr__ph_start(const struct kvr_agent *a);
void kvr__ph_add(struct kvr_agent *a, kvr__ph_t ph, uint64_t t0);
/* ns more of phase ph, measured by the caller (0: none). */
void kvr__ph_sum(struct kvr_agent *a, kvr__ph_t ph, uint64_t ns);
/* A pull or a load begins: a new window after a quiet spell. */
void kvr__ph_activity(struct kvr_agent *a);
/* A launch of `pulls` pulls moving `bytes`, at `at` (kvr_now_ns). */
void kvr__ph_launched(struct kvr_agent *a, uint32_t pulls, uint64_t bytes,
                      uint64_t at);
/* The kernels of a job launched at `launched` were seen complete. */
void kvr__ph_job_done(struct kvr_agent *a, uint64_t launched);
void kvr__ph_print(struct kvr_agent *a);

#endif
