/* The store connector: saves on its worker with send/save pairing (either
 * order), the PP quorum of saves (parts held here, parts reported by other
 * processes, and parts read from the records other stages leave in the
 * store's directory), generations of saves and loads, loads with a quorum
 * over parts into W = 2 ranks checked byte-exact, the max_tokens cap, a
 * corrupt chunk or a missing part as a shorter hit, a full disk failing
 * the save while the send is released, and other namespaces missing. */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvrelay/base.h"
#include "store_fixture.h"
#include "store_tmp.h"

#define BS 16
#define CHUNK 64u
#define NTOK 202u /* three full chunks and a tail */
#define SEED 0x5eedull
#define NCH (NTOK / CHUNK)

static const sf_model_t model = {
    .layers = 8, .pp = 4, .bs = BS, .tb = 576, .D = 128, .pool = 48};
static const uint32_t part_ends[4] = {2, 4, 6, 8};

static char dir[ST_DIR_MAX];
static uint32_t tokens[NTOK];
static kvr_block_hash_t chains[NCH];

static int setup(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < NTOK; i++)
        tokens[i] = 500 + i * 3;
    size_t n = 0;
    if (kvr_store_chains(tokens, NTOK, CHUNK, chains, NCH, &n, NULL) !=
            KVR_OK ||
        n != NCH)
        return -1;
    return st_tmpdir_make(dir, "store-conn") ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvr_failpoint_disarm_all();
    return st_tmpdir_remove(dir) ? 0 : -1;
}

static kvr_store_t *open_store(bool quick_scan)
{
    kvr_store_opts_t o = {.dir = dir, .quick_scan = quick_scan};
    kvr_store_t *st = NULL;
    assert_int_equal(kvr_store_open(&o, &st, NULL), KVR_OK);
    return st;
}

static kvr_layout_t layout(uint32_t W, bool repl)
{
    kvr_layout_t l = KVR_LAYOUT_INIT;
    l.block_size = BS;
    l.dcp_size = W;
    l.tp = W;
    l.interleave = repl ? 1 : BS; /* a sharded index needs I = bs */
    l.replicate_index = repl;
    return l;
}

static void namespace_of(uint32_t tb, const char *spec, uint8_t *ns)
{
    kvr_offload_desc_t d = {.model_tag = "test-dsa",
                            .dtype = "fp8",
                            .block_size = BS,
                            .chunk_size = CHUNK,
                            .tp = 1,
                            .dcp_size = 1,
                            .interleave = 1};
    sf_model_t m = model;
    m.tb = tb;
    kvr_region_desc_t r[SF_MAX_REGIONS];
    kvr_layout_t l = layout(1, false);
    size_t n = sf_layer_regions(&m, 0, m.layers, &l, false, r);
    assert_int_equal(kvr_store_namespace(&d, r, n, spec, ns, NULL), KVR_OK);
}

/* A producer holding layers [first, end) (one or more parts). */
static void producer(sf_side_t *s, uint32_t first, uint32_t end)
{
    unsigned seed = 5;
    kvr_layout_t l = layout(1, false);
    sf_side_init(s, &model, &l, false, first, end, (NTOK + BS - 1) / BS, &seed);
    assert_int_equal(sf_fill(s, SEED, tokens, NTOK), KVR_OK);
}

static kvr_store_conn_t *conn_wait(kvr_store_t *st, const uint8_t *ns,
                                   const sf_side_t *s, uint32_t wait_ms);

static kvr_store_conn_t *conn_of(kvr_store_t *st, const uint8_t *ns,
                                 const sf_side_t *s)
{
    return conn_wait(st, ns, s, 0);
}

