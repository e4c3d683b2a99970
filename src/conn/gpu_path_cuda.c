/* The connector's GPU path over the gpu layer (see gpu_path.h). */
#include "gpu_path.h"
#include "gpu_tables.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvrelay/base.h"
#include "kvrelay/gpu.h"

int kvr__gpu_device_count(void)
{
    int n = 0;
    return kvr_gpu_device_count(&n, NULL) == KVR_OK ? n : 0;
}

kvr_status_t kvr__gpu_alloc(int device, uint64_t len, void **ptr,
                            kvr_error_t *err)
{
    return kvr_gpu_malloc(device, len, ptr, err);
}

void kvr__gpu_free(void *ptr)
{
    kvr_gpu_free(ptr);
}

/* 2 GiB chunks with regions 2 MiB apart: the layout of the one mapping of
 * all regions that wrote scattered pages at the rate of local memory; any
 * allocation sized in multiples of 64 KiB did as well (docs/performance.md,
 * runs 2026-12-02n and o). */
void kvr__gpu_chunking(uint64_t *chunk, uint64_t *align)
{
    *chunk = 2ull << 30;
    *align = 2ull << 20;
}

kvr_status_t kvr__gpu_copy(void *dst, const void *src, uint64_t len,
                           kvr_error_t *err)
{
    return kvr_gpu_memcpy(dst, src, len, err);
}

kvr_status_t kvr__gpu_export(const void *ptr, uint8_t *rkey, uint32_t *len,
                             kvr_error_t *err)
{
    kvr_gpu_ipc_handle_t h;
    kvr_status_t st = kvr_gpu_ipc_export(ptr, &h, err);
    if (st != KVR_OK)
        return st;
    memcpy(rkey, h.handle, sizeof(h.handle));
    memcpy(rkey + sizeof(h.handle), &h.offset, sizeof(h.offset));
    *len = KVR_GPU_RKEY_BYTES;
    return KVR_OK;
}

static kvr_status_t handle_of(const uint8_t *rkey, uint32_t len,
                              kvr_gpu_ipc_handle_t *h, kvr_error_t *err)
{
    if (len != KVR_GPU_RKEY_BYTES)
        return kvr_error_set(err, KVR_ERR_PROTO,
                             "CUDA region key of %u bytes, "
                             "expected %u",
                             len, KVR_GPU_RKEY_BYTES);
    memcpy(h->handle, rkey, sizeof(h->handle));
    memcpy(&h->offset, rkey + sizeof(h->handle), sizeof(h->offset));
    return KVR_OK;
}

kvr_status_t kvr__gpu_open(int device, const uint8_t *rkey, uint32_t len,
                           void **ptr, kvr_error_t *err)
{
    kvr_gpu_ipc_handle_t h;
    kvr_status_t st = handle_of(rkey, len, &h, err);
    if (st == KVR_OK)
        st = kvr_gpu_set_device(device, err);
    if (st == KVR_OK)
        st = kvr_gpu_ipc_open(&h, ptr, err);
    return st;
}

void kvr__gpu_close(const uint8_t *rkey, uint32_t len, void *ptr)
{
    kvr_gpu_ipc_handle_t h;
    if (ptr != NULL && handle_of(rkey, len, &h, NULL) == KVR_OK)
        kvr_gpu_ipc_close(&h, ptr);
}

/* Pairs of one class (role and widths) share one relayout: its tables are
 * checked and uploaded once, then each region is one kernel launch. */
static bool same_class(const kvr_region_pair_t *a, const kvr_region_pair_t *b)
{
    return a->src.role == b->src.role &&
           a->src.page_bytes == b->src.page_bytes &&
           a->dst.page_bytes == b->dst.page_bytes &&
           a->src.index_dim == b->src.index_dim &&
           a->src.num_blocks == b->src.num_blocks &&
           a->dst.num_blocks == b->dst.num_blocks &&
           kvr_region_bytes(&a->src) == kvr_region_bytes(&b->src) &&
           kvr_region_bytes(&a->dst) == kvr_region_bytes(&b->dst);
}

/* Completion events kept for reuse: a CUDA event created and destroyed
 * per launch cost microseconds on the H200's host (docs/gpu.md, The
 * agent's launch). One comes back only once it fired (waited for). */
#define EVENT_CACHE 64

static struct {
    void *ev;
    int device;
} event_cache[EVENT_CACHE];
static int event_cached;
static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;

static kvr_status_t event_get(int device, void **ev, kvr_error_t *err)
{
    pthread_mutex_lock(&event_lock);
    for (int i = event_cached - 1; i >= 0; i--)
        if (event_cache[i].device == device) {
            *ev = event_cache[i].ev;
            event_cache[i] = event_cache[--event_cached];
            pthread_mutex_unlock(&event_lock);
            return KVR_OK;
        }
    pthread_mutex_unlock(&event_lock);
    return kvr_gpu_event_create(device, ev, err);
}

