/* An authenticated but hostile producer against a real consumer agent
 * (issue 15.1, rewritten for the agent). The producer is hand-made on the
 * agent's control links (src/conn/link.h): it listens, does the real keyed
 * handshake (session MACs included) as a PP head of one stage, greets with
 * STAGES, and answers every WRITE_REQUEST with WRITE_DONE of 0 bytes or of
 * 2^64 - 1 bytes (a STREAM_REQUEST first with LAYERS_DONE of its whole
 * range claiming as much). No such request may be reported LOADED (nor
 * any of its layers LAYERS_LOADED): each ends in
 * LOAD_FAILED, then RELEASED, and the producer gets a failed RELEASE. A
 * recv of 2^64 - 1 tokens is refused at the call or fails, never loads. */
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_harness.h"
#include "link_peer.h"

static const uint8_t KEY[KVR_WIRE_KEY_BYTES] = {
    1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

#define EVIL "evil-prefill"
#define INCARNATION 0x1234u

typedef struct {
    int listen_fd;
    char address[64];
    kvr__link_t *link;
    uint64_t done_bytes; /* what every WRITE_DONE claims */
    uint32_t releases;
    kvr_status_t last_outcome;
} evil_t;

/* The model's regions on a producer holding every layer. */
static uint32_t producer_regions(const ah_model_t *m, kvr_region_desc_t *d)
{
    uint32_t n = 0;
    for (uint32_t l = 0; l < m->layers; l++) {
        d[n++] = (kvr_region_desc_t){.role = KVR_ROLE_MLA,
                                     .layer = l,
                                     .num_blocks = m->src_pool,
                                     .page_bytes = (uint64_t)m->lay.block_size *
                                                   m->token_bytes};
        if (l % 2 == 0)
            d[n++] = (kvr_region_desc_t){
                .role = KVR_ROLE_INDEX,
                .layer = l,
                .num_blocks = m->src_pool,
                .index_dim = m->index_dim,
                .quant_block = m->index_dim,
                .page_bytes = kvr_index_page_tokens(&m->lay, false) *
                              kvr_index_stride(m->index_dim)};
    }
    return n;
}

static void evil_accept(evil_t *e, const ah_model_t *m)
{
    struct pollfd p = {.fd = e->listen_fd, .events = POLLIN};
    assert_true(poll(&p, 1, AH_WAIT_MS) == 1);
    int fd = accept(e->listen_fd, NULL, NULL);
    assert_true(fd >= 0);
    kvr_error_t err = {0};
    assert_int_equal(kvr__link_create(fd, false, KEY, &e->link, &err), KVR_OK);
    kvr_wire_topo_t topo = {.pp_rank = 0,
                            .pp_size = 1,
                            .tp_rank = 0,
                            .tp_size = 1,
                            .dp_size = 1,
                            .layer_start = 0,
                            .layer_end = m->layers};
    kvr_region_desc_t d[AH_MAX_REGIONS];
    uint32_t n = producer_regions(m, d);
    assert_int_equal(kvr_wire_hello_init(&e->link->ours, KVR_WIRE_PRODUCER,
                                         &topo, &m->lay, d, n, &err),
                     KVR_OK);
    e->link->ours.has_key = true;
    assert_int_equal(
        kvr_wire_id_set(&e->link->ours.instance, EVIL, strlen(EVIL), NULL),
        KVR_OK);
    e->link->ours.incarnation = INCARNATION;
}

static void send_stages(evil_t *e)
{
    kvr_wire_stage_t s = {
        .pp_rank = 0, .tp_rank = 0, .incarnation = INCARNATION};
    snprintf(s.address, sizeof(s.address), "%s", e->address);
    kvr_msg_t m = {.type = KVR_MSG_STAGES};
    m.u.stages = (kvr_msg_stages_t){
        .pp_size = 1, .tp_size = 1, .stages = &s, .num_stages = 1};
    assert_int_equal(kvr__link_send(e->link, &m), KVR_OK);
}

static void answer_done(evil_t *e, const kvr_msg_write_request_t *w)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_WRITE_DONE);
    m.u.write_done.request_id = w->request_id;
    m.u.write_done.write_nonce = w->write_nonce;
    m.u.write_done.bytes = e->done_bytes;
    assert_int_equal(kvr__link_send(e->link, &m), KVR_OK);
}

static void answer_layers(evil_t *e, const kvr_msg_write_request_t *w)
{
    kvr_msg_t m;
    kvr_msg_init(&m, KVR_MSG_LAYERS_DONE);
    m.u.layers_done.request_id = w->request_id;
    m.u.layers_done.write_nonce = w->write_nonce;
    m.u.layers_done.layer_begin = w->layer_begin;
    m.u.layers_done.layer_end = w->layer_end;
    m.u.layers_done.bytes = e->done_bytes;
    assert_int_equal(kvr__link_send(e->link, &m), KVR_OK);
}

/* One pass over the link: handshake frames, then STAGES once ready, then
 * the hostile answers. */
