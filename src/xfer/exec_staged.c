/* Staged executor: the producer packs the rank's stream in consumer order
 * into the consumer's granted staging slots, one chunk per slot; each
 * chunk is flushed (or stored through a mapping) before its CHUNK message.
 * The consumer unpacks a chunk only after its CHUNK arrived and acks it;
 * the ack frees the slot for chunk c + num_slots (back-pressure).
 * gpu-staged is the same protocol with the caller's packer (CUDA kernels)
 * instead of kvr_xfer_pack/unpack: the producer packs `depth` chunks ahead
 * into its own pack buffers, so packing chunk c + 1 overlaps putting
 * chunk c, and never packs through a mapping. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "exec_internal.h"

typedef unsigned long long ull;

typedef struct {
    kvr_ep_t *ep;
    const kvr_xfer_seg_t *segs;
    size_t n;
    const kvr_exec_params_t *p;
    kvr_exec_stats_t *stats;
    uint64_t total, chunks, settled; /* settled: chunks acked / unpacked */
    unsigned char *flags;            /* per chunk: acked / unpacked */
    kvr_xfer_cursor_t cur;
    unsigned char *buf; /* producer: pack buffer when not mapped */
    bool own_buf;
    const kvr_exec_packer_t *pk; /* gpu-staged; NULL: host copies */
    uint32_t depth;              /* pack buffers (gpu-staged) */
} staged_t;

kvr_status_t kvr__staged_check(const kvr_exec_params_t *p, bool producer,
                               kvr_error_t *err)
{
    if (p->slot_bytes == 0 || p->num_slots == 0 || p->slots == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "staged: %u slots of %llu bytes", p->num_slots,
                             (ull)p->slot_bytes);
    if (producer ? p->staging == NULL : p->staging_local == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "staged: no staging region");
    uint64_t len = producer ? kvr_rmem_len(p->staging) : UINT64_MAX;
    for (uint32_t i = 0; i < p->num_slots; i++) {
        uint64_t s = p->slots[i];
        if (s >= len / p->slot_bytes)
            return kvr_error_set(err, KVR_ERR_RUN_OUT_OF_BOUNDS,
                                 "staging slot %llu of %llu bytes is outside "
                                 "a staging region of %llu bytes",
                                 (ull)s, (ull)p->slot_bytes, (ull)len);
        for (uint32_t j = 0; j < i; j++)
            if (p->slots[j] == s)
                return kvr_error_set(err, KVR_ERR_INVALID,
                                     "staging slot %llu granted twice", (ull)s);
    }
    if (producer && p->pack_buf != NULL &&
        kvr_mem_len(p->pack_buf) < p->slot_bytes)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "pack buffer of %zu bytes < slot of %llu",
                             kvr_mem_len(p->pack_buf), (ull)p->slot_bytes);
    return KVR_OK;
}

kvr_status_t kvr__gpu_staged_check(const kvr_exec_params_t *p, bool producer,
                                   kvr_error_t *err)
{
    const kvr_exec_packer_t *k = p->packer;
    if (k == NULL || k->depth == 0 ||
        (producer ? k->pack == NULL || k->pack_wait == NULL
                  : k->unpack == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "gpu-staged: no packer, or one without its %s "
                             "functions or pack buffers",
                             producer ? "pack" : "unpack");
    if (producer && (p->pack_buf == NULL ||
                     kvr_mem_len(p->pack_buf) / k->depth < p->slot_bytes))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "gpu-staged: pack buffer of %zu bytes for %u "
                             "buffers of %llu",
                             kvr_mem_len(p->pack_buf), k->depth,
                             (ull)p->slot_bytes);
    return kvr__staged_check(p, producer, err);
}

