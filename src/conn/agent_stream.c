/* Layer-wise streaming in the agent (docs/agent.md Streaming, docs/design.md
 * §15). A consumer that streams asks each stage with STREAM_REQUEST (its
 * layer range); the stage serves the layers send_ready made ready one group
 * at a time, in layer order, and ends each group with LAYERS_DONE (its
 * layers, bytes and chunks) once its bytes are in place; WRITE_DONE still
 * ends the pull with the total. The consumer counts each group against its
 * own plan and reports LAYERS_LOADED for the layers that every stage
 * serving them has delivered; LOADED still needs every byte.
 *
 * A group is every ready layer from the pull's next layer on, as of the
 * moment it starts: layers made ready one by one while the pull keeps up
 * move one by one, and a pull that arrives after everything is ready moves
 * its range as one group (one flush, one LAYERS_DONE). */
#include <stdio.h>
#include <string.h>

#include "agent_internal.h"

/* ---- producer ---- */

/* The first seg at or after `from` whose layer is `layer` or later (segs
 * are in (layer, role) order). */
static size_t seg_at(const kvr__pull_t *p, size_t from, uint32_t layer)
{
    while (from < p->nsegs && p->segs[from].layer < layer)
        from++;
    return from;
}

/* The end of the run of ready layers from `from` on, within the pull. */
static uint32_t ready_until(const kvr_agent_t *a, const kvr__preq_t *r,
                            const kvr__pull_t *p, uint32_t from)
{
    uint32_t s = a->p.topo.layer_start, e = from;
    while (e < p->layer_hi && e >= s && e < a->p.topo.layer_end &&
           r->layer_ready[e - s])
        e++;
    return e;
}

bool kvr__stream_next(const kvr_agent_t *a, const kvr__preq_t *r,
                      kvr__pull_t *p)
{
    uint32_t begin = p->group_end > p->layer_lo ? p->group_end : p->layer_lo;
    uint32_t end = p->stream ? ready_until(a, r, p, begin) : p->layer_hi;
    if (end <= begin)
        return false;
    p->group_begin = begin;
    p->group_end = end;
    p->group_seg0 = p->group_segs;
    p->group_segs = p->stream ? seg_at(p, p->group_seg0, end) : p->nsegs;
    p->group_off0 = p->group_off;
    p->group_off += kvr__dseg_bytes(p->segs + p->group_seg0,
                                    p->group_segs - p->group_seg0);
    p->group_chunk0 = p->chunks;
    return true;
}

kvr_status_t kvr__stream_group_done(kvr_agent_t *a, kvr__pull_t *p)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_LAYERS_DONE);
    kvr_msg_layers_done_t *g = &m.u.layers_done;
    g->request_id = p->request;
    g->pp_rank = a->p.topo.pp_rank;
    g->tp_rank = a->p.topo.tp_rank;
    g->write_nonce = p->nonce;
    g->layer_begin = p->group_begin;
    g->layer_end = p->group_end;
    g->bytes = p->group_off - p->group_off0;
    g->chunks = p->chunks - p->group_chunk0;
    return kvr__alink_send(a, p->link, &m);
}

/* ---- consumer ---- */

void kvr__stream_ask(const kvr__creq_t *r, kvr__cstage_t *s, kvr_msg_t *m)
{
    const kvr_msg_hello_t *peer = &s->link->link->peer;
    s->stream = r->stream && peer->proto_minor >= KVR_WIRE_MINOR_STREAM;
    if (!s->stream)
        return;
    m->type = KVR_MSG_STREAM_REQUEST;
    m->u.write_request.layer_begin = s->layer_lo;
    m->u.write_request.layer_end = s->layer_hi;
}

/* Planned bytes of stage s for layers [begin, end). */
static uint64_t planned(const kvr__cstage_t *s, uint32_t begin, uint32_t end)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->nsegs; i++)
        if (s->segs[i].layer >= begin && s->segs[i].layer < end)
            n += kvr__dseg_bytes(&s->segs[i], 1);
    return n;
}

