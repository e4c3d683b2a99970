/* What links are for once they are up: a consumer's directory of producer
 * instances (bootstrap link, STAGES, one serving link per PP stage), the PP
 * head's stage table (JOIN in, STAGES out), a non-head stage joining its
 * head, and REGIONS (consumer announces, producer maps). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_internal.h"

/* ---- consumer: the directory ---- */

kvr__pdir_t *kvr__pdir_get(kvr_agent_t *a, const kvr_wire_id_t *instance,
                           const char *bootstrap)
{
    kvr__pdir_t *d = a->dirs;
    while (d != NULL && !kvr_wire_id_equal(&d->instance, instance))
        d = d->next;
    if (d == NULL) {
        d = calloc(1, sizeof(*d));
        if (d == NULL)
            return NULL;
        d->instance = *instance;
        d->next = a->dirs;
        a->dirs = d;
    }
    /* a new bootstrap address (a restarted head on another port) wins for
     * the next dial; live links stay until they fail */
    snprintf(d->bootstrap, sizeof(d->bootstrap), "%s", bootstrap);
    return d;
}

void kvr__pdir_free_all(kvr_agent_t *a)
{
    for (kvr__pdir_t *d = a->dirs, *n; d != NULL; d = n) {
        n = d->next;
        free(d->stages);
        free(d->serving);
        free(d);
    }
    a->dirs = NULL;
}

static void dir_error(kvr__pdir_t *d, kvr_status_t st, const char *msg)
{
    d->error = st;
    d->error_ns = kvr_now_ns();
    snprintf(d->error_msg, sizeof(d->error_msg), "%s", msg);
}

static kvr__alink_t *dial(kvr_agent_t *a, kvr__pdir_t *d, const char *address)
{
    kvr_error_t err = {0};
    kvr__alink_t *l = NULL;
    if (kvr__alink_dial(a, address, KVR__LINK_STAGE, &l, &err) != KVR_OK) {
        dir_error(d, err.code, err.msg);
        return NULL;
    }
    l->dir = d;
    return l;
}

static const kvr_wire_stage_t *stage_entry(const kvr__pdir_t *d, uint32_t pp,
                                           uint32_t tp)
{
    for (uint32_t i = 0; i < d->num_stages; i++)
        if (d->stages[i].pp_rank == pp && d->stages[i].tp_rank == tp &&
            d->stages[i].address[0])
            return &d->stages[i];
    return NULL;
}

static kvr__alink_t *link_to(kvr_agent_t *a, const kvr__pdir_t *d,
                             const char *address)
{
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next)
        if (l->dir == d && l->state != KVR__LINK_CLOSED &&
            strcmp(l->address, address) == 0)
            return l;
    return NULL;
}

/* Is producer tp rank tp one of our sources (docs/agent.md Fan-in)? */
static bool wanted(const kvr_agent_t *a, uint32_t tp)
{
    return tp < KVR_AGENT_MAX_TP && (a->sources >> tp & 1);
}

static kvr__alink_t **serving_slot(kvr__pdir_t *d, uint32_t pp, uint32_t tp)
{
    uint64_t i = (uint64_t)pp * d->tp_size + tp;
    return d->serving != NULL && pp < d->pp_size && tp < d->tp_size &&
                   i < d->num_serving
               ? &d->serving[i]
               : NULL;
}

/* Dials what the instance's waiting requests still need: the bootstrap
 * address until STAGES came, then each stage that is one of our sources. */
void kvr__pdir_kick(kvr_agent_t *a, kvr__pdir_t *d)
{
    if (kvr_now_ns() < d->next_dial_ns)
        return;
    d->next_dial_ns = 0; /* the retry is being made */
    if (d->head == NULL && (!d->have_stages || link_to(a, d, d->bootstrap)))
        d->head = link_to(a, d, d->bootstrap);
    if (d->head == NULL && !d->have_stages)
        d->head = dial(a, d, d->bootstrap);
    if (!d->have_stages)
        return;
    for (uint32_t pp = 0; pp < d->pp_size; pp++)
        for (uint32_t tp = 0; tp < d->tp_size; tp++) {
            const kvr_wire_stage_t *s = stage_entry(d, pp, tp);
            kvr__alink_t **slot = serving_slot(d, pp, tp);
            if (!wanted(a, tp) || slot == NULL || *slot != NULL || s == NULL)
                continue;
            kvr__alink_t *l = link_to(a, d, s->address);
            *slot = l ? l : dial(a, d, s->address);
        }
}

