/* The connector's GPU path emulated on the host, for tests without a
 * device (src/conn/gpu_path.h): "device memory" is host memory, a CUDA IPC
 * handle carries the pointer itself (agents of one process), and a stream
 * is a worker thread running what was queued on it in order: the
 * reference scatters and run copies (kvr_gpu_ref_*), each job's completion
 * flag and the host notifications. A job's "kernels" take
 * kvr__emul_kernel_us microseconds. It checks the agent's side of the GPU
 * path (launch, wake on completion, answer, teardown, cuts, gates on an
 * engine's events) with every byte verified, under the sanitizers too; the
 * kernels themselves are tested on a device (tests/gpu). gpu-staged is not
 * emulated (its calls refuse: gpu_refused.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_path.h"
#include "gpu_refused.h"
#include "gpu_tables.h"
#include "kvrelay/gpu.h"

static atomic_uint kernel_us;
static atomic_uint notifies; /* host notifications queued */
static atomic_uint jobs;     /* jobs queued */

void kvr__emul_kernel_us(unsigned us);
unsigned kvr__emul_notifies(void);
unsigned kvr__emul_jobs(void);

unsigned kvr__emul_jobs(void)
{
    return atomic_load(&jobs);
}

void kvr__emul_kernel_us(unsigned us)
{
    atomic_store(&kernel_us, us);
}

unsigned kvr__emul_notifies(void)
{
    return atomic_load(&notifies);
}

static kvr_status_t no_emul(kvr_error_t *err)
{
    return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                         "not emulated (gpu_path_emul.c)");
}

/* What gpu_refused.c refuses (gpu-staged) is not emulated. */
kvr_status_t kvr__gpu_refused(kvr_error_t *err)
{
    return no_emul(err);
}

/* ---- streams ---- */

typedef struct task {
    void (*fn)(void *);
    void *arg;
    struct task *next;
} task_t;

typedef struct emul_stream {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    task_t *head, *tail;
    bool running, stop;
} emul_stream_t;

static void *worker(void *arg)
{
    emul_stream_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->work, &s->mu);
        if (s->head == NULL)
            break;
        task_t *t = s->head;
        s->head = t->next;
        s->tail = s->head ? s->tail : NULL;
        s->running = true;
        pthread_mutex_unlock(&s->mu);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&s->mu);
        s->running = false;
        if (s->head == NULL)
            pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* fn(arg) after everything queued on stream; at once without a stream. */
static kvr_status_t enqueue(void *stream, void (*fn)(void *), void *arg,
                            kvr_error_t *err)
{
    emul_stream_t *s = stream;
    if (s == NULL) {
        fn(arg);
        return KVR_OK;
    }
    task_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_lock(&s->mu);
    if (s->tail != NULL)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return KVR_OK;
}

kvr_status_t kvr__gpu_stream_create(int device, void **stream, kvr_error_t *err)
{
    emul_stream_t *s = calloc(1, sizeof(*s));
    if (device != 0 || s == NULL) {
        free(s);
        return kvr_error_set(err, KVR_ERR_INVALID, "emulated device %d",
                             device);
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        free(s);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no thread");
    }
    *stream = s;
    return KVR_OK;
}

kvr_status_t kvr__gpu_stream_sync(void *stream, kvr_error_t *err)
{
    (void)err;
    emul_stream_t *s = stream;
    if (s == NULL)
        return KVR_OK;
    pthread_mutex_lock(&s->mu);
    while (s->head != NULL || s->running)
        pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return KVR_OK;
}

void kvr__gpu_stream_destroy(void *stream)
{
    emul_stream_t *s = stream;
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* it runs what is left first */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    free(s);
}

static void notify_task(void *arg)
{
    uint64_t one = 1;
    ssize_t n = write((int)(intptr_t)arg, &one, sizeof(one));
    (void)n;
}

static kvr_status_t notify_on(void *stream, int fd, kvr_error_t *err)
{
    atomic_fetch_add(&notifies, 1);
    return enqueue(stream, notify_task, (void *)(intptr_t)fd, err);
}

/* ---- events: an engine's (the tests make them) and the agent's gates ---- */

/* Records are counted; a record's task, when its stream reaches it, marks
 * the event done up to that record. A wait blocks its stream's worker
 * until the event is done up to its latest record as of the call (none:
 * nothing to wait for, as with CUDA). */
typedef struct emul_event {
    atomic_uint_fast64_t recorded, done;
} emul_event_t;

