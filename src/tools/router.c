/* The demo's decode router (router.h): block pool, prefix cache, OFFER ->
 * ASSIGN for every rank, blocks freed or cached once every rank released. */
#include "router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_internal.h"
#include "kvrelay/base.h"

/* ---- encoding: u8 type, then every field little-endian, strings as
 * u16 length + bytes; ids and hashes as counted arrays ---- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
    bool ok;
} cur_t;

static void put(cur_t *c, const void *p, size_t len)
{
    if (!c->ok || c->n + len > c->cap) {
        c->ok = false;
        return;
    }
    memcpy(c->b + c->n, p, len);
    c->n += len;
}

static void put_u(cur_t *c, uint64_t v, size_t bytes)
{
    uint8_t t[8];
    for (size_t i = 0; i < bytes; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    put(c, t, bytes);
}

static void put_s(cur_t *c, const char *s)
{
    size_t len = strlen(s);
    put_u(c, len, 2);
    put(c, s, len);
}

static void get(cur_t *c, void *p, size_t len)
{
    if (!c->ok || c->n + len > c->cap) {
        c->ok = false;
        memset(p, 0, len);
        return;
    }
    memcpy(p, c->b + c->n, len);
    c->n += len;
}

static uint64_t get_u(cur_t *c, size_t bytes)
{
    uint8_t t[8];
    uint64_t v = 0;
    get(c, t, bytes);
    for (size_t i = 0; i < bytes; i++)
        v |= (uint64_t)t[i] << (8 * i);
    return v;
}

static void get_s(cur_t *c, char *s, size_t cap)
{
    size_t len = (size_t)get_u(c, 2);
    if (len >= cap)
        c->ok = false;
    get(c, s, c->ok ? len : 0);
    s[c->ok ? len : 0] = '\0';
}

size_t rt_encode(const rt_msg_t *m, uint8_t *buf)
{
    cur_t c = {buf, 0, KVR_AGENT_NOTIFY_MAX, true};
    put_u(&c, m->type, 1);
    put_s(&c, m->request);
    put_s(&c, m->producer);
    put_s(&c, m->address);
    put_s(&c, m->text);
    put_u(&c, m->tokens, 8);
    put_u(&c, m->computed, 8);
    put_u(&c, m->status, 4);
    put_u(&c, m->abort, 1);
    put_u(&c, m->total, 4);
    put_u(&c, m->offset, 4);
    put_u(&c, m->count, 4);
    for (uint32_t i = 0; i < m->count && i < RT_IDS_MAX; i++)
        put_u(&c, m->ids[i], 4);
    put_u(&c, m->num_hashes, 4);
    for (uint32_t i = 0; i < m->num_hashes && i < RT_HASH_MAX; i++)
        put(&c, m->hashes[i].bytes, KVR_BLOCK_HASH_BYTES);
    return c.ok ? c.n : 0;
}

bool rt_decode(const uint8_t *buf, size_t len, rt_msg_t *m)
{
    cur_t c = {(uint8_t *)buf, 0, len, true};
    m->type = (rt_type_t)get_u(&c, 1);
    get_s(&c, m->request, sizeof(m->request));
    get_s(&c, m->producer, sizeof(m->producer));
    get_s(&c, m->address, sizeof(m->address));
    get_s(&c, m->text, sizeof(m->text));
    m->tokens = get_u(&c, 8);
    m->computed = get_u(&c, 8);
    m->status = (uint32_t)get_u(&c, 4);
    m->abort = get_u(&c, 1) != 0;
    m->total = (uint32_t)get_u(&c, 4);
    m->offset = (uint32_t)get_u(&c, 4);
    m->count = (uint32_t)get_u(&c, 4);
    if (m->count > RT_IDS_MAX || m->offset > m->total ||
        m->count > m->total - m->offset)
        return false;
    for (uint32_t i = 0; i < m->count; i++)
        m->ids[i] = (uint32_t)get_u(&c, 4);
    m->num_hashes = (uint32_t)get_u(&c, 4);
    if (m->num_hashes > RT_HASH_MAX)
        return false;
    for (uint32_t i = 0; i < m->num_hashes; i++)
        get(&c, m->hashes[i].bytes, KVR_BLOCK_HASH_BYTES);
    return c.ok && c.n == len && m->type >= RT_JOIN && m->type <= RT_FAILED;
}

/* ---- the router ---- */

