/* Cost model: what a put and a host copy of each size cost on this
 * transport, measured by a short probe (or given by hand as linear terms),
 * decides between direct and staged execution. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base_internal.h"
#include "exec_internal.h"

typedef unsigned long long ull;

/* Every timed quantity is the median of this many rounds; a round times
 * each size once, so a burst of noise from another process spoils one
 * sample of many sizes rather than every sample of one. */
#define ROUNDS 5
/* The local source is twice the last-level cache (16 to 128 MiB) and is
 * walked forward, so that puts and copies read cold bytes, as a transfer
 * out of a KV cache far larger than the caches does (a 4 MiB source reused
 * flatters a put by 2x, and not a copy as much). */
#define SRC_MIN_BYTES (16u << 20)
#define SRC_MAX_BYTES (128u << 20)
#define LLC_GUESS_BYTES (32u << 20)
/* The source is faulted in this much per step (kvr_cost_step), so that a
 * step stays short even while the source is filled. */
#define FILL_BYTES (4u << 20)
/* Failpoint slow-probe: every unit of the probe starts this late. */
#define SLOW_PROBE_NS 150000000L

typedef struct {
    kvr_ep_t *ep;
    const kvr_cost_probe_t *p;
    kvr_rmem_t *stage;  /* staging memory to probe; == p->scratch if none */
    unsigned char *src; /* local source, pages touched */
    uint64_t src_len, src_pos;
    unsigned char *copy_dst; /* copies land here: mapped staging or local */
    unsigned char *own_dst;
    uint64_t batch_bytes; /* bytes per timed batch (at least 2 pieces) */
    bool mapped;          /* staging memory reachable through kvr_rmem_ptr */
    uint64_t deadline_ns; /* of this step's puts and flushes */
    uint32_t points;
    uint64_t size[KVR_COST_POINTS];
    uint32_t puts[KVR_COST_POINTS];      /* puts per timed batch */
    kvr_plan_t *pieces[KVR_COST_POINTS]; /* copy batch: every other piece */
} probe_t;

typedef struct {
    double rtt[ROUNDS];
    double put[KVR_COST_POINTS][ROUNDS];
    double copy[KVR_COST_POINTS][ROUNDS];
    double unpack[KVR_COST_POINTS][ROUNDS];
    double one[KVR_COST_POINTS][ROUNDS];
    double small[ROUNDS], large[ROUNDS], stage[ROUNDS]; /* lean */
} samples_t;

static double seconds_since(uint64_t t0)
{
    return (double)(kvr_now_ns() - t0) * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v)
{
    double t[ROUNDS];
    memcpy(t, v, sizeof(t));
    qsort(t, ROUNDS, sizeof(t[0]), cmp_double);
    return t[ROUNDS / 2];
}

static uint64_t source_bytes(uint64_t large)
{
#ifdef _SC_LEVEL3_CACHE_SIZE
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE); /* glibc; 0 when unknown */
#else
    long llc = 0;
#endif
    uint64_t want = 2 * (llc > 0 ? (uint64_t)llc : LLC_GUESS_BYTES);
    want = want < SRC_MIN_BYTES   ? SRC_MIN_BYTES
           : want > SRC_MAX_BYTES ? SRC_MAX_BYTES
                                  : want;
    return want < 4 * large ? 4 * large : want;
}

/* Sizes small * step^k up to large, and large itself; step doubles until
 * they fit in KVR_COST_POINTS. Each size's copy batch is a plan of every
 * other piece of the source, packed as the staged executor packs. */