static void event_put(int device, void *ev)
{
    pthread_mutex_lock(&event_lock);
    if (ev != NULL && event_cached < EVENT_CACHE) {
        event_cache[event_cached].ev = ev;
        event_cache[event_cached++].device = device;
        ev = NULL;
    }
    pthread_mutex_unlock(&event_lock);
    kvr_gpu_event_destroy(ev);
}

#define TIMES_CLASSES 4 /* classes a job's line times apart */

struct kvr__gpu_job {
    kvr_gpu_relayout_t **rl; /* classes it made (no tables given for them),
                                alive until the job ends; NULL: none */
    size_t nrl;
    void *stream;  /* where its kernels run */
    void *done;    /* recorded after the last launch (event_get) */
    bool launched; /* some kernel was queued */
    bool recorded; /* done was recorded after them */
    int device;
    uint32_t refs; /* the pulls it serves */
    /* KVR_AGENT_GPU_TIMES only (below): */
    void *t0; /* a timed event before its first launch; NULL: untimed */
    uint64_t launch_ns, queued_ns, bytes, tokens;
    uint32_t pulls, kernels, slots;
    void *tk[TIMES_CLASSES]; /* timed events after each class's launches */
    uint64_t kbytes[TIMES_CLASSES];
    uint32_t krole[TIMES_CLASSES], nk;
};

/* ---- each job's time on the device (KVR_AGENT_GPU_TIMES=1) ----
 * For profiling a stage's stream (docs/performance.md, runs 2026-12-02m
 * and n): a job's kernels lie between two timed events, with one more
 * after each region class's launches (times_class), and when the job is
 * freed one line goes to stderr with its launch, start and end on the
 * host's monotonic clock (µs). A reference event, recorded once per
 * process and waited for, maps the device's clock onto the host's to a
 * few microseconds; a process drives one device here. Off, a job takes
 * untimed events from the cache as before. */
static pthread_once_t times_once = PTHREAD_ONCE_INIT;
static bool times_on;
static pthread_mutex_t times_lock = PTHREAD_MUTEX_INITIALIZER;
static void *times_ref; /* recorded and complete */
static uint64_t times_ref_ns;

static void times_init(void)
{
    const char *e = getenv("KVR_AGENT_GPU_TIMES");
    times_on = e != NULL && *e != '\0' && strcmp(e, "0") != 0;
}

static bool times(void)
{
    pthread_once(&times_once, times_init);
    return times_on;
}

/* The reference event, made on the first timed job's stream (waiting
 * once for what is queued there). */
static bool times_reference(int device, void *stream)
{
    bool ok = true;
    pthread_mutex_lock(&times_lock);
    if (times_ref == NULL) {
        void *ev = NULL;
        ok = kvr_gpu_event_create_timed(device, &ev, NULL) == KVR_OK &&
             kvr_gpu_event_record(ev, stream, NULL) == KVR_OK &&
             kvr_gpu_event_sync(ev, NULL) == KVR_OK;
        if (ok) {
            times_ref_ns = kvr_now_ns();
            times_ref = ev;
        } else {
            kvr_gpu_event_destroy(ev);
        }
    }
    pthread_mutex_unlock(&times_lock);
    return ok;
}

/* A timed job's events: t0 recorded now, done timed (not from the cache,
 * whose events keep no time). Best effort: false leaves the job untimed,
 * and profiling never fails a pull. */
static bool times_start(kvr__gpu_job_t *job)
{
    job->launch_ns = kvr_now_ns();
    if (times_reference(job->device, job->stream) &&
        kvr_gpu_event_create_timed(job->device, &job->t0, NULL) == KVR_OK &&
        kvr_gpu_event_create_timed(job->device, &job->done, NULL) == KVR_OK &&
        kvr_gpu_event_record(job->t0, job->stream, NULL) == KVR_OK)
        return true;
    kvr_gpu_event_destroy(job->t0);
    kvr_gpu_event_destroy(job->done);
    job->t0 = job->done = NULL;
    return false;
}

static double times_at_us(void *ev)
{
    float ms = 0;
    if (kvr_gpu_event_elapsed(times_ref, ev, &ms, NULL) != KVR_OK)
        return -1;
    return (double)times_ref_ns / 1e3 + (double)ms * 1e3;
}

/* The freed job's line, in one write (the stages share a stderr); its
 * events are complete (waited for). */
