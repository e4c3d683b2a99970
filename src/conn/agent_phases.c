/* Per-phase time of an agent's loop (agent_phases.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_internal.h"

#define QUIET_NS 20000000ull /* a window ends after this without activity */

uint64_t kvr__ph_start(const kvr_agent_t *a)
{
    return a->ph.on ? kvr_now_ns() : 0;
}

void kvr__ph_add(kvr_agent_t *a, kvr__ph_t ph, uint64_t t0)
{
    if (t0 == 0)
        return;
    uint64_t now = kvr_now_ns();
    a->ph.ns[ph] += now - t0;
    a->ph.n[ph]++;
    if (ph != KVR__PH_SPIN && ph != KVR__PH_TURN)
        a->ph.last_ns = now;
}

void kvr__ph_sum(kvr_agent_t *a, kvr__ph_t ph, uint64_t ns)
{
    if (ns == 0)
        return;
    a->ph.ns[ph] += ns;
    a->ph.n[ph]++;
}

static double ms(uint64_t ns)
{
    return (double)ns * 1e-6;
}

void kvr__ph_print(kvr_agent_t *a)
{
    static const char *name[KVR__PH_COUNT] = {
        "turn", "pull", "plan", "choose", "tables",
        "launch", "notify", "reap", "recv", "spin"};
    kvr__phases_t *p = &a->ph;
    if (!p->on || p->first_ns == 0)
        return;
    char line[1024] = {0};
    int k = snprintf(
        line, sizeof(line),
        "kvr phases %.*s pp %u dcp %u window %u: span %.3f ms, %llu pulls, "
        "%llu launches of %llu pulls, %.1f MB, launches over %.3f ms, gpu "
        "busy %.3f ms (%.1f GB/s)",
        (int)a->instance.len, a->instance.bytes, a->p.topo.pp_rank,
        a->p.topo.dcp_rank, p->window, ms(p->last_ns - p->first_ns),
        (unsigned long long)p->pulls, (unsigned long long)p->jobs,
        (unsigned long long)p->job_pulls, (double)p->bytes * 1e-6,
        ms(p->launch_last_ns - p->launch_first_ns), ms(p->gpu_busy_ns),
        p->gpu_busy_ns ? (double)p->bytes / (double)p->gpu_busy_ns : 0.0);
    for (int i = 0; i < KVR__PH_COUNT && k > 0 && (size_t)k < sizeof(line);
         i++)
        if (p->n[i] > 0)
            k += snprintf(line + k, sizeof(line) - (size_t)k,
                          "; %s %.3f ms / %llu", name[i], ms(p->ns[i]),
                          (unsigned long long)p->n[i]);
    /* one write: the bench's processes share one log */
    size_t len = k > 0 && (size_t)k < sizeof(line) - 1 ? (size_t)k
                                                        : sizeof(line) - 2;
    line[len] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len + 1);
    (void)w;
}

void kvr__ph_activity(kvr_agent_t *a)
{
    kvr__phases_t *p = &a->ph;
    if (!p->on)
        return;
    uint64_t now = kvr_now_ns();
    if (p->first_ns != 0 && now - p->last_ns < QUIET_NS) {
        p->last_ns = now;
        return;
    }
    kvr__ph_print(a);
    uint32_t w = p->window + (p->first_ns != 0);
    memset(p, 0, sizeof(*p));
    p->on = true;
    p->window = w;
    p->first_ns = p->last_ns = now;
}

void kvr__ph_launched(kvr_agent_t *a, uint32_t pulls, uint64_t bytes,
                      uint64_t at)
{
    kvr__phases_t *p = &a->ph;
    if (!p->on)
        return;
    p->jobs++;
    p->job_pulls += pulls;
    p->bytes += bytes;
    p->launch_first_ns = p->launch_first_ns ? p->launch_first_ns : at;
    p->launch_last_ns = at;
}

void kvr__ph_job_done(kvr_agent_t *a, uint64_t launched)
{
    kvr__phases_t *p = &a->ph;
    if (!p->on || launched == 0)
        return;
    uint64_t now = kvr_now_ns();
    uint64_t from = launched > p->gpu_last_done_ns ? launched
                                                    : p->gpu_last_done_ns;
    p->gpu_busy_ns += now > from ? now - from : 0;
    p->gpu_last_done_ns = now;
    p->last_ns = now;
}
