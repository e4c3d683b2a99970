/* The store connector (docs/store.md "The store connector"): saves on a
 * worker thread beside the agent's transfer, send/save pairing, the PP
 * quorum of saves (parts of other processes forwarded, or read from their
 * records in the store's directory), generations, and the quorum over
 * parts of a load. The books (kvr_pairing, kvr_quorum, the generations)
 * are not thread-safe: `mx` guards them, the queues and the waits;
 * `store_mx` serialises the store, which is one-thread. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "store_internal.h"

#define MAX_PARTS 64u
#define MAX_REQUESTS 16384u /* requests whose generations are held */
#define POLL_MS 5u          /* how often awaited records are looked for */

typedef struct job {
    struct job *next;
    uint8_t id[KVR_REQ_ID_MAX];
    size_t id_len;
    int64_t gen;
    kvr_block_hash_t *chains;
    size_t num_chains;
    uint32_t *blocks;
    size_t num_blocks;
} job_t;

typedef struct ev_node {
    struct ev_node *next;
    kvr_store_event_t ev;
} ev_node_t;

/* A save whose parts held by other processes are awaited as records. */
typedef struct wait {
    struct wait *next;
    uint8_t id[KVR_REQ_ID_MAX];
    size_t id_len;
    int64_t gen;
    uint64_t missing; /* bit per part not heard yet */
    uint64_t deadline_ns;
} wait_t;

/* The regions of one part, as a slice of the sorted copy. */
typedef struct part {
    size_t first, count;
} part_t;

struct kvr_store_conn {
    kvr_store_conn_params_t prm;
    uint8_t ns[KVR_STORE_NS_BYTES];
    kvr_store_region_t *regions; /* grouped by part */
    part_t part[MAX_PARTS];
    uint32_t part_ends[MAX_PARTS];
    uint32_t local_parts;
    pthread_mutex_t mx, store_mx;
    pthread_cond_t cv;
    pthread_t worker;
    bool stop;
    job_t *jobs, **jobs_tail;
    kvr_pairing_t *pairing;
    kvr_quorum_t *saves, *loads;
    ev_node_t *evs, **evs_tail;
    int event_fd;
    kvr__gens_t save_gens, load_gens;
    wait_t *waits;
    struct note *notes;
    uint64_t record_seq;
};

const char *kvr_store_event_name(kvr_store_event_kind_t kind)
{
    switch (kind) {
    case KVR_STORE_PART_SAVED:
        return "PART_SAVED";
    case KVR_STORE_SAVED:
        return "SAVED";
    case KVR_STORE_RELEASE:
        return "RELEASE";
    }
    return "UNKNOWN";
}

/* The part holding layer, or parts when none (a consumer-only layer). */
static uint32_t part_of(const kvr_store_conn_params_t *p, uint32_t layer)
{
    for (uint32_t i = 0; i < p->parts; i++)
        if (layer < p->part_ends[i])
            return i;
    return p->parts;
}

static kvr_status_t check_params(const kvr_store_conn_params_t *p,
                                 kvr_error_t *err)
{
    if (p == NULL || p->store == NULL || p->ns == NULL ||
        p->part_ends == NULL || (p->num_regions && p->regions == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store conn: NULL parameter");
    if (p->parts == 0 || p->parts > MAX_PARTS)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store conn: parts %u "
                             "not in [1, %u]",
                             p->parts, MAX_PARTS);
    for (uint32_t i = 0; i < p->parts; i++)
        if (p->part_ends[i] == 0 ||
            (i > 0 && p->part_ends[i] <= p->part_ends[i - 1]))
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "store conn: part_ends[%u] = %u does not "
                                 "increase",
                                 i, p->part_ends[i]);
    uint64_t v = (uint64_t)p->block_size * p->lay.dcp_size;
    if (p->block_size == 0 || p->chunk == 0 || p->chunk % v != 0)
        return kvr_error_set(err, KVR_ERR_CHUNK_SIZE,
                             "store conn: chunk "
                             "%llu is not a positive multiple of bs * W = %u "
                             "* %u",
                             (unsigned long long)p->chunk, p->block_size,
                             p->lay.dcp_size);
    return kvr_layout_check(&p->lay, err);
}