/* wait_ms: parts of other processes awaited from the directory. */
static kvr_store_conn_t *conn_wait(kvr_store_t *st, const uint8_t *ns,
                                   const sf_side_t *s, uint32_t wait_ms)
{
    kvr_store_conn_params_t p = {.store = st,
                                 .ns = ns,
                                 .block_size = BS,
                                 .chunk = CHUNK,
                                 .lay = s->lay,
                                 .parts = 4,
                                 .part_ends = part_ends,
                                 .regions = s->regions,
                                 .num_regions = s->num_regions,
                                 .remote_wait_ms = wait_ms};
    kvr_store_conn_t *c = NULL;
    kvr_error_t err;
    if (kvr_store_conn_create(&p, &c, &err) != KVR_OK)
        fail_msg("conn create: %s", err.msg);
    return c;
}

/* Waits (10 s at most) for the next event. */
static kvr_store_event_t next_event(kvr_store_conn_t *c)
{
    kvr_store_event_t ev;
    for (int i = 0; i < 1000; i++) {
        if (kvr_store_conn_poll(c, &ev))
            return ev;
        struct pollfd p = {.fd = kvr_store_conn_event_fd(c), .events = POLLIN};
        poll(&p, 1, 10);
    }
    fail_msg("no store event within 10 s");
    return ev;
}

static void no_event(kvr_store_conn_t *c)
{
    kvr_store_event_t ev;
    usleep(50000);
    if (kvr_store_conn_poll(c, &ev))
        fail_msg("unexpected %s event", kvr_store_event_name(ev.kind));
}

static void save(kvr_store_conn_t *c, const sf_side_t *s, const char *id,
                 int64_t gen)
{
    kvr_store_save_req_t r = {.request_id = id,
                              .request_id_len = strlen(id),
                              .generation = gen,
                              .chains = chains,
                              .num_chains = NCH,
                              .src_blocks = s->blocks,
                              .num_src_blocks = s->num_blocks};
    kvr_error_t err;
    if (kvr_store_conn_save(c, &r, &err) != KVR_OK)
        fail_msg("save %s: %s", id, err.msg);
}

static void send_done(kvr_store_conn_t *c, const char *id, kvr_status_t st)
{
    assert_int_equal(kvr_store_conn_send_done(c, id, strlen(id), st, NULL),
                     KVR_OK);
}

/* All four parts in one connector: the PP quorum completes from its own
 * worker. Send first: RELEASE only after every part saved. */
static void test_send_first_pp_quorum(void **state)
{
    (void)state;
    kvr_store_t *st = open_store(false);
    uint8_t ns[KVR_STORE_NS_BYTES];
    namespace_of(model.tb, NULL, ns);
    sf_side_t p;
    producer(&p, 0, 8);
    kvr_store_conn_t *c = conn_of(st, ns, &p);
    save(c, &p, "req-a", 3);
    send_done(c, "req-a", KVR_OK);
    for (uint32_t part = 0; part < 4; part++) {
        kvr_store_event_t ev = next_event(c);
        assert_int_equal(ev.kind, KVR_STORE_PART_SAVED);
        assert_int_equal(ev.part, part);
        assert_int_equal(ev.status, KVR_OK);
        assert_int_equal(ev.chunks, NCH);
        assert_int_equal(ev.generation, 3);
        assert_true(ev.bytes > 0);
    }
    kvr_store_event_t ev = next_event(c);
    assert_int_equal(ev.kind, KVR_STORE_SAVED);
    assert_int_equal(ev.status, KVR_OK);
    ev = next_event(c);
    assert_int_equal(ev.kind, KVR_STORE_RELEASE);
    assert_memory_equal(ev.request, "req-a", 5);
    no_event(c);
    /* a late duplicate of a finished save counts nowhere */
    assert_int_equal(
        kvr_store_conn_part_saved(c, "req-a", 5, 3, 1, KVR_OK, NULL),
        KVR_ERR_INVALID); /* part 1 is held here */
    kvr_store_conn_destroy(c);
    sf_side_free(&p);
    kvr_store_close(st);
}

/* One stage of four: its own part saved, SAVED waits for the parts of the
 * other processes; a duplicate report is ignored; save first, then the send
 * is released at once. */