static kvr_status_t ladder(probe_t *pr)
{
    uint64_t small = pr->p->small_bytes, large = pr->p->large_bytes;
    for (uint64_t step = 2;; step *= 2) {
        uint32_t n = 0;
        for (uint64_t s = small; s <= large && n < KVR_COST_POINTS; s *= step)
            pr->size[n++] = s;
        if (pr->size[n - 1] < large && n < KVR_COST_POINTS)
            pr->size[n++] = large;
        if (pr->size[n - 1] == large) {
            pr->points = n;
            break;
        }
    }
    for (uint32_t i = 0; i < pr->points; i++) {
        uint64_t s = pr->size[i], n = pr->batch_bytes / s;
        n = n < 2 ? 2 : n;
        pr->puts[i] = (uint32_t)(n > pr->p->small_count ? pr->p->small_count
                                                        : n);
        if (pr->puts[i] < 2)
            pr->puts[i] = 2;
        kvr_run_t *runs = malloc(n * sizeof(*runs));
        if (runs == NULL)
            return KVR_ERR_NO_MEMORY;
        for (uint64_t k = 0; k < n; k++)
            runs[k] = (kvr_run_t){.src = 2 * k * s, .dst = k * s, .len = s};
        kvr_status_t st = kvr_plan_from_runs(runs, n, &pr->pieces[i]);
        free(runs);
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

/* The base of the next `span` bytes of the source, wrapping around. */
static const unsigned char *next_src(probe_t *pr, uint64_t span)
{
    if (pr->src_pos + span > pr->src_len)
        pr->src_pos = 0;
    const unsigned char *s = pr->src + pr->src_pos;
    pr->src_pos += span;
    return s;
}

/* count puts of `bytes` back to back into dst, then one flush; the
 * sources are every other piece of the next stretch of the source. */
static kvr_status_t put_batch(probe_t *pr, kvr_rmem_t *dst, uint64_t bytes,
                              uint32_t count, double *secs)
{
    uint64_t room = kvr_rmem_len(dst) - bytes + 1;
    const unsigned char *src = next_src(pr, 2 * (uint64_t)count * bytes);
    const kvr_mem_t *own = pr->p->put_src;
    if (own != NULL) /* every other piece of it, wrapping */
        src = kvr_mem_addr(own);
    uint64_t span = own ? (kvr_mem_len(own) - bytes) / 2 + 1 : UINT64_MAX;
    kvr_status_t st = KVR_OK;
    uint64_t t0 = kvr_now_ns();
    for (uint32_t i = 0; i < count && st == KVR_OK; i++)
        st = kvr_xfer_put(pr->ep, src + 2 * ((i * bytes) % span), bytes, dst,
                          (i * bytes) % room, pr->deadline_ns);
    if (st == KVR_OK)
        st = kvr_xfer_flush(pr->ep, pr->deadline_ns);
    if (secs != NULL)
        *secs = seconds_since(t0);
    return st;
}

/* One small put and its flush, untimed: a target that went to sleep on
 * its event fd (it does after ~2 ms idle) is awake for the batch after. */
static kvr_status_t wake(probe_t *pr)
{
    return put_batch(pr, pr->p->scratch, pr->p->small_bytes, 1, NULL);
}

/* Packs size i's plan through kvr_xfer_pack (cold pieces into the warm
 * staging or pack buffer, a buffer's worth at a time, as chunks are
 * packed), or unpacks it through kvr_xfer_unpack (from that buffer into
 * cold pieces, as a consumer unpacks into a large KV cache). */
static double copy_batch(probe_t *pr, uint32_t i, bool pack)
{
    const kvr_plan_t *plan = pr->pieces[i];
    uint64_t total = kvr_plan_bytes(plan), room = pr->p->large_bytes;
    unsigned char *cold = (unsigned char *)next_src(pr, 2 * total);
    kvr_xfer_seg_t seg = {.plan = plan, .src = cold, .dst_local = cold};
    kvr_xfer_cursor_t cur = {0};
    uint64_t t0 = kvr_now_ns();
    for (uint64_t pos = 0; pos < total; pos += room) {
        uint64_t len = total - pos < room ? total - pos : room;
        if (pack)
            kvr_xfer_pack(&seg, 1, &cur, pos, pr->copy_dst, len);
        else
            kvr_xfer_unpack(&seg, 1, &cur, pos, pr->copy_dst, len);
    }
    return seconds_since(t0);
}

/* Per put of a batch: less the flush's round trip, which a stream of puts
 * pays once, but never below half the raw figure (a noisy round trip). */
static double per_put(double batch, double rtt, uint32_t count)
{
    double t = (batch - rtt) / count;
    return t < batch / count / 2 ? batch / count / 2 : t;
}

static void fit(const probe_t *pr, const samples_t *sm, kvr_cost_model_t *m)
{
    uint32_t n = pr->points;
    m->points = n;
    m->rtt_s = median(sm->rtt);
    for (uint32_t i = 0; i < n; i++) {
        double pieces = (double)kvr_plan_num_runs(pr->pieces[i]);
        double copy = median(sm->copy[i]) / pieces;
        double unpack = median(sm->unpack[i]) / pieces;
        double put = per_put(median(sm->put[i]), m->rtt_s, pr->puts[i]);
        /* no put outruns a copy of its bytes (the target copies them too) */
        put = put < copy ? copy : put;
        put = put < unpack ? unpack : put;
        m->unpack_at[i] = unpack;
        m->point_bytes[i] = (double)pr->size[i];
        m->put_at[i] = put;
        m->copy_at[i] = copy;
    }
    double large = m->point_bytes[n - 1];
    double copy_large_Bps = large / m->copy_at[n - 1];
    m->put_Bps = large / m->put_at[n - 1];
    m->put_s = m->put_at[0] - m->point_bytes[0] / m->put_Bps;
    if (m->put_s < m->put_at[0] / 2)
        m->put_s = m->put_at[0] / 2;
    m->copy_Bps = m->point_bytes[0] / m->copy_at[0];
    if (m->mapped) { /* the pack is the copy into the target: no put */
        m->stage_Bps = copy_large_Bps;
        for (uint32_t i = 0; i < n; i++)
            m->stage_at[i] = 0;
    } else {
        for (uint32_t i = 0; i < n; i++) {
            double t = median(sm->one[i]) - m->rtt_s;
            double copy = m->copy_at[i];
            m->stage_at[i] = t < copy ? copy : t;
        }
        m->stage_Bps = large / m->stage_at[n - 1];
    }
    /* a chunk: its CHUNK message and the ACK (each about a small put),
     * plus, unless mapped, the flush of its put */
    m->chunk_s = 2 * m->put_at[0] + (m->mapped ? 0 : m->rtt_s);
}

/* ---- the probe in steps ---- */

struct kvr_cost_run {
    kvr_cost_probe_t p; /* the caller's, copied */
    probe_t pr;
    samples_t sm;
    uint64_t filled; /* source bytes faulted in */
    bool warm;       /* the warm-up puts were made */
    uint32_t round;  /* the next unit: `unit` of round `round` */
    uint32_t unit;
    bool done;
    kvr_cost_model_t m;
};

/* Units of a full round: its round trip, then per size a put batch, a
 * staged put (none when mapped), a pack and an unpack, in that order
 * (local copies last: the target may fall asleep meanwhile). */
static kvr_status_t full_unit(probe_t *pr, uint32_t r, uint32_t u,
                              samples_t *sm)
{
    const kvr_cost_probe_t *p = pr->p;
    uint32_t n = pr->points, i = (u - 1) % n,
             part = u == 0 ? 0 : 1 + (u - 1) / n;
    if (part == 2 && pr->mapped)
        return KVR_OK; /* no put into staging memory will be made */
    if (part == 3 || part == 4) {
        double *t = part == 3 ? &sm->copy[i][r] : &sm->unpack[i][r];
        *t = copy_batch(pr, i, part == 3);
        return KVR_OK;
    }
    kvr_status_t st = wake(pr);
    if (st == KVR_OK && part == 0)
        st = put_batch(pr, p->scratch, p->small_bytes, 1, &sm->rtt[r]);
    else if (st == KVR_OK && part == 1)
        st = put_batch(pr, p->scratch, pr->size[i], pr->puts[i],
                       &sm->put[i][r]);
    else if (st == KVR_OK) /* a staged chunk: one put and its flush, alone */
        st = put_batch(pr, pr->stage, pr->size[i], 1, &sm->one[i][r]);
    return st;
}

/* The lean probe (kvr_cost_probe_t.lean), a round in 4 units: a round
 * trip (after a wake), a batch of small puts, one large put into scratch
 * and one into staging memory, each ended by its flush. */
static kvr_status_t lean_unit(probe_t *pr, uint32_t r, uint32_t u,
                              samples_t *sm)
{
    const kvr_cost_probe_t *p = pr->p;
    kvr_status_t st = u == 0 ? wake(pr) : KVR_OK;
    if (st == KVR_OK && u == 0)
        st = put_batch(pr, p->scratch, p->small_bytes, 1, &sm->rtt[r]);
    else if (st == KVR_OK && u == 1)
        st = put_batch(pr, p->scratch, p->small_bytes, p->small_count,
                       &sm->small[r]);
    else if (st == KVR_OK && u == 2)
        st = put_batch(pr, p->scratch, p->large_bytes, 1, &sm->large[r]);
    else if (st == KVR_OK)
        st = put_batch(pr, pr->stage, p->large_bytes, 1, &sm->stage[r]);
    return st;
}

/* The lean probe's linear model: medians of its rounds. */
static void lean_fit(const probe_t *pr, const samples_t *sm,
                     kvr_cost_model_t *m)
{
    const kvr_cost_probe_t *p = pr->p;
    double big = (double)p->large_bytes;
    *m = (kvr_cost_model_t){.rtt_s = median(sm->rtt)};
    m->put_s = per_put(median(sm->small), m->rtt_s, p->small_count);
    m->put_Bps = big / per_put(median(sm->large), m->rtt_s, 1);
    m->stage_Bps = big / per_put(median(sm->stage), m->rtt_s, 1);
    m->chunk_s = 2 * m->put_s + m->rtt_s;
}

/* The warm-up: faults in the target's pages and the paths' buffers. */
static kvr_status_t warm_up(probe_t *pr)
{
    const kvr_cost_probe_t *p = pr->p;
    kvr_status_t st = put_batch(pr, p->scratch, p->large_bytes, 1, NULL);
    if (st == KVR_OK && pr->stage != p->scratch)
        st = put_batch(pr, pr->stage, p->large_bytes, 1, NULL);
    return st;
}

/* One unit of the probe: a stretch of the source faulted in, the
 * warm-up, or one timed batch; the model once the last round is done. */
static kvr_status_t unit(kvr_cost_run_t *run)
{
    probe_t *pr = &run->pr;
    if (kvr__failpoint(KVR__FP_SLOW_PROBE, NULL, 0)) /* untimed */
        nanosleep(&(struct timespec){0, SLOW_PROBE_NS}, NULL);
    if (run->filled < pr->src_len) {
        uint64_t n = pr->src_len - run->filled;
        n = n < FILL_BYTES ? n : FILL_BYTES;
        memset(pr->src + run->filled, 0x5a, n);
        run->filled += n;
        return KVR_OK;
    }
    if (!run->warm) {
        run->warm = true;
        return warm_up(pr);
    }
    bool lean = run->p.lean;
    kvr_status_t st = lean ? lean_unit(pr, run->round, run->unit, &run->sm)
                           : full_unit(pr, run->round, run->unit, &run->sm);
    if (st != KVR_OK)
        return st;
    if (++run->unit == (lean ? 4 : 1 + 4 * pr->points)) {
        run->unit = 0;
        run->round++;
    }
    if (run->round == ROUNDS) {
        if (lean)
            lean_fit(pr, &run->sm, &run->m);
        else
            fit(pr, &run->sm, &run->m);
        run->done = true;
    }
    return KVR_OK;
}

static kvr_status_t check_probe(kvr_ep_t *ep, const kvr_cost_probe_t *probe,
                                kvr_error_t *err)
{
    if (ep == NULL || probe == NULL || probe->scratch == NULL ||
        probe->small_bytes == 0 || probe->small_count == 0 ||
        probe->large_bytes < 4 * probe->small_bytes)
        return kvr_error_set(err, KVR_ERR_INVALID, "bad probe parameters");
    if (kvr_rmem_len(probe->scratch) < probe->large_bytes ||
        (probe->stage_scratch &&
         kvr_rmem_len(probe->stage_scratch) < probe->large_bytes))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "probe scratch smaller than %llu bytes",
                             (ull)probe->large_bytes);
    if (probe->put_src && kvr_mem_len(probe->put_src) < probe->large_bytes)
        return kvr_error_set(
            err, KVR_ERR_INVALID, "probe put source of %zu bytes < %llu",
            kvr_mem_len(probe->put_src), (ull)probe->large_bytes);
    return KVR_OK;
}

/* The probe's memory: the source (faulted in by the first units), the
 * size ladder and, for a full probe, where copies land. */
static kvr_status_t prepare(kvr_cost_run_t *run)
{
    probe_t *pr = &run->pr;
    const kvr_cost_probe_t *p = &run->p;
    pr->src = malloc(pr->src_len);
    if (pr->src == NULL)
        return KVR_ERR_NO_MEMORY;
    if (p->lean) /* puts only: no ladder, no copies */
        return KVR_OK;
    kvr_status_t st = ladder(pr);
    void *ptr;
    run->m.mapped = kvr_rmem_ptr(pr->stage, 0, p->large_bytes, &ptr) == KVR_OK;
    pr->mapped = run->m.mapped;
    if (pr->mapped) { /* no put into staging memory will be made */
        pr->copy_dst = ptr;
        pr->stage = p->scratch;
    } else {
        pr->copy_dst = pr->own_dst = malloc(p->large_bytes);
    }
    if (st == KVR_OK && pr->copy_dst == NULL)
        st = KVR_ERR_NO_MEMORY;
    if (st == KVR_OK)
        memset(pr->copy_dst, 0, p->large_bytes); /* fault the pages in */
    return st;
}

void kvr_cost_free(kvr_cost_run_t *run)
{
    if (run == NULL)
        return;
    for (uint32_t i = 0; i < KVR_COST_POINTS; i++)
        kvr_plan_destroy(run->pr.pieces[i]);
    free(run->pr.src);
    free(run->pr.own_dst);
    free(run);
}

kvr_status_t kvr_cost_start(kvr_ep_t *ep, const kvr_cost_probe_t *probe,
                            kvr_cost_run_t **out, kvr_error_t *err)
{
    kvr_status_t st = check_probe(ep, probe, err);
    if (st != KVR_OK)
        return st;
    kvr_cost_run_t *run = calloc(1, sizeof(*run));
    if (run == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "cost probe: no memory");
    run->p = *probe;
    run->pr = (probe_t){.ep = ep,
                        .p = &run->p,
                        .stage = probe->stage_scratch ? probe->stage_scratch
                                                      : probe->scratch,
                        .batch_bytes = probe->large_bytes / 4,
                        .src_len = source_bytes(probe->large_bytes)};
    if (probe->lean) /* no host copies: a source as large as one put */
        run->pr.src_len = probe->large_bytes * 2;
    st = prepare(run);
    if (st != KVR_OK) {
        kvr_cost_free(run);
        return kvr_error_set(err, st, "cost probe: %s",
                             st == KVR_ERR_NO_MEMORY ? "out of memory"
                                                     : kvr_status_str(st));
    }
    *out = run;
    return KVR_OK;
}

kvr_status_t kvr_cost_step(kvr_cost_run_t *run, uint64_t until_ns,
                           uint64_t deadline_ns, bool *done, kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    run->pr.deadline_ns = deadline_ns;
    do
        st = run->done ? KVR_OK : unit(run);
    while (st == KVR_OK && !run->done && kvr_now_ns() < until_ns);
    *done = run->done;
    if (st != KVR_OK)
        return kvr_error_set(err, st, "cost probe: %s",
                             kvr_xfer_last_error(run->pr.ep->t));
    return KVR_OK;
}

bool kvr_cost_result(const kvr_cost_run_t *run, kvr_cost_model_t *out)
{
    if (run == NULL || !run->done)
        return false;
    *out = run->m;
    return true;
}

kvr_status_t kvr_cost_measure(kvr_ep_t *ep, const kvr_cost_probe_t *probe,
                              kvr_cost_model_t *out, kvr_error_t *err)
{
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "bad probe parameters");
    kvr_cost_run_t *run = NULL;
    kvr_status_t st = kvr_cost_start(ep, probe, &run, err);
    bool done = false;
    if (st == KVR_OK)
        st = kvr_cost_step(run, UINT64_MAX, probe->deadline_ns, &done, err);
    if (st == KVR_OK)
        kvr_cost_result(run, out);
    kvr_cost_free(run);
    return st;
}

