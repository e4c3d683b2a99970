/* The agent's staged executor (docs/agent.md Executors, docs/design.md §6):
 * the producer packs a pull's byte stream (its runs in the consumer's page
 * order) into chunks, writes each into a staging slot the consumer granted
 * and sends CHUNK_DONE; the consumer unpacks the chunk into its pages and
 * echoes CHUNK_DONE as the ack that frees the slot. One chunk per granted
 * slot may be unacked, so a pull with every slot full leaves the active
 * list until an ack comes. The consumer's LOADED needs every chunk
 * unpacked. The producer picks direct or staged per pull with the cost
 * model (kvr__data_choose), probed once per consumer link, in steps
 * between the loop's turns (kvr__probe_work). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"

/* ---- consumer: the slot pool ---- */

void kvr__staged_grant(kvr_agent_t *a, const kvr__creq_t *r, kvr__cstage_t *s)
{
    if (a->staging < 0)
        return;
    const kvr_region_desc_t *d = &a->regions[a->staging].desc;
    uint64_t usable = d->num_blocks - 1; /* the last: the cost probe's */
    uint64_t chunks = (s->expect_bytes + d->page_bytes - 1) / d->page_bytes;
    /* a fair share, so that every stage of the request can stage at once */
    uint64_t share = usable / (r->num_stages ? r->num_stages : 1);
    uint64_t want = chunks < share ? chunks : share ? share : 1;
    for (uint64_t i = 0;
         i < usable && s->nslots < want && s->nslots < KVR_AGENT_MAX_SLOTS; i++)
        if (!a->slot_busy[i]) {
            a->slot_busy[i] = 1;
            s->slots[s->nslots++] = (uint32_t)i;
        }
}

void kvr__staged_free(kvr_agent_t *a, kvr__cstage_t *s)
{
    for (uint32_t i = 0; i < s->nslots; i++)
        a->slot_busy[s->slots[i]] = 0;
    a->slots_freed = a->slots_freed || s->nslots > 0;
    s->nslots = 0;
}

static bool granted(const kvr__cstage_t *s, uint32_t slot)
{
    for (uint32_t i = 0; i < s->nslots; i++)
        if (s->slots[i] == slot)
            return true;
    return false;
}

kvr_status_t kvr__staged_unpack(kvr_agent_t *a, kvr__cstage_t *s,
                                const kvr_msg_chunk_done_t *m, kvr_error_t *err)
{
    const kvr__aregion_t *g = a->staging >= 0 ? &a->regions[a->staging] : NULL;
    if (g == NULL || !granted(s, m->slot) || m->offset != s->unpacked ||
        m->bytes == 0 || m->bytes > g->desc.page_bytes ||
        m->bytes > s->expect_bytes - s->unpacked)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "bad chunk %u (slot %u, offset %llu, %llu bytes; "
                             "expected offset %llu of %llu)",
                             m->chunk, m->slot, (unsigned long long)m->offset,
                             (unsigned long long)m->bytes,
                             (unsigned long long)s->unpacked,
                             (unsigned long long)s->expect_bytes);
    const uint8_t *buf = (const uint8_t *)g->base +
                         (uint64_t)m->slot * g->desc.page_bytes;
    if (g->device) {
        kvr_status_t st = kvr__agpu_unpack(a, s, m->offset, buf, m->bytes, err);
        if (st != KVR_OK)
            return st;
    } else {
        kvr__data_unpack(s->segs, s->nsegs, m->offset, buf, m->bytes);
    }
    s->unpacked += m->bytes;
    a->chunks_moved++;
    kvr_msg_t ack = {.type = KVR_MSG_CHUNK_DONE};
    ack.u.chunk_done = *m;
    kvr__alink_send(a, s->link, &ack);
    return KVR_OK;
}

/* ---- producer ---- */