typedef struct {
    bool used, assigned;
    rt_msg_t *offer; /* the OFFER (its hashes are the prefix) */
    uint32_t *dst;
    size_t ndst;
    uint64_t computed;
    uint64_t released; /* ranks that reported, bit per rank */
    kvr_status_t outcome;
    uint64_t deadline_ns;
    uint64_t offered_ns; /* when its OFFER came */
    bool gave_up;        /* placed without the prefix it reuses */
} rreq_t;

typedef struct {
    kvr_block_hash_t hash;
    bool used;
} cached_t;

/* A request the group expects from a producer instance, whether its
 * OFFER came, and the expected request whose prefix it reuses (an index,
 * -1 for none). */
typedef struct {
    char request[RT_ID_MAX + 1];
    char producer[KVR_AGENT_INSTANCE_MAX + 1];
    bool offered;
    int32_t source;
} expected_t;

/* A producer instance heard from: its first OFFER is the known point from
 * which its other OFFERs (sent in one burst) are due. */
typedef struct {
    char name[KVR_AGENT_INSTANCE_MAX + 1];
    char address[256];
    uint64_t first_ns;
} heard_t;

struct router {
    kvr_layout_t lay;
    uint32_t ranks, num_blocks, next, timeout_ms;
    uint64_t joined; /* bit per rank; rank 0 is the router's own */
    uint64_t silent; /* ranks silent past a request's timeout */
    expected_t *expected;
    uint32_t num_expected, cap_expected;
    heard_t heard[64];
    uint32_t num_heard, failed;
    uint64_t offer_wait_ns; /* OFFERs due after a producer's first */
    uint32_t *refs;
    cached_t *cached;
    rreq_t reqs[1024];
    uint32_t done;
    router_ops_t ops;
};

router_t *router_create(const kvr_layout_t *lay, uint32_t ranks,
                        uint32_t num_blocks, uint32_t timeout_ms,
                        const router_ops_t *ops)
{
    router_t *r = calloc(1, sizeof(*r));
    if (r == NULL || ranks == 0 || ranks > 64)
        goto fail;
    r->lay = *lay;
    r->ranks = ranks;
    r->num_blocks = num_blocks;
    r->timeout_ms = timeout_ms;
    r->offer_wait_ns = (uint64_t)timeout_ms * 1000000u;
    r->joined = 1;
    r->ops = *ops;
    r->refs = calloc(num_blocks + 1, sizeof(*r->refs));
    r->cached = calloc(num_blocks + 1, sizeof(*r->cached));
    if (r->refs != NULL && r->cached != NULL)
        return r;
fail:
    router_destroy(r);
    return NULL;
}

static void rreq_free(rreq_t *q)
{
    free(q->offer);
    free(q->dst);
    memset(q, 0, sizeof(*q));
}

void router_destroy(router_t *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < sizeof(r->reqs) / sizeof(r->reqs[0]); i++)
        rreq_free(&r->reqs[i]);
    free(r->refs);
    free(r->cached);
    free(r->expected);
    free(r);
}

void router_join(router_t *r, uint32_t rank)
{
    if (rank < r->ranks)
        r->joined |= 1ull << rank;
}

static bool all_joined(const router_t *r)
{
    return r->joined == (r->ranks == 64 ? ~0ull : (1ull << r->ranks) - 1);
}

/* Longest run of leading virtual blocks already cached, as block ids. */
static uint64_t lookup_prefix(const router_t *r, const rt_msg_t *o,
                              uint32_t *out)
{
    uint64_t k = 0;
    for (; k < o->num_hashes; k++) {
        uint32_t b = 0;
        while (b < r->num_blocks &&
               !(r->cached[b].used &&
                 memcmp(r->cached[b].hash.bytes, o->hashes[k].bytes,
                        KVR_BLOCK_HASH_BYTES) == 0))
            b++;
        if (b == r->num_blocks)
            break;
        out[k] = b;
    }
    return k;
}

