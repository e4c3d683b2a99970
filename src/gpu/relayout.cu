/* Relayout kernels: direct scatter into peer pages, pack into and unpack
 * from consumer-ordered staging. relayout_kernel moves the pieces of
 * relayout_map.h for all three: a warp takes 32 items (a piece, or an even
 * part of a large one, of at most 64 vectors), each lane works out one
 * item's addresses with the layout math, then the warp copies the items a
 * few at a time, every lane moving up to two vectors of each. Index
 * arithmetic is paid once per item; stores are full-warp and contiguous
 * (pieces are contiguous on the destination, so whole 128-byte lines go
 * over NVLink), loads follow the source's chunks. One-rank scatters of
 * small MLA chunks go through chunk_kernel instead: an item is one source
 * chunk, copied by a team of 8 lanes. */
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "cuda_util.cuh"

namespace
{

enum Mode : uint32_t { SCATTER_ALL, SCATTER, PACK, UNPACK };

/* A launch's parameters. R: its slots; one-slot jobs (pack, unpack, a
 * one-region scatter: the gpu-direct pull's launch) pass 200 bytes where
 * the 64-slot form passes 1.3 KB, which the driver copies into every
 * launch (docs/gpu.md, The cell under fair conditions). */
template <int R> struct JobT {
    kvr__rl_geom_t g;          /* device tables */
    const unsigned char *src;  /* region, or staging */
    unsigned char *dst[R];     /* SCATTER_ALL: per rank; SCATTER: per slot */
    const unsigned char *srcs[R]; /* SCATTER: per slot */
    uint16_t ranks[R];            /* SCATTER: per slot */
    uint32_t regions;      /* SCATTER: slots (a region for a rank), >= 1 */
    uint32_t region_items; /* SCATTER: items of each */
    uint64_t lo, hi;       /* stream range, pack/unpack */
    uint64_t stride;       /* source chunk distance */
    kvr__div chunk;        /* source chunk bytes */
    uint32_t mode, rank;
    uint32_t item0, num_items;
    uint32_t parts; /* items per piece */
    uint32_t part_bytes;
};

typedef JobT<KVR__GPU_MAX_RANKS> Job; /* every rank at once */
/* Slots of one kvr_gpu_scatter_regions launch: a PP stage's MLA layers
 * (about 20) for every rank of W = 4 in one kernel, not 64 and 16; a
 * kernel of a serving request's few hundred microseconds paid a fixed
 * cost of its own (docs/performance.md, run 2026-12-02j). */
constexpr int SLOTS = 128;
typedef JobT<SLOTS> JobS;
typedef JobT<1> Job1;

/* A kvr_gpu_scatter_requests launch: several requests of one class, each
 * its own tables (a geometry), their slots region-major so that the items
 * in flight at once span few layer regions however short the requests
 * (docs/gpu.md, Several requests a launch). Slot k's items are
 * [first[k], first[k + 1]) (the last up to num_items), in the order of
 * its relayout's pieces for its rank. */
constexpr int MERGE_GEOMS = 8;
constexpr int MERGE_SLOTS = 128;
struct JobM {
    kvr__rl_geom_t g[MERGE_GEOMS]; /* device tables */
    const unsigned char *srcs[MERGE_SLOTS];
    unsigned char *dst[MERGE_SLOTS];
    uint32_t first[MERGE_SLOTS];
    uint16_t ranks[MERGE_SLOTS];
    uint8_t geoms[MERGE_SLOTS]; /* index into g */
    uint32_t slots;
    uint64_t stride;
    kvr__div chunk;
    uint32_t item0, num_items;
    uint32_t parts, part_bytes;
};

/* A kernel's parameters must fit CUDA's 4 KiB. */
static_assert(sizeof(Job) <= 4096, "relayout Job too large for a parameter");
static_assert(sizeof(JobS) <= 4096, "relayout JobS too large for a parameter");
static_assert(sizeof(JobM) <= 4096, "relayout JobM too large for a parameter");
static_assert(sizeof(Job1) <= 256, "one-slot relayout Job grew");

/* Bytes [x0, x0 + len) of a piece; src and dst are the addresses of the
 * piece's byte 0 on each side (the source side in chunks). */
struct Item {
    uint64_t src, dst;
    uint32_t x0, len;
};

/* Clips the part [a, b) of piece p to the job's stream range. */
template <typename J>
__device__ bool clip(const J &j, const kvr__rl_piece_t &p, uint64_t *a,
                     uint64_t *b)
{
    if (j.mode != PACK && j.mode != UNPACK)
        return *a < *b;
    uint64_t s0 = max(p.stream + *a, j.lo), s1 = min(p.stream + *b, j.hi);
    *a = s0 - p.stream;
    *b = s1 - p.stream;
    return s0 < s1;
}

template <int R> __device__ Item describe(const JobT<R> &j, uint32_t item)
{
    Item it = {0, 0, 0, 0};
    uint32_t rank = j.rank;
    if (R > 1 && j.mode == SCATTER_ALL) { /* rank-minor: a replicated page's W
                                    copies are read back to back */
        uint32_t i = item / j.g.W;
        rank = item - i * j.g.W;
        item = i;
    }
    uint32_t r = 0; /* SCATTER: slot-major, each slot's items whole */
    if (R > 1 && j.mode == SCATTER && j.regions > 1) {
        r = item / j.region_items;
        item -= r * j.region_items;
        rank = j.ranks[r];
    }
    uint32_t piece = item / j.parts, part = item - piece * j.parts;
    kvr__rl_piece_t p = kvr__rl_piece_at(&j.g, rank, piece);
    uint64_t a = (uint64_t)part * j.part_bytes;
    uint64_t b = min(p.len, a + j.part_bytes);
    if (!clip(j, p, &a, &b))
        return it;
    uint64_t region = (uint64_t)(j.mode == SCATTER ? j.srcs[r] : j.src) + p.src;
    uint64_t staged = p.stream - j.lo;
    it.x0 = (uint32_t)a;
    it.len = (uint32_t)(b - a);
    switch (j.mode) {
    case SCATTER_ALL:
    case SCATTER:
        it.src = region;
        it.dst = (uint64_t)j.dst[R > 1 && j.mode == SCATTER_ALL ? rank : r] +
                 p.dst;
        break;
    case PACK:
        it.src = region;
        it.dst = (uint64_t)j.dst[0] + staged;
        break;
    default:
        it.src = (uint64_t)j.src + staged;
        it.dst = (uint64_t)j.dst[0] + p.dst;
    }
    return it;
}

/* The slot holding `item`: the last whose first item is at most it (a
 * slot of no items shares its first with the next). Lanes of a warp
 * mostly fall in one slot, so the parameter loads mostly broadcast. */
__device__ uint32_t slot_of(const JobM &j, uint32_t item)
{
    uint32_t lo = 0, n = j.slots;
    while (n > 1) {
        uint32_t half = n / 2;
        if (j.first[lo + half] <= item)
            lo += half;
        n -= half;
    }
    return lo;
}

__device__ Item describe(const JobM &j, uint32_t item)
{
    Item it = {0, 0, 0, 0};
    uint32_t k = slot_of(j, item);
    item -= j.first[k];
    uint32_t piece = item / j.parts, part = item - piece * j.parts;
    kvr__rl_piece_t p = kvr__rl_piece_at(&j.g[j.geoms[k]], j.ranks[k], piece);
    uint64_t a = (uint64_t)part * j.part_bytes;
    uint64_t b = min(p.len, a + j.part_bytes);
    if (a >= b)
        return it;
    it.src = (uint64_t)j.srcs[k] + p.src;
    it.dst = (uint64_t)j.dst[k] + p.dst;
    it.x0 = (uint32_t)a;
    it.len = (uint32_t)(b - a);
    return it;
}

__device__ Item from_lane(const Item &it, int lane)
{
    Item o;
    o.src = __shfl_sync(~0u, it.src, lane);
    o.dst = __shfl_sync(~0u, it.dst, lane);
    o.x0 = __shfl_sync(~0u, it.x0, lane);
    o.len = __shfl_sync(~0u, it.len, lane);
    return o;
}

/* Source address of byte x of a piece. */
template <typename J>
__device__ __forceinline__ uint64_t source_at(const J &j, uint64_t src,
                                              uint32_t x)
{
    uint32_t c = kvr__div_by(j.chunk, x);
    return src + c * j.stride + (x - c * j.chunk.d);
}

/* Items a warp copies together: each lane keeps 2 * STEP vectors in
 * flight, every load of the group issued before its first store. On an
 * H200 STEP 2, 4 and 8 measured the same on the one-rank MLA gather (0.79
 * of a device copy; docs/gpu.md, Relayout kernel speed): more items a
 * step cost registers, so fewer warps, and the bytes in flight an SM stay
 * the same; 16 was slower. */
#ifndef KVR_RL_STEP
#define KVR_RL_STEP 2
#endif

template <typename J, typename V, int STEP>
__device__ void copy_items(const J &j, const Item (&it)[STEP], uint32_t lane)
{
    V v[STEP][2];
#pragma unroll
    for (int s = 0; s < STEP; s++) {
        uint32_t n = it[s].len / sizeof(V);
        uint32_t x = it[s].x0 + lane * (uint32_t)sizeof(V);
        if (lane < n)
            v[s][0] = __ldg((const V *)source_at(j, it[s].src, x));
        if (lane + 32 < n)
            v[s][1] = __ldg(
                (const V *)source_at(j, it[s].src, x + 32 * sizeof(V)));
    }
#pragma unroll
    for (int s = 0; s < STEP; s++) {
        V *dst = (V *)(it[s].dst + it[s].x0);
        uint32_t n = it[s].len / sizeof(V);
        if (lane < n)
            dst[lane] = v[s][0];
        if (lane + 32 < n)
            dst[lane + 32] = v[s][1];
    }
}

constexpr int THREADS = 256;

template <typename J, typename V, int STEP>
__global__ void __launch_bounds__(THREADS) relayout_kernel(const J j)
{
    uint32_t lane = threadIdx.x & 31;
    uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    uint32_t warps = (gridDim.x * blockDim.x) >> 5;
    for (uint32_t base = warp * 32; base < j.num_items; base += warps * 32) {
        Item mine = {0, 0, 0, 0};
        if (base + lane < j.num_items)
            mine = describe(j, j.item0 + base + lane);
        uint32_t left = min(32u, j.num_items - base);
        for (uint32_t k = 0; k < left; k += STEP) {
            Item it[STEP];
#pragma unroll
            for (int s = 0; s < STEP; s++)
                it[s] = from_lane(mine, (int)k + s);
            copy_items<J, V, STEP>(j, it, lane);
        }
    }
}

/* The MLA gather of small chunks (I tokens, at most CHUNK_MAX bytes):
 * an item is one source chunk, contiguous on both sides, copied by a team
 * of G lanes with U vectors each in flight, as the run copy does
 * (kvr__copy_team): more bytes in flight an SM than relayout_kernel's two
 * items a lane, whose registers bound it to half occupancy (docs/gpu.md,
 * Relayout kernel speed). */
constexpr uint32_t CHUNK_MAX = 4096;

template <typename J, typename V, int G, int U>
__global__ void __launch_bounds__(THREADS) chunk_kernel(const J j)
{
    uint32_t lane = threadIdx.x % G;
    uint32_t team = (blockIdx.x * blockDim.x + threadIdx.x) / G;
    uint32_t teams = (gridDim.x * blockDim.x) / G;
    for (uint32_t i = team; i < j.num_items; i += teams) {
        Item it = describe(j, j.item0 + i);
        if (it.len == 0)
            continue;
        kvr__copy_team<V, G, U>(
            (const unsigned char *)source_at(j, it.src, it.x0),
            (unsigned char *)(it.dst + it.x0), it.len, lane);
    }
}

/* At most kvr__rl_tune_grid blocks a launch (0: as many as fit): the
 * benches' knob (bench_rl_trace --grid). A smaller grid narrows the span
 * of the items in flight, and lowered large requests' rate more than
 * short ones' (docs/performance.md, run 2026-12-02m). */
unsigned grid_cap(unsigned blocks)
{
    int cap = kvr__rl_tune_grid;
    return cap > 0 && blocks > (unsigned)cap ? (unsigned)cap : blocks;
}

template <typename J, typename V, int G, int U>
kvr_status_t launch_team(const J &j, cudaStream_t stream, kvr_error_t *err)
{
    unsigned blocks = 0;
    kvr_status_t st = kvr__grid_size((const void *)chunk_kernel<J, V, G, U>,
                                     THREADS, 0, (uint64_t)j.num_items * G,
                                     &blocks, err);
    if (st != KVR_OK)
        return st;
    blocks = grid_cap(blocks);
    chunk_kernel<J, V, G, U><<<blocks, THREADS, 0, stream>>>(j);
    return kvr__launch_status("relayout chunk_kernel", err);
}

/* Teams of 8 lanes, 5 vectors each (a 576-byte token of 16-byte vectors
 * in one round): on an H200 the one-rank gather ran at 0.859 of a device
 * copy, the items kernel at 0.820 in the same run, teams of 4 lanes of 9
 * at 0.826, the run copy's 8 of 8 at 0.807, and capping registers for
 * more blocks an SM (spills) at 0.615 (docs/gpu.md, Relayout kernel
 * speed). The knob's 3: 4 lanes of 9, 4: 8 lanes of 8. */
template <typename J, typename V>
kvr_status_t launch_chunks(const J &j, cudaStream_t stream, kvr_error_t *err)
{
    if (kvr__rl_tune_chunks == 3)
        return launch_team<J, V, 4, 9>(j, stream, err);
    if (kvr__rl_tune_chunks == 4)
        return launch_team<J, V, 8, 8>(j, stream, err);
    return launch_team<J, V, 8, 5>(j, stream, err);
}

/* Widest access (16, 8, 4 or 1 bytes) that divides every size, offset and
 * base pointer in `bits`. */
uint32_t vector_bytes(uint64_t bits)
{
    if (bits % 16 == 0)
        return 16;
    if (bits % 8 == 0)
        return 8;
    return bits % 4 == 0 ? 4 : 1;
}

/* Every piece length, page and stream offset is a multiple of these. */
uint64_t geometry_bits(const kvr__rl_geom_t *g)
{
    uint64_t bits = g->src_page | g->dst_page | g->unit;
    if (g->kind == KVR__RL_REPL)
        bits |= (uint64_t)g->bs * g->unit | (uint64_t)g->bs * 4;
    return bits;
}

template <typename J, typename V, int STEP>
kvr_status_t launch_step(const J &j, cudaStream_t stream, kvr_error_t *err)
{
    unsigned blocks = 0; /* a thread an item: a warp per 32 items */
    kvr_status_t st =
        kvr__grid_size((const void *)relayout_kernel<J, V, STEP>, THREADS, 0,
                       j.num_items, &blocks, err);
    if (st != KVR_OK)
        return st;
    blocks = grid_cap(blocks);
    relayout_kernel<J, V, STEP><<<blocks, THREADS, 0, stream>>>(j);
    return kvr__launch_status("relayout_kernel", err);
}

template <typename J, typename V>
kvr_status_t launch_as(const J &j, cudaStream_t stream, bool chunked,
                       kvr_error_t *err)
{
    if (chunked)
        return launch_chunks<J, V>(j, stream, err);
    switch (kvr__rl_tune_step) {
    case 2:
        return launch_step<J, V, 2>(j, stream, err);
    case 4:
        return launch_step<J, V, 4>(j, stream, err);
    case 8:
        return launch_step<J, V, 8>(j, stream, err);
    case 16:
        return launch_step<J, V, 16>(j, stream, err);
    default:
        return launch_step<J, V, KVR_RL_STEP>(j, stream, err);
    }
}

kvr_status_t device_tables(const kvr_gpu_relayout_t *rl, kvr__rl_geom_t *g,
                           kvr_error_t *err)
{
    int dev = 0;
    KVR__CUDA_TRY(cudaGetDevice(&dev), err);
    if (dev < 0 || dev >= KVR__GPU_MAX_DEVICES || rl->device[dev] == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "relayout tables are not on device %d: call "
                             "kvr_gpu_relayout_upload there first",
                             dev);
    const uint32_t *t = (const uint32_t *)rl->device[dev];
    *g = rl->geom;
    g->src_blocks = t + (rl->geom.src_blocks - rl->tables);
    g->dst_blocks = t + (rl->geom.dst_blocks - rl->tables);
    g->order = t + (rl->geom.order - rl->tables);
    return KVR_OK;
}

/* How pieces are cut into items, the same for every relayout of a class
 * (and vector width vb). */
struct Shape {
    kvr__div chunk; /* source chunk bytes */
    uint64_t stride;
    uint32_t parts, part_bytes;
    bool chunked; /* chunk_kernel, an item a source chunk */
};

kvr_status_t item_shape(const kvr__rl_geom_t *g, uint32_t mode, uint32_t vb,
                        Shape *s, kvr_error_t *err)
{
    /* Parts of at most 64 vectors (two per lane), of even size. */
    uint64_t piece = kvr__rl_max_piece(g);
    if (piece > INT32_MAX)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "relayout pieces of %llu bytes exceed 2^31",
                             (unsigned long long)piece);
    bool strided = g->kind == KVR__RL_MLA && mode != UNPACK;
    s->chunk = kvr__div_make(strided ? g->I * (uint32_t)g->unit : INT32_MAX);
    s->stride = strided ? (uint64_t)g->I * g->W * g->unit : 0;
    /* one-rank scatters of small MLA chunks: an item a chunk
     * (chunk_kernel); every rank at once reads whole pages, where the
     * items kernel measured faster (0.921 against 0.871) */
    s->chunked = strided && mode == SCATTER && s->chunk.d <= CHUNK_MAX &&
                 kvr__rl_tune_chunks != 1;
    s->parts = s->chunked ? (uint32_t)(piece / s->chunk.d)
                          : (uint32_t)((piece + 64 * vb - 1) / (64 * vb));
    s->part_bytes = s->chunked ? s->chunk.d
                               : (uint32_t)((piece + s->parts * vb - 1) /
                                            (s->parts * vb) * vb);
    return KVR_OK;
}

