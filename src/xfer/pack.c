/* Host pack/unpack: the byte stream of a transfer is every segment's runs
 * in plan order (destination order), so a consumer unpacks chunk by chunk
 * with the same plan the producer packed with. */
#include <string.h>

#include "xfer_internal.h"

uint64_t kvr_xfer_stream_bytes(const kvr_xfer_seg_t *segs, size_t n)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += kvr_plan_bytes(segs[i].plan);
    return bytes;
}

/* The run under the cursor, stepping over finished runs and segments;
 * NULL at the end of the stream. */
static const kvr_run_t *cur_run(const kvr_xfer_seg_t *segs, size_t n,
                                kvr_xfer_cursor_t *cur)
{
    while (cur->seg < n) {
        size_t num_runs;
        const kvr_run_t *runs = kvr_plan_runs(segs[cur->seg].plan, &num_runs);
        if (cur->run < num_runs && cur->in_run < runs[cur->run].len)
            return &runs[cur->run];
        if (cur->run < num_runs) {
            cur->run++;
        } else {
            cur->seg++;
            cur->run = 0;
        }
        cur->in_run = 0;
    }
    return NULL;
}

static void seek(const kvr_xfer_seg_t *segs, size_t n, kvr_xfer_cursor_t *cur,
                 uint64_t pos)
{
    if (pos < cur->pos)
        memset(cur, 0, sizeof(*cur));
    while (cur->pos < pos) {
        const kvr_run_t *r = cur_run(segs, n, cur);
        if (r == NULL)
            return;
        uint64_t step = r->len - cur->in_run;
        if (step > pos - cur->pos)
            step = pos - cur->pos;
        cur->in_run += step;
        cur->pos += step;
    }
}

/* The hot loop of staging: one memcpy per run piece, runs walked in
 * place (a run per 576-byte token at I = 1). */
static void copy_stream(const kvr_xfer_seg_t *segs, size_t n,
                        kvr_xfer_cursor_t *cur, uint64_t pos,
                        unsigned char *buf, uint64_t len, bool pack)
{
    seek(segs, n, cur, pos);
    while (len != 0 && cur->seg < n) {
        size_t num_runs;
        const kvr_run_t *runs = kvr_plan_runs(segs[cur->seg].plan, &num_runs);
        const unsigned char *src = segs[cur->seg].src;
        unsigned char *dst = segs[cur->seg].dst_local;
        while (len != 0 && cur->run < num_runs) {
            const kvr_run_t *r = &runs[cur->run];
            uint64_t step = r->len - cur->in_run;
            step = step < len ? step : len;
            if (pack)
                memcpy(buf, src + r->src + cur->in_run, step);
            else
                memcpy(dst + r->dst + cur->in_run, buf, step);
            cur->pos += step;
            buf += step;
            len -= step;
            cur->in_run += step;
            if (cur->in_run == r->len) {
                cur->run++;
                cur->in_run = 0;
            }
        }
        if (cur->run >= num_runs) {
            cur->seg++;
            cur->run = 0;
            cur->in_run = 0;
        }
    }
}

void kvr_xfer_pack(const kvr_xfer_seg_t *segs, size_t n, kvr_xfer_cursor_t *cur,
                   uint64_t pos, void *buf, uint64_t len)
{
    copy_stream(segs, n, cur, pos, buf, len, true);
}

void kvr_xfer_unpack(const kvr_xfer_seg_t *segs, size_t n,
                     kvr_xfer_cursor_t *cur, uint64_t pos, const void *buf,
                     uint64_t len)
{
    /* copy_stream only reads buf when unpacking */
    copy_stream(segs, n, cur, pos, (unsigned char *)(uintptr_t)buf, len, false);
}