/* A free block: unreferenced and uncached first, else evict a cached one.
 * The search rotates, so a freed block is reused as late as possible (a
 * request's pages stay inspectable after it finished). */
static bool take_block(router_t *r, uint32_t *out)
{
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < r->num_blocks; i++) {
            uint32_t b = (r->next + i) % r->num_blocks;
            if (r->refs[b] == 0 && (pass == 1 || !r->cached[b].used)) {
                r->cached[b].used = false;
                r->refs[b] = 1;
                r->next = (b + 1) % r->num_blocks;
                *out = b;
                return true;
            }
        }
    return false;
}

static kvr_status_t place(router_t *r, rreq_t *q, char *why, size_t cap)
{
    const rt_msg_t *o = q->offer;
    uint64_t V = kvr_virtual_block(&r->lay);
    uint64_t ndst = kvr_num_dst_blocks(&r->lay, o->tokens);
    if (o->tokens == 0 || ndst > r->num_blocks) {
        snprintf(why, cap,
                 "offer of %llu tokens needs %llu blocks, the "
                 "decode pool has %u",
                 (unsigned long long)o->tokens, (unsigned long long)ndst,
                 r->num_blocks);
        return KVR_ERR_NO_SPACE;
    }
    q->ndst = (size_t)ndst;
    q->dst = calloc(q->ndst + 1, sizeof(*q->dst));
    if (q->dst == NULL) {
        snprintf(why, cap, "no memory for %zu block ids", q->ndst);
        return KVR_ERR_NO_MEMORY;
    }
    uint64_t k = lookup_prefix(r, o, q->dst);
    if (k > 0 && k * V >= o->tokens) /* keep k*V < tokens: one to load */
        k = (o->tokens - 1) / V;
    if (k > q->ndst)
        k = q->ndst;
    for (uint64_t i = 0; i < k; i++)
        r->refs[q->dst[i]]++;
    uint64_t got = k;
    while (got < q->ndst && take_block(r, &q->dst[got]))
        got++;
    if (got < q->ndst) {
        for (uint64_t i = 0; i < got; i++)
            r->refs[q->dst[i]]--;
        snprintf(why, cap,
                 "decode pool of %u blocks has no room for %zu "
                 "more",
                 r->num_blocks, q->ndst - (size_t)k);
        return KVR_ERR_NO_SPACE;
    }
    q->computed = k;
    return KVR_OK;
}

/* The table in parts that fit a notification, to every rank. */
static void assign(router_t *r, rreq_t *q)
{
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return;
    m->type = RT_ASSIGN;
    memcpy(m->request, q->offer->request, sizeof(m->request));
    memcpy(m->producer, q->offer->producer, sizeof(m->producer));
    memcpy(m->address, q->offer->address, sizeof(m->address));
    m->tokens = q->offer->tokens;
    m->computed = q->computed;
    m->abort = r->ops.aborts(r->ops.ctx, q->offer->request);
    m->total = (uint32_t)q->ndst;
    printf("assigned %s %llu %zu%s\n", m->request,
           (unsigned long long)q->computed, q->ndst, m->abort ? " abort" : "");
    for (uint32_t rank = 0; rank < r->ranks; rank++)
        for (uint32_t off = 0; off == 0 || off < m->total; off += RT_IDS_MAX) {
            m->offset = off;
            m->count = m->total - off < RT_IDS_MAX ? m->total - off
                                                   : RT_IDS_MAX;
            memcpy(m->ids, q->dst + off, m->count * sizeof(*m->ids));
            r->ops.to_rank(r->ops.ctx, rank, m);
        }
    free(m);
    q->assigned = true;
    q->deadline_ns = kvr_deadline_ns(r->timeout_ms);
}

/* A request the group will not load: the producer (when it can be
 * reached) and every rank are told, so none waits for it. */
