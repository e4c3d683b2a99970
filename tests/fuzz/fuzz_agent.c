/* libFuzzer target over the agent's request state machines: a producer
 * agent and a consumer agent in this process (loopback data plane, control
 * links on 127.0.0.1, no progress threads: the fuzzer turns both loops),
 * real requests between them, and decoded frames injected into their links
 * (kvr__alink_inject) as a peer would send them: WRITE_DONE, WRITE_FAILED,
 * CHUNK_DONE, LAYERS_DONE to the consumer, WRITE_REQUEST, STREAM_REQUEST,
 * RELEASE and CHUNK_DONE acks to the producer, with counts over the whole u64 range (num_tokens near 2^64,
 * huge block counts), the requests' real nonces or others, duplicated and
 * out of order, for known requests and unknown ones; aborts and
 * send_ready (of one layer or all) in between; some requests streamed.
 *
 * Checked for every request the agents accepted: it ends (within its
 * deadline plus grace plus a margin) in exactly one terminal event
 * (consumer: LOADED or LOAD_FAILED, then RELEASED once; producer: SENT,
 * SEND_EXPIRED or SEND_FAILED once); LOADED carries the planned bytes;
 * a LOADED request that no forged WRITE_DONE reached holds its bytes;
 * LAYERS_LOADED only for streamed requests, each layer at most once and
 * never after the outcome, every layer once before a streamed LOADED.
 * No input may crash either agent (ASan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_internal.h"
#include "fuzz_cursor.h"
#include "kvrelay/agent.h"
#include "kvrelay/xfer.h"

#define LAYERS 2u
#define BS 16u
#define TOKEN_BYTES 32u
#define POOL 64u  /* blocks per region, both sides */
#define SLICE 16u /* an honest request's blocks: its own slice */
#define MAX_REQS 4u
#define MAX_OPS 48u
#define DEADLINE_MS 300u
#define GRACE_MS 150u
#define LEASE_MS 600u
#define END_MS 8000u /* every request ends by then, or it is a bug */

typedef struct world {
    kvr_transport_t *hub;
    kvr_agent_t *prod, *cons;
    uint8_t *src[LAYERS], *dst[LAYERS];
    uint32_t serial;
    bool foreign_writes; /* this input: a request with random tables, or
                            an injected WRITE_REQUEST, may have written
                            anywhere in the consumer's pool */
} world_t;

typedef struct freq {
    char id[32];
    uint64_t tokens, computed;
    uint32_t src[SLICE], dst[POOL];
    uint32_t nsrc, ndst;
    bool honest;                    /* its own disjoint slice, computed 0 */
    bool stream;                    /* received layer-wise */
    uint32_t layers_loaded[LAYERS]; /* LAYERS_LOADED per layer */
    bool forged_done;        /* a WRITE_DONE with its nonce was injected */
    bool must_fail;          /* ... one short of (or beyond) the planned bytes,
                         while the stage had not answered */
    bool sending, receiving; /* accepted by send_open / recv */
    uint32_t send_ends, loaded, load_failed, released;
    uint64_t loaded_bytes;
} freq_t;

static world_t W;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void die(const char *what, const freq_t *r)
{
    fprintf(stderr,
            "fuzz_agent: %s: request '%s' (%llu tokens, %llu "
            "computed, %u dst blocks): loaded %u, failed %u, released %u, "
            "send ends %u\n",
            what, r ? r->id : "-", r ? (unsigned long long)r->tokens : 0ull,
            r ? (unsigned long long)r->computed : 0ull, r ? r->ndst : 0,
            r ? r->loaded : 0, r ? r->load_failed : 0, r ? r->released : 0,
            r ? r->send_ends : 0);
    abort();
}

static uint8_t pattern(uint32_t layer, uint32_t block, uint64_t off)
{
    return (uint8_t)(1 + (layer * 7u + block * 131u + off * 3u) % 251u);
}

static kvr_agent_params_t params(const char *name, kvr_agent_role_t role)
{
    kvr_agent_params_t p = KVR_AGENT_PARAMS_INIT;
    p.instance_id = name;
    p.instance_id_len = strlen(name);
    p.role = role;
    p.layout.block_size = BS;
    p.topo = (kvr_wire_topo_t){.pp_rank = 0,
                               .pp_size = 1,
                               .tp_rank = 0,
                               .tp_size = 1,
                               .dp_rank = 0,
                               .dp_size = 1,
                               .layer_start = 0,
                               .layer_end = LAYERS};
    p.loopback_hub = W.hub;
    p.progress_thread = false;
    p.deadline_ms = DEADLINE_MS;
    p.grace_ms = GRACE_MS;
    p.lease_ms = LEASE_MS;
    p.unknown_wait_ms = 50;
    if (role == KVR_AGENT_PRODUCER)
        p.listen = "127.0.0.1:0";
    return p;
}