kvr_status_t kvr__staged_link(kvr_agent_t *a, kvr__alink_t *l,
                              const kvr_wire_region_t *staging,
                              kvr_error_t *err)
{
    const kvr_region_desc_t *d = &staging->desc;
    if (a->p.executor != KVR_AGENT_EXEC_AUTO)
        return KVR_OK; /* the choice is forced: no model needed */
    uint32_t scratch = 0;
    kvr_status_t st = kvr__dpeer_map(
        l->data, staging->base + (d->num_blocks - 1) * d->page_bytes,
        d->page_bytes, staging->rkey, staging->rkey_len, &scratch, err);
    if (st == KVR_OK)
        st = kvr__probe_start(a, l, scratch, d->page_bytes, NULL, err);
    return st;
}

kvr_status_t kvr__probe_start(kvr_agent_t *a, kvr__alink_t *l, uint32_t scratch,
                              uint64_t slot_bytes, const kvr__dmem_t *put_src,
                              kvr_error_t *err)
{
    kvr_status_t st = kvr__data_probe_start(l->data, scratch, slot_bytes,
                                            put_src, err);
    if (st == KVR_OK) {
        l->probe_ns = kvr_now_ns();
        a->probing++;
    }
    return st;
}

/* Is a pull of link l moving? Its puts would be timed with the probe's. */
static bool link_moving(const kvr_agent_t *a, const kvr__alink_t *l)
{
    for (const kvr__pull_t *p = a->active; p != NULL; p = p->work_next)
        if (p->link == l)
            return true;
    return false;
}

/* One step of link l's probe; false once it ended (measured or failed). */
static bool probe_step(kvr_agent_t *a, kvr__alink_t *l, uint64_t until_ns)
{
    kvr_error_t err = {0};
    bool done = false;
    kvr_status_t st = kvr__data_probe_step(l->data, until_ns, &done, &err);
    if (st != KVR_OK) { /* as a probe failing at REGIONS always did */
        kvr__regions_refuse(a, l, st, err.msg);
        return false;
    }
    if (done) {
        char what[256];
        kvr__data_model_describe(l->data, what, sizeof(what));
        kvr__agent_log(a,
                       "link %u: transport probe (in steps) ended %.1f "
                       "ms after REGIONS: %s",
                       l->serial, (double)(kvr_now_ns() - l->probe_ns) * 1e-6,
                       what);
    }
    return !done;
}

/* One probe at a time, the oldest link's (a->links is newest first): a
 * probe's source is 16-128 MiB, and links set up together had their
 * probes one after the other before probes ran in steps too. Pulls come
 * first: while one moves a probe makes a step only every
 * KVR_AGENT_PROBE_BUSY_NS (so it still ends under constant load), and
 * never on the link of a moving pull; the turn in which the last pull
 * stops moving steps it again. */
bool kvr__probe_work(kvr_agent_t *a, uint64_t until_ns)
{
    uint64_t now = kvr_now_ns();
    bool busy = a->active != NULL;
    if (a->probing == 0 ||
        (busy && now < a->probe_step_ns + KVR_AGENT_PROBE_BUSY_NS))
        return false;
    uint32_t left = 0, ready = 0;
    kvr__alink_t *oldest = NULL;
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next) {
        if (l->state == KVR__LINK_CLOSED || !kvr__data_probing(l->data))
            continue;
        left++;
        if (!link_moving(a, l)) {
            oldest = l;
            ready++;
        }
    }
    if (oldest != NULL) {
        if (!probe_step(a, oldest, until_ns)) {
            left--;
            ready--;
        }
        a->probe_step_ns = kvr_now_ns(); /* after it: a slow unit too */
    }
    a->probing = left;
    return ready > 0 && !busy;
}

static int forced(kvr_wire_exec_t asked, kvr_agent_exec_t ours)
{
    if (asked == KVR_WIRE_EXEC_STAGED || asked == KVR_WIRE_EXEC_DIRECT)
        return asked == KVR_WIRE_EXEC_STAGED ? 2 : 1;
    return ours == KVR_AGENT_EXEC_STAGED ? 2 : ours == KVR_AGENT_EXEC_DIRECT;
}

