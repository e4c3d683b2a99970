/* Decode leader (DCP rank 0): owns the group's destination block pool and
 * prefix cache, turns OFFERs into ASSIGNs for every rank, and frees or
 * caches blocks once every rank released the request (after quarantine).
 * An OFFER it cannot place is answered with a failed RELEASE per rank, so
 * the producer never waits for nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_internal.h"

typedef struct {
    kvr_block_hash_t hash;
    bool used;
} cache_entry_t;

struct kvr__leader {
    uint32_t num_blocks;
    uint32_t next; /* where the next free-block search starts */
    uint32_t max_reqs;
    uint32_t *refs;        /* per block: live requests using it */
    cache_entry_t *cached; /* per block: the prefix hash it holds, if any */
    kvr__lreq_t *reqs;
};

typedef struct kvr__pending_offer {
    bool used;
    kvr_wire_id_t id;
    uint64_t transfer_id, num_tokens;
    uint32_t *src;
    size_t nsrc;
} pending_offer_t;

kvr_status_t kvr__leader_create(kvr_conn_t *c, kvr_error_t *err)
{
    kvr__leader_t *l = calloc(1, sizeof(*l));
    uint32_t n = c->p.leader_blocks;
    if (l != NULL) {
        l->num_blocks = n;
        l->max_reqs = c->p.max_requests;
        l->refs = calloc(n + 1, sizeof(*l->refs));
        l->cached = calloc(n + 1, sizeof(*l->cached));
        l->reqs = calloc(l->max_reqs, sizeof(*l->reqs));
    }
    if (l == NULL || l->refs == NULL || l->cached == NULL || l->reqs == NULL) {
        kvr__leader_destroy(l);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for %u blocks", n);
    }
    c->leader = l;
    return KVR_OK;
}

static void lreq_free(kvr__lreq_t *r)
{
    free(r->dst);
    free(r->prompt);
    memset(r, 0, sizeof(*r));
}

void kvr__leader_destroy(kvr__leader_t *l)
{
    if (l == NULL)
        return;
    for (uint32_t i = 0; l->reqs != NULL && i < l->max_reqs; i++)
        lreq_free(&l->reqs[i]);
    free(l->refs);
    free(l->cached);
    free(l->reqs);
    free(l);
}

/* Longest run of leading virtual blocks already cached, as block ids. */
static uint64_t lookup_prefix(const kvr__leader_t *l, const kvr_block_hash_t *h,
                              size_t nh, uint32_t *out)
{
    uint64_t k = 0;
    for (; k < nh; k++) {
        uint32_t b = 0;
        while (b < l->num_blocks && !(l->cached[b].used &&
               memcmp(l->cached[b].hash.bytes, h[k].bytes, KVR_BLOCK_HASH_BYTES) == 0))
            b++;
        if (b == l->num_blocks)
            break;
        out[k] = b;
    }
    return k;
}

/* A free block: unreferenced and uncached first, else evict a cached one.
 * The search rotates, so a freed block is reused as late as possible (a
 * request's pages stay inspectable after it finished). */
static bool take_block(kvr__leader_t *l, uint32_t *out)
{
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < l->num_blocks; i++) {
            uint32_t b = (l->next + i) % l->num_blocks;
            if (l->refs[b] == 0 && (pass == 1 || !l->cached[b].used)) {
                l->cached[b].used = false;
                l->refs[b] = 1;
                l->next = (b + 1) % l->num_blocks;
                *out = b;
                return true;
            }
        }
    return false;
}