bool kvr__pdir_ready(const kvr_agent_t *a, const kvr__pdir_t *d)
{
    if (!d->have_stages || d->serving == NULL)
        return false;
    for (uint32_t pp = 0; pp < d->pp_size; pp++)
        for (uint32_t tp = 0; tp < d->tp_size; tp++) {
            const kvr__alink_t *l = d->serving[pp * d->tp_size + tp];
            if (wanted(a, tp) && (l == NULL || l->state != KVR__LINK_READY ||
                                  !l->regions_sent))
                return false;
        }
    return true;
}

bool kvr__pdir_ready_for(const kvr_agent_t *a, const kvr_wire_id_t *instance)
{
    const kvr__pdir_t *d = a->dirs;
    while (d != NULL && !kvr_wire_id_equal(&d->instance, instance))
        d = d->next;
    return d != NULL && kvr__pdir_ready(a, d);
}

/* REGIONS: our regions that move, with their keys and our data address. */
static kvr_status_t send_regions(kvr_agent_t *a, kvr__alink_t *l)
{
    kvr_wire_region_t *regs = calloc(a->num_regions + 1, sizeof(*regs));
    /* a CUDA region's key: its IPC handle, then the transport's key */
    const size_t stride = KVR_DATA_RKEY_MAX + KVR_GPU_RKEY_BYTES;
    uint8_t *keys = calloc(a->num_regions + 1, stride);
    kvr_status_t st = regs && keys ? KVR_OK : KVR_ERR_NO_MEMORY;
    uint32_t n = 0;
    for (uint32_t i = 0; st == KVR_OK && i < a->num_regions; i++) {
        if (a->regions[i].consumer_only)
            continue; /* staging goes: the producer writes chunks there */
        kvr_wire_region_t *r = &regs[n];
        uint8_t *key = keys + (size_t)n * stride;
        kvr_error_t err = {0};
        r->desc = a->regions[i].desc;
        r->base = (uint64_t)(uintptr_t)a->regions[i].base;
        r->rkey = key;
        r->memory = KVR_WIRE_MEM_HOST;
        st = a->regions[i].device
                 ? kvr__agpu_export(a, &a->regions[i], r, key, &err)
                 : kvr__dmem_rkey(a->regions[i].mem, key, &r->rkey_len);
        n++;
    }
    const void *addr = NULL;
    size_t alen = 0;
    if (st == KVR_OK)
        st = kvr__data_address(a->data, &addr, &alen);
    kvr_msg_t m = {.type = KVR_MSG_REGIONS};
    m.u.regions = (kvr_msg_regions_t){regs, n, addr, (uint32_t)alen};
    if (st == KVR_OK)
        st = kvr__alink_send(a, l, &m);
    free(regs);
    free(keys);
    if (st != KVR_OK)
        kvr__alink_close(a, l, st, "sending REGIONS failed (%s)",
                         kvr_status_name(st));
    return st;
}

/* Is l the link to stage (pp, tp) we expected, of the instance we asked? */
static kvr_status_t check_stage(const kvr__alink_t *l, kvr_error_t *err)
{
    const kvr__pdir_t *d = l->dir;
    const kvr_wire_topo_t *t = &l->link->peer.topo;
    if (!kvr_wire_id_equal(&l->peer_instance, &d->instance))
        return kvr_error_set(err, KVR_ERR_PEER_ROLE,
                             "%s is instance '%.*s', not '%.*s'", l->address,
                             (int)l->peer_instance.len, l->peer_instance.bytes,
                             (int)d->instance.len, d->instance.bytes);
    if (!l->kv)
        return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                             "%s: '%.*s' or this agent has no KV regions",
                             l->address, (int)d->instance.len,
                             d->instance.bytes);
    if (t->pp_size > KVR_AGENT_MAX_STAGES)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "%s: producer PP size %u > %u", l->address,
                             t->pp_size, KVR_AGENT_MAX_STAGES);
    uint32_t Wp = kvr_producer_dcp(&l->link->peer.layout);
    if (t->dcp_rank != t->tp_rank % Wp)
        return kvr_error_set(err, KVR_ERR_PEER_ROLE,
                             "%s: producer tp rank %u says DCP rank %u, not "
                             "tp %% W_p = %u",
                             l->address, t->tp_rank, t->dcp_rank,
                             t->tp_rank % Wp);
    if (d->head == l && (t->pp_rank != 0 || t->tp_rank != 0))
        return kvr_error_set(err, KVR_ERR_PEER_ROLE,
                             "bootstrap %s is stage (pp %u, tp %u) of '%.*s', "
                             "not its PP head",
                             l->address, t->pp_rank, t->tp_rank,
                             (int)d->instance.len, d->instance.bytes);
    return KVR_OK;
}