static kvr_status_t staged_init(staged_t *s, kvr_ep_t *ep,
                                const kvr_xfer_seg_t *segs, size_t n,
                                const kvr_exec_params_t *p,
                                kvr_exec_stats_t *stats)
{
    memset(s, 0, sizeof(*s));
    s->ep = ep;
    s->segs = segs;
    s->n = n;
    s->p = p;
    s->stats = stats;
    s->pk = p->packer;
    s->total = kvr_xfer_stream_bytes(segs, n);
    s->chunks = s->total / p->slot_bytes + (s->total % p->slot_bytes != 0);
    s->flags = calloc(s->chunks + 1, 1);
    if (s->flags == NULL)
        return kvr__fail(ep->t, KVR_ERR_NO_MEMORY, "flags for %llu chunks",
                         (ull)s->chunks);
    return KVR_OK;
}

static void staged_fini(staged_t *s)
{
    free(s->flags);
    if (s->own_buf)
        free(s->buf);
}

static uint64_t chunk_len(const staged_t *s, uint64_t c)
{
    uint64_t off = c * s->p->slot_bytes;
    return s->total - off < s->p->slot_bytes ? s->total - off
                                             : s->p->slot_bytes;
}

/* Mapped staging first (no put at all), then the caller's registered
 * buffer, then a private one. */
static kvr_status_t pick_buffer(staged_t *s)
{
    void *ptr;
    const kvr_exec_params_t *p = s->p;
    if (kvr_rmem_ptr(p->staging, 0, p->slot_bytes, &ptr) == KVR_OK) {
        s->stats->mapped = true;
        return KVR_OK;
    }
    if (p->pack_buf != NULL) {
        s->buf = kvr_mem_addr(p->pack_buf);
        return KVR_OK;
    }
    s->buf = malloc(p->slot_bytes);
    s->own_buf = s->buf != NULL;
    return s->buf ? KVR_OK
                  : kvr__fail(s->ep->t, KVR_ERR_NO_MEMORY,
                              "pack buffer of %llu bytes", (ull)p->slot_bytes);
}

static kvr_status_t wait_ack(staged_t *s, uint64_t chunk)
{
    while (!s->flags[chunk]) {
        uint32_t type;
        kvr__exec_msg_t m;
        kvr_status_t st = kvr__exec_recv_ctl(s->ep, s->p->transfer_id,
                                             KVR__BIT(KVR__MSG_ACK),
                                             s->p->deadline_ns, &type, &m);
        if (st != KVR_OK)
            return st;
        if (m.chunk >= s->chunks)
            return kvr__fail(s->ep->t, KVR_ERR_PROTO,
                             "ack for chunk %llu of %llu", (ull)m.chunk,
                             (ull)s->chunks);
        if (!s->flags[m.chunk]) { /* duplicates are ignored */
            s->flags[m.chunk] = 1;
            s->settled++;
        }
    }
    return KVR_OK;
}

/* Chunk c (len bytes in consumer slot `slot`) is in place: CHUNK tells the
 * consumer, and it counts. */
static kvr_status_t chunk_sent(staged_t *s, uint64_t c, uint32_t slot,
                               uint64_t len)
{
    const kvr_exec_params_t *p = s->p;
    kvr__exec_msg_t m = {
        .transfer_id = p->transfer_id, .chunk = c, .bytes = len, .slot = slot};
    kvr_status_t st = kvr__exec_send_ctl(s->ep, KVR__MSG_CHUNK, &m,
                                         p->deadline_ns, s->stats);
    if (st == KVR_OK) {
        s->stats->chunks++;
        s->stats->bytes += len;
    }
    return st;
}

static kvr_status_t send_chunk(staged_t *s, uint64_t c)
{
    const kvr_exec_params_t *p = s->p;
    kvr_status_t st = c >= p->num_slots ? wait_ack(s, c - p->num_slots)
                                        : KVR_OK;
    uint64_t len = chunk_len(s, c);
    uint32_t slot = p->slots[c % p->num_slots];
    uint64_t roff = (uint64_t)slot * p->slot_bytes;
    if (st == KVR_OK && s->stats->mapped) {
        void *dst;
        st = kvr_rmem_ptr(p->staging, roff, len, &dst);
        if (st == KVR_OK)
            kvr_xfer_pack(s->segs, s->n, &s->cur, c * p->slot_bytes, dst, len);
        atomic_thread_fence(memory_order_release);
    } else if (st == KVR_OK) {
        kvr_xfer_pack(s->segs, s->n, &s->cur, c * p->slot_bytes, s->buf, len);
        st = kvr_xfer_put(s->ep, s->buf, len, p->staging, roff, p->deadline_ns);
        if (st == KVR_OK)
            st = kvr_xfer_flush(s->ep, p->deadline_ns);
        s->stats->puts++;
    }
    return st == KVR_OK ? chunk_sent(s, c, slot, len) : st;
}