typedef struct mark {
    emul_event_t *ev;
    uint64_t n;
} mark_t;

static void mark_task(void *arg)
{
    mark_t *m = arg;
    atomic_store(&m->ev->done, m->n);
    free(m);
}

static void wait_task(void *arg)
{
    mark_t *m = arg;
    while (atomic_load(&m->ev->done) < m->n)
        usleep(100);
    free(m);
}

static kvr_status_t event_task(void *stream, emul_event_t *e, bool record,
                               kvr_error_t *err)
{
    mark_t *m = malloc(sizeof(*m));
    if (m == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    m->ev = e;
    m->n = record ? atomic_fetch_add(&e->recorded, 1) + 1
                  : atomic_load(&e->recorded);
    kvr_status_t st = enqueue(stream, record ? mark_task : wait_task, m, err);
    if (st != KVR_OK)
        free(m);
    return st;
}

/* The tests' engine: events, records on a stream of the emulation
 * (kvr__gpu_stream_create), and any host task queued there. */
void *kvr__emul_event_new(void);
void kvr__emul_event_free(void *event);
kvr_status_t kvr__emul_record(void *event, void *stream);
kvr_status_t kvr__emul_run_on(void *stream, void (*fn)(void *), void *arg);
bool kvr__emul_event_done(void *event);

void *kvr__emul_event_new(void)
{
    return calloc(1, sizeof(emul_event_t));
}

void kvr__emul_event_free(void *event)
{
    free(event);
}

kvr_status_t kvr__emul_record(void *event, void *stream)
{
    return event_task(stream, event, true, NULL);
}

kvr_status_t kvr__emul_run_on(void *stream, void (*fn)(void *), void *arg)
{
    return enqueue(stream, fn, arg, NULL);
}

bool kvr__emul_event_done(void *event)
{
    emul_event_t *e = event;
    return atomic_load(&e->done) >= atomic_load(&e->recorded);
}

kvr_status_t kvr__gpu_gate_create(int device, void **gate, kvr_error_t *err)
{
    if (device != 0)
        return kvr_error_set(err, KVR_ERR_INVALID, "emulated device %d",
                             device);
    *gate = kvr__emul_event_new();
    return *gate ? KVR_OK : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
}

void kvr__gpu_gate_destroy(void *gate)
{
    kvr__emul_event_free(gate);
}

kvr_status_t kvr__gpu_gate_arm(void *stream, void *engine_event, void *gate,
                               int fd, kvr_error_t *err)
{
    kvr_status_t st = event_task(stream, engine_event, false, err);
    if (st == KVR_OK)
        st = event_task(stream, gate, true, err);
    return st == KVR_OK && fd >= 0 ? notify_on(stream, fd, err) : st;
}

/* A slow watcher for the tests: its waits begin only once released;
 * how many it finished. */
static atomic_bool syncs_held;
static atomic_uint syncs_done;
void kvr__emul_hold_syncs(bool hold);
unsigned kvr__emul_syncs_done(void);

void kvr__emul_hold_syncs(bool hold)
{
    atomic_store(&syncs_held, hold);
}

unsigned kvr__emul_syncs_done(void)
{
    return atomic_load(&syncs_done);
}

kvr_status_t kvr__gpu_gate_sync(void *gate, kvr_error_t *err)
{
    (void)err;
    while (atomic_load(&syncs_held))
        usleep(100);
    while (!kvr__emul_event_done(gate))
        usleep(100);
    atomic_fetch_add(&syncs_done, 1);
    return KVR_OK;
}

kvr_status_t kvr__gpu_gate_done(void *gate, bool *done, kvr_error_t *err)
{
    (void)err;
    *done = kvr__emul_event_done(gate);
    return KVR_OK;
}

kvr_status_t kvr__gpu_warm(int device, void *stream, kvr_error_t *err)
{
    (void)device;
    return kvr__gpu_stream_sync(stream, err);
}

/* The pool is the real one's contract only: nothing to keep here. */
struct kvr_gpu_pool {
    void *stream;
};

kvr_status_t kvr__gpu_pool_create(int device, void *stream,
                                  struct kvr_gpu_pool **pool, kvr_error_t *err)
{
    (void)device;
    *pool = calloc(1, sizeof(**pool));
    if (*pool == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    (*pool)->stream = stream;
    return KVR_OK;
}

void kvr__gpu_pool_destroy(struct kvr_gpu_pool *pool)
{
    if (pool != NULL)
        kvr__gpu_stream_sync(pool->stream, NULL);
    free(pool);
}

/* ---- memory and IPC ---- */

int kvr__gpu_device_count(void)
{
    return 1;
}

kvr_status_t kvr__gpu_use(int device, kvr_error_t *err)
{
    return device == 0 ? KVR_OK
                       : kvr_error_set(err, KVR_ERR_INVALID,
                                       "emulated device %d", device);
}

kvr_status_t kvr__gpu_alloc(int device, uint64_t len, void **ptr,
                            kvr_error_t *err)
{
    (void)device;
    /* 256-byte aligned and zeroed, as cudaMalloc's at least */
    uint64_t n = (len + 255) / 256 * 256;
    *ptr = aligned_alloc(256, n ? n : 256);
    if (*ptr != NULL)
        memset(*ptr, 0, n);
    return *ptr ? KVR_OK : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
}

void kvr__gpu_free(void *ptr)
{
    free(ptr);
}

/* Small chunks, so that the tests' regions (240-400 KiB) share some and
 * fill others */
void kvr__gpu_chunking(uint64_t *chunk, uint64_t *align)
{
    *chunk = 1u << 20;
    *align = 256;
}

kvr_status_t kvr__gpu_copy(void *dst, const void *src, uint64_t len,
                           kvr_error_t *err)
{
    (void)err;
    memcpy(dst, src, len);
    return KVR_OK;
}

kvr_status_t kvr__gpu_export(const void *ptr, uint8_t *rkey, uint32_t *len,
                             kvr_error_t *err)
{
    (void)err;
    memset(rkey, 0, KVR_GPU_RKEY_BYTES);
    memcpy(rkey, &ptr, sizeof(ptr));
    *len = KVR_GPU_RKEY_BYTES;
    return KVR_OK;
}

kvr_status_t kvr__gpu_open(int device, const uint8_t *rkey, uint32_t len,
                           void **ptr, kvr_error_t *err)
{
    if (device != 0 || len != KVR_GPU_RKEY_BYTES)
        return kvr_error_set(err, KVR_ERR_PROTO, "emulated key of %u bytes",
                             len);
    memcpy(ptr, rkey, sizeof(*ptr));
    return KVR_OK;
}

void kvr__gpu_close(const uint8_t *rkey, uint32_t len, void *ptr)
{
    (void)rkey, (void)len, (void)ptr;
}

/* ---- jobs ---- */

struct kvr__gpu_job {
    kvr_gpu_relayout_t **rl; /* one per pair (NULL: a run copy) */
    bool *owned;             /* made by the job, not from given tables */
    const void **src;
    void **dst;
    uint32_t *ranks;
    size_t n;
    uint32_t refs; /* the pulls sharing it (the loop's thread only) */
    const kvr__gpu_runs_t *runs; /* a run copy's table and range */
    uint64_t pos, len;
    void *stream; /* where it was queued */
    atomic_bool done;
    atomic_int status;
};

struct kvr__gpu_runs {
    kvr_gpu_runs_t *rt;
    void *stream; /* freed after the copies queued there */
};

static kvr_status_t queue_job(void *stream, kvr__gpu_job_t *j,
                              kvr_error_t *err);

static void run_job(void *arg)
{
    kvr__gpu_job_t *j = arg;
    kvr_status_t st = KVR_OK;
    unsigned us = atomic_load(&kernel_us);
    if (us > 0)
        usleep(us);
    for (size_t i = 0; i < j->n && st == KVR_OK; i++)
        st = kvr_gpu_ref_scatter(j->rl[i], j->ranks[i], j->src[i], j->dst[i],
                                 NULL);
    if (j->runs != NULL)
        st = kvr_gpu_runs_copy_ref(j->runs->rt, j->pos, j->len, NULL, NULL,
                                   NULL);
    atomic_store(&j->status, (int)st);
    atomic_store(&j->done, true);
}

static kvr_status_t queue_job(void *stream, kvr__gpu_job_t *j,
                              kvr_error_t *err)
{
    j->stream = stream;
    kvr_status_t st = enqueue(stream, run_job, j, err);
    if (st == KVR_OK)
        atomic_fetch_add(&jobs, 1);
    return st;
}

/* kvr__gpu_job_end, the job marked done first when it never ran (its
 * free waits for that). */
static kvr_status_t job_end(kvr__gpu_job_t *j, kvr_status_t st,
                            kvr__gpu_job_t **out)
{
    if (st != KVR_OK)
        atomic_store(&j->done, true);
    return kvr__gpu_job_end(j, st, out);
}

static kvr__gpu_job_t *job_new(size_t n)
{
    kvr__gpu_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->rl = calloc(n + 1, sizeof(*j->rl));
    j->src = calloc(n + 1, sizeof(*j->src));
    j->dst = calloc(n + 1, sizeof(*j->dst));
    j->ranks = calloc(n + 1, sizeof(*j->ranks));
    j->owned = calloc(n + 1, sizeof(*j->owned));
    j->refs = 1;
    if (j->rl == NULL || j->src == NULL || j->dst == NULL ||
        j->ranks == NULL || j->owned == NULL) {
        atomic_store(&j->done, true); /* never queued: its free waits not */
        kvr__gpu_job_free(j);
        return NULL;
    }
    return j;
}

/* Emulated tables (gpu_tables.h): a relayout per pair given, found again
 * by the pair's descriptions (kvr__gpu_tables_match; stricter than the
 * device's per-class tables: a launch finds them only for pairs the tables
 * were made with). */

static atomic_uint tables_used; /* pairs launched from given tables */
static atomic_uint pairs_launched;

unsigned kvr__emul_tables_used(void);
unsigned kvr__emul_pairs(void);

unsigned kvr__emul_tables_used(void)
{
    return atomic_load(&tables_used);
}

unsigned kvr__emul_pairs(void)
{
    return atomic_load(&pairs_launched);
}

kvr_status_t kvr__gpu_tables_make(int device, void *stream,
                                  struct kvr_gpu_pool *pool,
                                  const kvr_layout_t *lay,
                                  const kvr_region_pair_t *pairs, size_t n,
                                  const kvr_request_t *req,
                                  kvr__gpu_tables_t **out, kvr_error_t *err)
{
    (void)device, (void)stream, (void)pool;
    kvr_gpu_request_t g = kvr__gpu_request(req);
    kvr__gpu_tables_t *t = NULL;
    kvr_status_t st = kvr__gpu_tables_new(n, &t, err);
    for (size_t i = 0; i < n && st == KVR_OK; i++) {
        st = kvr_gpu_relayout_create(lay, &pairs[i].src, &pairs[i].dst, &g,
                                     &t->rl[i], err);
        t->reps[i] = pairs[i];
        t->n += st == KVR_OK;
    }
    if (st != KVR_OK) {
        kvr__gpu_tables_free(t);
        return st;
    }
    *out = t;
    return KVR_OK;
}

static bool same_desc(const kvr_region_desc_t *a, const kvr_region_desc_t *b)
{
    return a->role == b->role && a->layer == b->layer &&
           a->num_blocks == b->num_blocks && a->page_bytes == b->page_bytes &&
           a->index_dim == b->index_dim && a->bytes == b->bytes;
}

bool kvr__gpu_tables_match(const kvr_region_pair_t *rep,
                           const kvr_region_pair_t *pair)
{
    return same_desc(&rep->src, &pair->src) && same_desc(&rep->dst, &pair->dst);
}

static atomic_uint merged; /* jobs of more than one request */

unsigned kvr__emul_merged(void);

unsigned kvr__emul_merged(void)
{
    return atomic_load(&merged);
}

/* Slot i's relayout into j: from its request's tables, else made now
 * (and owned by the job); *bytes grows by its rank's share. */
static kvr_status_t slot_relayout(const kvr_layout_t *lay,
                                  const kvr__gpu_launch_t *l, size_t i,
                                  kvr__gpu_job_t *j, uint64_t *bytes,
                                  kvr_error_t *err)
{
    uint32_t q = l->req ? l->req[i] : 0;
    const kvr_region_pair_t *pair = &l->pairs[i];
    j->rl[i] = kvr__gpu_tables_find(l->tables ? l->tables[q] : NULL, pair);
    if (j->rl[i] != NULL)
        atomic_fetch_add(&tables_used, 1);
    atomic_fetch_add(&pairs_launched, 1);
    j->owned[i] = j->rl[i] == NULL;
    kvr_gpu_request_t g = kvr__gpu_request(&l->reqs[q]);
    kvr_status_t st = KVR_OK;
    if (j->owned[i])
        st = kvr_gpu_relayout_create(lay, &pair->src, &pair->dst, &g,
                                     &j->rl[i], err);
    if (st == KVR_OK)
        *bytes += kvr_gpu_relayout_bytes(j->rl[i], l->ranks[i]);
    return st;
}

/* Every request's slots in turn on the host, as one request's. */
kvr_status_t kvr__gpu_job_launch(int device, void *stream,
                                 struct kvr_gpu_pool *pool,
                                 const kvr_layout_t *lay,
                                 const kvr__gpu_launch_t *l,
                                 kvr__gpu_job_t **out, uint64_t *bytes,
                                 kvr_error_t *err)
{
    (void)device, (void)pool;
    kvr__gpu_job_t *j = job_new(l->n);
    if (j == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_status_t st = KVR_OK;
    *bytes = 0;
    for (size_t i = 0; i < l->n && st == KVR_OK; i++, j->n++) {
        st = slot_relayout(lay, l, i, j, bytes, err);
        j->src[i] = l->src[i];
        j->dst[i] = l->dst[i];
        j->ranks[i] = l->ranks[i];
    }
    if (st == KVR_OK)
        st = queue_job(stream, j, err);
    if (st == KVR_OK && l->nreq > 1)
        atomic_fetch_add(&merged, 1);
    return job_end(j, st, out);
}

kvr_status_t kvr__gpu_job_done(kvr__gpu_job_t *job, bool *done,
                               kvr_error_t *err)
{
    *done = atomic_load(&job->done);
    kvr_status_t st = *done ? (kvr_status_t)atomic_load(&job->status) : KVR_OK;
    return st == KVR_OK ? KVR_OK
                        : kvr_error_set(err, st, "emulated kernel failed");
}

void kvr__gpu_job_free(kvr__gpu_job_t *job)
{
    if (job == NULL)
        return;
    while (!atomic_load(&job->done)) /* its "kernels" end first */
        usleep(100);
    if (!kvr__gpu_unref(&job->refs))
        return;
    for (size_t i = 0; i < job->n; i++)
        if (job->owned[i])
            kvr_gpu_relayout_destroy(job->rl[i]);
    free(job->rl);
    free(job->owned);
    free(job->src);
    free(job->dst);
    free(job->ranks);
    free(job);
}

/* The side stream is not emulated: the note follows the job on its own
 * stream's worker (what it must come after). */
kvr_status_t kvr__gpu_job_notify(kvr__gpu_job_t *job, void *side, int fd,
                                 kvr_error_t *err)
{
    (void)side;
    return notify_on(job->stream, fd, err);
}

void kvr__gpu_job_share(kvr__gpu_job_t *job)
{
    job->refs++;
}

/* ---- run copies ---- */

kvr_status_t kvr__gpu_runs_make(int device, void *stream,
                                struct kvr_gpu_pool *pool,
                                const kvr_plan_t *const *plans,
                                const void *const *src, void *const *dst,
                                size_t n, kvr__gpu_runs_t **out,
                                kvr_error_t *err)
{
    (void)device, (void)pool;
    kvr__gpu_runs_t *r = calloc(1, sizeof(*r));
    kvr_status_t st =
        r ? kvr__gpu_runs_of_plans(plans, src, dst, n, &r->rt, err)
          : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for run tables");
    if (st != KVR_OK) {
        free(r);
        return st;
    }
    r->stream = stream;
    *out = r;
    return KVR_OK;
}

static void free_runs(void *arg)
{
    kvr__gpu_runs_t *r = arg;
    kvr_gpu_runs_destroy(r->rt);
    free(r);
}

void kvr__gpu_runs_free(kvr__gpu_runs_t *rt)
{
    if (rt != NULL && enqueue(rt->stream, free_runs, rt, NULL) != KVR_OK) {
        kvr__gpu_stream_sync(rt->stream, NULL);
        free_runs(rt);
    }
}

kvr_status_t kvr__gpu_job_runs(int device, void *stream,
                               const kvr__gpu_runs_t *rt, uint64_t pos,
                               uint64_t len, const void *src_buf, void *dst_buf,
                               kvr__gpu_job_t **out, kvr_error_t *err)
{
    (void)device;
    if (src_buf != NULL || dst_buf != NULL)
        return no_emul(err);
    kvr__gpu_job_t *j = job_new(0);
    if (j == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    j->runs = rt;
    j->pos = pos;
    j->len = len;
    return job_end(j, queue_job(stream, j, err), out);
}