static void refuse_id(router_t *r, const char *request, const char *producer,
                      const char *address, kvr_status_t st, const char *why)
{
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m != NULL) {
        m->type = RT_REFUSE;
        snprintf(m->request, sizeof(m->request), "%s", request);
        m->status = (uint32_t)st;
        snprintf(m->text, sizeof(m->text), "%s", why);
        printf("refused-offer %s %s %s\n", m->request, kvr_status_name(st),
               why);
        if (address[0] != '\0')
            r->ops.to_producer(r->ops.ctx, producer, address, m);
        for (uint32_t rank = 0; rank < r->ranks; rank++)
            r->ops.to_rank(r->ops.ctx, rank, m);
        free(m);
    }
    r->done++;
    r->failed++;
}

static void refuse(router_t *r, rreq_t *q, kvr_status_t st, const char *why)
{
    refuse_id(r, q->offer->request, q->offer->producer, q->offer->address, st,
              why);
    free(q->dst);
    q->dst = NULL;
    q->outcome = st;
}

/* Ranks silent past a request's timeout, as text ("1 3"). */
static void silent_ranks(const router_t *r, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t k = 0; k < r->ranks && n + 12 < cap; k++)
        if ((r->silent >> k) & 1)
            n += (size_t)snprintf(buf + n, cap - n, "%s%u", n ? " " : "", k);
}

/* An offer whose first prefix block is that of a request still loading
 * waits for it: its blocks are cached when it lands, so the prefix moves
 * once. */
static bool prefix_in_flight(const router_t *r, const rreq_t *q)
{
    if (q->offer->num_hashes == 0)
        return false;
    for (size_t i = 0; i < sizeof(r->reqs) / sizeof(r->reqs[0]); i++) {
        const rreq_t *o = &r->reqs[i];
        if (o != q && o->used && o->assigned && o->offer->num_hashes > 0 &&
            memcmp(o->offer->hashes[0].bytes, q->offer->hashes[0].bytes,
                   KVR_BLOCK_HASH_BYTES) == 0)
            return true;
    }
    return false;
}

static rreq_t *find(router_t *r, const char *id);

static expected_t *expected_of(router_t *r, const char *request)
{
    for (uint32_t i = 0; i < r->num_expected; i++)
        if (strcmp(r->expected[i].request, request) == 0)
            return &r->expected[i];
    return NULL;
}

/* An offer that reuses another request's prefix (router_reuses) waits
 * until that request was placed or ended here: OFFERs of different
 * producers arrive in any order, and one placed first would miss the
 * prefix (the other then waits for it in prefix_in_flight). Bounded by
 * timeout_ms after its own OFFER: past that it is placed without. */
static bool source_pending(router_t *r, rreq_t *q)
{
    const expected_t *e = expected_of(r, q->offer->request);
    if (q->gave_up || e == NULL || e->source < 0)
        return false;
    const expected_t *src = &r->expected[e->source];
    const rreq_t *s = find(r, src->request);
    if (src->offered && (s == NULL || s->assigned))
        return false;
    if (kvr_now_ns() < q->offered_ns + r->offer_wait_ns)
        return true;
    printf("reuse-missed %s %s not placed within %llu ms of this offer\n",
           q->offer->request, src->request,
           (unsigned long long)(r->offer_wait_ns / 1000000u));
    q->gave_up = true;
    return false;
}

static void try_place(router_t *r, rreq_t *q)
{
    char why[200];
    if (q->assigned || !all_joined(r) || prefix_in_flight(r, q) ||
        source_pending(r, q))
        return;
    const char *id = q->offer->request;
    kvr_status_t st = KVR_ERR_REFUSED; /* docs/failpoints.md */
    char ranks[120];
    silent_ranks(r, ranks, sizeof(ranks));
    if (kvr__failpoint(KVR__FP_REFUSE_OFFER, id, strlen(id))) {
        snprintf(why, sizeof(why), "failpoint refuse-offer");
    } else if (r->silent != 0) {
        /* a load needs every rank: one that stopped answering fails it */
        st = KVR_ERR_PEER_DEAD;
        snprintf(why, sizeof(why),
                 "decode rank(s) %s silent past a request's deadline plus "
                 "grace",
                 ranks);
    } else {
        st = place(r, q, why, sizeof(why));
    }
    if (st != KVR_OK) {
        refuse(r, q, st, why);
        rreq_free(q);
        return;
    }
    assign(r, q);
}