/* Copies the regions grouped by part; counts the parts held here. */
static kvr_status_t group_regions(kvr_store_conn_t *c, kvr_error_t *err)
{
    const kvr_store_conn_params_t *p = &c->prm;
    c->regions = calloc(p->num_regions + 1, sizeof *c->regions);
    if (c->regions == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store conn");
    size_t n = 0;
    for (uint32_t k = 0; k < p->parts; k++) {
        c->part[k].first = n;
        for (size_t i = 0; i < p->num_regions; i++)
            if (part_of(p, p->regions[i].desc.layer) == k)
                c->regions[n++] = p->regions[i];
        c->part[k].count = n - c->part[k].first;
        c->local_parts += c->part[k].count > 0;
    }
    c->prm.regions = c->regions;
    c->prm.num_regions = n;
    return KVR_OK;
}

/* ---- events -------------------------------------------------------------- */

/* Under mx. The books are updated before the event is queued; an event
 * that cannot be allocated (a process out of memory) is dropped. */
static void push_event(kvr_store_conn_t *c, const kvr_store_event_t *ev)
{
    ev_node_t *n = malloc(sizeof *n);
    if (n == NULL)
        return;
    n->next = NULL;
    n->ev = *ev;
    bool was_empty = c->evs == NULL;
    *c->evs_tail = n;
    c->evs_tail = &n->next;
    if (was_empty) {
        uint64_t one = 1;
        (void)!write(c->event_fd, &one, sizeof one);
    }
}

static kvr_store_event_t event_of(kvr_store_event_kind_t kind, const void *id,
                                  size_t len, int64_t gen, kvr_status_t status,
                                  const char *msg)
{
    kvr_store_event_t ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = kind;
    memcpy(ev.request, id, len);
    ev.request_len = len;
    ev.generation = gen;
    ev.status = status;
    snprintf(ev.message, sizeof ev.message, "%s", msg ? msg : "");
    return ev;
}

bool kvr_store_conn_poll(kvr_store_conn_t *c, kvr_store_event_t *out)
{
    if (c == NULL || out == NULL)
        return false;
    pthread_mutex_lock(&c->mx);
    ev_node_t *n = c->evs;
    if (n != NULL) {
        c->evs = n->next;
        if (c->evs == NULL) {
            c->evs_tail = &c->evs;
            uint64_t v;
            (void)!read(c->event_fd, &v, sizeof v);
        }
        *out = n->ev;
    }
    pthread_mutex_unlock(&c->mx);
    free(n);
    return n != NULL;
}

int kvr_store_conn_event_fd(const kvr_store_conn_t *c)
{
    return c ? c->event_fd : -1;
}

/* Under mx: the pairing's releases of a send become RELEASE events. */
static void drain_pairing(kvr_store_conn_t *c)
{
    kvr_release_t r[4];
    size_t n = 0;
    do {
        if (kvr_pairing_poll(c->pairing, r, 4, &n, NULL) != KVR_OK)
            return;
        for (size_t i = 0; i < n; i++) {
            if (r[i].kind != KVR_RELEASE_SEND)
                continue;
            kvr_store_event_t ev = event_of(KVR_STORE_RELEASE, r[i].req_id,
                                            r[i].req_id_len, 0, r[i].status,
                                            NULL);
            push_event(c, &ev);
            kvr__gens_drop(&c->save_gens, r[i].req_id, r[i].req_id_len);
        }
    } while (n == 4);
}

/* The first failure of a save whose quorum is still open: SAVED names it
 * even when a later report completes the quorum. */
typedef struct note {
    struct note *next;
    uint8_t id[KVR_REQ_ID_MAX];
    size_t id_len;
    int64_t gen;
    char msg[KVR_ERROR_MSG_MAX];
} note_t;

static note_t **note_find(kvr_store_conn_t *c, const kvr_completion_id_t *op)
{
    note_t **pn = &c->notes;
    while (*pn != NULL &&
           ((*pn)->gen != op->generation || (*pn)->id_len != op->req_id_len ||
            memcmp((*pn)->id, op->req_id, op->req_id_len) != 0))
        pn = &(*pn)->next;
    return pn;
}

/* Under mx: one part's outcome counts toward the PP quorum. */
static void report_part(kvr_store_conn_t *c, const kvr_completion_id_t *op,
                        uint32_t part, kvr_status_t status, const char *msg)
{
    kvr_quorum_result_t res;
    if (kvr_quorum_report(c->saves, op, part, status, &res, NULL) != KVR_OK ||
        res.outcome == KVR_QUORUM_IGNORED)
        return;
    note_t **pn = note_find(c, op), *n = *pn;
    if (res.outcome == KVR_QUORUM_PENDING) {
        if (status != KVR_OK && n == NULL && (n = calloc(1, sizeof *n))) {
            memcpy(n->id, op->req_id, op->req_id_len);
            n->id_len = op->req_id_len;
            n->gen = op->generation;
            snprintf(n->msg, sizeof n->msg, "%s", msg);
            *pn = n;
        }
        return;
    }
    kvr_store_event_t ev = event_of(KVR_STORE_SAVED, op->req_id, op->req_id_len,
                                    op->generation, res.status,
                                    res.status == KVR_OK ? NULL
                                    : n != NULL          ? n->msg
                                                         : msg);
    push_event(c, &ev);
    if (n != NULL) {
        *pn = n->next;
        free(n);
    }
}

/* ---- records of parts saved (remote_wait_ms) ------------------------------ */

/* "<ns>-r<BLAKE2b-128 of the request id>-g<generation>-p<part>.kvp". */
static void record_name(const kvr_store_conn_t *c, const uint8_t *id,
                        size_t len, int64_t gen, uint32_t part, char *out,
                        size_t cap)
{
    uint8_t h[16];
    char ns[2 * KVR_STORE_NS_BYTES + 1], rh[2 * sizeof h + 1];
    crypto_generichash(h, sizeof h, id, len, NULL, 0);
    sodium_bin2hex(ns, sizeof ns, c->ns, KVR_STORE_NS_BYTES);
    sodium_bin2hex(rh, sizeof rh, h, sizeof h);
    snprintf(out, cap, "%s-r%s-g%" PRId64 "-p%u.kvp", ns, rh, gen, part);
}

/* With remote_wait_ms, the connector holding part 0 (the PP head, where
 * the seed keeps the PP quorum) reads the records of the parts it does not
 * hold; a connector without part 0 writes one for each part it saves. */
static bool records_on(const kvr_store_conn_t *c)
{
    return c->prm.remote_wait_ms > 0 && c->prm.store->dir != NULL &&
           c->local_parts < c->prm.parts;
}

static bool is_head(const kvr_store_conn_t *c)
{
    return c->part[0].count > 0;
}

/* Under mx: a part saved here, recorded for the process that counts the
 * request's quorum (temp name, then rename: a record is whole or absent).
 * Best effort: a record that cannot be written fails that part there at
 * its deadline. */
static void record_write(kvr_store_conn_t *c, const kvr_store_event_t *ev)
{
    if (!records_on(c) || is_head(c))
        return;
    char name[160], tmp[200], text[KVR_ERROR_MSG_MAX + 64];
    record_name(c, ev->request, ev->request_len, ev->generation, ev->part, name,
                sizeof name);
    snprintf(tmp, sizeof tmp, ".tmp-%ld-r%" PRIu64 "-%s", (long)getpid(),
             c->record_seq++, name);
    int n = snprintf(text, sizeof text, "%d %" PRIu64 " %" PRIu64 "\n%s",
                     (int)ev->status, ev->bytes, ev->chunks, ev->message);
    int dfd = c->prm.store->dir_fd;
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    bool ok = write(fd, text, (size_t)n) == n;
    close(fd);
    if (!ok || renameat(dfd, tmp, dfd, name) != 0)
        unlinkat(dfd, tmp, 0);
}

/* Reads and removes the record of part p of w, if it is there yet. */
static bool record_take(kvr_store_conn_t *c, const wait_t *w, uint32_t p,
                        kvr_status_t *status, char *msg, size_t cap)
{
    char name[160], text[KVR_ERROR_MSG_MAX + 64];
    record_name(c, w->id, w->id_len, w->gen, p, name, sizeof name);
    int dfd = c->prm.store->dir_fd;
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    int code = (int)KVR_ERR_IO, used = 0;
    text[n > 0 ? n : 0] = '\0';
    if (sscanf(text, "%d %*u %*u\n%n", &code, &used) < 1)
        snprintf(msg, cap, "part %u's record %s is unreadable", p, name);
    else
        snprintf(msg, cap, "%s", text + used);
    *status = (kvr_status_t)code;
    unlinkat(dfd, name, 0);
    return true;
}

/* Under mx: every awaited part that recorded its save, or whose time is
 * up, reports to the quorum; finished waits go. */
static void poll_waits(kvr_store_conn_t *c)
{
    uint64_t now = kvr_now_ns();
    for (wait_t **pw = &c->waits; *pw != NULL;) {
        wait_t *w = *pw;
        kvr_completion_id_t op = kvr_completion_op(w->id, w->id_len, w->gen);
        for (uint32_t p = 0; p < c->prm.parts; p++) {
            char msg[KVR_ERROR_MSG_MAX];
            kvr_status_t st;
            if (!(w->missing >> p & 1u))
                continue;
            if (!record_take(c, w, p, &st, msg, sizeof msg)) {
                if (now < w->deadline_ns)
                    continue;
                st = KVR_ERR_TIMEOUT;
                snprintf(msg, sizeof msg,
                         "part %u recorded no save within "
                         "%u ms",
                         p, c->prm.remote_wait_ms);
            }
            w->missing &= ~(1ull << p);
            report_part(c, &op, p, st, msg);
        }
        if (w->missing == 0) {
            *pw = w->next;
            free(w);
        } else {
            pw = &w->next;
        }
    }
}

/* Under mx: the parts of (request, generation) held elsewhere are awaited
 * from their records. */
static kvr_status_t add_wait(kvr_store_conn_t *c, const kvr_completion_id_t *op,
                             kvr_error_t *err)
{
    if (!records_on(c) || !is_head(c))
        return KVR_OK;
    wait_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store save: wait");
    memcpy(w->id, op->req_id, op->req_id_len);
    w->id_len = op->req_id_len;
    w->gen = op->generation;
    for (uint32_t p = 0; p < c->prm.parts; p++)
        if (c->part[p].count == 0)
            w->missing |= 1ull << p;
    w->deadline_ns = kvr_now_ns() + (uint64_t)c->prm.remote_wait_ms * 1000000u;
    w->next = c->waits;
    c->waits = w;
    return KVR_OK;
}

/* ---- the worker ------------------------------------------------------------ */

static kvr_store_io_t io_of(const kvr_store_conn_t *c, const job_t *j,
                            uint32_t part)
{
    kvr_store_io_t io = {.ns = c->ns,
                         .part = part,
                         .block_size = c->prm.block_size,
                         .chunk = c->prm.chunk,
                         .chains = j->chains,
                         .num_chains = j->num_chains,
                         .lay = &c->prm.lay,
                         .regions = c->regions + c->part[part].first,
                         .num_regions = c->part[part].count,
                         .blocks = j->blocks,
                         .num_blocks = j->num_blocks};
    return io;
}

/* Saves one part of a job (store_mx held only around the store). */
static kvr_store_event_t save_part(kvr_store_conn_t *c, const job_t *j,
                                   uint32_t part)
{
    kvr_store_io_t io = io_of(c, j, part);
    kvr_error_t err = {0};
    size_t saved = 0;
    kvr_store_stats_t before, after;
    pthread_mutex_lock(&c->store_mx);
    kvr_store_stats(c->prm.store, &before);
    kvr_status_t s = kvr_store_save(c->prm.store, &io, &saved, &err);
    kvr_store_stats(c->prm.store, &after);
    pthread_mutex_unlock(&c->store_mx);
    kvr_store_event_t ev = event_of(KVR_STORE_PART_SAVED, j->id, j->id_len,
                                    j->gen, s, s == KVR_OK ? NULL : err.msg);
    ev.part = part;
    ev.chunks = saved;
    ev.bytes = after.saved_bytes - before.saved_bytes;
    return ev;
}

static void run_job(kvr_store_conn_t *c, const job_t *j)
{
    kvr_completion_id_t op = kvr_completion_op(j->id, j->id_len, j->gen);
    kvr_status_t first = KVR_OK;
    for (uint32_t p = 0; p < c->prm.parts; p++) {
        if (c->part[p].count == 0)
            continue;
        kvr_store_event_t ev = save_part(c, j, p);
        pthread_mutex_lock(&c->mx);
        push_event(c, &ev);
        record_write(c, &ev);
        report_part(c, &op, p, ev.status, ev.message);
        pthread_mutex_unlock(&c->mx);
        if (first == KVR_OK)
            first = ev.status;
    }
    pthread_mutex_lock(&c->mx);
    kvr_pair_outcome_t out;
    kvr_pairing_save_done(c->pairing, &op, first, &out, NULL);
    drain_pairing(c);
    pthread_mutex_unlock(&c->mx);
}

static void free_job(job_t *j)
{
    if (j == NULL)
        return;
    free(j->chains);
    free(j->blocks);
    free(j);
}

/* Under mx: sleeps until a job or stop comes, looking for awaited records
 * every POLL_MS meanwhile. */
static void idle(kvr_store_conn_t *c)
{
    while (!c->stop && c->jobs == NULL) {
        if (c->waits == NULL) {
            pthread_cond_wait(&c->cv, &c->mx);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += POLL_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&c->cv, &c->mx, &ts);
        poll_waits(c);
    }
}

static void *worker_main(void *arg)
{
    kvr_store_conn_t *c = arg;
    pthread_mutex_lock(&c->mx);
    for (;;) {
        poll_waits(c);
        idle(c);
        if (c->stop)
            break;
        job_t *j = c->jobs;
        c->jobs = j->next;
        if (c->jobs == NULL)
            c->jobs_tail = &c->jobs;
        pthread_mutex_unlock(&c->mx);
        run_job(c, j);
        free_job(j);
        pthread_mutex_lock(&c->mx);
    }
    pthread_mutex_unlock(&c->mx);
    return NULL;
}

/* ---- create, destroy ------------------------------------------------------ */

static kvr_status_t create_books(kvr_store_conn_t *c, kvr_error_t *err)
{
    kvr_quorum_params_t q = KVR_QUORUM_PARAMS_INIT;
    q.members = c->prm.parts;
    kvr_pairing_params_t pp = KVR_PAIRING_PARAMS_INIT;
    kvr_status_t s = kvr_quorum_create(&q, &c->saves, err);
    if (s == KVR_OK)
        s = kvr_quorum_create(&q, &c->loads, err);
    if (s == KVR_OK)
        s = kvr_pairing_create(&pp, &c->pairing, err);
    if (s == KVR_OK)
        s = kvr__gens_init(&c->save_gens, MAX_REQUESTS, err);
    if (s == KVR_OK)
        s = kvr__gens_init(&c->load_gens, MAX_REQUESTS, err);
    return s;
}

static kvr_status_t start(kvr_store_conn_t *c, kvr_error_t *err)
{
    c->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->event_fd < 0)
        return kvr_error_set(err, KVR_ERR_IO, "eventfd: %s", strerror(errno));
    pthread_mutex_init(&c->mx, NULL);
    pthread_mutex_init(&c->store_mx, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&c->worker, NULL, worker_main, c);
    if (rc != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->store_mx);
        pthread_mutex_destroy(&c->mx);
        return kvr_error_set(err, KVR_ERR_IO, "store conn worker: %s",
                             strerror(rc));
    }
    return KVR_OK;
}