static void test_save_first_remote_parts(void **state)
{
    (void)state;
    kvr_store_t *st = open_store(false);
    uint8_t ns[KVR_STORE_NS_BYTES];
    namespace_of(model.tb, NULL, ns);
    sf_side_t p;
    producer(&p, 2, 4); /* part 1 */
    kvr_store_conn_t *c = conn_of(st, ns, &p);
    save(c, &p, "req-b", 0);
    kvr_store_event_t ev = next_event(c);
    assert_int_equal(ev.kind, KVR_STORE_PART_SAVED);
    assert_int_equal(ev.part, 1);
    no_event(c); /* no SAVED: parts 0, 2, 3 not reported; no RELEASE */
    send_done(c, "req-b", KVR_ERR_PEER_DEAD); /* save already done */
    ev = next_event(c);
    assert_int_equal(ev.kind, KVR_STORE_RELEASE);
    assert_int_equal(ev.status, KVR_ERR_PEER_DEAD);
    for (uint32_t part = 0; part < 4; part += part == 0 ? 2 : 1) {
        assert_int_equal(
            kvr_store_conn_part_saved(c, "req-b", 5, 0, part,
                                      part == 3 ? KVR_ERR_IO : KVR_OK, NULL),
            KVR_OK);
        if (part == 0) /* repeated: counts once */
            assert_int_equal(
                kvr_store_conn_part_saved(c, "req-b", 5, 0, 0, KVR_OK, NULL),
                KVR_OK);
    }
    ev = next_event(c);
    assert_int_equal(ev.kind, KVR_STORE_SAVED);
    assert_int_equal(ev.status, KVR_ERR_IO); /* a failed part dominates */
    /* another generation is another operation */
    assert_int_equal(
        kvr_store_conn_part_saved(c, "req-b", 5, 1, 0, KVR_OK, NULL), KVR_OK);
    no_event(c);
    assert_int_equal(
        kvr_store_conn_part_saved(c, "req-b", 5, 0, 9, KVR_OK, NULL),
        KVR_ERR_INVALID);
    kvr_store_conn_destroy(c);
    sf_side_free(&p);
    kvr_store_close(st);
}

/* Saves every part of the request through four stage connectors. */
static void save_all(kvr_store_t *st, const uint8_t *ns, sf_side_t prod[4])
{
    for (uint32_t s = 0; s < 4; s++) {
        producer(&prod[s], 2 * s, 2 * s + 2);
        kvr_store_conn_t *c = conn_of(st, ns, &prod[s]);
        save(c, &prod[s], "req-c", 0);
        kvr_store_event_t ev = next_event(c);
        assert_int_equal(ev.kind, KVR_STORE_PART_SAVED);
        assert_int_equal(ev.status, KVR_OK);
        kvr_store_conn_destroy(c);
    }
}

static void verify_rank(sf_side_t prod[4], const sf_side_t *c, uint32_t rank,
                        uint64_t n)
{
    kvr_error_t err;
    if (sf_verify_rank(prod, 2, c, rank, n, &err) != KVR_OK)
        fail_msg("rank %u: %s", rank, err.msg);
}

/* A consumer rank of W = 2 loads through its connector. */
static uint64_t load_rank(kvr_store_t *st, const uint8_t *ns, bool repl,
                          uint32_t rank, uint64_t max_tokens, sf_side_t *out)
{
    kvr_layout_t l = layout(2, repl);
    unsigned seed = 9 + rank;
    sf_side_init(out, &model, &l, true, 0, model.layers,
                 (NTOK + 2 * BS - 1) / (2 * BS), &seed);
    kvr_store_conn_t *c = conn_of(st, ns, out);
    kvr_store_load_req_t r = {.request_id = "req-c",
                              .request_id_len = 5,
                              .chains = chains,
                              .num_chains = NCH,
                              .dst_blocks = out->blocks,
                              .num_dst_blocks = out->num_blocks,
                              .rank = rank,
                              .max_tokens = max_tokens};
    uint64_t got = 77, bytes = 0;
    kvr_error_t err;
    if (kvr_store_conn_load(c, &r, &got, &bytes, &err) != KVR_OK)
        fail_msg("load rank %u: %s", rank, err.msg);
    assert_true(got == 0 || bytes > 0);
    kvr_store_conn_destroy(c);
    return got;
}