static double per_byte(double rate)
{
    return rate > 0 ? 1.0 / rate : 0;
}

/* Linear between measured sizes; below the first, `flat` keeps its cost
 * (a put's fixed cost dominates) or else scales it down (a copy); above
 * the last, the extra bytes go at tail_Bps. */
static double curve(const kvr_cost_model_t *m, const double *at, double s,
                    bool flat, double tail_Bps)
{
    const double *x = m->point_bytes;
    uint32_t n = m->points;
    if (s <= x[0])
        return flat ? at[0] : at[0] * s / x[0];
    for (uint32_t i = 1; i < n; i++)
        if (s <= x[i])
            return at[i - 1] +
                   (at[i] - at[i - 1]) * (s - x[i - 1]) / (x[i] - x[i - 1]);
    return at[n - 1] + (s - x[n - 1]) * per_byte(tail_Bps);
}

typedef struct {
    double put, pack, unpack;
} costs_t;

/* Adds the seconds to put, pack and unpack `runs` runs of `bytes` in all. */
static void run_costs(const kvr_cost_model_t *m, double runs, double bytes,
                      costs_t *c)
{
    if (runs == 0)
        return;
    double mean = bytes / runs;
    uint32_t n = m->points;
    if (n == 0) {
        c->put += runs * m->put_s + bytes * per_byte(m->put_Bps);
        c->pack += bytes * per_byte(m->copy_Bps);
        c->unpack += bytes * per_byte(m->copy_Bps);
        return;
    }
    /* a hand-made model without an unpack curve: unpack as packing */
    const double *un = m->unpack_at[0] > 0 ? m->unpack_at : m->copy_at;
    c->put += runs * curve(m, m->put_at, mean, true, m->put_Bps);
    c->pack += runs * curve(m, m->copy_at, mean, false,
                            m->point_bytes[n - 1] / m->copy_at[n - 1]);
    c->unpack += runs *
                 curve(m, un, mean, false, m->point_bytes[n - 1] / un[n - 1]);
}