static kvr_agent_t *start(const char *name, kvr_agent_role_t role,
                          uint8_t **bases)
{
    kvr_agent_params_t p = params(name, role);
    kvr_agent_t *a = NULL;
    kvr_error_t err = {0};
    if (kvr_agent_create(&p, &a, &err) != KVR_OK) {
        fprintf(stderr, "kvr_agent_create: %s\n", err.msg);
        abort();
    }
    for (uint32_t l = 0; l < LAYERS; l++) {
        kvr_region_desc_t d = {.role = KVR_ROLE_MLA,
                               .layer = l,
                               .num_blocks = POOL,
                               .page_bytes = BS * TOKEN_BYTES};
        void *base = NULL;
        if (kvr_agent_alloc_region(a, &d, 0, &base) != KVR_OK)
            abort();
        bases[l] = base;
    }
    if (kvr_agent_start(a) != KVR_OK) {
        fprintf(stderr, "kvr_agent_start: %s\n", kvr_agent_last_error(a));
        abort();
    }
    return a;
}

static void setup(void)
{
    kvr_loopback_params_t lp = KVR_LOOPBACK_PARAMS_INIT;
    if (kvr_transport_loopback_create(NULL, &lp, &W.hub, NULL) != KVR_OK)
        abort();
    W.prod = start("fuzz-prefill", KVR_AGENT_PRODUCER, W.src);
    W.cons = start("fuzz-decode", KVR_AGENT_CONSUMER, W.dst);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint64_t o = 0; o < (uint64_t)POOL * BS * TOKEN_BYTES; o++)
            W.src[l][o] = pattern(l, (uint32_t)(o / (BS * TOKEN_BYTES)),
                                  o % (BS * TOKEN_BYTES));
}

/* ---- events ---- */

static freq_t *find(freq_t *reqs, uint32_t n, const kvr_wire_id_t *id)
{
    for (uint32_t i = 0; i < n; i++)
        if (id->len == strlen(reqs[i].id) &&
            memcmp(id->bytes, reqs[i].id, id->len) == 0)
            return &reqs[i];
    return NULL;
}

static uint64_t planned_bytes(const freq_t *r)
{
    return (r->tokens - r->computed * BS) * TOKEN_BYTES * LAYERS;
}

static void on_event(freq_t *reqs, uint32_t n, const kvr_agent_event_t *e)
{
    freq_t *r = find(reqs, n, &e->request);
    if (r == NULL)
        return; /* an earlier input's late event is not ours */
    switch (e->kind) {
    case KVR_AGENT_SENT:
    case KVR_AGENT_SEND_EXPIRED:
    case KVR_AGENT_SEND_FAILED:
        r->send_ends++;
        break;
    case KVR_AGENT_LOADED:
        if (r->released || r->load_failed)
            die("LOADED after the request ended", r);
        r->loaded++;
        r->loaded_bytes = e->bytes;
        break;
    case KVR_AGENT_LOAD_FAILED:
        if (r->released || r->loaded)
            die("LOAD_FAILED after the request ended", r);
        r->load_failed++;
        break;
    case KVR_AGENT_RELEASED:
        r->released++;
        break;
    case KVR_AGENT_LAYERS_LOADED:
        if (!r->stream || r->released || r->loaded || r->load_failed)
            die("LAYERS_LOADED not streamed, or after the outcome", r);
        for (uint32_t l = e->layer_begin; l < e->layer_end; l++)
            if (l >= LAYERS || r->layers_loaded[l]++)
                die("a layer reported twice, or beyond the model", r);
        break;
    default:
        break;
    }
}

static void pump(freq_t *reqs, uint32_t n, uint32_t turns)
{
    for (uint32_t t = 0; t < turns; t++) {
        kvr_agent_progress(W.prod, 1);
        kvr_agent_progress(W.cons, 1);
        kvr_agent_event_t e;
        while (kvr_agent_poll(W.prod, &e) || kvr_agent_poll(W.cons, &e))
            on_event(reqs, n, &e);
    }
}

static bool all_ended(const freq_t *reqs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if ((reqs[i].sending && reqs[i].send_ends == 0) ||
            (reqs[i].receiving && reqs[i].released == 0))
            return false;
    return true;
}

/* Destination bytes of an honest request: token t of virtual block j came
 * from source block src[j]. */