template <typename J> void set_shape(J &j, const Shape &s)
{
    j.chunk = s.chunk;
    j.stride = s.stride;
    j.parts = s.parts;
    j.part_bytes = s.part_bytes;
}

kvr_status_t too_many_items(uint64_t items, uint32_t part_bytes,
                            kvr_error_t *err)
{
    return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                         "relayout of %llu items of %u bytes exceeds the "
                         "kernel's 2^31",
                         (unsigned long long)items, part_bytes);
}

/* The job's kernels for accesses of vb bytes. */
template <typename J>
kvr_status_t launch_vb(const J &j, uint32_t vb, bool chunked, void *stream,
                       kvr_error_t *err)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (vb == 16)
        return launch_as<J, uint4>(j, s, chunked, err);
    if (vb == 8)
        return launch_as<J, uint2>(j, s, chunked, err);
    if (vb == 4)
        return launch_as<J, uint32_t>(j, s, chunked, err);
    return launch_as<J, unsigned char>(j, s, chunked, err);
}

/* Runs pieces [first, first + count) of the job's rank(s). */
template <int R>
kvr_status_t launch(const kvr_gpu_relayout_t *rl, JobT<R> &j, uint64_t bits,
                    uint32_t first, uint32_t count, void *stream,
                    kvr_error_t *err)
{
    kvr_status_t st = device_tables(rl, &j.g, err);
    if (st != KVR_OK || count == 0)
        return st;
    uint32_t vb = vector_bytes(bits | geometry_bits(&j.g));
    uint64_t ranks = j.mode == SCATTER_ALL ? j.g.W
                     : j.mode == SCATTER   ? j.regions
                                           : 1; /* copies of each item */
    Shape sh;
    st = item_shape(&j.g, j.mode, vb, &sh, err);
    if (st != KVR_OK)
        return st;
    set_shape(j, sh);
    uint64_t items = (uint64_t)count * j.parts * ranks;
    if ((uint64_t)(first + count) * j.parts * ranks > INT32_MAX)
        return too_many_items(items, j.part_bytes, err);
    j.item0 = first * j.parts;
    j.num_items = (uint32_t)items;
    j.region_items = count * j.parts;
    return launch_vb(j, vb, sh.chunked, stream, err);
}