void kvr__link_ready_stage(kvr_agent_t *a, kvr__alink_t *l)
{
    kvr_error_t err = {0};
    kvr__pdir_t *d = l->dir;
    if (d == NULL || check_stage(l, &err) != KVR_OK) {
        kvr__alink_close(a, l, err.code ? err.code : KVR_ERR_PROTO, "%s",
                         err.msg[0] ? err.msg : "a link with no directory");
        return;
    }
    const kvr_wire_topo_t *t = &l->link->peer.topo;
    bool serving = wanted(a, t->tp_rank);
    kvr__alink_t **slot = d->have_stages
                              ? serving_slot(d, t->pp_rank, t->tp_rank)
                              : NULL;
    if (serving && slot != NULL && *slot == NULL)
        *slot = l;
    if (serving && send_regions(a, l) != KVR_OK)
        return;
    l->regions_sent = serving;
    d->error = KVR_OK;
    kvr__recv_dir_changed(a, d);
}

/* The serving table for PP x TP stages; links already in it stay where
 * the shape is unchanged. */
static kvr_status_t resize_serving(kvr__pdir_t *d, uint32_t pp, uint32_t tp)
{
    if (d->serving != NULL && d->pp_size == pp && d->tp_size == tp)
        return KVR_OK;
    kvr__alink_t **n = calloc((size_t)pp * tp + 1, sizeof(*n));
    if (n == NULL)
        return KVR_ERR_NO_MEMORY;
    free(d->serving);
    d->serving = n;
    d->num_serving = pp * tp;
    d->pp_size = pp;
    d->tp_size = tp;
    return KVR_OK;
}

/* The head's STAGES: every stage's address, the serving links follow. */
void kvr__link_on_stages(kvr_agent_t *a, kvr__alink_t *l,
                         const kvr_msg_stages_t *m)
{
    kvr__pdir_t *d = l->dir;
    const kvr_wire_topo_t *t = &l->link->peer.topo;
    if (d == NULL || t->pp_rank != 0 || t->tp_rank != 0 ||
        m->pp_size != t->pp_size || m->tp_size != t->tp_size ||
        m->pp_size > KVR_AGENT_MAX_STAGES || m->tp_size > KVR_AGENT_MAX_TP) {
        kvr__alink_close(a, l, KVR_ERR_PROTO,
                         "STAGES from %s: not a PP head, "
                         "or PP %u x TP %u against its HELLO's %u x %u "
                         "(at most %u x %u)",
                         l->address, m->pp_size, m->tp_size, t->pp_size,
                         t->tp_size, KVR_AGENT_MAX_STAGES, KVR_AGENT_MAX_TP);
        return;
    }
    kvr_wire_stage_t *copy = calloc(m->num_stages + 1, sizeof(*copy));
    if (copy == NULL)
        return;
    memcpy(copy, m->stages, m->num_stages * sizeof(*copy));
    if (resize_serving(d, m->pp_size, m->tp_size) != KVR_OK) {
        free(copy);
        return;
    }
    free(d->stages);
    d->stages = copy;
    d->num_stages = m->num_stages;
    d->have_stages = true;
    d->head = l;
    if (wanted(a, 0) && d->serving[0] == NULL)
        d->serving[0] = l;
    /* a serving link whose stage now has another incarnation is stale */
    for (uint32_t i = 0; i < d->num_serving; i++) {
        kvr__alink_t *s = d->serving[i];
        const kvr_wire_stage_t *e = stage_entry(d, i / d->tp_size,
                                                i % d->tp_size);
        if (s != NULL && e != NULL && s->ever_ready &&
            s->peer_incarnation != e->incarnation)
            kvr__alink_close(a, s, KVR_ERR_PEER_DEAD,
                             "producer stage (pp %u, tp %u) restarted "
                             "(incarnation %016llx is now %016llx)",
                             i / d->tp_size, i % d->tp_size,
                             (unsigned long long)s->peer_incarnation,
                             (unsigned long long)e->incarnation);
    }
    kvr__pdir_kick(a, d);
    kvr__recv_dir_changed(a, d);
}

/* A closed link leaves the directory; a refusal, or a failure before the
 * link was ever up, is what the waiting requests fail with. */