static void verify_bytes(const freq_t *r)
{
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint64_t t = 0; t < r->tokens; t++)
            for (uint32_t b = 0; b < TOKEN_BYTES; b++) {
                uint64_t in_page = (t % BS) * TOKEN_BYTES + b;
                uint32_t sb = r->src[t / BS], db = r->dst[t / BS];
                uint8_t got =
                    W.dst[l][(uint64_t)db * BS * TOKEN_BYTES + in_page];
                if (got != pattern(l, sb, in_page))
                    die("LOADED without its bytes in place", r);
            }
}

static void check(const freq_t *reqs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const freq_t *r = &reqs[i];
        if (r->sending && r->send_ends != 1)
            die("not exactly one producer outcome", r);
        if (!r->receiving)
            continue;
        if (r->released != 1 || r->loaded + r->load_failed != 1)
            die("not exactly one consumer outcome then RELEASED", r);
        if (r->loaded && r->loaded_bytes != planned_bytes(r))
            die("LOADED short of (or beyond) its planned bytes", r);
        if (r->loaded && r->must_fail)
            die("LOADED after a WRITE_DONE short of its planned bytes", r);
        if (r->loaded && !r->forged_done && !W.foreign_writes)
            verify_bytes(r);
        for (uint32_t l = 0; r->loaded && r->stream && l < LAYERS; l++)
            if (r->layers_loaded[l] != 1)
                die("LOADED, streamed, without every layer reported once", r);
    }
}

/* ---- requests ---- */

static void make_req(cursor_t *c, uint32_t i, freq_t *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "f%u-%u", W.serial, i);
    r->honest = take(c, 4) != 3;
    r->stream = take(c, 2);
    W.foreign_writes |= !r->honest;
    r->tokens = r->honest ? 1 + take(c, SLICE * BS)
                          : take_count(c, take(c, POOL * BS + 2));
    r->computed = r->honest ? 0 : take_count(c, take(c, 3));
    uint64_t need = r->tokens / BS + (r->tokens % BS != 0);
    r->nsrc = need <= SLICE ? (uint32_t)need : take(c, SLICE + 1);
    r->ndst = r->honest ? r->nsrc : take(c, POOL + 1);
    for (uint32_t k = 0; k < SLICE; k++) /* reversed: no coalescing */
        r->src[k] = r->honest ? i * SLICE + SLICE - 1 - k : take(c, POOL + 2);
    for (uint32_t k = 0; k < POOL; k++)
        r->dst[k] = r->honest ? i * SLICE + k : take(c, POOL + 2);
}

static void open_req(freq_t *r)
{
    kvr_agent_send_t s = {r->id, strlen(r->id), r->src, r->nsrc, r->tokens, 0,
                          1};
    r->sending = kvr_agent_send_open(W.prod, &s) == KVR_OK;
    kvr_agent_recv_t q = {"fuzz-prefill",
                          strlen("fuzz-prefill"),
                          kvr_agent_address(W.prod),
                          r->id,
                          strlen(r->id),
                          r->dst,
                          r->ndst,
                          r->tokens,
                          r->computed,
                          0,
                          r->stream};
    if (r->honest)
        for (uint32_t l = 0; l < LAYERS; l++)
            for (uint32_t k = 0; k < r->ndst; k++)
                memset(W.dst[l] + (uint64_t)r->dst[k] * BS * TOKEN_BYTES, 0,
                       BS * TOKEN_BYTES);
    r->receiving = kvr_agent_recv(W.cons, &q) == KVR_OK;
}

/* ---- injected frames ---- */

static const kvr__creq_t *live_creq(const freq_t *r)
{
    for (const kvr__creq_t *q = W.cons->creqs; q != NULL; q = q->next)
        if (q->id.len == strlen(r->id) &&
            !memcmp(q->id.bytes, r->id, q->id.len))
            return q;
    return NULL;
}

static void pick_id(cursor_t *c, freq_t *reqs, uint32_t n, kvr_wire_id_t *id,
                    freq_t **which)
{
    uint32_t k = take(c, n + 1);
    *which = k < n ? &reqs[k] : NULL;
    const char *s = k < n ? reqs[k].id : "unknown-request";
    kvr_wire_id_set(id, s, strlen(s), NULL);
}

/* The request's nonce as the consumer drew it, or another. */
static uint64_t pick_nonce(cursor_t *c, const freq_t *r)
{
    const kvr__creq_t *q = r ? live_creq(r) : NULL;
    if (q != NULL && take(c, 4) != 3) /* an exhausted input: the real one */
        return q->nonce;
    return take(c, 2) ? take_u64(c) : 0;
}

