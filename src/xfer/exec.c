/* Executors' shared parts and the direct executor: one put per coalesced
 * run (bounded in flight by the transport), one flush, then DONE. */
#include <stdlib.h>
#include <string.h>

#include "exec_internal.h"

typedef unsigned long long ull;

const char *kvr_exec_name(kvr_exec_kind_t kind)
{
    switch (kind) {
    case KVR_EXEC_AUTO:
        return "auto";
    case KVR_EXEC_DIRECT:
        return "direct";
    case KVR_EXEC_STAGED:
        return "staged";
    case KVR_EXEC_GPU_STAGED:
        return "gpu-staged";
    case KVR_EXEC_GPU_DIRECT:
        return "gpu-direct";
    }
    return "unknown";
}

void kvr__exec_msg_encode(const kvr__exec_msg_t *m,
                          unsigned char out[KVR__EXEC_MSG_BYTES])
{
    kvr__put_le(out, m->transfer_id, 8);
    kvr__put_le(out + 8, m->chunk, 8);
    kvr__put_le(out + 16, m->bytes, 8);
    kvr__put_le(out + 24, m->slot, 4);
}

kvr_status_t kvr__exec_msg_decode(const kvr_xfer_msg_t *msg,
                                  kvr__exec_msg_t *out)
{
    if (msg->len != KVR__EXEC_MSG_BYTES)
        return KVR_ERR_PROTO;
    out->transfer_id = kvr__get_le(msg->data, 8);
    out->chunk = kvr__get_le(msg->data + 8, 8);
    out->bytes = kvr__get_le(msg->data + 16, 8);
    out->slot = (uint32_t)kvr__get_le(msg->data + 24, 4);
    return KVR_OK;
}

kvr_status_t kvr__exec_send_ctl(kvr_ep_t *ep, uint32_t type,
                                const kvr__exec_msg_t *m, uint64_t deadline_ns,
                                kvr_exec_stats_t *stats)
{
    unsigned char buf[KVR__EXEC_MSG_BYTES];
    kvr__exec_msg_encode(m, buf);
    kvr_status_t st = kvr_xfer_send_msg(ep, type, buf, sizeof(buf),
                                        deadline_ns);
    if (st == KVR_OK)
        stats->msgs++;
    return st;
}

typedef struct {
    uint64_t transfer_id;
    uint32_t types; /* bit (type - RESERVED) */
} match_t;

static int match_ctl(void *ctx, const kvr_xfer_msg_t *msg)
{
    const match_t *m = ctx;
    uint32_t bit = msg->type - KVR_XFER_MSG_RESERVED;
    kvr__exec_msg_t em;
    return msg->type > KVR_XFER_MSG_RESERVED && bit < 32 &&
           (m->types & (1u << bit)) &&
           kvr__exec_msg_decode(msg, &em) == KVR_OK &&
           em.transfer_id == m->transfer_id;
}

kvr_status_t kvr__exec_recv_ctl(kvr_ep_t *ep, uint64_t transfer_id,
                                uint32_t types, uint64_t deadline_ns,
                                uint32_t *type, kvr__exec_msg_t *out)
{
    match_t m = {.transfer_id = transfer_id,
                 .types = types | KVR__BIT(KVR__MSG_ABORT)};
    kvr_xfer_msg_t *msg = NULL;
    kvr_status_t st = kvr_xfer_recv_msg(ep->t, match_ctl, &m, &msg,
                                        deadline_ns);
    if (st == KVR_OK) {
        *type = msg->type;
        kvr__exec_msg_decode(msg, out);
        kvr_xfer_msg_free(msg);
    }
    if (st == KVR_OK && *type == KVR__MSG_ABORT) {
        st = kvr__exec_abort_status(out->slot);
        return kvr__fail(ep->t, st, "peer aborted the transfer with status %u",
                         out->slot);
    }
    if (st == KVR_OK || kvr__ep_failed(ep) == KVR_OK)
        return st;
    return kvr__ep_failed(ep); /* a dead peer explains the silence */
}

/* A peer's abort carries its status; anything unknown or OK is malformed. */
kvr_status_t kvr__exec_abort_status(uint32_t code)
{
    const char *name = kvr_status_name((kvr_status_t)code);
    if (code == KVR_OK || name == NULL)
        return KVR_ERR_PROTO;
    return (kvr_status_t)code;
}

/* Best effort: the peer learns why before its own deadline. */
void kvr__exec_abort(kvr_ep_t *ep, uint64_t transfer_id, kvr_status_t st,
                     kvr_exec_stats_t *stats)
{
    if (kvr__ep_failed(ep) != KVR_OK)
        return;
    kvr__exec_msg_t m = {.transfer_id = transfer_id, .slot = (uint32_t)st};
    kvr__exec_send_ctl(ep, KVR__MSG_ABORT, &m, kvr_deadline_ns(100), stats);
}

kvr_status_t kvr__exec_error(kvr_ep_t *ep, kvr_error_t *err, kvr_status_t st,
                             const char *what, uint64_t transfer_id)
{
    return kvr_error_set(err, st, "%s, transfer %llu: %s (%s)", what,
                         (ull)transfer_id, kvr_status_str(st),
                         kvr_xfer_last_error(ep->t));
}