static rreq_t *find(router_t *r, const char *id)
{
    for (size_t i = 0; i < sizeof(r->reqs) / sizeof(r->reqs[0]); i++)
        if (r->reqs[i].used && strcmp(r->reqs[i].offer->request, id) == 0)
            return &r->reqs[i];
    return NULL;
}

void router_expect(router_t *r, const char *request, const char *producer)
{
    if (r->num_expected == r->cap_expected) {
        uint32_t cap = r->cap_expected ? 2 * r->cap_expected : 16;
        expected_t *e = realloc(r->expected, cap * sizeof(*e));
        if (e == NULL)
            return; /* not watched: --timeout still bounds it */
        r->expected = e;
        r->cap_expected = cap;
    }
    expected_t *e = &r->expected[r->num_expected++];
    memset(e, 0, sizeof(*e));
    snprintf(e->request, sizeof(e->request), "%s", request);
    snprintf(e->producer, sizeof(e->producer), "%s", producer);
    e->source = -1;
}

void router_reuses(router_t *r, const char *request, const char *source)
{
    const expected_t *src = expected_of(r, source);
    expected_t *e = expected_of(r, request);
    if (e != NULL && src != NULL && src != e)
        e->source = (int32_t)(src - r->expected);
}

/* An OFFER came: its producer is heard from, its request no longer due. */
static void note_offer(router_t *r, const rt_msg_t *offer)
{
    for (uint32_t i = 0; i < r->num_expected; i++)
        if (strcmp(r->expected[i].request, offer->request) == 0 &&
            strcmp(r->expected[i].producer, offer->producer) == 0)
            r->expected[i].offered = true;
    for (uint32_t i = 0; i < r->num_heard; i++)
        if (strcmp(r->heard[i].name, offer->producer) == 0)
            return;
    if (r->num_heard == sizeof(r->heard) / sizeof(r->heard[0]))
        return;
    heard_t *h = &r->heard[r->num_heard++];
    snprintf(h->name, sizeof(h->name), "%s", offer->producer);
    snprintf(h->address, sizeof(h->address), "%s", offer->address);
    h->first_ns = kvr_now_ns();
}

/* OFFERs due from a producer heard from long ago are lost (a partition,
 * a dropped link): refused at once, so no rank waits to --timeout. */
static void tick_lost(router_t *r, uint64_t now)
{
    for (uint32_t i = 0; i < r->num_expected; i++) {
        expected_t *e = &r->expected[i];
        for (uint32_t h = 0; !e->offered && h < r->num_heard; h++) {
            const heard_t *p = &r->heard[h];
            if (strcmp(p->name, e->producer) != 0 ||
                now < p->first_ns + r->offer_wait_ns)
                continue;
            char why[200];
            snprintf(why, sizeof(why),
                     "no OFFER from %s within %llu ms of its first: lost",
                     p->name,
                     (unsigned long long)(r->offer_wait_ns / 1000000u));
            e->offered = true; /* ended: a late OFFER is a duplicate */
            refuse_id(r, e->request, p->name, p->address, KVR_ERR_TIMEOUT, why);
        }
    }
}

void router_offer(router_t *r, const rt_msg_t *offer)
{
    for (uint32_t i = 0; i < r->num_expected; i++)
        if (r->expected[i].offered &&
            strcmp(r->expected[i].request, offer->request) == 0 &&
            find(r, offer->request) == NULL) {
            printf("refused-offer %s ERR_EXISTS offered before, or given up "
                   "as lost\n",
                   offer->request);
            return;
        }
    note_offer(r, offer);
    if (find(r, offer->request) != NULL) {
        printf("refused-offer %s ERR_EXISTS already live here\n",
               offer->request);
        return;
    }
    rreq_t *q = NULL;
    for (size_t i = 0; q == NULL && i < sizeof(r->reqs) / sizeof(r->reqs[0]);
         i++)
        if (!r->reqs[i].used)
            q = &r->reqs[i];
    rt_msg_t *copy = q ? malloc(sizeof(*copy)) : NULL;
    if (copy == NULL) {
        refuse_id(r, offer->request, offer->producer, offer->address,
                  KVR_ERR_NO_SPACE, "too many live requests");
        return;
    }
    *copy = *offer;
    *q = (rreq_t){.used = true, .offer = copy, .offered_ns = kvr_now_ns()};
    try_place(r, q);
}