static void free_conn(kvr_store_conn_t *c)
{
    if (c->event_fd >= 0)
        close(c->event_fd);
    kvr_pairing_destroy(c->pairing);
    kvr_quorum_destroy(c->saves);
    kvr_quorum_destroy(c->loads);
    kvr__gens_fini(&c->save_gens);
    kvr__gens_fini(&c->load_gens);
    while (c->waits != NULL) {
        wait_t *w = c->waits;
        c->waits = w->next;
        free(w);
    }
    while (c->notes != NULL) {
        struct note *n = c->notes;
        c->notes = n->next;
        free(n);
    }
    free(c->regions);
    free(c);
}

kvr_status_t kvr_store_conn_create(const kvr_store_conn_params_t *params,
                                   kvr_store_conn_t **out, kvr_error_t *err)
{
    kvr_status_t s = check_params(params, err);
    if (s != KVR_OK)
        return s;
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "store conn: out is NULL");
    kvr_store_conn_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store conn");
    c->prm = *params;
    c->event_fd = -1;
    memcpy(c->ns, params->ns, KVR_STORE_NS_BYTES);
    c->prm.ns = c->ns;
    memcpy(c->part_ends, params->part_ends,
           params->parts * sizeof *c->part_ends);
    c->prm.part_ends = c->part_ends;
    c->jobs_tail = &c->jobs;
    c->evs_tail = &c->evs;
    s = group_regions(c, err);
    if (s == KVR_OK)
        s = create_books(c, err);
    if (s == KVR_OK)
        s = start(c, err);
    if (s != KVR_OK) {
        free_conn(c);
        return s;
    }
    *out = c;
    return KVR_OK;
}