static kvr_status_t place(kvr_conn_t *c, kvr__lreq_t *r, const kvr_msg_offer_t *o,
                          kvr_error_t *err)
{
    kvr__leader_t *l = c->leader;
    uint64_t V = kvr_virtual_block(&c->p.layout);
    /* a hostile count must not size an allocation; block counts never wrap
     * (a wrapped count was an empty request "loaded" with 0 bytes) */
    uint64_t nsrc = kvr_num_src_blocks(&c->p.layout, o->num_tokens);
    uint64_t ndst = kvr_num_dst_blocks(&c->p.layout, o->num_tokens);
    if (o->num_tokens == 0 || nsrc > o->num_src_blocks)
        return kvr_error_set(err, KVR_ERR_SRC_TABLE_SHORT, "offer of %llu tokens "
                             "needs %llu source blocks of %u, it has %u",
                             (unsigned long long)o->num_tokens,
                             (unsigned long long)nsrc, c->p.layout.block_size,
                             o->num_src_blocks);
    if (ndst > l->num_blocks)
        return kvr_error_set(err, KVR_ERR_NO_SPACE, "offer of %llu tokens needs "
                             "more than the %u-block decode pool",
                             (unsigned long long)o->num_tokens, l->num_blocks);
    r->ndst = (size_t)ndst;
    r->dst = calloc(r->ndst + 1, sizeof(*r->dst));
    kvr_block_hash_t *h = calloc(o->num_prompt / V + 1, sizeof(*h));
    size_t nh = 0;
    kvr_status_t st = r->dst && h ? KVR_OK : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK && o->num_prompt > 0)
        st = kvr_prefix_hashes(NULL, o->prompt, o->num_prompt, V, h,
                               o->num_prompt / V + 1, &nh, err);
    uint64_t k = st == KVR_OK ? lookup_prefix(l, h, nh, r->dst) : 0;
    if (k > 0 && k * V >= o->num_tokens) /* keep k*V < num_tokens */
        k = (o->num_tokens - 1) / V;
    for (uint64_t i = 0; i < k; i++)
        l->refs[r->dst[i]]++;
    uint64_t got = k;
    while (st == KVR_OK && got < r->ndst && take_block(l, &r->dst[got]))
        got++;
    if (st == KVR_OK && got < r->ndst)
        st = kvr_error_set(err, KVR_ERR_NO_SPACE, "decode pool of %u blocks has "
                           "no room for %zu more", l->num_blocks, r->ndst - k);
    if (st != KVR_OK)
        for (uint64_t i = 0; i < got; i++)
            l->refs[r->dst[i]]--;
    r->num_computed = k;
    free(h);
    return st;
}

/* Answers an OFFER that cannot be placed: one failed RELEASE per rank, and
 * a LOAD_FAILED here, so the decode side hears of the refusal too (the other
 * ranks never saw the OFFER). */
static void refuse_offer(kvr_conn_t *c, kvr__peer_t *from, const kvr_msg_offer_t *o,
                         kvr_status_t st, const char *why)
{
    kvr__conn_fail(c, st, "offer '%.*s' refused: %s", (int)o->request_id.len,
                   o->request_id.bytes, why);
    kvr_conn_event_t *e = kvr__event_push(c, KVR_EVENT_LOAD_FAILED, &o->request_id,
                                          o->transfer_id, st, c->last_error);
    e->num_tokens = o->num_tokens;
    for (uint32_t r = 0; r < c->p.layout.tp; r++) {
        kvr_msg_t m;
        kvr_msg_init(&m, KVR_MSG_RELEASE);
        m.u.release.request_id = o->request_id;
        m.u.release.transfer_id = o->transfer_id;
        m.u.release.consumer_rank = r;
        m.u.release.write_nonce = kvr_wire_random_nonce();
        m.u.release.outcome = st;
        kvr__peer_send(from, &m);
    }
}

static uint32_t rank_links(kvr_conn_t *c, kvr__peer_t **out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->num_peers; i++) {
        kvr__peer_t *p = c->peers[i];
        if (p->link->ready && !p->link->closed &&
            p->link->peer.side == KVR_WIRE_CONSUMER)
            out[n++] = p;
    }
    return n;
}

static void send_assign(kvr_conn_t *c, kvr__peer_t *to, const kvr_msg_offer_t *o,
                        const kvr__lreq_t *r)
{
    kvr_msg_t fwd = {.type = KVR_MSG_OFFER};
    fwd.u.offer = *o;
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_ASSIGN);
    m.u.assign.request_id = o->request_id;
    m.u.assign.transfer_id = o->transfer_id;
    m.u.assign.dst_blocks = r->dst;
    m.u.assign.num_dst_blocks = (uint32_t)r->ndst;
    m.u.assign.num_computed_blocks = r->num_computed;
    m.u.assign.deadline_ms = c->p.deadline_ms;
    if (to != NULL) {
        kvr__peer_send(to, &fwd);
        kvr__peer_send(to, &m);
        return;
    }
    kvr__rank_offer(c, o);
    kvr__rank_assign(c, &m.u.assign);
}