static void evil_step(evil_t *e)
{
    kvr__link_t *l = e->link;
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    p.events |= kvr__link_wants_write(l) ? POLLOUT : 0;
    poll(&p, 1, 20);
    kvr__link_flush(l);
    kvr__link_read(l);
    kvr_error_t err = {0};
    for (bool have = true; have && !l->closed;) {
        kvr_msg_t m;
        have = false;
        if (kvr__link_next(l, &m, &have, &err) != KVR_OK)
            fail_msg("link: %s", err.msg);
        if (!have)
            break;
        bool was_ready = l->ready;
        if (m.type == KVR_MSG_BYE)
            fail_msg("the consumer refused: %s", m.u.bye.text);
        if (m.type < KVR_MSG_REGIONS &&
            link_peer_handshake(l, &m, &err) != KVR_OK)
            fail_msg("handshake: %s", err.msg);
        if (!was_ready && l->ready)
            send_stages(e);
        if (m.type == KVR_MSG_STREAM_REQUEST)
            answer_layers(e, &m.u.write_request);
        if (m.type == KVR_MSG_WRITE_REQUEST || m.type == KVR_MSG_STREAM_REQUEST)
            answer_done(e, &m.u.write_request);
        if (m.type == KVR_MSG_RELEASE) {
            e->releases++;
            e->last_outcome = m.u.release.outcome;
        }
        kvr_msg_free(&m);
    }
    kvr__link_flush(l);
}

typedef struct {
    ah_model_t m;
    kvr_transport_t *hub;
    ah_agent_t cons;
    evil_t evil;
} fixture_t;

static void tweak_key(kvr_agent_params_t *p)
{
    p->key = KEY;
    p->deadline_ms = 10000;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->m = ah_model();
    f->m.lay.dcp_size = 1; /* one rank: it pulls every token */
    f->m.lay.tp = 1;
    f->hub = ah_hub();
    kvr_agent_params_t p = ah_consumer_params(&f->m, f->hub, "decode", 0);
    tweak_key(&p);
    ah_start(&f->m, &p, 0, false, &f->cons);
    f->evil.listen_fd = ah_silent_listener(f->evil.address,
                                           sizeof(f->evil.address));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    ah_stop(&f->cons);
    if (f->evil.link != NULL)
        kvr__link_destroy(f->evil.link);
    close(f->evil.listen_fd);
    kvr_transport_destroy(f->hub);
    free(f);
    return 0;
}

/* recv of request id from the hostile producer; the producer side runs
 * until the consumer's RELEASED, which must follow a LOAD_FAILED. */
static void expect_never_loaded(fixture_t *f, const char *id, uint64_t claim,
                                bool stream)
{
    ah_req_t r;
    ah_req(&f->m, 0, 200, &r);
    snprintf(r.id, sizeof(r.id), "%s", id);
    f->evil.done_bytes = claim;
    uint32_t before = f->evil.releases;
    ah_recv_stream(&f->cons, EVIL, f->evil.address, &r, 10000, stream);
    if (f->evil.link == NULL)
        evil_accept(&f->evil, &f->m);
    for (uint64_t end = ah_now_ms() + AH_WAIT_MS;
         ah_count(&f->cons, id, KVR_AGENT_RELEASED) == 0 &&
         ah_now_ms() < end;) {
        evil_step(&f->evil);
        ah_collect(&f->cons);
    }
    assert_int_equal(ah_count(&f->cons, id, KVR_AGENT_LOADED), 0);
    assert_int_equal(ah_count(&f->cons, id, KVR_AGENT_LAYERS_LOADED), 0);
    const kvr_agent_event_t *ev = ah_wait(&f->cons, id, KVR_AGENT_LOAD_FAILED,
                                          1000);
    assert_int_not_equal(ev->status, KVR_OK);
    printf("%s: %s %s\n", id, kvr_status_name(ev->status), ev->message);
    assert_non_null(strstr(ev->message, "bytes"));
    ah_wait(&f->cons, id, KVR_AGENT_RELEASED, 1000);
    for (uint64_t end = ah_now_ms() + 2000;
         f->evil.releases == before && ah_now_ms() < end;)
        evil_step(&f->evil);
    assert_int_equal(f->evil.releases, before + 1); /* a failed RELEASE */
    assert_int_not_equal(f->evil.last_outcome, KVR_OK);
}

static void test_zero_bytes_done_fails(void **state)
{
    fixture_t *f = *state;
    expect_never_loaded(f, "zero", 0, false);
    expect_never_loaded(f, "huge", UINT64_MAX, false);
}

/* Streamed: the groups' claims are checked against the plan too. */
static void test_stream_claims_fail(void **state)
{
    fixture_t *f = *state;
    expect_never_loaded(f, "zero-layers", 0, true);
    expect_never_loaded(f, "huge-layers", UINT64_MAX, true);
}

/* 2^64 - 1 tokens: refused at the call (the table cannot hold them), or
 * failed; never LOADED with 0 bytes (the block counts must not wrap). */
static void test_huge_token_count_refused(void **state)
{
    fixture_t *f = *state;
    static const uint32_t dst[2] = {0, 1};
    kvr_agent_recv_t r = {
        EVIL, strlen(EVIL), f->evil.address, "wrap", 4, dst, 2, UINT64_MAX, 0,
        5000, false};
    kvr_status_t st = kvr_agent_recv(f->cons.agent, &r);
    if (st == KVR_OK) {
        ah_wait(&f->cons, "wrap", KVR_AGENT_RELEASED, AH_WAIT_MS);
        assert_int_equal(ah_count(&f->cons, "wrap", KVR_AGENT_LOADED), 0);
        assert_int_equal(ah_count(&f->cons, "wrap", KVR_AGENT_LOAD_FAILED), 1);
    } else {
        printf("wrap: %s\n", kvr_agent_last_error(f->cons.agent));
        assert_non_null(strstr(kvr_agent_last_error(f->cons.agent), "token"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_zero_bytes_done_fails, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_huge_token_count_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stream_claims_fail, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