void kvr_store_conn_destroy(kvr_store_conn_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mx);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mx);
    pthread_join(c->worker, NULL);
    while (c->jobs != NULL) {
        job_t *j = c->jobs;
        c->jobs = j->next;
        free_job(j);
    }
    while (c->evs != NULL) {
        ev_node_t *n = c->evs;
        c->evs = n->next;
        free(n);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->store_mx);
    pthread_mutex_destroy(&c->mx);
    free_conn(c);
}

/* ---- producer calls --------------------------------------------------------- */

/* What an operation whose generation is not above its request's latest
 * gets: KVR_ERR_EXISTS for the same one, KVR_ERR_CANCELED for an older. */
static kvr_status_t stale(const kvr__gens_t *g, kvr_error_t *err,
                          const char *what, const kvr_completion_id_t *op,
                          int64_t latest)
{
    kvr__view_t v;
    char repr[KVR__REPR_MAX] = "?";
    if (kvr__view_of(op, g->hkey, &v, NULL) == KVR_OK)
        kvr__view_repr(&v, repr);
    if (latest == op->generation)
        return kvr_error_set(err, KVR_ERR_EXISTS, "%s %s: already declared",
                             what, repr);
    return kvr_error_set(err, KVR_ERR_CANCELED,
                         "%s %s: superseded by generation %" PRId64, what, repr,
                         latest);
}