/* Seconds to put one chunk of `bytes` into staging memory (no flush). */
static double stage_cost(const kvr_cost_model_t *m, double bytes)
{
    if (m->points == 0)
        return bytes * per_byte(m->stage_Bps);
    return curve(m, m->stage_at, bytes, false, m->stage_Bps);
}

static bool model_ok(const kvr_cost_model_t *m)
{
    if (m->points > KVR_COST_POINTS)
        return false;
    for (uint32_t i = 0; i < m->points; i++)
        if (!(m->point_bytes[i] > (i ? m->point_bytes[i - 1] : 0)) ||
            !(m->put_at[i] >= 0) || !(m->copy_at[i] > 0) ||
            !(m->unpack_at[i] >= 0) || !(m->stage_at[i] >= 0))
            return false;
    return true;
}

typedef struct {
    double bytes, chunks, last; /* stream bytes, chunks, first chunk's */
    costs_t c;
    double stage; /* every chunk's put into staging memory */
} shape_t;

static shape_t shape_of(const kvr_cost_model_t *m, const kvr_xfer_seg_t *segs,
                        size_t n, uint64_t slot_bytes)
{
    shape_t sh = {0};
    uint64_t bytes = kvr_xfer_stream_bytes(segs, n);
    for (size_t i = 0; i < n; i++)
        run_costs(m, (double)kvr_plan_num_runs(segs[i].plan),
                  (double)kvr_plan_bytes(segs[i].plan), &sh.c);
    uint64_t full = bytes / slot_bytes, rest = bytes % slot_bytes;
    sh.bytes = (double)bytes;
    sh.chunks = (double)(full + (rest != 0));
    sh.last = (double)(bytes < slot_bytes ? bytes : slot_bytes);
    sh.stage = (double)full * stage_cost(m, (double)slot_bytes) +
               (rest ? stage_cost(m, (double)rest) : 0);
    return sh;
}