void kvr__link_lost_dir(kvr_agent_t *a, kvr__alink_t *l)
{
    kvr__pdir_t *d = l->dir;
    if (d == NULL)
        return;
    if (d->head == l)
        d->head = NULL;
    for (uint32_t i = 0; i < d->num_serving; i++)
        if (d->serving[i] == l)
            d->serving[i] = NULL;
    bool head = l->link != NULL && l->ever_ready &&
                l->link->peer.topo.pp_rank == 0 &&
                l->link->peer.topo.tp_rank == 0;
    if (l->refused ||
        (!l->ever_ready && (d->head == NULL || !d->have_stages))) {
        /* the head is unreachable, or a link was refused: final */
        dir_error(d, l->close_status, l->close_why);
    } else if (!l->ever_ready || head) {
        /* a stage moved or is restarting: retry soon; the head announces a
         * new address with STAGES, or is asked again if it is gone too */
        snprintf(d->error_msg, sizeof(d->error_msg), "%s", l->close_why);
        d->next_dial_ns = kvr_now_ns() + 200 * 1000000ull;
        if (d->head == NULL)
            d->have_stages = false;
    }
    kvr__recv_dir_changed(a, d);
}

/* Head: a stage's JOIN link closed; it is no longer announced. */
void kvr__link_lost_stage(kvr_agent_t *a, kvr__alink_t *l)
{
    if (a->stage_table == NULL || !l->joined)
        return;
    const kvr_wire_topo_t *t = &l->link->peer.topo;
    kvr_wire_stage_t *e =
        &a->stage_table[t->pp_rank * a->p.topo.tp_size + t->tp_rank];
    if (e->incarnation != l->peer_incarnation)
        return; /* already replaced by a newer incarnation */
    memset(e, 0, sizeof(*e));
    kvr__stages_send(a, NULL);
}

/* ---- producer: the PP head's stage table, JOIN, STAGES ---- */

void kvr__stages_send(kvr_agent_t *a, kvr__alink_t *only)
{
    const kvr_wire_topo_t *t = &a->p.topo;
    uint32_t total = t->pp_size * t->tp_size, n = 0;
    kvr_wire_stage_t *list = calloc(total + 1, sizeof(*list));
    if (list == NULL || a->stage_table == NULL) {
        free(list);
        return;
    }
    for (uint32_t i = 0; i < total; i++)
        if (a->stage_table[i].address[0]) {
            list[n] = a->stage_table[i];
            list[n].pp_rank = i / t->tp_size;
            list[n++].tp_rank = i % t->tp_size;
        }
    kvr_msg_t m = {.type = KVR_MSG_STAGES};
    m.u.stages = (kvr_msg_stages_t){t->pp_size, t->tp_size, list, n};
    for (kvr__alink_t *l = a->links; l != NULL; l = l->next)
        if ((only == NULL || only == l) && l->state == KVR__LINK_READY &&
            l->kind == KVR__LINK_ACCEPT &&
            l->link->peer.side == KVR_WIRE_CONSUMER)
            kvr__alink_send(a, l, &m);
    free(list);
}

void kvr__link_ready_accept(kvr_agent_t *a, kvr__alink_t *l)
{
    if (l->link->peer.side == KVR_WIRE_CONSUMER)
        kvr__stages_send(a, l);
}

/* May the peer on l join us: a non-head stage of our instance, of our
 * shape, and we its head? */
static kvr_status_t check_join(const kvr_agent_t *a, const kvr__alink_t *l,
                               const kvr_msg_join_t *m, kvr_error_t *err)
{
    const kvr_wire_topo_t *t = &l->link->peer.topo, *me = &a->p.topo;
    bool peer_head = t->pp_rank == 0 && t->tp_rank == 0;
    if (a->stage_table == NULL || m->address[0] == '\0' || l->joined)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "JOIN without an address, "
                             "twice, or to a stage that is not a PP head");
    if (!kvr_wire_id_equal(&l->peer_instance, &a->instance) || peer_head)
        return kvr_error_set(err, KVR_ERR_PEER_ROLE,
                             "a producer stage of '%.*s' (pp %u, tp %u) joined "
                             "stage (pp %u, tp %u) of '%.*s', which is not its "
                             "PP head",
                             (int)l->peer_instance.len, l->peer_instance.bytes,
                             t->pp_rank, t->tp_rank, me->pp_rank, me->tp_rank,
                             (int)a->instance.len, a->instance.bytes);
    if (t->pp_size != me->pp_size || t->tp_size != me->tp_size)
        return kvr_error_set(err, KVR_ERR_LAYOUT_MISMATCH,
                             "stage says PP %u x TP %u, the head PP %u x TP %u",
                             t->pp_size, t->tp_size, me->pp_size, me->tp_size);
    return KVR_OK;
}