uint32_t all_pieces(const kvr_gpu_relayout_t *rl)
{
    return rl->geom.num_blocks * kvr__rl_pieces_per_block(&rl->geom);
}

kvr_status_t check_pointers(const void *a, const void *b, kvr_error_t *err)
{
    if (a == NULL || b == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "buffer is NULL");
    return KVR_OK;
}

/* A one-rank job from src into dst. */
template <int R = 1>
JobT<R> rank_job(Mode mode, uint32_t rank, const void *src, void *dst)
{
    JobT<R> j = {};
    j.mode = mode;
    j.rank = rank;
    j.src = j.srcs[0] = (const unsigned char *)src;
    j.dst[0] = (unsigned char *)dst;
    j.ranks[0] = (uint16_t)rank;
    j.regions = 1;
    return j;
}

/* Pack or unpack rank's stream bytes [offset, offset + len). */
kvr_status_t run_range(const kvr_gpu_relayout_t *rl, Mode mode, uint32_t rank,
                       const void *src, void *dst, uint64_t offset,
                       uint64_t len, void *stream, kvr_error_t *err)
{
    kvr_status_t st = kvr__rl_check_range(rl, rank, offset, len, err);
    if (st != KVR_OK || len == 0)
        return st;
    st = check_pointers(src, dst, err);
    if (st != KVR_OK)
        return st;
    Job1 j = rank_job(mode, rank, src, dst);
    j.lo = offset;
    j.hi = offset + len;
    uint32_t s0, s1, per = kvr__rl_pieces_per_block(&rl->geom);
    kvr__rl_block_span(&rl->geom, rank, offset, len, &s0, &s1);
    uint64_t bits = (uintptr_t)src | (uintptr_t)dst | offset | len;
    return launch(rl, j, bits, s0 * per, (s1 - s0) * per, stream, err);
}

} // namespace

