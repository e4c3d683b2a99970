/* Cost model: per-put cost and bandwidth of the transport, measured by a
 * short probe (or given), decide between direct and staged execution. */
#include <stdlib.h>
#include <string.h>

#include "exec_internal.h"

typedef unsigned long long ull;

typedef struct {
    kvr_ep_t *ep;
    const kvr_cost_probe_t *p;
    unsigned char *buf; /* large_bytes, pages touched */
} probe_t;

static double seconds_since(uint64_t t0)
{
    return (double)(kvr_xfer_now_ns() - t0) * 1e-9;
}

/* Puts count pieces of `bytes` back to back into dst, then flushes. */
static kvr_status_t timed_puts(probe_t *pr, kvr_rmem_t *dst, uint64_t bytes,
                               uint32_t count, double *secs)
{
    uint64_t room = kvr_rmem_len(dst) - bytes;
    uint64_t t0 = kvr_xfer_now_ns();
    kvr_status_t st = KVR_OK;
    for (uint32_t i = 0; i < count && st == KVR_OK; i++)
        st = kvr_xfer_put(pr->ep, pr->buf, bytes, dst, (i * bytes) % (room + 1),
                          pr->p->deadline_ns);
    if (st == KVR_OK)
        st = kvr_xfer_flush(pr->ep, pr->p->deadline_ns);
    *secs = seconds_since(t0);
    return st;
}

/* Gathers small pieces at a stride from a buffer larger than the caches,
 * as packing a fragmented plan does (a cache-hot copy flatters by 2-3x). */
#define COPY_PROBE_BYTES (48u << 20)

static double copy_rate(const probe_t *pr)
{
    uint64_t piece = pr->p->small_bytes, pieces = COPY_PROBE_BYTES / 3 / piece;
    unsigned char *src = malloc(COPY_PROBE_BYTES);
    if (src == NULL)
        return 0; /* unknown: the model then counts no copy cost */
    memset(src, 1, COPY_PROBE_BYTES);
    unsigned char *dst = src + 2 * pieces * piece;
    uint64_t t0 = kvr_xfer_now_ns();
    for (uint64_t i = 0; i < pieces; i++)
        memcpy(dst + i * piece, src + 2 * i * piece, piece);
    double secs = seconds_since(t0);
    free(src);
    return secs > 0 ? (double)(pieces * piece) / secs : 0;
}

/* Bandwidth of one large put: the median of three (the best flatters:
 * a put can look complete early), after one that faults in the target's
 * pages (first touch is slow in VMs). */
static kvr_status_t large_rate(probe_t *pr, kvr_rmem_t *dst, double *Bps)
{
    double secs[4];
    kvr_status_t st = KVR_OK;
    for (int i = 0; i < 4 && st == KVR_OK; i++)
        st = timed_puts(pr, dst, pr->p->large_bytes, 1, &secs[i]);
    double a = secs[1], b = secs[2], c = secs[3];
    double median = a > b ? (b > c ? b : (a > c ? c : a))
                          : (a > c ? a : (b > c ? c : b));
    *Bps = (double)pr->p->large_bytes / median;
    return st;
}