static void times_print(const kvr__gpu_job_t *job)
{
    char line[512];
    int n = snprintf(
        line, sizeof(line),
        "kvr gpu job: pid %d tokens %llu pulls %u kernels %u slots %u "
        "bytes %llu launch_us %.1f start_us %.1f end_us %.1f queued_us %.1f",
        (int)getpid(), (unsigned long long)job->tokens, job->pulls,
        job->kernels, job->slots, (unsigned long long)job->bytes,
        (double)job->launch_ns / 1e3, times_at_us(job->t0),
        times_at_us(job->done), (double)job->queued_ns / 1e3);
    /* each class's launches: role, bytes, end (µs) */
    for (uint32_t k = 0; k < job->nk && n > 0 && (size_t)n < sizeof(line);
         k++)
        n += snprintf(line + n, sizeof(line) - (size_t)n,
                      " class %u %llu %.1f", job->krole[k],
                      (unsigned long long)job->kbytes[k],
                      times_at_us(job->tk[k]));
    if (n > 0 && (size_t)n < sizeof(line) - 1)
        line[n++] = '\n';
    if (job->recorded && n > 0 && (size_t)n < sizeof(line))
        (void)!write(STDERR_FILENO, line, (size_t)n);
    kvr_gpu_event_destroy(job->t0);
    kvr_gpu_event_destroy(job->done);
    for (uint32_t k = 0; k < job->nk; k++)
        kvr_gpu_event_destroy(job->tk[k]);
}

/* A timed event after a class's launches (best effort, as times_start). */
static void times_class(kvr__gpu_job_t *job, uint32_t role, uint64_t bytes)
{
    void *ev = NULL;
    if (job->t0 == NULL || job->nk == TIMES_CLASSES)
        return;
    if (kvr_gpu_event_create_timed(job->device, &ev, NULL) != KVR_OK ||
        kvr_gpu_event_record(ev, job->stream, NULL) != KVR_OK) {
        kvr_gpu_event_destroy(ev);
        return;
    }
    job->tk[job->nk] = ev;
    job->kbytes[job->nk] = bytes;
    job->krole[job->nk++] = role;
}

/* A request's relayout tables (gpu_tables.h), one per region class:
 * checked, sorted and uploaded once (kvr__gpu_tables_make), then read by
 * every launch of the request's layer groups. */
bool kvr__gpu_tables_match(const kvr_region_pair_t *rep,
                           const kvr_region_pair_t *pair)
{
    return same_class(rep, pair);
}

/* The relayout of pair's class, checked and uploaded (small tables into
 * a mapped slot of pool, others into a block of it, on stream, or
 * synchronously). Every caller frees the tables only after the kernels
 * that read them completed (kvr__gpu_job_free waits for them), as a
 * mapped slot needs. */
static kvr_status_t class_relayout(void *stream, kvr_gpu_pool_t *pool,
                                   const kvr_layout_t *lay,
                                   const kvr_region_pair_t *pair,
                                   const kvr_request_t *req,
                                   kvr_gpu_relayout_t **out, kvr_error_t *err)
{
    kvr_gpu_request_t g = kvr__gpu_request(req);
    kvr_gpu_relayout_t *rl = NULL;
    kvr_status_t st =
        kvr_gpu_relayout_create(lay, &pair->src, &pair->dst, &g, &rl, err);
    if (st == KVR_OK)
        st = pool     ? kvr_gpu_relayout_upload_mapped(rl, pool, err)
             : stream ? kvr_gpu_relayout_upload_async(rl, stream, err)
                      : kvr_gpu_relayout_upload(rl, err);
    if (st != KVR_OK) {
        kvr_gpu_relayout_destroy(rl);
        return st;
    }
    *out = rl;
    return KVR_OK;
}

kvr_status_t kvr__gpu_tables_make(int device, void *stream,
                                  struct kvr_gpu_pool *pool,
                                  const kvr_layout_t *lay,
                                  const kvr_region_pair_t *pairs, size_t n,
                                  const kvr_request_t *req,
                                  kvr__gpu_tables_t **out, kvr_error_t *err)
{
    kvr__gpu_tables_t *t = NULL;
    kvr_status_t st = kvr__gpu_tables_new(n, &t, err);
    if (st == KVR_OK)
        st = kvr_gpu_set_device(device, err);
    for (size_t i = 0; i < n && st == KVR_OK; i++) {
        if (kvr__gpu_tables_find(t, &pairs[i]) != NULL)
            continue;
        st = class_relayout(stream, pool, lay, &pairs[i], req, &t->rl[t->n],
                            err);
        if (st == KVR_OK)
            t->reps[t->n++] = pairs[i];
    }
    if (st != KVR_OK) {
        kvr__gpu_tables_free(t);
        return st;
    }
    *out = t;
    return KVR_OK;
}

/* A class made at the launch (its tables were not given): kept by the
 * job until it ends. */
static kvr_status_t job_keep(kvr__gpu_job_t *job, kvr_gpu_relayout_t *rl,
                             kvr_error_t *err)
{
    kvr_gpu_relayout_t **k = realloc(job->rl, (job->nrl + 1) * sizeof(*k));
    if (k == NULL) {
        kvr_gpu_relayout_destroy(rl);
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    }
    job->rl = k;
    k[job->nrl++] = rl;
    return KVR_OK;
}

/* Whether pair i is the first of its class in pairs (the pairs of a pull
 * alternate among two or three classes, so a later pair finds its class
 * within the first few). */