static uint64_t pick_bytes(cursor_t *c, const freq_t *r)
{
    const kvr__creq_t *q = r ? live_creq(r) : NULL;
    uint64_t plan = q != NULL && q->num_stages > 0 ? q->stages[0].expect_bytes
                                                   : 0;
    switch (take(c, 4)) {
    case 0:
        return plan;
    case 1:
        return plan + take(c, 3) - 1;
    case 2:
        return take_count(c, take(c, 255));
    default:
        return plan / (1 + take(c, 4));
    }
}

/* A WRITE_DONE with the request's nonce, to its unanswered stage: taken as
 * the stage's answer, so unless it carries exactly the planned bytes the
 * request must fail. */
static void note_forged(freq_t *r, const kvr_msg_write_done_t *d)
{
    const kvr__creq_t *q = r ? live_creq(r) : NULL;
    if (q == NULL || q->nonce != d->write_nonce || d->pp_rank != 0 ||
        q->state != KVR_RECV_PULLING || q->num_stages != 1)
        return;
    const kvr__cstage_t *st = &q->stages[0];
    if (!st->sent || st->answered)
        return;
    r->forged_done = true;
    r->must_fail |= d->bytes != st->expect_bytes ||
                    st->unpacked != (d->chunks ? d->bytes : 0);
}

/* A LAYERS_DONE with the request's real nonce may be counted as a group
 * whose bytes never moved: its bytes are not checked then. */
static void note_forged_layers(freq_t *r, const kvr_msg_layers_done_t *g)
{
    const kvr__creq_t *q = r ? live_creq(r) : NULL;
    if (q != NULL && q->nonce == g->write_nonce)
        r->forged_done = true;
}

static void inject_to_consumer(cursor_t *c, freq_t *reqs, uint32_t n,
                               uint32_t what)
{
    static const kvr_msg_type_t types[] = {
        KVR_MSG_WRITE_DONE, KVR_MSG_WRITE_FAILED, KVR_MSG_CHUNK_DONE,
        KVR_MSG_LAYERS_DONE};
    kvr_msg_t m;
    kvr_msg_init(&m, types[what]);
    freq_t *r = NULL;
    kvr_wire_id_t id;
    pick_id(c, reqs, n, &id, &r);
    uint64_t nonce = pick_nonce(c, r);
    uint32_t pp = take(c, 8) == 0 ? take(c, 4) : 0;
    if (what == 0) {
        m.u.write_done = (kvr_msg_write_done_t){.request_id = id,
                                                .pp_rank = pp,
                                                .write_nonce = nonce,
                                                .bytes = pick_bytes(c, r),
                                                .chunks = take(c, 3)};
        note_forged(r, &m.u.write_done);
    } else if (what == 1) {
        m.u.write_failed = (kvr_msg_write_failed_t){
            .request_id = id,
            .pp_rank = pp,
            .write_nonce = nonce,
            .status = take(c, 2) ? KVR_ERR_TIMEOUT : (kvr_status_t)take(c, 64)};
        snprintf(m.u.write_failed.text, sizeof(m.u.write_failed.text),
                 "injected");
    } else if (what == 3) {
        uint32_t b = take(c, LAYERS + 1);
        m.u.layers_done = (kvr_msg_layers_done_t){
            .request_id = id,
            .pp_rank = pp,
            .write_nonce = nonce,
            .layer_begin = b,
            .layer_end = b + 1 + take(c, LAYERS),
            .bytes = pick_bytes(c, r) / (1 + take(c, LAYERS)),
            .chunks = take(c, 3)};
        note_forged_layers(r, &m.u.layers_done);
    } else {
        m.u.chunk_done = (kvr_msg_chunk_done_t){
            .request_id = id,
            .pp_rank = pp,
            .write_nonce = nonce,
            .chunk = take(c, 4),
            .slot = take(c, 4),
            .offset = take_count(c, take(c, 255)),
            .bytes = take_count(c, take(c, 255))};
    }
    kvr__alink_inject(W.cons, KVR__LINK_STAGE, &m);
}