kvr_status_t kvr__staged_choose(kvr_agent_t *a, kvr__pull_t *p,
                                kvr_error_t *err)
{
    const kvr__alink_t *l = p->link;
    p->staged = false;
    if (a->p.cuda_device >= 0)
        return kvr__agpu_choose(a, p, err);
    if (p->executor == KVR_WIRE_EXEC_GPU_DIRECT ||
        p->executor == KVR_WIRE_EXEC_GPU_STAGED)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "%s asked of a stage whose KV is in host memory",
                             p->executor == KVR_WIRE_EXEC_GPU_DIRECT
                                 ? "gpu-direct"
                                 : "gpu-staged");
    if (p->nslots == 0)
        return p->executor == KVR_WIRE_EXEC_STAGED
                   ? kvr_error_set(err, KVR_ERR_NO_SPACE,
                                   "staged executor "
                                   "asked without staging slots")
                   : KVR_OK;
    if (l->staging < 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "staging slots granted but "
                             "the consumer announced no STAGING region");
    const kvr_region_desc_t *d = &l->maps[l->staging].desc;
    for (uint32_t i = 0; i < p->nslots; i++)
        if (p->slots[i] >= d->num_blocks - 1)
            return kvr_error_set(err, KVR_ERR_BLOCK_RANGE,
                                 "staging slot %u "
                                 "outside the %llu usable slots",
                                 p->slots[i],
                                 (unsigned long long)(d->num_blocks - 1));
    p->staged = kvr__data_choose(l->data, forced(p->executor, a->p.executor),
                                 p->segs, p->nsegs, d->page_bytes) == 2;
    return KVR_OK;
}

kvr_status_t kvr__staged_chunk_done(kvr_agent_t *a, kvr__pull_t *p,
                                    uint32_t slot, uint64_t len)
{
    kvr_msg_t m = {.type = KVR_MSG_CHUNK_DONE};
    kvr_msg_chunk_done_t *d = &m.u.chunk_done;
    d->request_id = p->request;
    d->pp_rank = a->p.topo.pp_rank;
    d->tp_rank = a->p.topo.tp_rank;
    d->write_nonce = p->nonce;
    d->chunk = p->chunks;
    d->slot = slot;
    d->offset = p->sent_off;
    d->bytes = len;
    return kvr__alink_send(a, p->link, &m);
}

/* One host-staged chunk: the pull's next bytes (at most a slot, never past
 * the group's end) into the next granted slot, then CHUNK_DONE. */
static kvr_status_t host_chunk(kvr_agent_t *a, kvr__pull_t *p, uint64_t *len,
                               kvr_error_t *err)
{
    kvr__alink_t *l = p->link;
    const kvr__amap_t *sm = &l->maps[l->staging];
    uint64_t slot_bytes = sm->desc.page_bytes;
    uint64_t n = p->group_off - p->sent_off;
    n = n < slot_bytes ? n : slot_bytes;
    uint32_t slot = p->slots[p->chunks % p->nslots];
    kvr_status_t st = kvr__data_send_chunk(
        l->data, p->segs, p->nsegs, p->sent_off, n, sm->mapping,
        slot * slot_bytes, p->deadline_ns, err);
    if (st == KVR_OK && kvr__staged_chunk_done(a, p, slot, n) != KVR_OK)
        st = kvr_error_set(err, KVR_ERR_PEER_DEAD, "consumer link lost");
    *len = n;
    return st;
}

kvr_status_t kvr__staged_slice(kvr_agent_t *a, kvr__pull_t *p, uint64_t *moved,
                               bool *done, kvr_error_t *err)
{
    uint64_t posted = 0;
    kvr_status_t st = p->gstaged ? kvr__agpu_staged_begin(a, p, err) : KVR_OK;
    p->waiting_ack = false;
    /* up to the end of the layer group moving (the whole stream when the
     * pull is not streamed): a chunk never spans two groups */
    while (st == KVR_OK && p->sent_off < p->group_off &&
           posted < KVR_AGENT_SLICE_BYTES) {
        if (p->chunks >= p->acked + p->nslots) {
            p->waiting_ack = true;
            break;
        }
        uint64_t len = 0;
        st = p->gstaged ? kvr__agpu_staged_chunk(a, p, &len, err)
                        : host_chunk(a, p, &len, err);
        if (st == KVR_OK) {
            p->sent_off += len;
            p->chunks++;
            posted += len;
            a->chunks_moved++;
        }
    }
    *moved += posted;
    *done = st == KVR_OK && p->sent_off >= p->group_off;
    return st;
}
