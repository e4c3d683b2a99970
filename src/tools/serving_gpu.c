/* `kvrelay bench serving --prefill gpu`: a stage's simulated prefill as
 * compute on its GPU, the way an engine's layer hooks hand KV over: the
 * engine queues a layer group's compute, records an event after it and
 * calls send_ready with that event at once, running ahead of its GPU
 * (docs/performance.md, the GPU's prefill). The compute is a kernel that
 * keeps the engine's stream busy for the group's time (kvr_gpu_spin).
 * Without CUDA every call is refused. */
#include <stdlib.h>

#include "serving.h"

#ifdef CLI_HAVE_CUDA
#include "kvrelay/gpu.h"

struct sv_engine {
    void *stream;
    void *event; /* re-recorded for every group: send_ready's gate took
                    the record it was given (docs/agent.md, CUDA events) */
};

kvr_status_t sv_engine_create(int device, sv_engine_t **out, kvr_error_t *err)
{
    sv_engine_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    kvr_status_t st = kvr_gpu_stream_create(device, &e->stream, err);
    if (st == KVR_OK)
        st = kvr_gpu_event_create(device, &e->event, err);
    if (st == KVR_OK) /* the spin kernel loaded before the first request */
        st = kvr_gpu_spin(e->stream, 0, err);
    if (st == KVR_OK)
        st = kvr_gpu_sync(e->stream, err);
    if (st != KVR_OK) {
        sv_engine_destroy(e);
        return st;
    }
    *out = e;
    return KVR_OK;
}

void sv_engine_destroy(sv_engine_t *e)
{
    if (e == NULL)
        return;
    if (e->stream != NULL)
        kvr_gpu_sync(e->stream, NULL);
    kvr_gpu_event_destroy(e->event);
    kvr_gpu_stream_destroy(e->stream);
    free(e);
}

kvr_status_t sv_engine_step(sv_engine_t *e, uint64_t ns, void **event,
                            kvr_error_t *err)
{
    kvr_status_t st = ns ? kvr_gpu_spin(e->stream, ns, err) : KVR_OK;
    if (st == KVR_OK)
        st = kvr_gpu_event_record(e->event, e->stream, err);
    *event = e->event;
    return st;
}

kvr_status_t sv_engine_mark(sv_engine_t *e, int device, void **mark,
                            kvr_error_t *err)
{
    kvr_status_t st = kvr_gpu_event_create(device, mark, err);
    if (st == KVR_OK && (st = kvr_gpu_event_record(*mark, e->stream, err)))
        kvr_gpu_event_destroy(*mark);
    return st;
}

kvr_status_t sv_engine_passed(void *mark, bool *done, kvr_error_t *err)
{
    int d = 0;
    kvr_status_t st = kvr_gpu_event_done(mark, &d, err);
    *done = d != 0;
    return st;
}

void sv_engine_unmark(void *mark)
{
    kvr_gpu_event_destroy(mark);
}

#else

static kvr_status_t no_cuda(kvr_error_t *err)
{
    return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                         "--prefill gpu: kvrelay was built without CUDA");
}

kvr_status_t sv_engine_create(int device, sv_engine_t **out, kvr_error_t *err)
{
    (void)device, (void)out;
    return no_cuda(err);
}

void sv_engine_destroy(sv_engine_t *e)
{
    (void)e;
}

kvr_status_t sv_engine_step(sv_engine_t *e, uint64_t ns, void **event,
                            kvr_error_t *err)
{
    (void)e, (void)ns, (void)event;
    return no_cuda(err);
}

kvr_status_t sv_engine_mark(sv_engine_t *e, int device, void **mark,
                            kvr_error_t *err)
{
    (void)e, (void)device, (void)mark;
    return no_cuda(err);
}

kvr_status_t sv_engine_passed(void *mark, bool *done, kvr_error_t *err)
{
    (void)mark;
    *done = true;
    return no_cuda(err);
}

void sv_engine_unmark(void *mark)
{
    (void)mark;
}

#endif

bool sv_engine_built(void)
{
#ifdef CLI_HAVE_CUDA
    return true;
#else
    return false;
#endif
}