void kvr__link_on_join(kvr_agent_t *a, kvr__alink_t *l, const kvr_msg_join_t *m)
{
    const kvr_wire_topo_t *t = &l->link->peer.topo;
    kvr_error_t err = {0};
    if (check_join(a, l, m, &err) != KVR_OK) {
        kvr__alink_close(a, l, err.code, "%s", err.msg);
        return;
    }
    l->joined = true;
    kvr_wire_stage_t *e =
        &a->stage_table[t->pp_rank * a->p.topo.tp_size + t->tp_rank];
    e->incarnation = l->peer_incarnation;
    e->dcp_rank = t->dcp_rank;
    snprintf(e->address, sizeof(e->address), "%s", m->address);
    kvr__agent_log(a, "stage (pp %u, tp %u) joined from %s", t->pp_rank,
                   t->tp_rank, m->address);
    kvr__stages_send(a, NULL);
}

void kvr__link_ready_join(kvr_agent_t *a, kvr__alink_t *l)
{
    kvr_msg_t m = {.type = KVR_MSG_JOIN};
    snprintf(m.u.join.address, sizeof(m.u.join.address), "%s", a->address);
    kvr__alink_send(a, l, &m);
}

void kvr__join_tick(kvr_agent_t *a, uint64_t now, uint64_t *next)
{
    kvr_error_t err = {0};
    bool head = a->p.topo.pp_rank == 0 && a->p.topo.tp_rank == 0;
    if (!(a->p.role & KVR_AGENT_PRODUCER) || head || !a->started ||
        a->join_link != NULL)
        return;
    if (now < a->join_retry_ns) {
        if (a->join_retry_ns < *next)
            *next = a->join_retry_ns;
        return;
    }
    if (kvr__alink_dial(a, a->bootstrap_spec, KVR__LINK_JOIN, &a->join_link,
                        &err) != KVR_OK) {
        kvr__agent_log(a, "joining the PP head: %s", err.msg);
        a->join_link = NULL;
        a->join_retry_ns = now + 200 * 1000000ull;
        if (a->join_retry_ns < *next)
            *next = a->join_retry_ns;
    }
}

/* ---- producer: a consumer's REGIONS ---- */

static int cmp_twin(const void *x, const void *y)
{
    const kvr__twin_t *a = x, *b = y;
    if (a->layer != b->layer)
        return a->layer < b->layer ? -1 : 1;
    if (a->role != b->role)
        return a->role < b->role ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* The maps by (layer, role), the first index first (as a scan finds). */
static kvr_status_t index_twins(kvr__alink_t *l, kvr_error_t *err)
{
    l->twins = malloc((l->num_maps + 1) * sizeof(*l->twins));
    if (l->twins == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint32_t j = 0; j < l->num_maps; j++)
        l->twins[j] = (kvr__twin_t){l->maps[j].desc.layer,
                                    (uint32_t)l->maps[j].desc.role, j};
    qsort(l->twins, l->num_maps, sizeof(*l->twins), cmp_twin);
    return KVR_OK;
}

static int twin_of(const kvr__alink_t *l, const kvr_region_desc_t *d)
{
    kvr__twin_t want = {d->layer, (uint32_t)d->role, 0};
    size_t lo = 0, hi = l->twins != NULL ? l->num_maps : 0, n = hi;
    while (lo < hi) { /* the first entry not below want */
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_twin(&l->twins[mid], &want) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == n || l->twins[lo].layer != want.layer ||
        l->twins[lo].role != want.role)
        return -1;
    return (int)l->twins[lo].index;
}

/* One region of a consumer's REGIONS: checked, then mapped on our data
 * peer (host) or through CUDA IPC (device, gpu-direct). */
static kvr_status_t map_one(kvr_agent_t *a, kvr__alink_t *l,
                            const kvr_wire_region_t *r, uint32_t i,
                            kvr_error_t *err)
{
    bool staging = r->desc.role == KVR_ROLE_STAGING;
    bool device = a->p.cuda_device >= 0 || r->memory != KVR_WIRE_MEM_HOST;
    if (staging && (l->staging >= 0 || r->desc.num_blocks < 2))
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "a second STAGING region, "
                             "or one of %llu slot(s)",
                             (unsigned long long)r->desc.num_blocks);
    uint64_t span;
    if (__builtin_mul_overflow(r->desc.num_blocks, r->desc.page_bytes, &span) ||
        span == 0 || (r->desc.bytes != 0 && r->desc.bytes < span))
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "consumer region layer %u: %llu blocks of %llu "
                             "bytes in %llu registered bytes",
                             r->desc.layer,
                             (unsigned long long)r->desc.num_blocks,
                             (unsigned long long)r->desc.page_bytes,
                             (unsigned long long)r->desc.bytes);
    kvr_status_t st = staging
                          ? KVR_OK
                          : kvr_region_check(&a->p.layout, &r->desc, true, err);
    if (st == KVR_OK && device)
        st = kvr__agpu_map(a, l, r, &l->maps[i], err);
    else if (st == KVR_OK)
        st = kvr__dpeer_map(l->data, r->base, kvr_region_bytes(&r->desc),
                            r->rkey, r->rkey_len, &l->maps[i].mapping, err);
    /* host KV the consumer allocated through kvrelay on this host: direct
     * sends store into it (docs/agent.md, Executors) */
    if (st == KVR_OK && !device && !staging)
        kvr__dpeer_map_stores(l->data, l->maps[i].mapping);
    if (st == KVR_OK && staging)
        st = device ? kvr__agpu_link(a, l, r, &l->maps[i], err)
                    : kvr__staged_link(a, l, r, err);
    l->maps[i].desc = r->desc;
    if (st == KVR_OK && staging)
        l->staging = (int)i;
    return st;
}