/* A request the group failed: its producer may hold sources some rank
 * never asked for (a rank that failed before its pull); it is told. */
static void tell_failed(router_t *r, const rreq_t *q)
{
    rt_msg_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return;
    m->type = RT_FAILED;
    snprintf(m->request, sizeof(m->request), "%s", q->offer->request);
    m->status = (uint32_t)q->outcome;
    snprintf(m->text, sizeof(m->text), "the decode group failed it");
    r->ops.to_producer(r->ops.ctx, q->offer->producer, q->offer->address, m);
    free(m);
}

/* Every rank released: blocks of a loaded request are cached under its
 * prefix hashes, then every block drops its reference. */
static void finish(router_t *r, rreq_t *q)
{
    const rt_msg_t *o = q->offer;
    if (q->outcome != KVR_OK && q->outcome != KVR_ERR_CANCELED)
        tell_failed(r, q);
    if (q->outcome == KVR_OK)
        for (uint32_t i = 0; i < o->num_hashes && i < q->ndst; i++) {
            r->cached[q->dst[i]].hash = o->hashes[i];
            r->cached[q->dst[i]].used = true;
        }
    for (size_t i = 0; i < q->ndst; i++)
        r->refs[q->dst[i]]--;
    printf("released %s %s %zu\n", o->request, kvr_status_name(q->outcome),
           q->ndst);
    fflush(stdout);
    r->done++;
    /* an abort the ranks were asked for is no failure */
    r->failed += q->outcome != KVR_OK && q->outcome != KVR_ERR_CANCELED;
    rreq_free(q);
}

static uint64_t all_ranks(const router_t *r)
{
    return r->ranks == 64 ? ~0ull : (1ull << r->ranks) - 1;
}

void router_released(router_t *r, uint32_t rank, const rt_msg_t *m)
{
    rreq_t *q = find(r, m->request);
    if (rank < r->ranks)
        r->silent &= ~(1ull << rank); /* it answers (again) */
    if (q == NULL || !q->assigned || rank >= r->ranks ||
        (q->released >> rank) & 1)
        return;
    q->released |= 1ull << rank;
    if (m->status != KVR_OK && q->outcome == KVR_OK)
        q->outcome = (kvr_status_t)m->status;
    if (q->released == all_ranks(r))
        finish(r, q);
}

void router_tick(router_t *r)
{
    uint64_t now = kvr_now_ns();
    tick_lost(r, now);
    for (size_t i = 0; i < sizeof(r->reqs) / sizeof(r->reqs[0]); i++) {
        rreq_t *q = &r->reqs[i];
        if (!q->used)
            continue;
        if (!q->assigned) {
            try_place(r, q);
        } else if (now >= q->deadline_ns) {
            /* a rank that never answers (dead) no longer writes: its
             * agent ends every load by deadline plus grace */
            for (uint32_t k = 0; k < r->ranks; k++)
                if (!((q->released >> k) & 1)) {
                    printf("rank-silent %s %u\n", q->offer->request, k);
                    r->silent |= 1ull << k;
                }
            if (q->outcome == KVR_OK)
                q->outcome = KVR_ERR_TIMEOUT;
            finish(r, q);
        }
    }
}

uint32_t router_done(const router_t *r)
{
    return r->done;
}

uint32_t router_failed(const router_t *r)
{
    return r->failed;
}

uint32_t router_blocks_in_use(const router_t *r)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < r->num_blocks; b++)
        n += r->refs[b] > 0;
    return n;
}