/* Layer l is loaded once every stage that serves it counted it. */
static bool layer_loaded(const kvr__creq_t *r, uint32_t l)
{
    for (uint32_t i = 0; i < r->num_stages; i++) {
        const kvr__cstage_t *s = &r->stages[i];
        if (l >= s->layer_lo && l < s->layer_hi && s->layer_next <= l)
            return false;
    }
    return true;
}

static void report_run(kvr_agent_t *a, const kvr__creq_t *r, uint32_t begin,
                       uint32_t end)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < r->num_stages; i++)
        bytes += planned(&r->stages[i], begin, end);
    kvr__agent_layers_loaded(a, &r->producer, &r->id, begin, end, bytes);
}

/* A stage just counted layers [begin, end): our layers in it that are now
 * loaded from every source become LAYERS_LOADED, one event per run. Walks
 * our regions (in layer order), never the range itself: a peer's range is
 * its word, and may be huge. */
static void report(kvr_agent_t *a, const kvr__creq_t *r, uint32_t begin,
                   uint32_t end)
{
    bool open = false;
    uint32_t run = 0, last = 0;
    for (uint32_t i = 0; r->stream && i < a->num_order; i++) {
        uint32_t l = a->regions[a->order[i]].desc.layer;
        if (l < begin || l >= end)
            continue;
        if (layer_loaded(r, l)) {
            run = open ? run : l;
            last = l;
            open = true;
            continue;
        }
        if (open)
            report_run(a, r, run, last + 1);
        open = false;
    }
    if (open)
        report_run(a, r, run, last + 1);
}

kvr_status_t kvr__stream_count(kvr_agent_t *a, kvr__creq_t *r, kvr__cstage_t *s,
                               const kvr_msg_layers_done_t *g, kvr_error_t *err)
{
    if (!s->stream)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "LAYERS_DONE from a stage not asked to stream");
    if (g->layer_begin != s->layer_next || g->layer_end <= g->layer_begin ||
        g->layer_end > s->layer_hi)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "LAYERS_DONE for layers [%u, %u), expected a "
                             "group from layer %u up to %u",
                             g->layer_begin, g->layer_end, s->layer_next,
                             s->layer_hi);
    uint64_t want = planned(s, g->layer_begin, g->layer_end);
    uint64_t through = s->counted + g->bytes;
    /* staged: every chunk of the group unpacked before it counts */
    bool unpacked = g->chunks ? s->unpacked == through
                              : s->unpacked == 0 || s->unpacked == through;
    if (g->bytes != want || !unpacked)
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "layers [%u, %u): %llu bytes in %u chunks "
                             "(%llu unpacked in all), the plan has %llu",
                             g->layer_begin, g->layer_end,
                             (unsigned long long)g->bytes, g->chunks,
                             (unsigned long long)s->unpacked,
                             (unsigned long long)want);
    s->counted = through;
    s->layer_next = g->layer_end;
    report(a, r, g->layer_begin, g->layer_end);
    return KVR_OK;
}

kvr_status_t kvr__stream_stage_done(kvr_agent_t *a, kvr__creq_t *r,
                                    kvr__cstage_t *s, kvr_error_t *err)
{
    if (s->stream &&
        (s->layer_next != s->layer_hi || s->counted != s->expect_bytes))
        return kvr_error_set(err, KVR_ERR_VERIFY,
                             "WRITE_DONE with layers [%u, %u) of [%u, %u) "
                             "counted (%llu of %llu bytes)",
                             s->layer_lo, s->layer_next, s->layer_lo,
                             s->layer_hi, (unsigned long long)s->counted,
                             (unsigned long long)s->expect_bytes);
    uint32_t begin = s->layer_next;
    s->counted = s->expect_bytes;
    s->layer_next = s->layer_hi;
    report(a, r, begin, s->layer_hi);
    return KVR_OK;
}

/* ---- tests ---- */

void kvr__agent_speak_3_0(kvr_agent_t *a)
{
    pthread_mutex_lock(&a->turn_lock); /* the loop reads it in its turns */
    a->speaks_3_0 = true;
    pthread_mutex_unlock(&a->turn_lock);
}