/* Under mx: the generation becomes the request's latest, the save is
 * declared to the pairing and, with remote_wait_ms, awaited from the
 * other parts' records; nothing changes on failure. */
static kvr_status_t admit_save(kvr_store_conn_t *c,
                               const kvr_completion_id_t *op, kvr_error_t *err)
{
    int64_t latest = kvr__gens_latest(&c->save_gens, op->req_id,
                                      op->req_id_len);
    if (latest >= op->generation)
        return stale(&c->save_gens, err, "save", op, latest);
    kvr_status_t s = kvr__gens_set(&c->save_gens, op->req_id, op->req_id_len,
                                   op->generation, err);
    if (s == KVR_OK)
        s = kvr_pairing_expect_save(c->pairing, op, err);
    if (s == KVR_OK)
        s = add_wait(c, op, err);
    if (s == KVR_OK)
        return KVR_OK;
    if (latest >= 0) /* its slot is there: setting it cannot fail */
        (void)kvr__gens_set(&c->save_gens, op->req_id, op->req_id_len, latest,
                            NULL);
    else
        kvr__gens_drop(&c->save_gens, op->req_id, op->req_id_len);
    return s;
}

/* Under mx: a queued save of an older generation of op's request ends
 * without running: each part held here CANCELED, its pairing released. */