static bool first_of_class(const kvr_region_pair_t *pairs, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (same_class(&pairs[j], &pairs[i]))
            return false;
    return true;
}

/* Slots of one kvr_gpu_scatter_regions launch. */
#define LAUNCH_SLOTS 128 /* kvr_gpu_scatter_regions' per launch */

static uint32_t req_of(const kvr__gpu_launch_t *l, size_t i)
{
    return l->req ? l->req[i] : 0;
}

/* Request q's relayout of pairs[i]'s class: from its tables, else checked
 * and uploaded now and kept by the job. */
static kvr_status_t class_of(kvr__gpu_job_t *job, void *stream,
                             kvr_gpu_pool_t *pool, const kvr_layout_t *lay,
                             const kvr__gpu_launch_t *l, size_t i,
                             kvr_gpu_relayout_t **rl, kvr_error_t *err)
{
    uint32_t q = req_of(l, i);
    *rl = kvr__gpu_tables_find(l->tables ? l->tables[q] : NULL, &l->pairs[i]);
    if (*rl != NULL)
        return KVR_OK;
    kvr_status_t st =
        class_relayout(stream, pool, lay, &l->pairs[i], &l->reqs[q], rl, err);
    return st == KVR_OK ? job_keep(job, *rl, err) : st;
}

/* Whether the slots of pairs[first]'s class span several requests. */
static bool class_merged(const kvr__gpu_launch_t *l, size_t first)
{
    for (size_t i = first + 1; i < l->n; i++)
        if (req_of(l, i) != req_of(l, first) &&
            same_class(&l->pairs[first], &l->pairs[i]))
            return true;
    return false;
}

static void count_launch(kvr__gpu_job_t *job, size_t slots, uint32_t kernels)
{
    job->launched = job->launched || slots > 0;
    job->kernels += kernels;
    job->slots += (uint32_t)slots;
}

/* The class of pairs[first] over several requests (KVR_AGENT_GPU_MERGE):
 * one kvr_gpu_scatter_requests call, which runs the slots region-major
 * so the items in flight span few regions, as one long request's do
 * (docs/gpu.md, Several requests a launch). Its arrays are allocated per
 * launch: the mode is opt-in and unmeasured. */
static kvr_status_t launch_merged(kvr__gpu_job_t *job, void *stream,
                                  kvr_gpu_pool_t *pool,
                                  const kvr_layout_t *lay,
                                  const kvr__gpu_launch_t *l, size_t first,
                                  uint64_t *bytes, kvr_error_t *err)
{
    kvr_gpu_scatter_slot_t *slots = calloc(l->n + 1, sizeof(*slots));
    const kvr_gpu_relayout_t **rls = calloc(l->nreq + 1, sizeof(*rls));
    uint32_t *at = calloc(l->nreq + 1, sizeof(*at)); /* index + 1 in rls */
    kvr_status_t st = slots && rls && at ? KVR_OK
                                         : kvr_error_set(err, KVR_ERR_NO_MEMORY,
                                                         "no memory");
    size_t m = 0, nrl = 0;
    for (size_t i = first; i < l->n && st == KVR_OK; i++) {
        uint32_t q = req_of(l, i);
        kvr_gpu_relayout_t *rl = NULL;
        if (i > first && !same_class(&l->pairs[first], &l->pairs[i]))
            continue;
        if (at[q] == 0 && (st = class_of(job, stream, pool, lay, l, i, &rl,
                                         err)) == KVR_OK) {
            rls[nrl++] = rl;
            at[q] = (uint32_t)nrl;
        }
        if (st == KVR_OK) {
            slots[m++] = (kvr_gpu_scatter_slot_t){at[q] - 1, l->ranks[i],
                                                  l->src[i], l->dst[i]};
            *bytes += kvr_gpu_relayout_bytes(rls[at[q] - 1], l->ranks[i]);
        }
    }
    if (st == KVR_OK && m > 0) { /* kernels: one per 128 slots at least */
        count_launch(job, m, (uint32_t)((m + LAUNCH_SLOTS - 1) / LAUNCH_SLOTS));
        st = kvr_gpu_scatter_requests(rls, nrl, slots, m, stream, err);
    }
    free(slots);
    free(rls);
    free(at);
    return st;
}

/* The relayout of the class of pairs[first] (from tables, else checked
 * and uploaded now and kept by the job), then one launch for every region
 * of that class and every rank, 128 slots a launch, from slot arrays on
 * the stack: a pull allocates nothing here (kvr_gpu_scatter_regions).
 * Several requests of the class go through launch_merged. */