kvr_status_t kvr__leader_offer(kvr_conn_t *c, kvr__peer_t *from,
                               const kvr_msg_offer_t *o)
{
    kvr__leader_t *l = c->leader;
    kvr__peer_t *ranks[KVR_CONN_MAX_LINKS];
    uint32_t n = rank_links(c, ranks);
    kvr__lreq_t *r = NULL;
    for (uint32_t i = 0; i < l->max_reqs && r == NULL; i++)
        if (!l->reqs[i].used)
            r = &l->reqs[i];
    char why[KVR_ERROR_MSG_MAX];
    if (n + 1 != c->p.layout.dcp_size) {
        snprintf(why, sizeof(why), "%u of %u decode ranks connected", n + 1,
                 c->p.layout.dcp_size);
        refuse_offer(c, from, o, KVR_ERR_PEER_DEAD, why);
        return KVR_OK;
    }
    if (r == NULL) {
        refuse_offer(c, from, o, KVR_ERR_NO_SPACE, "leader request table full");
        return KVR_OK;
    }
    kvr_error_t err = {0};
    if (place(c, r, o, &err) != KVR_OK) {
        refuse_offer(c, from, o, err.code ? err.code : KVR_ERR_NO_SPACE, err.msg);
        lreq_free(r);
        return KVR_OK;
    }
    r->used = true;
    r->id = o->request_id;
    r->transfer_id = o->transfer_id;
    r->num_tokens = o->num_tokens;
    r->prompt = malloc((o->num_prompt + 1) * sizeof(*r->prompt));
    if (r->prompt != NULL && o->num_prompt)
        memcpy(r->prompt, o->prompt, o->num_prompt * sizeof(*r->prompt));
    r->num_prompt = r->prompt ? o->num_prompt : 0;
    for (uint32_t i = 0; i < n; i++)
        send_assign(c, ranks[i], o, r);
    send_assign(c, NULL, o, r);
    return KVR_OK;
}

/* Full virtual blocks of a finished request enter the prefix cache. */
static void cache_prefix(kvr__leader_t *l, const kvr__lreq_t *r, uint64_t V)
{
    size_t nh = r->num_prompt / V;
    kvr_block_hash_t *h = calloc(nh + 1, sizeof(*h));
    size_t got = 0;
    if (h != NULL && nh > 0 &&
        kvr_prefix_hashes(NULL, r->prompt, r->num_prompt, V, h, nh + 1, &got, NULL) == KVR_OK)
        for (size_t i = 0; i < got && i < r->ndst && (i + 1) * V <= r->num_tokens; i++) {
            l->cached[r->dst[i]].hash = h[i];
            l->cached[r->dst[i]].used = true;
        }
    free(h);
}

static kvr__lreq_t *find_lreq(kvr__leader_t *l, const kvr_wire_id_t *id,
                              uint64_t transfer)
{
    for (uint32_t i = 0; i < l->max_reqs; i++)
        if (l->reqs[i].used && l->reqs[i].transfer_id == transfer &&
            kvr_wire_id_equal(&l->reqs[i].id, id))
            return &l->reqs[i];
    return NULL;
}

void kvr__leader_release(kvr_conn_t *c, const kvr_msg_release_t *rel,
                         uint32_t rank)
{
    kvr__leader_t *l = c->leader;
    kvr__lreq_t *r = find_lreq(l, &rel->request_id, rel->transfer_id);
    if (r == NULL || rank >= 64 || (r->released >> rank & 1))
        return;
    r->released |= 1ull << rank;
    r->failed |= rel->outcome != KVR_OK;
    uint64_t all = (1ull << c->p.layout.dcp_size) - 1;
    if ((r->released & all) != all)
        return;
    if (!r->failed)
        cache_prefix(l, r, kvr_virtual_block(&c->p.layout));
    for (size_t i = 0; i < r->ndst; i++)
        l->refs[r->dst[i]]--;
    kvr_conn_event_t *e = kvr__event_push(c, KVR_EVENT_GROUP_DONE, &r->id,
                                          r->transfer_id,
                                          r->failed ? KVR_ERR_REFUSED : KVR_OK,
                                          r->failed ? "a rank failed" : "");
    e->num_tokens = r->num_tokens;
    e->num_computed_blocks = r->num_computed;
    kvr__event_attach(e, NULL, 0, r->dst, r->ndst);
    lreq_free(r);
}

/* ---- rank side ---- */

static pending_offer_t *offers(kvr_conn_t *c)
{
    if (c->offers == NULL)
        c->offers = calloc(c->p.max_requests, sizeof(*c->offers));
    return c->offers;
}

void kvr__rank_offers_free(kvr_conn_t *c)
{
    for (uint32_t i = 0; c->offers != NULL && i < c->p.max_requests; i++)
        free(c->offers[i].src);
    free(c->offers);
    c->offers = NULL;
}