static void cancel_job(kvr_store_conn_t *c, const job_t *j, int64_t by)
{
    kvr_completion_id_t old = kvr_completion_op(j->id, j->id_len, j->gen);
    char msg[96];
    snprintf(msg, sizeof msg, "superseded by generation %" PRId64, by);
    for (uint32_t p = 0; p < c->prm.parts; p++) {
        if (c->part[p].count == 0)
            continue;
        kvr_store_event_t ev = event_of(KVR_STORE_PART_SAVED, j->id, j->id_len,
                                        j->gen, KVR_ERR_CANCELED, msg);
        ev.part = p;
        push_event(c, &ev);
        record_write(c, &ev);
        report_part(c, &old, p, KVR_ERR_CANCELED, msg);
    }
    kvr_pair_outcome_t out;
    kvr_pairing_save_done(c->pairing, &old, KVR_ERR_CANCELED, &out, NULL);
    drain_pairing(c);
}

static void supersede(kvr_store_conn_t *c, const kvr_completion_id_t *op)
{
    job_t **pj = &c->jobs, *last = NULL;
    while (*pj != NULL) {
        job_t *j = *pj;
        if (j->id_len == op->req_id_len && j->gen < op->generation &&
            memcmp(j->id, op->req_id, j->id_len) == 0) {
            *pj = j->next;
            cancel_job(c, j, op->generation);
            free_job(j);
            continue;
        }
        last = j;
        pj = &j->next;
    }
    c->jobs_tail = last != NULL ? &last->next : &c->jobs;
}