static kvr_status_t launch_class(kvr__gpu_job_t *job, void *stream,
                                 kvr_gpu_pool_t *pool, const kvr_layout_t *lay,
                                 const kvr__gpu_launch_t *l, size_t first,
                                 uint64_t *bytes, kvr_error_t *err)
{
    if (class_merged(l, first))
        return launch_merged(job, stream, pool, lay, l, first, bytes, err);
    kvr_gpu_relayout_t *rl = NULL;
    kvr_status_t st = class_of(job, stream, pool, lay, l, first, &rl, err);
    const void *s[LAUNCH_SLOTS];
    void *d[LAUNCH_SLOTS];
    uint32_t r[LAUNCH_SLOTS];
    size_t m = 0;
    for (size_t i = first; i < l->n && st == KVR_OK; i++) {
        if (i > first && !same_class(&l->pairs[first], &l->pairs[i]))
            continue;
        s[m] = l->src[i];
        d[m] = l->dst[i];
        r[m++] = l->ranks[i];
        *bytes += kvr_gpu_relayout_bytes(rl, l->ranks[i]);
        if (m == LAUNCH_SLOTS) {
            count_launch(job, m, 1);
            st = kvr_gpu_scatter_regions(rl, r, s, d, m, stream, err);
            m = 0;
        }
    }
    count_launch(job, m, m > 0);
    return st == KVR_OK && m > 0
               ? kvr_gpu_scatter_regions(rl, r, s, d, m, stream, err)
               : st;
}

static void stamp(uint64_t *stamps, int i)
{
    if (stamps != NULL)
        stamps[i] = kvr_now_ns();
}

/* A job of one reference on stream, device made current; *out is NULL
 * only when there was no memory for it. */