kvr_status_t kvr__rank_offer(kvr_conn_t *c, const kvr_msg_offer_t *o)
{
    pending_offer_t *t = offers(c), *slot = NULL;
    for (uint32_t i = 0; t != NULL && i < c->p.max_requests && slot == NULL; i++)
        if (!t[i].used)
            slot = &t[i];
    if (slot == NULL) {
        kvr__conn_fail(c, KVR_ERR_NO_SPACE, "no room for offer '%.*s'",
                       (int)o->request_id.len, o->request_id.bytes);
        return KVR_OK;
    }
    slot->src = malloc((o->num_src_blocks + 1) * sizeof(*slot->src));
    if (slot->src == NULL)
        return KVR_ERR_NO_MEMORY;
    if (o->num_src_blocks > 0) /* an empty list decodes as NULL */
        memcpy(slot->src, o->src_blocks, o->num_src_blocks * sizeof(*slot->src));
    slot->nsrc = o->num_src_blocks;
    slot->used = true;
    slot->id = o->request_id;
    slot->transfer_id = o->transfer_id;
    slot->num_tokens = o->num_tokens;
    return KVR_OK;
}

kvr_status_t kvr__rank_assign(kvr_conn_t *c, const kvr_msg_assign_t *a)
{
    if (kvr__failpoint(KVR__FP_DIE_ASSIGN, a->request_id.bytes,
                       a->request_id.len))
        kvr__failpoint_exit(); /* a decode rank killed */
    pending_offer_t *t = offers(c), *o = NULL;
    for (uint32_t i = 0; t != NULL && i < c->p.max_requests && o == NULL; i++)
        if (t[i].used && t[i].transfer_id == a->transfer_id &&
            kvr_wire_id_equal(&t[i].id, &a->request_id))
            o = &t[i];
    if (o == NULL) {
        kvr__conn_fail(c, KVR_ERR_NOT_FOUND, "ASSIGN for '%.*s' without OFFER",
                       (int)a->request_id.len, a->request_id.bytes);
        return KVR_OK;
    }
    kvr_conn_load_t load = {a->request_id.bytes, a->request_id.len, a->transfer_id,
                            o->src, o->nsrc, a->dst_blocks, a->num_dst_blocks,
                            o->num_tokens, a->num_computed_blocks, a->deadline_ms};
    kvr_error_t err = {0};
    kvr_status_t st = kvr__consumer_load(c, &load, &err);
    if (st != KVR_OK) {
        /* the group must hear of it: fail locally, release to the leader */
        kvr__creq_t r = {.id = a->request_id, .transfer_id = a->transfer_id,
                         .nonce = kvr_wire_random_nonce(), .status = st};
        kvr_conn_event_t *e = kvr__event_push(c, KVR_EVENT_LOAD_FAILED, &r.id,
                                              r.transfer_id, st, err.msg);
        e->num_tokens = o->num_tokens;
        kvr__rank_release(c, &r);
    }
    free(o->src);
    memset(o, 0, sizeof(*o));
    return KVR_OK;
}

void kvr__rank_release(kvr_conn_t *c, const kvr__creq_t *r)
{
    kvr_msg_release_t rel = {.request_id = r->id, .transfer_id = r->transfer_id,
                             .consumer_rank = c->p.topo.dcp_rank,
                             .write_nonce = r->nonce, .outcome = r->status};
    if (c->leader != NULL) {
        kvr__leader_release(c, &rel, c->p.topo.dcp_rank);
        return;
    }
    if (c->leader_link == NULL || c->leader_link->link->closed)
        return;
    kvr_msg_t m = {.type = KVR_MSG_RELEASE};
    m.u.release = rel;
    kvr__peer_send(c->leader_link, &m);
}

/* A rank that is gone will never release: count it as a failed release. */
void kvr__leader_rank_lost(kvr_conn_t *c, uint32_t rank)
{
    kvr__leader_t *l = c->leader;
    for (uint32_t i = 0; l != NULL && i < l->max_reqs; i++) {
        kvr__lreq_t *r = &l->reqs[i];
        if (!r->used)
            continue;
        kvr_msg_release_t rel = {.request_id = r->id, .transfer_id = r->transfer_id,
                                 .consumer_rank = rank, .outcome = KVR_ERR_PEER_DEAD};
        kvr__leader_release(c, &rel, rank);
    }
}