static kvr_status_t direct_send(kvr_ep_t *ep, const kvr_xfer_seg_t *segs,
                                size_t n, const kvr_exec_params_t *p,
                                kvr_exec_stats_t *stats)
{
    kvr_status_t st = KVR_OK;
    for (size_t i = 0; i < n && st == KVR_OK; i++) {
        size_t num_runs;
        const kvr_run_t *runs = kvr_plan_runs(segs[i].plan, &num_runs);
        const unsigned char *src = segs[i].src;
        for (size_t r = 0; r < num_runs && st == KVR_OK; r++) {
            st = kvr_xfer_put(ep, src + runs[r].src, runs[r].len, segs[i].dst,
                              runs[r].dst, p->deadline_ns);
            stats->puts++;
            stats->bytes += runs[r].len;
        }
    }
    if (st == KVR_OK)
        st = kvr_xfer_flush(ep, p->deadline_ns);
    kvr__exec_msg_t done = {.transfer_id = p->transfer_id,
                            .bytes = stats->bytes};
    if (st == KVR_OK)
        st = kvr__exec_send_ctl(ep, KVR__MSG_DONE, &done, p->deadline_ns,
                                stats);
    if (st == KVR_OK) /* DONE must leave even if the caller stops progressing */
        st = kvr_xfer_drain(ep, p->deadline_ns);
    return st;
}

/* Direct consumer: the producer's DONE follows its flush, so the data is
 * in place once DONE arrived with the planned byte count. */
static kvr_status_t direct_recv(kvr_ep_t *ep, const kvr_xfer_seg_t *segs,
                                size_t n, const kvr_exec_params_t *p,
                                kvr_exec_stats_t *stats)
{
    uint32_t type;
    kvr__exec_msg_t m;
    kvr_status_t st = kvr__exec_recv_ctl(
        ep, p->transfer_id, KVR__BIT(KVR__MSG_DONE), p->deadline_ns, &type, &m);
    if (st != KVR_OK)
        return st;
    uint64_t want = kvr_xfer_stream_bytes(segs, n);
    if (m.bytes != want)
        return kvr__fail(ep->t, KVR_ERR_PROTO,
                         "DONE reports %llu bytes, the plan has %llu",
                         (ull)m.bytes, (ull)want);
    stats->bytes = m.bytes;
    return KVR_OK;
}

static kvr_status_t check_args(kvr_ep_t *ep, kvr_exec_kind_t kind,
                               const kvr_xfer_seg_t *segs, size_t n,
                               const kvr_exec_params_t *p, bool producer,
                               kvr_error_t *err)
{
    if (ep == NULL || p == NULL || (n && segs == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "ep, params or segs NULL");
    if (kind != KVR_EXEC_DIRECT && kind != KVR_EXEC_STAGED &&
        kind != KVR_EXEC_GPU_STAGED)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "executor %d: pick direct, staged or gpu-staged "
                             "(see kvr_cost_choose; gpu-direct runs outside "
                             "this layer)",
                             (int)kind);
    bool gpu = kind == KVR_EXEC_GPU_STAGED; /* the packer has the bases */
    for (size_t i = 0; i < n; i++) {
        const kvr_xfer_seg_t *s = &segs[i];
        bool ok = s->plan != NULL &&
                  (gpu || (producer ? s->src != NULL &&
                                          (kind == KVR_EXEC_STAGED ||
                                           s->dst != NULL)
                                    : kind == KVR_EXEC_DIRECT ||
                                          s->dst_local != NULL));
        if (!ok)
            return kvr_error_set(
                err, KVR_ERR_INVALID, "segment %zu lacks its plan or %s base",
                i, producer ? "source/destination" : "destination");
    }
    if (kind == KVR_EXEC_STAGED)
        return kvr__staged_check(p, producer, err);
    if (gpu)
        return kvr__gpu_staged_check(p, producer, err);
    return KVR_OK;
}

/* Both sides: check, run, and on failure tell the peer why (unless the
 * peer is the reason: dead or silent). */
static kvr_status_t run(kvr_ep_t *ep, kvr_exec_kind_t kind,
                        const kvr_xfer_seg_t *segs, size_t n,
                        const kvr_exec_params_t *p, bool producer,
                        kvr_exec_stats_t *stats, kvr_error_t *err)
{
    static const char *const what[2][3] = {
        {"direct receive", "staged receive", "gpu-staged receive"},
        {"direct send", "staged send", "gpu-staged send"}};
    kvr_exec_stats_t s = {0};
    kvr_status_t st = check_args(ep, kind, segs, n, p, producer, err);
    if (st != KVR_OK)
        return st;
    /* the gpu-staged protocol is staged's; the packer is in p */
    bool staged = kind != KVR_EXEC_DIRECT;
    kvr_exec_params_t q = *p;
    if (kind == KVR_EXEC_STAGED)
        q.packer = NULL;
    p = &q;
    if (producer)
        st = staged ? kvr__staged_send(ep, segs, n, p, &s)
                    : direct_send(ep, segs, n, p, &s);
    else
        st = staged ? kvr__staged_recv(ep, segs, n, p, &s)
                    : direct_recv(ep, segs, n, p, &s);
    if (st != KVR_OK) {
        if (st != KVR_ERR_TIMEOUT && st != KVR_ERR_PEER_DEAD)
            kvr__exec_abort(ep, p->transfer_id, st, &s);
        return kvr__exec_error(ep, err, st, what[producer][kind - 1],
                               p->transfer_id);
    }
    if (stats != NULL)
        *stats = s;
    return KVR_OK;
}

kvr_status_t kvr_exec_send(kvr_ep_t *ep, kvr_exec_kind_t kind,
                           const kvr_xfer_seg_t *segs, size_t n,
                           const kvr_exec_params_t *params,
                           kvr_exec_stats_t *stats, kvr_error_t *err)
{
    return run(ep, kind, segs, n, params, true, stats, err);
}

kvr_status_t kvr_exec_recv(kvr_ep_t *ep, kvr_exec_kind_t kind,
                           const kvr_xfer_seg_t *segs, size_t n,
                           const kvr_exec_params_t *params,
                           kvr_exec_stats_t *stats, kvr_error_t *err)
{
    return run(ep, kind, segs, n, params, false, stats, err);
}