static kvr_status_t job_new(int device, void *stream, kvr__gpu_job_t **out,
                            kvr_error_t *err)
{
    kvr__gpu_job_t *job = calloc(1, sizeof(*job));
    *out = job;
    if (job == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    job->refs = job->pulls = 1;
    job->device = device;
    job->stream = stream;
    return kvr_gpu_set_device(device, err);
}

/* kvr__gpu_job_launch; stamps (NULL or 4): set up, event, launched,
 * recorded (kvr__gpu_send's breakdown). waits: the caller synchronises
 * the stream itself, so no completion event is taken or recorded. */
static kvr_status_t job_start(int device, void *stream,
                              struct kvr_gpu_pool *pool,
                              const kvr_layout_t *lay,
                              const kvr__gpu_launch_t *l,
                              kvr__gpu_job_t **out, uint64_t *bytes,
                              bool waits, uint64_t *stamps, kvr_error_t *err)
{
    kvr__gpu_job_t *job = NULL;
    kvr_status_t st = job_new(device, stream, &job, err);
    if (job == NULL)
        return st;
    stamp(stamps, 0);
    if (st == KVR_OK && !waits)
        st = times() && times_start(job) ? KVR_OK
                                          : event_get(device, &job->done, err);
    stamp(stamps, 1);
    *bytes = 0;
    for (size_t q = 0; q < l->nreq; q++)
        job->tokens += l->reqs[q].num_tokens;
    for (size_t i = 0; i < l->n && st == KVR_OK; i++)
        if (first_of_class(l->pairs, i)) {
            uint64_t before = *bytes;
            st = launch_class(job, stream, pool, lay, l, i, bytes, err);
            times_class(job, (uint32_t)l->pairs[i].src.role, *bytes - before);
        }
    stamp(stamps, 2);
    if (job->t0 != NULL) /* timed: when the host had queued it */
        job->queued_ns = kvr_now_ns();
    if (st == KVR_OK && !waits)
        st = kvr_gpu_event_record(job->done, stream, err);
    job->recorded = st == KVR_OK && !waits;
    job->bytes = *bytes;
    stamp(stamps, 3);
    return kvr__gpu_job_end(job, st, out);
}

kvr_status_t kvr__gpu_job_launch(int device, void *stream,
                                 struct kvr_gpu_pool *pool,
                                 const kvr_layout_t *lay,
                                 const kvr__gpu_launch_t *l,
                                 kvr__gpu_job_t **out, uint64_t *bytes,
                                 kvr_error_t *err)
{
    return job_start(device, stream, pool, lay, l, out, bytes, false, NULL,
                     err);
}

kvr_status_t kvr__gpu_job_notify(kvr__gpu_job_t *job, void *side, int fd,
                                 kvr_error_t *err)
{
    if (!job->recorded) /* no event to wait for: after it on its stream */
        return kvr_gpu_stream_notify(job->stream, fd, err);
    kvr_status_t st = kvr_gpu_stream_wait(side, job->done, err);
    return st == KVR_OK ? kvr_gpu_stream_notify(side, fd, err) : st;
}

kvr_status_t kvr__gpu_job_done(kvr__gpu_job_t *job, bool *done,
                               kvr_error_t *err)
{
    int d = 0;
    kvr_status_t st = kvr_gpu_event_done(job->done, &d, err);
    *done = st != KVR_OK || d;
    return st;
}

void kvr__gpu_job_free(kvr__gpu_job_t *job)
{
    if (job == NULL)
        return;
    /* the tables must outlive the launches using them (tables read in
     * place are rewritten by the next upload at once), and a cut pull's
     * mappings its kernels: the event, or (none recorded after kernels
     * that were queued: a failed start, or kvr__gpu_send's) the stream */
    if (job->recorded)
        kvr_gpu_event_sync(job->done, NULL);
    else if (job->launched)
        kvr_gpu_sync(job->stream, NULL);
    if (!kvr__gpu_unref(&job->refs))
        return;
    for (size_t i = 0; i < job->nrl; i++)
        kvr_gpu_relayout_destroy(job->rl[i]);
    if (job->t0 != NULL)
        times_print(job);
    else
        event_put(job->device, job->done);
    free(job->rl);
    free(job);
}

void kvr__gpu_job_share(kvr__gpu_job_t *job)
{
    job->refs++;
    job->pulls++;
}

kvr_status_t kvr__gpu_send(int device, void *stream, struct kvr_gpu_pool *pool,
                           const kvr_layout_t *lay, uint32_t rank,
                           const kvr_region_pair_t *pairs,
                           const void *const *src, void *const *dst, size_t n,
                           const kvr_request_t *req,
                           const kvr__gpu_tables_t *tables, uint64_t *bytes,
                           uint64_t *stamps, kvr_error_t *err)
{
    kvr__gpu_job_t *job = NULL;
    kvr__gpu_tables_t *made = NULL;
    uint32_t *ranks = calloc(n + 1, sizeof(*ranks));
    stamp(stamps, 0);
    if (ranks == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (size_t i = 0; i < n; i++)
        ranks[i] = rank;
    kvr_status_t st = KVR_OK;
    if (tables == NULL)
        st = kvr__gpu_tables_make(device, stream, pool, lay, pairs, n, req,
                                  &made, err);
    stamp(stamps, 1);
    const kvr__gpu_tables_t *t = tables ? tables : made;
    kvr__gpu_launch_t l = {&t, req, 1, NULL, ranks, pairs, src, dst, n};
    if (st == KVR_OK)
        st = job_start(device, stream, pool, lay, &l, &job, bytes, true,
                       stamps ? stamps + 2 : NULL, err);
    free(ranks);
    /* the stream, not an event: one call fewer (the event record cost
     * 4.7 us a launch in the cuda_ipc cell, docs/transport.md) */
    if (st == KVR_OK)
        st = kvr_gpu_sync(stream, err);
    stamp(stamps, 6);
    kvr__gpu_job_free(job);
    kvr__gpu_tables_free(made);
    stamp(stamps, 7);
    return st;
}

/* ---- run copies ---- */

struct kvr__gpu_runs {
    kvr_gpu_runs_t *rt;
};

kvr_status_t kvr__gpu_runs_make(int device, void *stream,
                                struct kvr_gpu_pool *pool,
                                const kvr_plan_t *const *plans,
                                const void *const *src, void *const *dst,
                                size_t n, kvr__gpu_runs_t **out,
                                kvr_error_t *err)
{
    kvr__gpu_runs_t *r = calloc(1, sizeof(*r));
    kvr_status_t st =
        r ? kvr__gpu_runs_of_plans(plans, src, dst, n, &r->rt, err)
          : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory for run tables");
    if (st == KVR_OK)
        st = kvr_gpu_set_device(device, err);
    if (st == KVR_OK)
        st = pool ? kvr_gpu_runs_upload_pool(r->rt, pool, err)
                  : kvr_gpu_runs_upload(r->rt, stream, err);
    if (st != KVR_OK) {
        kvr__gpu_runs_free(r);
        return st;
    }
    *out = r;
    return KVR_OK;
}

kvr_status_t kvr__gpu_runs_copy(const kvr__gpu_runs_t *rt, uint64_t pos,
                                uint64_t len, const void *src_buf,
                                void *dst_buf, void *stream, kvr_error_t *err)
{
    return kvr_gpu_runs_copy(rt->rt, pos, len, src_buf, dst_buf, stream, err);
}

void kvr__gpu_runs_free(kvr__gpu_runs_t *rt)
{
    if (rt == NULL)
        return;
    kvr_gpu_runs_destroy(rt->rt);
    free(rt);
}

kvr_status_t kvr__gpu_job_runs(int device, void *stream,
                               const kvr__gpu_runs_t *rt, uint64_t pos,
                               uint64_t len, const void *src_buf,
                               void *dst_buf, kvr__gpu_job_t **out,
                               kvr_error_t *err)
{
    kvr__gpu_job_t *job = NULL;
    kvr_status_t st = job_new(device, stream, &job, err);
    if (job == NULL)
        return st;
    if (st == KVR_OK)
        st = event_get(device, &job->done, err);
    job->launched = st == KVR_OK;
    if (st == KVR_OK)
        st = kvr__gpu_runs_copy(rt, pos, len, src_buf, dst_buf, stream, err);
    if (st == KVR_OK)
        st = kvr_gpu_event_record(job->done, stream, err);
    job->recorded = st == KVR_OK;
    return kvr__gpu_job_end(job, st, out);
}

kvr_status_t kvr__gpu_runs_time(const kvr__gpu_runs_t *rt, uint64_t len,
                                const void *src_buf, void *dst_buf,
                                void *stream, double *secs, kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    uint64_t best = UINT64_MAX;
    for (int rep = 0; rep < 4 && st == KVR_OK; rep++) { /* the first warms */
        uint64_t t0 = kvr_now_ns();
        st = kvr__gpu_runs_copy(rt, 0, len, src_buf, dst_buf, stream, err);
        if (st == KVR_OK)
            st = kvr_gpu_sync(stream, err);
        uint64_t t = kvr_now_ns() - t0;
        best = rep > 0 && t < best ? t : best;
    }
    *secs = st == KVR_OK ? (double)best * 1e-9 : 0;
    return st;
}

kvr_status_t kvr__gpu_use(int device, kvr_error_t *err)
{
    return kvr_gpu_set_device(device, err);
}

kvr_status_t kvr__gpu_stream_create(int device, void **stream, kvr_error_t *err)
{
    return kvr_gpu_stream_create(device, stream, err);
}

void kvr__gpu_stream_destroy(void *stream)
{
    kvr_gpu_stream_destroy(stream);
}

kvr_status_t kvr__gpu_stream_sync(void *stream, kvr_error_t *err)
{
    return kvr_gpu_sync(stream, err);
}

kvr_status_t kvr__gpu_gate_create(int device, void **gate, kvr_error_t *err)
{
    return kvr_gpu_event_create(device, gate, err);
}

kvr_status_t kvr__gpu_gate_sync(void *gate, kvr_error_t *err)
{
    return kvr_gpu_event_sync(gate, err);
}

void kvr__gpu_gate_destroy(void *gate)
{
    kvr_gpu_event_destroy(gate);
}

kvr_status_t kvr__gpu_gate_arm(void *stream, void *engine_event, void *gate,
                               int fd, kvr_error_t *err)
{
    kvr_status_t st = kvr_gpu_stream_wait(stream, engine_event, err);
    if (st == KVR_OK)
        st = kvr_gpu_event_record(gate, stream, err);
    return st == KVR_OK && fd >= 0 ? kvr_gpu_stream_notify(stream, fd, err)
                                   : st;
}

kvr_status_t kvr__gpu_gate_done(void *gate, bool *done, kvr_error_t *err)
{
    int d = 0;
    kvr_status_t st = kvr_gpu_event_done(gate, &d, err);
    *done = st != KVR_OK || d;
    return st;
}

kvr_status_t kvr__gpu_pool_create(int device, void *stream,
                                  struct kvr_gpu_pool **pool, kvr_error_t *err)
{
    return kvr_gpu_pool_create(device, stream, pool, err);
}

void kvr__gpu_pool_destroy(struct kvr_gpu_pool *pool)
{
    kvr_gpu_pool_destroy(pool);
}

kvr_status_t kvr__gpu_warm(int device, void *stream, kvr_error_t *err)
{
    kvr_status_t st = kvr_gpu_set_device(device, err);
    return st == KVR_OK ? kvr_gpu_warm(stream, err) : st;
}

/* ---- gpu-staged's packer ---- */

#define PACKER_DEPTH_MAX 8u

struct kvr__gpu_packer {
    kvr_exec_packer_t ops;
    int device;
    uint32_t rank;
    size_t n;
    kvr_gpu_relayout_t **rl;
    uint64_t *off; /* stream offset of each pair's share; off[n]: total */
    const void *const *src;
    void *const *dst;
    const void **src_copy; /* the caller's arrays, kept */
    void **dst_copy;
    void *stream;
    void *ev[PACKER_DEPTH_MAX];
};

/* Runs fn over the pairs whose share overlaps stream [pos, pos + len):
 * pack (buf != NULL: bytes into buf) or unpack (from cbuf). */
static kvr_status_t each_share(kvr__gpu_packer_t *k, uint64_t pos,
                               uint64_t len, unsigned char *buf,
                               const unsigned char *cbuf, kvr_error_t *err)
{
    kvr_status_t st = kvr_gpu_set_device(k->device, err);
    for (size_t i = 0; i < k->n && st == KVR_OK; i++) {
        uint64_t lo = pos > k->off[i] ? pos : k->off[i];
        uint64_t hi = pos + len < k->off[i + 1] ? pos + len : k->off[i + 1];
        if (lo >= hi)
            continue;
        st = buf ? kvr_gpu_pack(k->rl[i], k->rank, k->src[i], lo - k->off[i],
                                hi - lo, buf + (lo - pos), k->stream, err)
                 : kvr_gpu_unpack(k->rl[i], k->rank, cbuf + (lo - pos),
                                  lo - k->off[i], hi - lo, k->dst[i],
                                  k->stream, err);
    }
    return st;
}

static kvr_status_t packer_pack(void *ctx, uint64_t pos, uint64_t len,
                                void *dst, uint32_t buf, kvr_error_t *err)
{
    kvr__gpu_packer_t *k = ctx;
    kvr_status_t st = each_share(k, pos, len, dst, NULL, err);
    return st == KVR_OK ? kvr_gpu_event_record(k->ev[buf], k->stream, err)
                        : st;
}

static kvr_status_t packer_wait(void *ctx, uint32_t buf, kvr_error_t *err)
{
    kvr__gpu_packer_t *k = ctx;
    return kvr_gpu_event_sync(k->ev[buf], err);
}

static kvr_status_t packer_unpack(void *ctx, uint64_t pos, uint64_t len,
                                  const void *src, kvr_error_t *err)
{
    kvr__gpu_packer_t *k = ctx;
    kvr_status_t st = each_share(k, pos, len, NULL, src, err);
    return st == KVR_OK ? kvr_gpu_sync(k->stream, err) : st;
}

static kvr_status_t packer_tables(kvr__gpu_packer_t *k, const kvr_layout_t *lay,
                                  const kvr_region_pair_t *pairs,
                                  const kvr_request_t *req, kvr_error_t *err)
{
    kvr_gpu_request_t g = kvr__gpu_request(req);
    kvr_status_t st = KVR_OK;
    for (size_t i = 0; i < k->n && st == KVR_OK; i++) {
        st = kvr_gpu_relayout_create(lay, &pairs[i].src, &pairs[i].dst, &g,
                                     &k->rl[i], err);
        if (st == KVR_OK)
            st = kvr_gpu_relayout_upload(k->rl[i], err);
        if (st == KVR_OK)
            k->off[i + 1] =
                k->off[i] + kvr_gpu_relayout_bytes(k->rl[i], k->rank);
    }
    return st;
}

kvr_status_t kvr__gpu_packer_create(int device, const kvr_layout_t *lay,
                                    uint32_t rank,
                                    const kvr_region_pair_t *pairs,
                                    const void *const *src, void *const *dst,
                                    size_t n, const kvr_request_t *req,
                                    uint32_t depth, kvr__gpu_packer_t **out,
                                    kvr_error_t *err)
{
    if (depth == 0 || depth > PACKER_DEPTH_MAX || n == 0)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "gpu packer: depth %u (1-%u), %zu pairs", depth,
                             PACKER_DEPTH_MAX, n);
    kvr__gpu_packer_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    k->device = device;
    k->rank = rank;
    k->n = n;
    k->rl = calloc(n, sizeof(*k->rl));
    k->off = calloc(n + 1, sizeof(*k->off));
    k->src_copy = calloc(n, sizeof(*k->src_copy));
    k->dst_copy = calloc(n, sizeof(*k->dst_copy));
    kvr_status_t st = k->rl && k->off && k->src_copy && k->dst_copy
                          ? kvr_gpu_set_device(device, err)
                          : kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    for (size_t i = 0; st == KVR_OK && i < n; i++) {
        k->src_copy[i] = src ? src[i] : NULL;
        k->dst_copy[i] = dst ? dst[i] : NULL;
    }
    k->src = k->src_copy;
    k->dst = k->dst_copy;
    if (st == KVR_OK)
        st = packer_tables(k, lay, pairs, req, err);
    if (st == KVR_OK)
        st = kvr_gpu_stream_create(device, &k->stream, err);
    for (uint32_t b = 0; b < depth && st == KVR_OK; b++)
        st = kvr_gpu_event_create(device, &k->ev[b], err);
    k->ops = (kvr_exec_packer_t){.ctx = k,
                                 .depth = depth,
                                 .pack = packer_pack,
                                 .pack_wait = packer_wait,
                                 .unpack = packer_unpack};
    if (st != KVR_OK) {
        kvr__gpu_packer_destroy(k);
        return st;
    }
    *out = k;
    return KVR_OK;
}

const kvr_exec_packer_t *kvr__gpu_packer_ops(const kvr__gpu_packer_t *pk)
{
    return &pk->ops;
}

uint64_t kvr__gpu_packer_bytes(const kvr__gpu_packer_t *pk)
{
    return pk->off[pk->n];
}

void kvr__gpu_packer_destroy(kvr__gpu_packer_t *pk)
{
    if (pk == NULL)
        return;
    if (pk->stream != NULL)
        kvr_gpu_sync(pk->stream, NULL);
    for (uint32_t b = 0; b < PACKER_DEPTH_MAX; b++)
        kvr_gpu_event_destroy(pk->ev[b]);
    kvr_gpu_stream_destroy(pk->stream);
    for (size_t i = 0; pk->rl != NULL && i < pk->n; i++)
        kvr_gpu_relayout_destroy(pk->rl[i]);
    free(pk->rl);
    free(pk->off);
    free(pk->src_copy);
    free(pk->dst_copy);
    free(pk);
}