static void flip_byte_of(const kvr_block_hash_t *chain, uint32_t part)
{
    char hex[65], cmd[256];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", chain->bytes[i]);
    snprintf(cmd, sizeof cmd,
             "f=$(ls %s/*-%s-p%u.kvc) && printf '\\377' | dd of=$f bs=1 "
             "seek=7096 conv=notrunc status=none",
             dir, hex, part);
    assert_int_equal(system(cmd), 0);
}

static void test_load_quorum_corrupt_and_namespace(void **state)
{
    (void)state;
    kvr_store_t *st = open_store(false);
    uint8_t ns[KVR_STORE_NS_BYTES];
    namespace_of(model.tb, "mtp:1", ns);
    sf_side_t prod[4], c;
    save_all(st, ns, prod);
    for (uint32_t r = 0; r < 2; r++) { /* replicated and sharded index */
        assert_int_equal(load_rank(st, ns, r == 0, r, NTOK, &c), NCH * CHUNK);
        verify_rank(prod, &c, r, NCH * CHUNK);
        sf_side_free(&c);
    }
    /* at most max_tokens: the prompt less its last token */
    assert_int_equal(load_rank(st, ns, true, 1, 2 * CHUNK, &c), 2 * CHUNK);
    sf_side_free(&c);
    /* a byte flipped in part 2's chunk 1: the hit ends before it, and the
     * bytes that did land are exact */
    kvr_store_close(st);
    flip_byte_of(&chains[1], 2);
    st = open_store(true); /* quick scan: the load itself must catch it */
    assert_int_equal(load_rank(st, ns, true, 0, NTOK, &c), CHUNK);
    verify_rank(prod, &c, 0, CHUNK);
    sf_side_free(&c);
    kvr_store_stats_t s;
    kvr_store_stats(st, &s);
    assert_true(s.corrupt >= 1);
    /* other namespaces: geometry, speculative config */
    uint8_t ns2[KVR_STORE_NS_BYTES], ns3[KVR_STORE_NS_BYTES];
    namespace_of(2 * model.tb, "mtp:1", ns2);
    namespace_of(model.tb, NULL, ns3);
    assert_int_equal(load_rank(st, ns2, true, 0, NTOK, &c), 0);
    sf_side_free(&c);
    assert_int_equal(load_rank(st, ns3, true, 0, NTOK, &c), 0);
    sf_side_free(&c);
    /* a part missing altogether: no hit at all */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm %s/*-p3.kvc", dir);
    kvr_store_close(st);
    assert_int_equal(system(cmd), 0);
    st = open_store(true);
    assert_int_equal(load_rank(st, ns, true, 0, NTOK, &c), 0);
    sf_side_free(&c);
    for (int i = 0; i < 4; i++)
        sf_side_free(&prod[i]);
    kvr_store_close(st);
}

/* A full disk: every part's save fails with ERR_IO naming it, nothing is
 * left on disk, and the send is released all the same. */
static void test_full_disk(void **state)
{
    (void)state;
    kvr_store_t *st = open_store(false);
    assert_int_equal(kvr_failpoint_arm("store-enospc", "", NULL), KVR_OK);
    uint8_t ns[KVR_STORE_NS_BYTES];
    namespace_of(model.tb, NULL, ns);
    sf_side_t p;
    producer(&p, 0, 4);
    kvr_store_conn_t *c = conn_of(st, ns, &p);
    save(c, &p, "req-d", 0);
    send_done(c, "req-d", KVR_OK);
    for (int i = 0; i < 2; i++) {
        kvr_store_event_t ev = next_event(c);
        assert_int_equal(ev.kind, KVR_STORE_PART_SAVED);
        assert_int_equal(ev.status, KVR_ERR_IO);
        assert_non_null(strstr(ev.message, "No space left"));
        assert_int_equal(ev.chunks, 0);
    }
    kvr_store_event_t ev = next_event(c);
    assert_int_equal(ev.kind, KVR_STORE_RELEASE);
    assert_int_equal(ev.status, KVR_OK);
    kvr_store_conn_destroy(c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", dir);
    assert_int_equal(system(cmd), 0);
    sf_side_free(&p);
    kvr_store_close(st);
}

static void save_gen(kvr_store_conn_t *c, const sf_side_t *s, const char *id,
                     int64_t gen, kvr_status_t want, const char *why)
{
    kvr_store_save_req_t r = {.request_id = id,
                              .request_id_len = strlen(id),
                              .generation = gen,
                              .chains = chains,
                              .num_chains = NCH,
                              .src_blocks = s->blocks,
                              .num_src_blocks = s->num_blocks};
    kvr_error_t err = {0};
    assert_int_equal(kvr_store_conn_save(c, &r, &err), want);
    if (why != NULL && strstr(err.msg, why) == NULL)
        fail_msg("save %s gen %lld: '%s' lacks '%s'", id, (long long)gen,
                 err.msg, why);
}

/* A request saved again with a newer generation while the first save is
 * queued behind another request: each generation completes apart (four
 * parts and a SAVED each; the older one CANCELED when it had not started),
 * the send is released once, after both; a repeated or older generation is
 * refused. */
static void test_save_generations(void **state)
{
    (void)state;
    kvr_store_t *st = open_store(false);
    uint8_t ns[KVR_STORE_NS_BYTES];
    namespace_of(model.tb, NULL, ns);
    sf_side_t p;
    producer(&p, 0, 8);
    kvr_store_conn_t *c = conn_of(st, ns, &p);
    save(c, &p, "busy", 0); /* the worker saves this one meanwhile */
    save(c, &p, "req-g", 0);
    save(c, &p, "req-g", 1);
    save_gen(c, &p, "req-g", 1, KVR_ERR_EXISTS, "already declared");
    save_gen(c, &p, "req-g", 0, KVR_ERR_CANCELED, "superseded by generation 1");
    send_done(c, "req-g", KVR_OK);
    send_done(c, "busy", KVR_OK);
    int parts[2] = {0, 0}, saved[2] = {0, 0}, released = 0;
    kvr_status_t old = KVR_OK;
    for (int n = 0; n < 6 + 11; n++) { /* busy's six, req-g's eleven */
        kvr_store_event_t ev = next_event(c);
        bool g = ev.request_len == 5 && memcmp(ev.request, "req-g", 5) == 0;
        if (!g)
            continue;
        assert_true(ev.generation == 0 || ev.generation == 1 ||
                    ev.kind == KVR_STORE_RELEASE);
        int gen = (int)ev.generation;
        if (ev.kind == KVR_STORE_PART_SAVED) {
            parts[gen]++;
            if (gen == 1)
                assert_int_equal(ev.status, KVR_OK);
            else if (ev.status != KVR_OK) /* queued when gen 1 came */
                assert_non_null(
                    strstr(ev.message, "superseded by generation 1"));
            old = gen == 0 ? ev.status : old;
        } else if (ev.kind == KVR_STORE_SAVED) {
            assert_int_equal(parts[gen], 4); /* its own four parts */
            assert_int_equal(ev.status, gen == 1 ? KVR_OK : old);
            saved[gen]++;
        } else {
            assert_int_equal(saved[0] + saved[1], 2); /* after both saves */
            released++;
        }
    }
    assert_int_equal(saved[0], 1);
    assert_int_equal(saved[1], 1);
    assert_int_equal(released, 1);
    print_message("generation 0 ended %s\n", kvr_status_name(old));
    /* released: the request is done here; a later save is refused */
    save_gen(c, &p, "req-g", 2, KVR_ERR_EXISTS, NULL);
    kvr_store_conn_destroy(c);
    sf_side_free(&p);
    kvr_store_close(st);
}

static kvr_status_t load_gen(kvr_store_conn_t *c, const sf_side_t *s,
                             int64_t gen, uint64_t *got, kvr_error_t *err)
{
    kvr_store_load_req_t r = {.request_id = "req-c",
                              .request_id_len = 5,
                              .generation = gen,
                              .chains = chains,
                              .num_chains = NCH,
                              .dst_blocks = s->blocks,
                              .num_dst_blocks = s->num_blocks,
                              .rank = 0,
                              .max_tokens = NTOK};
    uint64_t bytes = 0;
    return kvr_store_conn_load(c, &r, got, &bytes, err);
}

/* A load of an older generation than the request's latest lands nothing;
 * forget lets the id start over. */
static void test_load_generations(void **state)
{
    (void)state;
    kvr_store_t *st = open_store(false);
    uint8_t ns[KVR_STORE_NS_BYTES];
    namespace_of(model.tb, NULL, ns);
    sf_side_t prod[4], cons;
    save_all(st, ns, prod);
    kvr_layout_t l = layout(2, true);
    unsigned seed = 9;
    sf_side_init(&cons, &model, &l, true, 0, model.layers,
                 (NTOK + 2 * BS - 1) / (2 * BS), &seed);
    kvr_store_conn_t *c = conn_of(st, ns, &cons);
    uint64_t got = 0;
    kvr_error_t err;
    assert_int_equal(load_gen(c, &cons, 1, &got, &err), KVR_OK);
    assert_int_equal(got, NCH * CHUNK);
    kvr_store_stats_t before, after;
    kvr_store_stats(st, &before);
    got = 77;
    assert_int_equal(load_gen(c, &cons, 0, &got, &err), KVR_ERR_CANCELED);
    assert_non_null(strstr(err.msg, "superseded by generation 1"));
    kvr_store_stats(st, &after);
    assert_int_equal(got, 77);
    assert_int_equal(after.loaded_bytes, before.loaded_bytes);
    assert_int_equal(after.host_hits + after.disk_hits,
                     before.host_hits + before.disk_hits);
    assert_int_equal(load_gen(c, &cons, 1, &got, &err), KVR_OK); /* again */
    assert_int_equal(load_gen(c, &cons, 2, &got, &err), KVR_OK);
    assert_int_equal(load_gen(c, &cons, 1, &got, &err), KVR_ERR_CANCELED);
    assert_int_equal(kvr_store_conn_forget(c, "req-c", 5, &err), KVR_OK);
    assert_int_equal(load_gen(c, &cons, 0, &got, &err), KVR_OK);
    verify_rank(prod, &cons, 0, NCH * CHUNK);
    kvr_store_conn_destroy(c);
    sf_side_free(&cons);
    for (int i = 0; i < 4; i++)
        sf_side_free(&prod[i]);
    kvr_store_close(st);
}

static int count_records(void)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while (d != NULL && (de = readdir(d)) != NULL)
        n += strstr(de->d_name, ".kvp") != NULL;
    if (d != NULL)
        closedir(d);
    return n;
}

/* Four stages, each its own store on one directory (as four processes):
 * the head's SAVED is the quorum of its own part and the records of the
 * other three (which it removes); a failed part's record carries its
 * failure; a stage that never saves fails the quorum at the deadline. */
static void test_quorum_through_records(void **state)
{
    (void)state;
    uint8_t ns[KVR_STORE_NS_BYTES];
    namespace_of(model.tb, NULL, ns);
    kvr_store_t *st[4];
    sf_side_t p[4];
    kvr_store_conn_t *c[4];
    for (uint32_t s = 0; s < 4; s++) {
        st[s] = open_store(true);
        producer(&p[s], 2 * s, 2 * s + 2);
        c[s] = conn_wait(st[s], ns, &p[s], s == 3 ? 60000 : 400);
    }
    /* every stage saves; part 2 fails first, with a full disk */
    assert_int_equal(kvr_failpoint_arm("store-enospc", "", NULL), KVR_OK);
    save(c[2], &p[2], "req-q", 5);
    kvr_store_event_t ev = next_event(c[2]);
    assert_int_equal(ev.status, KVR_ERR_IO);
    kvr_failpoint_disarm_all();
    for (uint32_t s = 4; s-- > 0;)
        if (s != 2)
            save(c[s], &p[s], "req-q", 5);
    ev = next_event(c[0]);
    assert_int_equal(ev.kind, KVR_STORE_PART_SAVED);
    assert_int_equal(ev.status, KVR_OK);
    ev = next_event(c[0]);
    assert_int_equal(ev.kind, KVR_STORE_SAVED);
    assert_int_equal(ev.generation, 5);
    assert_int_equal(ev.status, KVR_ERR_IO);
    assert_non_null(strstr(ev.message, "No space left"));
    for (uint32_t s = 1; s < 4; s++) {
        if (s != 2) {
            ev = next_event(c[s]);
            assert_int_equal(ev.kind, KVR_STORE_PART_SAVED);
        }
        no_event(c[s]); /* only the head counts the quorum */
    }
    assert_int_equal(count_records(), 0); /* the head took them all */
    /* all saved: OK; then stage 3 silent: the head fails it at 400 ms */
    for (int round = 0; round < 2; round++) {
        const char *id = round == 0 ? "req-ok" : "req-mute";
        for (uint32_t s = round == 0 ? 4 : 3; s-- > 0;)
            save(c[s], &p[s], id, 0);
        ev = next_event(c[0]);
        assert_int_equal(ev.kind, KVR_STORE_PART_SAVED);
        ev = next_event(c[0]);
        assert_int_equal(ev.kind, KVR_STORE_SAVED);
        assert_memory_equal(ev.request, id, strlen(id));
        assert_int_equal(ev.status, round == 0 ? KVR_OK : KVR_ERR_TIMEOUT);
        if (round == 1)
            assert_non_null(strstr(ev.message, "part 3 recorded no save"));
    }
    for (uint32_t s = 0; s < 4; s++) {
        kvr_store_conn_destroy(c[s]);
        sf_side_free(&p[s]);
        kvr_store_close(st[s]);
    }
    assert_int_equal(count_records(), 0);
}

static void test_bad_params(void **state)
{
    (void)state;
    kvr_store_opts_t o = {.host_bytes = 1 << 20};
    kvr_store_t *st;
    assert_int_equal(kvr_store_open(&o, &st, NULL), KVR_OK);
    uint8_t ns[KVR_STORE_NS_BYTES] = {0};
    uint32_t bad_ends[2] = {4, 4};
    kvr_store_conn_params_t p = {.store = st,
                                 .ns = ns,
                                 .block_size = BS,
                                 .chunk = CHUNK,
                                 .lay = layout(1, false),
                                 .parts = 2,
                                 .part_ends = bad_ends};
    kvr_store_conn_t *c = NULL;
    kvr_error_t err;
    assert_int_equal(kvr_store_conn_create(&p, &c, &err), KVR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "part_ends[1] = 4"));
    bad_ends[1] = 8;
    p.chunk = 24;
    assert_int_equal(kvr_store_conn_create(&p, &c, &err), KVR_ERR_CHUNK_SIZE);
    assert_non_null(strstr(err.msg, "24"));
    p.chunk = CHUNK;
    p.parts = 0;
    assert_int_equal(kvr_store_conn_create(&p, &c, &err), KVR_ERR_INVALID);
    p.parts = 2;
    assert_int_equal(kvr_store_conn_create(&p, &c, &err), KVR_OK);
    kvr_store_save_req_t r = {.request_id = "x", .request_id_len = 1};
    /* no regions here: nothing to save */
    assert_int_equal(kvr_store_conn_save(c, &r, &err), KVR_ERR_INVALID);
    r.request_id_len = 0;
    assert_int_equal(kvr_store_conn_save(c, &r, &err), KVR_ERR_INVALID);
    kvr_store_conn_destroy(c);
    kvr_store_conn_destroy(NULL);
    kvr_store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_send_first_pp_quorum, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_save_first_remote_parts, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_load_quorum_corrupt_and_namespace,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_generations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_generations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quorum_through_records, setup,
                                        teardown),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