/* Benchmark knobs (bench/gpu/bench_rl_kernel.c), 0 for the defaults. */
int kvr__rl_tune_step = 0;
int kvr__rl_tune_chunks = 0;
int kvr__rl_tune_grid = 0;
int kvr__rl_tune_merge_order = 0;

/* The current device, as an index into rl's per-device copies; *done
 * when it has one already. */
static kvr_status_t upload_slot(const kvr_gpu_relayout_t *rl, int *dev,
                                bool *done, kvr_error_t *err)
{
    if (rl == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "relayout is NULL");
    KVR__CUDA_TRY(cudaGetDevice(dev), err);
    if (*dev < 0 || *dev >= KVR__GPU_MAX_DEVICES)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "device %d: at most %d devices", *dev,
                             KVR__GPU_MAX_DEVICES);
    *done = rl->device[*dev] != NULL;
    return KVR_OK;
}

extern "C" kvr_status_t kvr_gpu_relayout_upload(kvr_gpu_relayout_t *rl,
                                                kvr_error_t *err)
{
    int dev = 0;
    bool done = false;
    kvr_status_t st = upload_slot(rl, &dev, &done, err);
    if (st != KVR_OK || done)
        return st;
    void *p = NULL;
    size_t bytes = rl->table_words * sizeof(uint32_t);
    KVR__CUDA_TRY(cudaMalloc(&p, bytes), err);
    cudaError_t e = cudaMemcpy(p, rl->tables, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(p);
        return kvr__cuda_status(e, "cudaMemcpy(relayout tables)", err);
    }
    rl->device[dev] = p;
    rl->free_device = kvr__cuda_free_on;
    return KVR_OK;
}