/* Packer errors land on the transport, as the executor's own do. */
static kvr_status_t packer_failed(staged_t *s, kvr_status_t st,
                                  const kvr_error_t *e, const char *what,
                                  uint64_t c)
{
    return st == KVR_OK ? KVR_OK
                        : kvr__fail(s->ep->t, st, "%s of chunk %llu: %s", what,
                                    (ull)c, e->msg);
}

static unsigned char *pack_buffer(const staged_t *s, uint64_t c)
{
    return (unsigned char *)kvr_mem_addr(s->p->pack_buf) +
           (c % s->depth) * s->p->slot_bytes;
}

static kvr_status_t gpu_pack(staged_t *s, uint64_t c)
{
    kvr_error_t e = {0};
    if (c >= s->chunks)
        return KVR_OK;
    kvr_status_t st = s->pk->pack(s->pk->ctx, c * s->p->slot_bytes,
                                  chunk_len(s, c), pack_buffer(s, c),
                                  (uint32_t)(c % s->depth), &e);
    return packer_failed(s, st, &e, "pack", c);
}

/* Chunk c was packed ahead into pack buffer c % depth; once its put is
 * flushed that buffer takes chunk c + depth, packed while chunk c + 1
 * goes out. The slot is reused only after chunk c - num_slots's ack. */
static kvr_status_t send_gpu_chunk(staged_t *s, uint64_t c)
{
    const kvr_exec_params_t *p = s->p;
    kvr_error_t e = {0};
    kvr_status_t st = c >= p->num_slots ? wait_ack(s, c - p->num_slots)
                                        : KVR_OK;
    if (st == KVR_OK)
        st = packer_failed(
            s, s->pk->pack_wait(s->pk->ctx, (uint32_t)(c % s->depth), &e), &e,
            "pack", c);
    uint64_t len = chunk_len(s, c);
    uint32_t slot = p->slots[c % p->num_slots];
    if (st == KVR_OK)
        st = kvr_xfer_put(s->ep, pack_buffer(s, c), len, p->staging,
                          (uint64_t)slot * p->slot_bytes, p->deadline_ns);
    if (st == KVR_OK)
        st = kvr_xfer_flush(s->ep, p->deadline_ns);
    s->stats->puts++;
    if (st == KVR_OK)
        st = gpu_pack(s, c + s->depth);
    return st == KVR_OK ? chunk_sent(s, c, slot, len) : st;
}

static kvr_status_t send_chunks(staged_t *s)
{
    kvr_status_t st = KVR_OK;
    if (s->pk == NULL) {
        if (s->chunks != 0)
            st = pick_buffer(s);
        for (uint64_t c = 0; c < s->chunks && st == KVR_OK; c++)
            st = send_chunk(s, c);
        return st;
    }
    s->depth = s->pk->depth;
    for (uint64_t c = 0; c < s->depth && st == KVR_OK; c++)
        st = gpu_pack(s, c);
    for (uint64_t c = 0; c < s->chunks && st == KVR_OK; c++)
        st = send_gpu_chunk(s, c);
    /* a failed chunk may leave packs running into the buffers: wait for
     * them before the caller may free those */
    for (uint32_t b = 0; st != KVR_OK && b < s->depth; b++) {
        kvr_error_t e;
        s->pk->pack_wait(s->pk->ctx, b, &e);
    }
    return st;
}