/* gpu-staged: pack kernels run ahead of the puts and the consumer's
 * unpack kernels behind them, so the slowest of the three streams sets
 * the pace; the first chunk's pack and the last one's unpack are alone. */
static double gpu_staged_cost(const kvr_cost_model_t *m,
                              const kvr_cost_gpu_t *g, const shape_t *sh)
{
    double copy = sh->bytes * per_byte(g->pack_Bps);
    double puts = sh->stage + sh->chunks * m->chunk_s;
    double alone = sh->bytes > 0 ? 2 * copy * sh->last / sh->bytes : 0;
    return (copy > puts ? copy : puts) + alone + sh->chunks * g->launch_s +
           m->rtt_s;
}

kvr_exec_kind_t kvr_cost_choose_gpu(const kvr_cost_model_t *model,
                                    const kvr_cost_gpu_t *gpu,
                                    kvr_exec_kind_t force,
                                    const kvr_xfer_seg_t *segs, size_t n,
                                    uint64_t slot_bytes,
                                    double t[KVR_COST_KINDS])
{
    double tt[KVR_COST_KINDS] = {0};
    bool usable = model != NULL && slot_bytes != 0 && model_ok(model);
    bool cuda = gpu != NULL && gpu->cuda;
    if (usable) {
        shape_t sh = shape_of(model, segs, n, slot_bytes);
        tt[KVR_EXEC_DIRECT] = sh.c.put + model->rtt_s;
        if (cuda) {
            if (gpu->pack_Bps > 0)
                tt[KVR_EXEC_GPU_STAGED] = gpu_staged_cost(model, gpu, &sh);
            if (gpu->direct_Bps > 0)
                tt[KVR_EXEC_GPU_DIRECT] = sh.bytes / gpu->direct_Bps +
                                          gpu->launch_s + model->rtt_s;
        } else if (model->points > 0 || model->copy_Bps > 0) {
            /* producer packs chunk c + 1 while the consumer unpacks chunk
             * c: the slower of the two sets the pace; the last unpack is
             * alone; no put into staging when mapped (a lean model, no
             * copy rate: no host staging) */
            double stream = sh.c.pack > sh.c.unpack ? sh.c.pack : sh.c.unpack;
            tt[KVR_EXEC_STAGED] =
                stream + sh.chunks * model->chunk_s +
                (sh.bytes > 0 ? sh.c.unpack * sh.last / sh.bytes : 0) +
                (model->mapped ? 0 : sh.stage) + model->rtt_s;
        }
    }
    if (t != NULL)
        memcpy(t, tt, sizeof(tt));
    if (force != KVR_EXEC_AUTO && (unsigned)force < KVR_COST_KINDS)
        return force;
    kvr_exec_kind_t best = KVR_EXEC_DIRECT;
    for (unsigned k = KVR_EXEC_STAGED; usable && k < KVR_COST_KINDS; k++)
        if (tt[k] > 0 && tt[k] < tt[best])
            best = (kvr_exec_kind_t)k;
    return best;
}

kvr_exec_kind_t kvr_cost_choose(const kvr_cost_model_t *model,
                                kvr_exec_kind_t force,
                                const kvr_xfer_seg_t *segs, size_t n,
                                uint64_t slot_bytes, double *t_direct,
                                double *t_staged)
{
    double t[KVR_COST_KINDS];
    if (force != KVR_EXEC_DIRECT && force != KVR_EXEC_STAGED)
        force = KVR_EXEC_AUTO;
    kvr_exec_kind_t k =
        kvr_cost_choose_gpu(model, NULL, force, segs, n, slot_bytes, t);
    if (t_direct != NULL)
        *t_direct = t[KVR_EXEC_DIRECT];
    if (t_staged != NULL)
        *t_staged = t[KVR_EXEC_STAGED];
    return k;
}