extern "C" kvr_status_t kvr_gpu_relayout_upload_async(kvr_gpu_relayout_t *rl,
                                                      void *stream,
                                                      kvr_error_t *err)
{
    int dev = 0;
    bool done = false;
    kvr_status_t st = upload_slot(rl, &dev, &done, err);
    if (st != KVR_OK || done)
        return st;
    if (stream == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "stream is NULL");
    cudaStream_t s = (cudaStream_t)stream;
    void *p = NULL;
    size_t bytes = rl->table_words * sizeof(uint32_t);
    KVR__CUDA_TRY(cudaMallocAsync(&p, bytes, s), err);
    /* pageable source: staged at once, the host may reuse it on return */
    cudaError_t e = cudaMemcpyAsync(p, rl->tables, bytes,
                                    cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        cudaFreeAsync(p, s);
        return kvr__cuda_status(e, "cudaMemcpyAsync(relayout tables)", err);
    }
    rl->device[dev] = p;
    rl->device_owner[dev] = stream;
    rl->free_device = kvr__cuda_free_on;
    return KVR_OK;
}

extern "C" kvr_status_t kvr_gpu_relayout_upload_pool(kvr_gpu_relayout_t *rl,
                                                     kvr_gpu_pool_t *pool,
                                                     kvr_error_t *err)
{
    int dev = 0;
    bool done = false;
    kvr_status_t st = upload_slot(rl, &dev, &done, err);
    if (st != KVR_OK || done)
        return st;
    if (pool == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "pool is NULL");
    cudaStream_t s = (cudaStream_t)kvr__pool_stream(pool);
    void *p = NULL;
    size_t bytes = rl->table_words * sizeof(uint32_t);
    st = kvr__pool_get(pool, bytes, &p, err);
    if (st != KVR_OK)
        return st;
    /* after every launch queued on s so far, some of which may still read
     * this block under its last owner's tables */
    cudaError_t e = cudaMemcpyAsync(p, rl->tables, bytes,
                                    cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        kvr__pool_put(p, bytes, pool);
        return kvr__cuda_status(e, "cudaMemcpyAsync(relayout tables)", err);
    }
    rl->device[dev] = p;
    rl->device_owner[dev] = pool;
    rl->free_device = kvr__pool_put;
    return KVR_OK;
}

