/* Fan-in (docs/agent.md Fan-in, docs/design.md §18): which producer stages
 * a consumer rank pulls from, and so which consumer ranks a producer stage
 * serves. Both sides derive it from the layout alone, with the planner's
 * kvr_plan_sources, so a consumer's quorum and a producer's count of the
 * ranks that release it agree without a message.
 *
 * Ranks: a producer stage of tp rank t holds DCP rank t % W_p (its TP
 * group split into W_p DCP ranks, as engines split it); the tp ranks of
 * one DCP rank p are its replicas, and consumer tp rank c takes p from
 * replica p + W_p * (c % (TP_p / W_p)), spreading the consumers. A consumer
 * of tp rank c is DCP rank c % W. Head-sharded regions name tp ranks
 * directly (the planner spreads the replicas of a head). At W_p == 1 this
 * is c % TP_p, the rule of the unsharded producer. */
#include <stdlib.h>

#include "agent_internal.h"

/* The region of the other side with the same role, layer and geometry,
 * its pages in that side's block size (num_blocks kept). */
kvr_region_desc_t kvr__twin_desc(const kvr_layout_t *lay,
                                 const kvr_region_desc_t *d, bool to_consumer)
{
    kvr_region_desc_t t = *d;
    uint32_t bs = lay->block_size, bsp = kvr_producer_block_size(lay);
    t.bytes = 0;
    if (d->role == KVR_ROLE_DENSE && d->heads != 0)
        t.page_bytes = kvr_dense_page_bytes(lay, d, to_consumer);
    else if (d->role == KVR_ROLE_MLA || d->role == KVR_ROLE_DENSE)
        t.page_bytes = to_consumer ? d->page_bytes / bsp * bs
                                   : d->page_bytes / bs * bsp;
    else if (d->role == KVR_ROLE_INDEX)
        t.page_bytes = kvr_index_page_tokens(lay, to_consumer) *
                       kvr_index_stride(d->index_dim);
    return t;
}

/* The producer tp ranks holding what consumer tp rank c takes of one
 * region (given on the consumer's side), as a bit mask. */
static kvr_status_t region_sources(const kvr_layout_t *lay,
                                   const kvr_region_desc_t *dst, uint32_t c,
                                   uint64_t *mask, kvr_error_t *err)
{
    kvr_region_pair_t pair = {kvr__twin_desc(lay, dst, false), *dst};
    pair.src.num_blocks = pair.dst.num_blocks = 1;
    kvr_axis_t axis = kvr_region_axis(dst);
    uint32_t ranks[KVR_AGENT_MAX_TP], Wp = kvr_producer_dcp(lay);
    uint32_t rank = axis == KVR_AXIS_TP ? c : c % lay->dcp_size;
    size_t n = 0;
    kvr_status_t st = kvr_plan_sources(lay, &pair, rank, NULL, ranks,
                                       KVR_AGENT_MAX_TP, &n, err);
    for (size_t i = 0; st == KVR_OK && i < n; i++)
        *mask |= 1ull << (axis == KVR_AXIS_TP
                              ? ranks[i]
                              : ranks[i] + Wp * (c % (lay->producer_tp / Wp)));
    return st;
}

kvr_status_t kvr_agent_sources(const kvr_layout_t *lay,
                               const kvr_region_desc_t *regions, size_t n,
                               bool consumer, uint32_t consumer_tp,
                               uint64_t *mask, kvr_error_t *err)
{
    kvr_status_t st = lay && mask && (n == 0 || regions)
                          ? kvr_layout_check(lay, err)
                          : kvr_error_set(err, KVR_ERR_INVALID, "NULL argument");
    if (st != KVR_OK)
        return st;
    if (lay->producer_tp > KVR_AGENT_MAX_TP || lay->tp > KVR_AGENT_MAX_TP)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "producer TP %u, consumer TP %u: at most %u",
                             lay->producer_tp, lay->tp, KVR_AGENT_MAX_TP);
    if (consumer_tp >= lay->tp)
        return kvr_error_set(err, KVR_ERR_RANK_RANGE,
                             "consumer tp rank %u out of range [0, %u)",
                             consumer_tp, lay->tp);
    *mask = 0;
    for (size_t i = 0; st == KVR_OK && i < n; i++) {
        if (regions[i].role == KVR_ROLE_STAGING)
            continue;
        kvr_region_desc_t d = consumer ? regions[i]
                                       : kvr__twin_desc(lay, &regions[i], true);
        st = region_sources(lay, &d, consumer_tp, mask, err);
    }
    return st;
}