static kvr_status_t measure(probe_t *pr, kvr_cost_model_t *m)
{
    const kvr_cost_probe_t *p = pr->p;
    double t_small, t_mid, t_rtt, large_Bps;
    uint64_t s1 = p->small_bytes, s2 = 16 * p->small_bytes;
    uint32_t n1 = p->small_count, n2 = p->small_count / 4 + 1;
    kvr_status_t st = large_rate(pr, p->scratch, &large_Bps);
    /* the round trip: the best of 8, as a sleeping target's wake-up is a
     * once-per-transfer cost, not a per-chunk one */
    for (int i = 0; i < 8 && st == KVR_OK; i++) {
        double t;
        st = timed_puts(pr, p->scratch, s1, 1, &t);
        t_rtt = i == 0 || t < t_rtt ? t : t_rtt;
    }
    if (st == KVR_OK)
        st = timed_puts(pr, p->scratch, s1, n1, &t_small);
    if (st == KVR_OK && s2 <= p->large_bytes)
        st = timed_puts(pr, p->scratch, s2, n2, &t_mid);
    if (st != KVR_OK)
        return st;
    /* t(put of s bytes) = put_s + s / put_Bps, fitted through a token-sized
     * and a 16-token put: run-sized puts move far slower than one large
     * put, most of all over TCP. */
    double per_byte = (t_mid / n2 - t_small / n1) / (double)(s2 - s1);
    if (s2 > p->large_bytes || per_byte < 1.0 / large_Bps)
        per_byte = 1.0 / large_Bps;
    m->put_Bps = 1.0 / per_byte;
    m->put_s = t_small / n1 - (double)s1 * per_byte;
    if (m->put_s <= 0) /* a noisy fit: charge the token put whole */
        m->put_s = t_small / n1;
    m->chunk_s = 2 * t_rtt; /* the chunk's flush plus its message and ack */
    m->copy_Bps = copy_rate(pr);
    kvr_rmem_t *stage = p->stage_scratch ? p->stage_scratch : p->scratch;
    void *ptr;
    m->mapped = kvr_rmem_ptr(stage, 0, p->large_bytes, &ptr) == KVR_OK;
    m->stage_Bps = large_Bps;
    if (!m->mapped && stage != p->scratch)
        st = large_rate(pr, stage, &m->stage_Bps);
    return st;
}

kvr_status_t kvr_cost_measure(kvr_ep_t *ep, const kvr_cost_probe_t *probe,
                              kvr_cost_model_t *out, kvr_error_t *err)
{
    if (ep == NULL || probe == NULL || out == NULL || probe->scratch == NULL ||
        probe->small_bytes == 0 || probe->small_count == 0 ||
        probe->large_bytes < 4 * probe->small_bytes)
        return kvr_error_set(err, KVR_ERR_INVALID, "bad probe parameters");
    if (kvr_rmem_len(probe->scratch) < probe->large_bytes ||
        (probe->stage_scratch &&
         kvr_rmem_len(probe->stage_scratch) < probe->large_bytes))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "probe scratch smaller than %llu bytes",
                             (ull)probe->large_bytes);
    probe_t pr = {.ep = ep, .p = probe, .buf = malloc(probe->large_bytes)};
    if (pr.buf == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "probe buffer");
    memset(pr.buf, 0x5a, probe->large_bytes);
    kvr_cost_model_t m = {0};
    kvr_status_t st = measure(&pr, &m);
    free(pr.buf);
    if (st != KVR_OK)
        return kvr_error_set(err, st, "cost probe: %s",
                             kvr_xfer_last_error(ep->t));
    *out = m;
    return KVR_OK;
}

static double per_byte(double rate)
{
    return rate > 0 ? 1.0 / rate : 0;
}

kvr_exec_kind_t kvr_cost_choose(const kvr_cost_model_t *model,
                                kvr_exec_kind_t force,
                                const kvr_xfer_seg_t *segs, size_t n,
                                uint64_t slot_bytes, double *t_direct,
                                double *t_staged)
{
    uint64_t runs = 0, bytes = kvr_xfer_stream_bytes(segs, n);
    for (size_t i = 0; i < n; i++)
        runs += kvr_plan_num_runs(segs[i].plan);
    double td = 0, ts = 0;
    if (model != NULL && slot_bytes != 0) {
        double b = (double)bytes, chunks = (double)((bytes + slot_bytes - 1) /
                                                    slot_bytes);
        double last = (double)(bytes < slot_bytes ? bytes : slot_bytes);
        td = (double)runs * model->put_s + b * per_byte(model->put_Bps);
        ts = chunks * model->chunk_s + b * per_byte(model->copy_Bps) +
             (model->mapped ? 0 : b * per_byte(model->stage_Bps)) +
             last * per_byte(model->copy_Bps);
    }
    if (t_direct != NULL)
        *t_direct = td;
    if (t_staged != NULL)
        *t_staged = ts;
    if (force == KVR_EXEC_DIRECT || force == KVR_EXEC_STAGED)
        return force;
    if (model == NULL || slot_bytes == 0)
        return KVR_EXEC_DIRECT;
    return ts < td ? KVR_EXEC_STAGED : KVR_EXEC_DIRECT;
}