extern "C" kvr_status_t kvr_gpu_relayout_upload_mapped(kvr_gpu_relayout_t *rl,
                                                       kvr_gpu_pool_t *pool,
                                                       kvr_error_t *err)
{
    int dev = 0;
    bool done = false;
    kvr_status_t st = upload_slot(rl, &dev, &done, err);
    if (st != KVR_OK || done)
        return st;
    if (pool == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "pool is NULL");
    size_t bytes = rl->table_words * sizeof(uint32_t);
    void *host = NULL, *p = NULL;
    if (kvr__pool_mapped_get(pool, bytes, &host, &p) != KVR_OK)
        return kvr_gpu_relayout_upload_pool(rl, pool, err);
    /* read by kernels launched after this store (a launch orders it) */
    memcpy(host, rl->tables, bytes);
    rl->device[dev] = p;
    rl->device_owner[dev] = pool;
    rl->free_device = kvr__pool_mapped_put;
    return KVR_OK;
}

/* The default kernels of one job form, launched empty. */
template <typename J> static void warm(cudaStream_t s)
{
    J j = {};
    j.chunk = kvr__div_make(1);
    relayout_kernel<J, uint4, KVR_RL_STEP><<<1, THREADS, 0, s>>>(j);
    relayout_kernel<J, uint2, KVR_RL_STEP><<<1, THREADS, 0, s>>>(j);
    relayout_kernel<J, uint32_t, KVR_RL_STEP><<<1, THREADS, 0, s>>>(j);
    relayout_kernel<J, unsigned char, KVR_RL_STEP><<<1, THREADS, 0, s>>>(j);
    chunk_kernel<J, uint4, 8, 5><<<1, THREADS, 0, s>>>(j);
    chunk_kernel<J, uint2, 8, 5><<<1, THREADS, 0, s>>>(j);
    chunk_kernel<J, uint32_t, 8, 5><<<1, THREADS, 0, s>>>(j);
    chunk_kernel<J, unsigned char, 8, 5><<<1, THREADS, 0, s>>>(j);
}

kvr_status_t kvr__relayout_warm(void *stream, kvr_error_t *err)
{
    warm<Job1>((cudaStream_t)stream);
    warm<Job>((cudaStream_t)stream);
    warm<JobS>((cudaStream_t)stream);
    warm<JobM>((cudaStream_t)stream);
    return kvr__launch_status("relayout_kernel (warm-up)", err);
}

extern "C" kvr_status_t kvr_gpu_scatter(const kvr_gpu_relayout_t *rl,
                                        const void *src_base,
                                        void *const *dst_bases, void *stream,
                                        kvr_error_t *err)
{
    if (rl == NULL || src_base == NULL || dst_bases == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "relayout or buffer is NULL");
    if (rl->geom.W > KVR__GPU_MAX_RANKS)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "scatter into %u ranks at once: at most %d, use "
                             "kvr_gpu_scatter_rank",
                             rl->geom.W, KVR__GPU_MAX_RANKS);
    Job j = {};
    j.mode = SCATTER_ALL;
    j.src = (const unsigned char *)src_base;
    uint64_t bits = (uintptr_t)src_base;
    for (uint32_t r = 0; r < rl->geom.W; r++) {
        if (dst_bases[r] == NULL)
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "rank %u's destination is NULL", r);
        j.dst[r] = (unsigned char *)dst_bases[r];
        bits |= (uintptr_t)dst_bases[r];
    }
    return launch(rl, j, bits, 0, all_pieces(rl), stream, err);
}

extern "C" kvr_status_t kvr_gpu_scatter_rank(const kvr_gpu_relayout_t *rl,
                                             uint32_t rank,
                                             const void *src_base,
                                             void *dst_base, void *stream,
                                             kvr_error_t *err)
{
    kvr_status_t st = kvr__rl_check_range(rl, rank, 0, 0, err);
    if (st == KVR_OK)
        st = check_pointers(src_base, dst_base, err);
    if (st != KVR_OK)
        return st;
    Job1 j = rank_job(SCATTER, rank, src_base, dst_base);
    uint64_t bits = (uintptr_t)src_base | (uintptr_t)dst_base;
    return launch(rl, j, bits, 0, all_pieces(rl), stream, err);
}

/* One launch of m <= R slots. */
template <int R>
static kvr_status_t scatter_slots(const kvr_gpu_relayout_t *rl,
                                  const uint32_t *ranks,
                                  const void *const *src_bases,
                                  void *const *dst_bases, size_t m,
                                  void *stream, kvr_error_t *err)
{
    JobT<R> j = rank_job<R>(SCATTER, ranks[0], NULL, NULL);
    uint64_t bits = 0;
    kvr_status_t st = KVR_OK;
    for (size_t i = 0; st == KVR_OK && i < m; i++) {
        st = kvr__rl_check_range(rl, ranks[i], 0, 0, err);
        if (st == KVR_OK)
            st = check_pointers(src_bases[i], dst_bases[i], err);
        j.ranks[i] = (uint16_t)ranks[i];
        j.srcs[i] = (const unsigned char *)src_bases[i];
        j.dst[i] = (unsigned char *)dst_bases[i];
        bits |= (uintptr_t)src_bases[i] | (uintptr_t)dst_bases[i];
    }
    j.regions = (uint32_t)m;
    if (st == KVR_OK)
        st = launch(rl, j, bits, 0, all_pieces(rl), stream, err);
    return st;
}