/* Our moving regions of layers [lo, hi), on our side. */
static size_t moving_regions(const kvr_agent_t *a, uint32_t lo, uint32_t hi,
                             kvr_region_desc_t *out)
{
    size_t n = 0;
    for (uint32_t i = 0; i < a->num_order; i++) {
        const kvr_region_desc_t *d = &a->regions[a->order[i]].desc;
        if (d->layer >= lo && d->layer < hi)
            out[n++] = *d;
    }
    return n;
}

kvr_status_t kvr__sources_mask(const kvr_agent_t *a, uint32_t lo, uint32_t hi,
                               uint32_t consumer_tp, uint64_t *mask,
                               kvr_error_t *err)
{
    kvr_region_desc_t *regs = calloc(a->num_order + 1, sizeof(*regs));
    if (regs == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    size_t n = moving_regions(a, lo, hi, regs);
    bool consumer = a->p.role & KVR_AGENT_CONSUMER;
    kvr_status_t st = kvr_agent_sources(&a->p.layout, regs, n, consumer,
                                        consumer_tp, mask, err);
    free(regs);
    return st;
}

/* One axis for every region: a pull is one plan set (docs/agent.md). */
static kvr_status_t one_axis(kvr_agent_t *a, kvr_error_t *err)
{
    for (uint32_t i = 0; i < a->num_order; i++) {
        const kvr_region_desc_t *d = &a->regions[a->order[i]].desc;
        kvr_axis_t axis = kvr_region_axis(d);
        if (i > 0 && axis != a->axis)
            return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                                 "%s layer %u is sharded over %s ranks, "
                                 "other regions over %s: an agent moves one "
                                 "axis",
                                 kvr_role_name(d->role), d->layer,
                                 axis == KVR_AXIS_TP ? "TP" : "DCP",
                                 axis == KVR_AXIS_TP ? "DCP" : "TP");
        a->axis = axis;
    }
    return KVR_OK;
}

/* At start: the combination is planned (else the planner's status, before
 * any link), our consumers' sources (consumer) or the consumer tp ranks we
 * serve (producer). */
kvr_status_t kvr__sources_start(kvr_agent_t *a, kvr_error_t *err)
{
    const kvr_wire_topo_t *t = &a->p.topo;
    kvr_status_t st = one_axis(a, err);
    if (st == KVR_OK && (a->p.role & KVR_AGENT_CONSUMER))
        st = kvr__sources_mask(a, 0, UINT32_MAX, t->tp_rank, &a->sources, err);
    a->serves = 0;
    a->served = 0;
    for (uint32_t c = 0; st == KVR_OK && (a->p.role & KVR_AGENT_PRODUCER) &&
                         c < a->p.layout.tp;
         c++) {
        uint64_t m = 0;
        st = kvr__sources_mask(a, 0, UINT32_MAX, c, &m, err);
        if (st == KVR_OK && (m >> t->tp_rank & 1)) {
            a->serves |= 1ull << c;
            a->served++;
        }
    }
    return st;
}

/* The rank conventions above, checked at create. */
kvr_status_t kvr__sources_check_topo(const kvr_agent_params_t *p,
                                     kvr_error_t *err)
{
    const kvr_wire_topo_t *t = &p->topo;
    uint32_t W = p->layout.dcp_size, Wp = kvr_producer_dcp(&p->layout);
    bool producer = p->role & KVR_AGENT_PRODUCER;
    uint32_t sides = producer ? Wp : W;
    if (sides != 0 && t->dcp_rank != t->tp_rank % sides)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%s tp rank %u is DCP rank %u, not tp %% %s = %u "
                             "(a DCP group splits the TP group)",
                             producer ? "producer" : "consumer", t->tp_rank,
                             t->dcp_rank, producer ? "W_p" : "W",
                             t->tp_rank % sides);
    return KVR_OK;
}