static job_t *job_of(const kvr_store_save_req_t *r)
{
    job_t *j = calloc(1, sizeof *j);
    if (j == NULL)
        return NULL;
    memcpy(j->id, r->request_id, r->request_id_len);
    j->id_len = r->request_id_len;
    j->gen = r->generation;
    j->num_chains = r->num_chains;
    j->num_blocks = r->num_src_blocks;
    j->chains = malloc((r->num_chains + 1) * sizeof *j->chains);
    j->blocks = malloc((r->num_src_blocks + 1) * sizeof *j->blocks);
    if (j->chains == NULL || j->blocks == NULL) {
        free_job(j);
        return NULL;
    }
    if (r->num_chains)
        memcpy(j->chains, r->chains, r->num_chains * sizeof *j->chains);
    if (r->num_src_blocks)
        memcpy(j->blocks, r->src_blocks, r->num_src_blocks * sizeof *j->blocks);
    return j;
}

kvr_status_t kvr_store_conn_save(kvr_store_conn_t *c,
                                 const kvr_store_save_req_t *req,
                                 kvr_error_t *err)
{
    if (c == NULL || req == NULL || (req->num_chains && req->chains == NULL) ||
        (req->num_src_blocks && req->src_blocks == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "store save: NULL argument");
    kvr_completion_id_t op = kvr_completion_op(
        req->request_id, req->request_id_len, req->generation);
    kvr_status_t s = kvr_completion_id_check(&op, err);
    if (s != KVR_OK)
        return s;
    if (c->local_parts == 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store save: this "
                             "connector holds no region of any part");
    job_t *j = job_of(req);
    if (j == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "store save");
    pthread_mutex_lock(&c->mx);
    s = admit_save(c, &op, err);
    if (s == KVR_OK) {
        supersede(c, &op);
        *c->jobs_tail = j;
        c->jobs_tail = &j->next;
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mx);
    if (s != KVR_OK)
        free_job(j);
    return s;
}

kvr_status_t kvr_store_conn_part_saved(kvr_store_conn_t *c,
                                       const void *request_id, size_t len,
                                       int64_t generation, uint32_t part,
                                       kvr_status_t status, kvr_error_t *err)
{
    if (c == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "store conn is NULL");
    kvr_completion_id_t op = kvr_completion_op(request_id, len, generation);
    kvr_status_t s = kvr_completion_id_check(&op, err);
    if (s != KVR_OK)
        return s;
    if (part >= c->prm.parts || c->part[part].count > 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store conn: part %u "
                             "is %s",
                             part,
                             part >= c->prm.parts ? "out of range"
                                                  : "held here (its worker "
                                                    "reports it)");
    pthread_mutex_lock(&c->mx);
    report_part(c, &op, part, status, "a remote part failed its save");
    pthread_mutex_unlock(&c->mx);
    return KVR_OK;
}

/* The calls about a whole request (not one save or load): the connector
 * and the request id checked, the id as the books key it. */
static kvr_status_t request_of(const kvr_store_conn_t *c,
                               const void *request_id, size_t len,
                               kvr_completion_id_t *id, kvr_error_t *err)
{
    if (c == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "store conn is NULL");
    *id = kvr_completion_req(request_id, len);
    return kvr_completion_id_check(id, err);
}

kvr_status_t kvr_store_conn_send_done(kvr_store_conn_t *c,
                                      const void *request_id, size_t len,
                                      kvr_status_t status, kvr_error_t *err)
{
    kvr_completion_id_t id;
    kvr_status_t s = request_of(c, request_id, len, &id, err);
    if (s != KVR_OK)
        return s;
    pthread_mutex_lock(&c->mx);
    kvr_pair_outcome_t out;
    s = kvr_pairing_send_done(c->pairing, &id, status, &out, err);
    if (s == KVR_OK)
        drain_pairing(c);
    pthread_mutex_unlock(&c->mx);
    return s;
}

/* ---- consumer load -------------------------------------------------------- */

/* Loads one part; its hit in *tokens. */
static kvr_status_t load_part(kvr_store_conn_t *c,
                              const kvr_store_load_req_t *r, uint32_t part,
                              size_t chains, uint64_t *tokens, kvr_error_t *err)
{
    kvr_store_io_t io = {.ns = c->ns,
                         .part = part,
                         .block_size = c->prm.block_size,
                         .chunk = c->prm.chunk,
                         .chains = r->chains,
                         .num_chains = chains,
                         .lay = &c->prm.lay,
                         .rank = r->rank,
                         .regions = c->regions + c->part[part].first,
                         .num_regions = c->part[part].count,
                         .blocks = r->dst_blocks,
                         .num_blocks = r->num_dst_blocks};
    return kvr_store_load(c->prm.store, &io, tokens, err);
}

/* Under store_mx: every part loaded and reported; the quorum's outcome. */
static kvr_status_t load_parts(kvr_store_conn_t *c,
                               const kvr_store_load_req_t *r, size_t chains,
                               uint64_t *hit, kvr_error_t *err)
{
    kvr_completion_id_t op = kvr_completion_op(r->request_id, r->request_id_len,
                                               r->generation);
    kvr_error_t first = {0};
    kvr_quorum_result_t res = {0};
    *hit = (uint64_t)chains * c->prm.chunk;
    for (uint32_t p = 0; p < c->prm.parts; p++) {
        uint64_t t = 0;
        kvr_error_t e = {0};
        kvr_status_t s = load_part(c, r, p, chains, &t, &e);
        if (s != KVR_OK && first.msg[0] == '\0')
            first = e;
        *hit = t < *hit ? t : *hit;
        pthread_mutex_lock(&c->mx);
        kvr_status_t q = kvr_quorum_report(c->loads, &op, p, s, &res, err);
        pthread_mutex_unlock(&c->mx);
        if (q != KVR_OK)
            return q;
    }
    pthread_mutex_lock(&c->mx);
    kvr_quorum_forget(c->loads, &op, NULL); /* the same id may load again */
    pthread_mutex_unlock(&c->mx);
    if (res.outcome != KVR_QUORUM_DONE)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "store load: the "
                             "quorum over %u parts did not complete",
                             c->prm.parts);
    if (res.status != KVR_OK)
        return kvr_error_set(err, res.status, "%s", first.msg);
    return KVR_OK;
}