extern "C" kvr_status_t
kvr_gpu_scatter_regions(const kvr_gpu_relayout_t *rl, const uint32_t *ranks,
                        const void *const *src_bases, void *const *dst_bases,
                        size_t n, void *stream, kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    if (ranks == NULL || src_bases == NULL || dst_bases == NULL)
        st = kvr_error_set(err, KVR_ERR_INVALID, "slot arrays are NULL");
    for (size_t k = 0; st == KVR_OK && k < n; k += SLOTS) {
        size_t m = n - k < SLOTS ? n - k : SLOTS;
        /* the smallest job that holds them: the driver copies it into
         * the launch */
        if (m == 1)
            st = scatter_slots<1>(rl, ranks + k, src_bases + k, dst_bases + k,
                                  m, stream, err);
        else if (m <= KVR__GPU_MAX_RANKS)
            st = scatter_slots<KVR__GPU_MAX_RANKS>(rl, ranks + k,
                                                   src_bases + k,
                                                   dst_bases + k, m, stream,
                                                   err);
        else
            st = scatter_slots<SLOTS>(rl, ranks + k, src_bases + k,
                                      dst_bases + k, m, stream, err);
    }
    return st;
}

/* The first field in which b's class differs from a's (the fields that
 * cut pieces into items and place them), or NULL; *x, *y its values. */
static const char *class_differs(const kvr__rl_geom_t *a,
                                 const kvr__rl_geom_t *b, uint64_t *x,
                                 uint64_t *y)
{
    const struct {
        const char *name;
        uint64_t x, y;
    } f[] = {{"kind", a->kind, b->kind},
             {"block size", a->bs, b->bs},
             {"W", a->W, b->W},
             {"interleave", a->I, b->I},
             {"unit", a->unit, b->unit},
             {"source page", a->src_page, b->src_page},
             {"destination page", a->dst_page, b->dst_page},
             {"preshuffle", a->preshuffle, b->preshuffle}};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].x != f[i].y) {
            *x = f[i].x;
            *y = f[i].y;
            return f[i].name;
        }
    return NULL;
}

static kvr_status_t check_class(const kvr_gpu_relayout_t *const *rls,
                                size_t nrl, kvr_error_t *err)
{
    for (size_t i = 0; i < nrl; i++) {
        uint64_t x = 0, y = 0;
        if (rls[i] == NULL)
            return kvr_error_set(err, KVR_ERR_INVALID, "relayout %zu is NULL",
                                 i);
        const char *f = class_differs(&rls[0]->geom, &rls[i]->geom, &x, &y);
        if (f != NULL)
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "relayout %zu's %s %llu differs from "
                                 "relayout 0's %llu: one class a call",
                                 i, f, (unsigned long long)y,
                                 (unsigned long long)x);
    }
    return KVR_OK;
}

/* Every slot names a relayout and a rank of it and both bases; *bits
 * gathers the bases for the vector width. */
static kvr_status_t check_slots(const kvr_gpu_relayout_t *const *rls,
                                size_t nrl, const kvr_gpu_scatter_slot_t *slots,
                                size_t n, uint64_t *bits, kvr_error_t *err)
{
    for (size_t k = 0; k < n; k++) {
        const kvr_gpu_scatter_slot_t *s = &slots[k];
        if (s->relayout >= nrl)
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "slot %zu: relayout %u of %zu", k,
                                 s->relayout, nrl);
        if (s->rank >= rls[s->relayout]->geom.W)
            return kvr_error_set(err, KVR_ERR_RANK_RANGE,
                                 "slot %zu: DCP rank %u out of range [0, %u)",
                                 k, s->rank, rls[s->relayout]->geom.W);
        if (s->src_base == NULL || s->dst_base == NULL)
            return kvr_error_set(err, KVR_ERR_INVALID,
                                 "slot %zu: %s base is NULL", k,
                                 s->src_base == NULL ? "source"
                                                     : "destination");
        *bits |= (uintptr_t)s->src_base | (uintptr_t)s->dst_base;
    }
    return KVR_OK;
}

/* Every relayout's tables on the current device, before the first
 * launch: a refusal leaves nothing half done. */
static kvr_status_t check_uploaded(const kvr_gpu_relayout_t *const *rls,
                                   size_t nrl, kvr_error_t *err)
{
    kvr__rl_geom_t g;
    kvr_status_t st = KVR_OK;
    for (size_t i = 0; st == KVR_OK && i < nrl; i++)
        st = device_tables(rls[i], &g, err);
    return st;
}

/* The launch order: region-major (by source, then destination base), in
 * groups of MERGE_GEOMS relayouts (by index) so that every launch holds
 * all of its regions' requests; stable, so equal slots keep the
 * caller's order (all of them with kvr__rl_tune_merge_order 1). */
static kvr_status_t region_order(const kvr_gpu_scatter_slot_t *slots,
                                 size_t n, uint32_t **out, kvr_error_t *err)
{
    if (n > UINT32_MAX)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "%zu slots: at most 2^32 - 1", n);
    uint32_t *o = (uint32_t *)malloc(n * sizeof(*o));
    if (o == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "%zu slots' order", n);
    for (size_t k = 0; k < n; k++)
        o[k] = (uint32_t)k;
    bool given = kvr__rl_tune_merge_order == 1;
    std::stable_sort(o, o + n, [slots, given](uint32_t x, uint32_t y) {
        const kvr_gpu_scatter_slot_t &a = slots[x], &b = slots[y];
        uint32_t ga = a.relayout / MERGE_GEOMS, gb = b.relayout / MERGE_GEOMS;
        if (ga != gb || given)
            return ga < gb;
        if (a.src_base != b.src_base)
            return (uintptr_t)a.src_base < (uintptr_t)b.src_base;
        return (uintptr_t)a.dst_base < (uintptr_t)b.dst_base;
    });
    *out = o;
    return KVR_OK;
}