static void inject_to_producer(cursor_t *c, freq_t *reqs, uint32_t n,
                               uint32_t what)
{
    static uint32_t blocks[1024];
    kvr_msg_t m;
    freq_t *r = NULL;
    kvr_wire_id_t id;
    pick_id(c, reqs, n, &id, &r);
    uint64_t nonce = pick_nonce(c, r);
    if (what == 0 || what == 3) {
        W.foreign_writes = true;
        kvr_msg_init(&m, KVR_MSG_WRITE_REQUEST);
        uint32_t nb = take(c, 4) == 0 ? 1024 : take(c, POOL + 1);
        for (uint32_t k = 0; k < nb; k++)
            blocks[k] = take(c, 8) == 0 ? (uint32_t)take_u64(c) : take(c, POOL);
        m.u.write_request = (kvr_msg_write_request_t){
            .request_id = id,
            .src_blocks = blocks,
            .num_src_blocks = nb,
            .dst_blocks = blocks,
            .num_dst_blocks = nb,
            .num_tokens = take_count(c, take(c, 255)),
            .num_computed_blocks = take_count(c, take(c, 2)),
            .dcp_rank = take(c, 8) == 0 ? take(c, 4) : 0,
            .executor = (kvr_wire_exec_t)take(c, 3),
            .write_nonce = nonce ? nonce : 1,
            .deadline_ms = take(c, 2) ? DEADLINE_MS : take(c, 255)};
        if (what == 3) { /* any range, empty and past the stage's too */
            m.type = KVR_MSG_STREAM_REQUEST;
            m.u.write_request.layer_begin = take(c, LAYERS + 2);
            m.u.write_request.layer_end = take(c, LAYERS + 2);
        }
    } else if (what == 1) {
        kvr_msg_init(&m, KVR_MSG_RELEASE);
        m.u.release = (kvr_msg_release_t){
            .request_id = id,
            .write_nonce = nonce,
            .outcome = take(c, 2) ? KVR_OK : KVR_ERR_VERIFY};
    } else {
        kvr_msg_init(&m, KVR_MSG_CHUNK_DONE);
        m.u.chunk_done = (kvr_msg_chunk_done_t){
            .request_id = id,
            .write_nonce = nonce,
            .chunk = take(c, 4),
            .slot = take(c, 4),
            .bytes = take_count(c, take(c, 255))};
    }
    kvr__alink_inject(W.prod, KVR__LINK_ACCEPT, &m);
}

static void abort_one(cursor_t *c, freq_t *reqs, uint32_t n)
{
    freq_t *r = &reqs[take(c, n)];
    if (take(c, 2))
        kvr_agent_recv_abort(W.cons, "fuzz-prefill", strlen("fuzz-prefill"),
                             r->id, strlen(r->id));
    else
        kvr_agent_send_abort(W.prod, r->id, strlen(r->id));
}

static void run_op(cursor_t *c, freq_t *reqs, uint32_t n)
{
    uint32_t op = take(c, 12);
    if (op < 4)
        inject_to_consumer(c, reqs, n, op);
    else if (op < 8)
        inject_to_producer(c, reqs, n, op - 4);
    else if (op == 8)
        abort_one(c, reqs, n);
    else if (op == 9) { /* one layer, or all of them */
        freq_t *r = &reqs[take(c, n)];
        uint32_t l = take(c, LAYERS + 1);
        kvr_agent_send_ready(W.prod, r->id, strlen(r->id), l < LAYERS ? l : 0,
                             l < LAYERS ? l + 1 : LAYERS, NULL);
    } else
        pump(reqs, n, 1 + take(c, 8));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (W.prod == NULL)
        setup();
    W.serial++;
    W.foreign_writes = false;
    cursor_t c = {data, size};
    freq_t reqs[MAX_REQS];
    uint32_t n = 1 + take(&c, MAX_REQS);
    for (uint32_t i = 0; i < n; i++) {
        make_req(&c, i, &reqs[i]);
        open_req(&reqs[i]);
        if (take(&c, 4) != 0)
            kvr_agent_send_ready(W.prod, reqs[i].id, strlen(reqs[i].id), 0,
                                 LAYERS, NULL);
    }
    pump(reqs, n, 2);
    for (uint32_t k = 0; k < MAX_OPS && c.n > 0; k++)
        run_op(&c, reqs, n);
    /* what the input left open ends by abort, or (rarely: slow) by lease
     * and deadline */
    bool wait_out = c.n > 0 && take(&c, 16) == 0;
    for (uint32_t i = 0; i < n && !wait_out; i++) {
        kvr_agent_send_abort(W.prod, reqs[i].id, strlen(reqs[i].id));
        kvr_agent_recv_abort(W.cons, "fuzz-prefill", strlen("fuzz-prefill"),
                             reqs[i].id, strlen(reqs[i].id));
    }
    uint64_t end = now_ms() + END_MS;
    while (!all_ended(reqs, n) && now_ms() < end)
        pump(reqs, n, 1);
    pump(reqs, n, 2); /* a second terminal event would show now */
    check(reqs, n);
    return 0;
}