/* Under mx: a load's generation becomes its request's latest; an older
 * one is refused. */
static kvr_status_t admit_load(kvr_store_conn_t *c,
                               const kvr_completion_id_t *op, kvr_error_t *err)
{
    int64_t latest = kvr__gens_latest(&c->load_gens, op->req_id,
                                      op->req_id_len);
    if (latest > op->generation)
        return stale(&c->load_gens, err, "load", op, latest);
    return kvr__gens_set(&c->load_gens, op->req_id, op->req_id_len,
                         op->generation, err);
}

kvr_status_t kvr_store_conn_forget(kvr_store_conn_t *c, const void *request_id,
                                   size_t len, kvr_error_t *err)
{
    kvr_completion_id_t id;
    kvr_status_t s = request_of(c, request_id, len, &id, err);
    if (s != KVR_OK)
        return s;
    pthread_mutex_lock(&c->mx);
    kvr__gens_drop(&c->save_gens, request_id, len);
    kvr__gens_drop(&c->load_gens, request_id, len);
    pthread_mutex_unlock(&c->mx);
    return KVR_OK;
}

kvr_status_t kvr_store_conn_load(kvr_store_conn_t *c,
                                 const kvr_store_load_req_t *req,
                                 uint64_t *tokens, uint64_t *bytes,
                                 kvr_error_t *err)
{
    if (c == NULL || req == NULL || tokens == NULL ||
        (req->num_chains && req->chains == NULL))
        return kvr_error_set(err, KVR_ERR_INVALID, "store load: NULL argument");
    kvr_completion_id_t op = kvr_completion_op(
        req->request_id, req->request_id_len, req->generation);
    kvr_status_t s = kvr_completion_id_check(&op, err);
    if (s != KVR_OK)
        return s;
    pthread_mutex_lock(&c->mx);
    s = admit_load(c, &op, err);
    pthread_mutex_unlock(&c->mx);
    if (s != KVR_OK)
        return s;
    size_t chains = req->num_chains;
    if (chains > req->max_tokens / c->prm.chunk)
        chains = (size_t)(req->max_tokens / c->prm.chunk);
    uint64_t hit = 0;
    kvr_store_stats_t before, after;
    pthread_mutex_lock(&c->store_mx);
    kvr_store_stats(c->prm.store, &before);
    s = load_parts(c, req, chains, &hit, err);
    kvr_store_stats(c->prm.store, &after);
    pthread_mutex_unlock(&c->store_mx);
    if (s != KVR_OK)
        return s;
    *tokens = hit;
    if (bytes != NULL)
        *bytes = after.loaded_bytes - before.loaded_bytes;
    return KVR_OK;
}