/* A merged launch being filled. */
struct Merge {
    JobM j;
    uint32_t rl_of[MERGE_GEOMS]; /* the relayout of each geometry */
    uint32_t ngeoms, vb;
    bool chunked;
};

static kvr_status_t merge_flush(Merge *m, void *stream, kvr_error_t *err)
{
    kvr_status_t st = KVR_OK;
    if (m->j.num_items > 0)
        st = launch_vb(m->j, m->vb, m->chunked, stream, err);
    m->j.slots = m->j.num_items = 0;
    m->ngeoms = 0;
    return st;
}

/* m's geometry for relayout i, or ngeoms when it has none yet. */
static uint32_t merge_geom(const Merge *m, uint32_t i)
{
    uint32_t g = 0;
    while (g < m->ngeoms && m->rl_of[g] != i)
        g++;
    return g;
}

/* Adds a slot to m, launching m first when the slot does not fit. */
static kvr_status_t merge_slot(Merge *m, const kvr_gpu_relayout_t *const *rls,
                               const kvr_gpu_scatter_slot_t *s, void *stream,
                               kvr_error_t *err)
{
    const kvr_gpu_relayout_t *rl = rls[s->relayout];
    uint64_t items = (uint64_t)all_pieces(rl) * m->j.parts;
    if (items > INT32_MAX)
        return too_many_items(items, m->j.part_bytes, err);
    uint32_t g = merge_geom(m, s->relayout);
    kvr_status_t st = KVR_OK;
    if (m->j.slots == MERGE_SLOTS || g == MERGE_GEOMS ||
        m->j.num_items + items > INT32_MAX) {
        st = merge_flush(m, stream, err);
        g = 0;
    }
    if (st == KVR_OK && g == m->ngeoms) {
        st = device_tables(rl, &m->j.g[g], err);
        m->rl_of[m->ngeoms++] = s->relayout;
    }
    if (st != KVR_OK)
        return st;
    uint32_t k = m->j.slots++;
    m->j.srcs[k] = (const unsigned char *)s->src_base;
    m->j.dst[k] = (unsigned char *)s->dst_base;
    m->j.ranks[k] = (uint16_t)s->rank;
    m->j.geoms[k] = (uint8_t)g;
    m->j.first[k] = m->j.num_items;
    m->j.num_items += (uint32_t)items;
    return KVR_OK;
}

/* The slots in `order`, as few launches as hold them. */
static kvr_status_t merge_run(const kvr_gpu_relayout_t *const *rls,
                              const kvr_gpu_scatter_slot_t *slots,
                              const uint32_t *order, size_t n, uint64_t bits,
                              void *stream, kvr_error_t *err)
{
    Merge *m = (Merge *)calloc(1, sizeof(*m));
    if (m == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "a merged launch");
    m->vb = vector_bytes(bits | geometry_bits(&rls[0]->geom));
    Shape sh;
    kvr_status_t st = item_shape(&rls[0]->geom, SCATTER, m->vb, &sh, err);
    set_shape(m->j, sh);
    m->chunked = sh.chunked;
    for (size_t k = 0; st == KVR_OK && k < n; k++)
        st = merge_slot(m, rls, &slots[order[k]], stream, err);
    if (st == KVR_OK)
        st = merge_flush(m, stream, err);
    free(m);
    return st;
}

extern "C" kvr_status_t
kvr_gpu_scatter_requests(const kvr_gpu_relayout_t *const *rls, size_t nrl,
                         const kvr_gpu_scatter_slot_t *slots, size_t n,
                         void *stream, kvr_error_t *err)
{
    if (rls == NULL || slots == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "relayout or slot array is NULL");
    uint64_t bits = 0;
    uint32_t *order = NULL;
    kvr_status_t st = check_class(rls, nrl, err);
    if (st == KVR_OK)
        st = check_slots(rls, nrl, slots, n, &bits, err);
    if (st != KVR_OK || n == 0)
        return st;
    st = check_uploaded(rls, nrl, err);
    if (st == KVR_OK)
        st = region_order(slots, n, &order, err);
    if (st == KVR_OK)
        st = merge_run(rls, slots, order, n, bits, stream, err);
    free(order);
    return st;
}

extern "C" kvr_status_t kvr_gpu_pack(const kvr_gpu_relayout_t *rl,
                                     uint32_t rank, const void *src_base,
                                     uint64_t offset, uint64_t len,
                                     void *staging, void *stream,
                                     kvr_error_t *err)
{
    return run_range(rl, PACK, rank, src_base, staging, offset, len, stream,
                     err);
}

extern "C" kvr_status_t kvr_gpu_unpack(const kvr_gpu_relayout_t *rl,
                                       uint32_t rank, const void *staging,
                                       uint64_t offset, uint64_t len,
                                       void *dst_base, void *stream,
                                       kvr_error_t *err)
{
    return run_range(rl, UNPACK, rank, staging, dst_base, offset, len, stream,
                     err);
}