kvr_status_t kvr__staged_send(kvr_ep_t *ep, const kvr_xfer_seg_t *segs,
                              size_t n, const kvr_exec_params_t *p,
                              kvr_exec_stats_t *stats)
{
    staged_t s;
    kvr_status_t st = staged_init(&s, ep, segs, n, p, stats);
    if (st == KVR_OK)
        st = send_chunks(&s);
    kvr__exec_msg_t done = {
        .transfer_id = p->transfer_id, .chunk = s.chunks, .bytes = s.total};
    if (st == KVR_OK)
        st = kvr__exec_send_ctl(ep, KVR__MSG_DONE, &done, p->deadline_ns,
                                stats);
    for (uint64_t c = 0; c < s.chunks && st == KVR_OK; c++)
        st = wait_ack(&s, c);
    staged_fini(&s);
    return st;
}

/* A CHUNK is checked against the consumer's own plan and grant before a
 * single byte is copied out of the slot. */
static kvr_status_t on_chunk(staged_t *s, const kvr__exec_msg_t *m)
{
    const kvr_exec_params_t *p = s->p;
    uint64_t c = m->chunk;
    if (c >= s->chunks || m->bytes != chunk_len(s, c) ||
        m->slot != p->slots[c % p->num_slots])
        return kvr__fail(s->ep->t, KVR_ERR_PROTO,
                         "CHUNK %llu (%llu bytes, slot %u) does not match a "
                         "plan of %llu chunks",
                         (ull)c, (ull)m->bytes, m->slot, (ull)s->chunks);
    if (!s->flags[c]) {
        atomic_thread_fence(memory_order_acquire);
        const unsigned char *src = (const unsigned char *)p->staging_local +
                                   (uint64_t)m->slot * p->slot_bytes;
        kvr_error_t e = {0};
        if (s->pk == NULL)
            kvr_xfer_unpack(s->segs, s->n, &s->cur, c * p->slot_bytes, src,
                            m->bytes);
        else {
            kvr_status_t st = s->pk->unpack(s->pk->ctx, c * p->slot_bytes,
                                            m->bytes, src, &e);
            if (st != KVR_OK)
                return packer_failed(s, st, &e, "unpack", c);
        }
        s->flags[c] = 1;
        s->settled++;
        s->stats->chunks++;
        s->stats->bytes += m->bytes;
    }
    kvr__exec_msg_t ack = {.transfer_id = p->transfer_id, .chunk = c};
    return kvr__exec_send_ctl(s->ep, KVR__MSG_ACK, &ack, p->deadline_ns,
                              s->stats);
}

static kvr_status_t on_done(staged_t *s, const kvr__exec_msg_t *m)
{
    if (m->bytes != s->total || m->chunk != s->chunks)
        return kvr__fail(s->ep->t, KVR_ERR_PROTO,
                         "DONE reports %llu bytes in %llu chunks, the plan has "
                         "%llu in %llu",
                         (ull)m->bytes, (ull)m->chunk, (ull)s->total,
                         (ull)s->chunks);
    return KVR_OK;
}

kvr_status_t kvr__staged_recv(kvr_ep_t *ep, const kvr_xfer_seg_t *segs,
                              size_t n, const kvr_exec_params_t *p,
                              kvr_exec_stats_t *stats)
{
    staged_t s;
    bool done = false;
    kvr_status_t st = staged_init(&s, ep, segs, n, p, stats);
    while (st == KVR_OK && (s.settled < s.chunks || !done)) {
        uint32_t type;
        kvr__exec_msg_t m;
        st = kvr__exec_recv_ctl(ep, p->transfer_id,
                                KVR__BIT(KVR__MSG_CHUNK) |
                                    KVR__BIT(KVR__MSG_DONE),
                                p->deadline_ns, &type, &m);
        if (st == KVR_OK && type == KVR__MSG_CHUNK)
            st = on_chunk(&s, &m);
        else if (st == KVR_OK) {
            st = on_done(&s, &m);
            done = true;
        }
    }
    /* The last acks must leave before this side stops progressing: UCX may
     * hold them in its pending queue while the producer's FIFO is full. A
     * flush would need the producer's progress too, which it may have
     * stopped once the acks arrived; draining needs only ours. */
    if (st == KVR_OK)
        st = kvr_xfer_drain(ep, p->deadline_ns);
    staged_fini(&s);
    return st;
}