static kvr_status_t map_regions(kvr_agent_t *a, kvr__alink_t *l,
                                const kvr_msg_regions_t *m, kvr_error_t *err)
{
    l->maps = calloc(m->num_regions + 1, sizeof(*l->maps));
    if (l->maps == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (uint32_t i = 0; i < m->num_regions; i++) {
        kvr_status_t st = map_one(a, l, &m->regions[i], i, err);
        l->num_maps = i + 1; /* a mapping made is undone with the link */
        if (st != KVR_OK)
            return st;
    }
    kvr_status_t st = index_twins(l, err);
    if (st != KVR_OK)
        return st;
    for (uint32_t i = 0; i < a->num_regions; i++)
        if (kvr__region_moves(&a->regions[i]) &&
            twin_of(l, &a->regions[i].desc) < 0)
            return kvr_error_set(
                err, KVR_ERR_LAYOUT_MISMATCH,
                "producer %s region layer %u has no twin on "
                "consumer '%.*s' tp %u",
                kvr_role_name(a->regions[i].desc.role),
                a->regions[i].desc.layer, (int)l->peer_instance.len,
                l->peer_instance.bytes, l->link->peer.topo.tp_rank);
    return KVR_OK;
}

void kvr__link_on_regions(kvr_agent_t *a, kvr__alink_t *l,
                          const kvr_msg_regions_t *m)
{
    kvr_error_t err = {0};
    if (l->maps != NULL || !l->kv) {
        kvr__alink_close(a, l, l->kv ? KVR_ERR_PROTO : KVR_ERR_LAYOUT_MISMATCH,
                         l->kv ? "a second REGIONS"
                               : "REGIONS on a link where one side has no KV "
                                 "regions");
        return;
    }
    /* CUDA KV needs a data peer only when our transport moves CUDA memory
     * (gpu-direct's kernels write through IPC) */
    kvr_status_t st = a->p.cuda_device >= 0 && !kvr__data_has_cuda(a->data)
                          ? KVR_OK
                          : kvr__dpeer_open(a->data, m->address, m->address_len,
                                            &l->data, &err);
    if (st == KVR_OK)
        st = map_regions(a, l, m, &err);
    if (st != KVR_OK) {
        kvr__regions_refuse(a, l, st, err.msg);
        return;
    }
    l->regions_ready = true;
}

void kvr__regions_refuse(kvr_agent_t *a, kvr__alink_t *l, kvr_status_t st,
                         const char *why)
{
    kvr_msg_t bye;
    kvr_msg_init(&bye, KVR_MSG_BYE);
    bye.u.bye.status = st;
    snprintf(bye.u.bye.text, sizeof(bye.u.bye.text), "%s", why);
    kvr__alink_send(a, l, &bye);
    kvr__alink_close(a, l, st, "REGIONS: %s", why);
}

int kvr__twin_index(const kvr__alink_t *l, const kvr_region_desc_t *d)
{
    return twin_of(l, d);
}
