/* Decode-side DCP ops on the GPU (docs/design.md §10): top-k filter/convert,
 * row-to-request maps, replicated index slot mapping, LSE merge. */
#include <cuda/atomic>

#include "cuda_util.cuh"

struct kvr_gpu_decode {
    int device;
    uint32_t max_rows;
    void *mem;                /* State, then max_rows scan flags */
    kvr__fault_t *host_fault; /* pinned mirror for kvr_gpu_decode_check */
    uint32_t smem_block;      /* dynamic shared memory a row tile may take */
};

namespace
{

/* Top-k scan state: block b handles row b, or tile b of rows (blocks start
 * in index order, as CUB's single-pass scans assume), and publishes its
 * count, then its inclusive prefix, in flags[b], tagged with the launch's
 * epoch so that no launch has to clear them. The last block bumps the epoch
 * once its look-back is done: by then every block has published, so every
 * block has read the epoch. All of it lives on the device, so launches can
 * be captured in a graph and replayed; no atomic is shared by the blocks. */
struct State {
    uint32_t epoch;
    uint32_t pad[3];
    kvr__fault_t fault;
};

constexpr uint64_t EPOCH_MASK = (1ull << 30) - 1;
constexpr uint32_t FLAG_AGGREGATE = 1, FLAG_INCLUSIVE = 2;

uint64_t *scan_flags(void *mem)
{
    return (uint64_t *)((char *)mem + sizeof(State));
}

__device__ void record(kvr__fault_t *f, kvr__fault_code_t code, int32_t row,
                       int32_t col, int32_t value)
{
    if (atomicCAS(&f->code, 0, (int32_t)code) == 0) {
        f->row = row;
        f->col = col;
        f->value = value;
    }
}

struct TopkJob {
    kvr_gpu_topk_args_t a;
    kvr__div by_i, by_w, by_v, by_iw;
    uint32_t limit;   /* positions must be below min(max_blocks * V, 2^31) */
    uint32_t vec4;    /* rows can be read 16 bytes at a time */
    uint32_t shift_i; /* POW2 kernels: log2(I) */
    /* Row-tile kernel with I, W and bs powers of two: g is owned when
     * (g & own_mask) == own_bits; its slot is table[g >> shift_v] << shift_bs
     * | (g & (V - 1)) >> shift_iw << shift_i | (g & (I - 1)). */
    uint32_t own_mask, own_bits, shift_v, shift_iw, shift_bs;
    uint32_t entry_lim; /* POW2: entries from here on overflow INT32_MAX */
};

constexpr int TK_THREADS = 128, TK_ITEMS = 16, TK_TILE = TK_THREADS * TK_ITEMS;
#ifndef KVR_TOPK_MIN_BLOCKS
#define KVR_TOPK_MIN_BLOCKS 16 /* all of an SM's threads */
#endif

/* g if this rank owns candidate v (kvr__owner's formula: a shift and a mask
 * when I and W are powers of two, multiply and shift otherwise), else -1;
 * bad positions are recorded and dropped. */
template <bool POW2>
__device__ __forceinline__ int32_t owned(const TopkJob &j, int32_t v,
                                         uint32_t row, uint32_t col,
                                         kvr__fault_t *f)
{
    if (v == -1)
        return -1;
    if ((uint32_t)v >= j.limit) { /* also every v < -1 */
        record(f, KVR__FAULT_POS, row, col, v);
        return -1;
    }
    uint32_t chunk = POW2 ? (uint32_t)v >> j.shift_i
                          : kvr__div_by(j.by_i, (uint32_t)v);
    uint32_t owner = POW2 ? chunk & (j.by_w.d - 1)
                          : chunk - kvr__div_by(j.by_w, chunk) * j.by_w.d;
    return owner == j.a.rank ? v : -1;
}

/* Slot of owned position g: kvr__dst_slot, with g % V / (I*W) * I + g % I
 * for local(g) % bs (V is a multiple of I*W). -1, and a recorded fault, for
 * a negative block-table entry or a slot past INT32_MAX. */
__device__ int32_t slot_of(const TopkJob &j, const int32_t *table, int32_t v,
                           uint32_t row, uint32_t col, kvr__fault_t *f)
{
    uint32_t g = (uint32_t)v, vb = kvr__div_by(j.by_v, g);
    int32_t entry = table[vb];
    uint32_t local = kvr__div_by(j.by_iw, g - vb * j.by_v.d) * j.by_i.d +
                     (g - kvr__div_by(j.by_i, g) * j.by_i.d);
    uint64_t slot = (uint64_t)entry * j.a.block_size + local;
    if (entry < 0 || slot > INT32_MAX) {
        record(f, entry < 0 ? KVR__FAULT_BLOCK : KVR__FAULT_SLOT, row, col,
               entry);
        return -1;
    }
    return (int32_t)slot;
}

/* Loads this thread's TK_ITEMS consecutive candidates of a tile and keeps
 * the positions this rank owns (bit i of *own); returns how many. Needs no
 * block table, so a row's count is known after one round trip. */
template <bool POW2>
__device__ int32_t load_owned(const TopkJob &j, uint32_t row, uint32_t tile,
                              bool req_ok, kvr__fault_t *f,
                              int32_t (&v)[TK_ITEMS], uint32_t *own)
{
    const int32_t *cand = j.a.token_indices + (uint64_t)row * j.a.topk;
    uint32_t col0 = tile + threadIdx.x * TK_ITEMS;
    if (j.vec4 && col0 + TK_ITEMS <= j.a.topk) {
        const int4 *p = (const int4 *)(cand + col0);
#pragma unroll
        for (int q = 0; q < TK_ITEMS / 4; q++) {
            int4 x = __ldg(p + q);
            v[4 * q] = x.x;
            v[4 * q + 1] = x.y;
            v[4 * q + 2] = x.z;
            v[4 * q + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < TK_ITEMS; i++)
            v[i] = col0 + i < j.a.topk ? __ldg(cand + col0 + i) : -1;
    }
    *own = 0;
#pragma unroll
    for (int i = 0; i < TK_ITEMS; i++) {
        v[i] = req_ok ? owned<POW2>(j, v[i], row, col0 + i, f) : -1;
        *own |= (uint32_t)(v[i] >= 0) << i;
    }
    return __popc(*own);
}

/* Exclusive prefix of x over the block; *total gets the sum. */
__device__ int32_t block_scan(int32_t x, int32_t *total)
{
    __shared__ int32_t warp_sums[TK_THREADS / 32];
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t incl = x;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
        int32_t y = __shfl_up_sync(~0u, incl, d);
        incl += lane >= (uint32_t)d ? y : 0;
    }
    if (lane == 31)
        warp_sums[warp] = incl;
    __syncthreads();
    int32_t before = 0, sum = 0;
#pragma unroll
    for (int w = 0; w < TK_THREADS / 32; w++) {
        before += (uint32_t)w < warp ? warp_sums[w] : 0;
        sum += warp_sums[w];
    }
    __syncthreads();
    *total = sum;
    return before + incl - x;
}

using flag_ref =
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>;

__device__ unsigned long long flag_word(uint32_t epoch, uint32_t state,
                                        uint32_t value)
{
    return ((epoch & EPOCH_MASK) << 34) | ((uint64_t)state << 32) | value;
}

/* Flags each lane reads per look-back step (the window is 32 times this):
 * one for the row-per-block kernel, whose thousands of waiting blocks make
 * wider windows cost more in spin traffic than they save; more for the
 * row-tile kernel, whose few hundred resident tiles all publish at once, so
 * that one round trip reaches back to the start. */
#ifndef KVR_TOPK_FLAGS_PER_LANE
#define KVR_TOPK_FLAGS_PER_LANE 1
#endif
#ifndef KVR_TOPK_TILE_FLAGS_PER_LANE
#define KVR_TOPK_TILE_FLAGS_PER_LANE 1
#endif
/* Flag slots between two tiles' flags in the row-tile kernel: spread over
 * more L2 lines, the flags that hundreds of waiting tiles poll contend less
 * (a point faster at 16384 rows and more); at most TR_ROWS, so that they
 * still fit in max_rows slots. */
#ifndef KVR_TOPK_FLAG_STRIDE
#define KVR_TOPK_FLAG_STRIDE KVR_TOPK_ROWS /* 128 bytes apart at 16 rows */
#endif
#ifndef KVR_TOPK_SPIN_NS
#define KVR_TOPK_SPIN_NS 32 /* first back-off of a look-back poll */
#endif
#ifndef KVR_TOPK_SPIN_STEPS
#define KVR_TOPK_SPIN_STEPS 2 /* the back-off doubles this many times */
#endif

/* One look-back window [end - 32*FPL, end), lane L holding FPL consecutive
 * rows: waits until every row after the nearest inclusive one has
 * published, then returns the sum from there; *found tells whether an
 * inclusive flag (or the start) was inside. */
template <int FPL, int STRIDE>
__device__ uint32_t window_sum(unsigned long long *f, int64_t end,
                               uint32_t epoch, bool *found)
{
    int lane = (int)(threadIdx.x & 31);
    int64_t first = end - 32 * FPL + lane * FPL;
    uint32_t state[FPL], value[FPL];
    for (int spin = 0;; spin++) {
        int incl_at = -1; /* this lane's last inclusive row */
#pragma unroll
        for (int k = 0; k < FPL; k++) {
            state[k] = FLAG_INCLUSIVE; /* before row 0: an empty prefix */
            value[k] = 0;
            if (first + k >= 0) {
                unsigned long long w = flag_ref(f[(first + k) * STRIDE])
                                           .load(cuda::memory_order_relaxed);
                state[k] = (w >> 34) == (epoch & EPOCH_MASK)
                               ? (uint32_t)(w >> 32) & 3
                               : 0;
                value[k] = (uint32_t)w;
            }
            incl_at = state[k] == FLAG_INCLUSIVE ? k : incl_at;
        }
        uint32_t incl = __ballot_sync(~0u, incl_at >= 0);
        int top = incl ? 31 - __clz(incl) : 0;
        int from = lane > top    ? 0
                   : lane == top ? (incl_at > 0 ? incl_at : 0)
                                 : FPL;
        bool pending = false;
        uint32_t sum = 0;
#pragma unroll
        for (int k = 0; k < FPL; k++) {
            pending |= k >= from && state[k] == 0;
            sum += k >= from ? value[k] : 0;
        }
        if (!__any_sync(~0u, pending)) {
            for (int d = 16; d > 0; d /= 2)
                sum += __shfl_xor_sync(~0u, sum, d);
            *found = incl != 0;
            return sum;
        }
        if (spin > 0) /* back off: spinning warps slow the rows they wait for */
            __nanosleep(
                (uint32_t)KVR_TOPK_SPIN_NS
                << (spin < KVR_TOPK_SPIN_STEPS ? spin : KVR_TOPK_SPIN_STEPS));
    }
}

/* Decoupled look-back by one warp: publish this row's count, add up the
 * windows before it back to the nearest inclusive prefix, publish ours.
 * Returns the sum of the rows before `row`. */
template <int FPL, int STRIDE>
__device__ uint32_t look_back(uint64_t *flags, uint32_t row, uint32_t epoch,
                              uint32_t count)
{
    unsigned long long *f = (unsigned long long *)flags;
    uint32_t lane = threadIdx.x & 31;
    if (lane == 0)
        flag_ref(f[row * STRIDE])
            .store(
                flag_word(epoch, row ? FLAG_AGGREGATE : FLAG_INCLUSIVE, count),
                cuda::memory_order_relaxed);
    uint32_t prefix = 0;
    bool found = row == 0;
    for (int64_t end = row; !found; end -= 32 * FPL)
        prefix += window_sum<FPL, STRIDE>(f, end, epoch, &found);
    if (lane == 0 && row > 0)
        flag_ref(f[row * STRIDE])
            .store(flag_word(epoch, FLAG_INCLUSIVE, prefix + count),
                   cuda::memory_order_relaxed);
    return prefix;
}

/* Thread 0 of block `index`, its look-back done: the first block writes
 * indptr[0], the last bumps the epoch (every block has read it by then:
 * see State). */
__device__ void scan_done(const TopkJob &j, State *st, uint32_t index,
                          uint32_t epoch)
{
    if (index == 0)
        j.a.out_indptr[0] = 0;
    if (index == gridDim.x - 1)
        st->epoch = epoch + 1;
}

/* Compacts the columns of this thread's owned candidates in shared memory
 * from `offset`. */
__device__ void stage_columns(int32_t *stage, uint32_t tile, uint32_t own,
                              int32_t offset)
{
    uint32_t col0 = tile + threadIdx.x * TK_ITEMS;
#pragma unroll
    for (int i = 0; i < TK_ITEMS; i++)
        if (own >> i & 1)
            stage[offset++] = (int32_t)(col0 + i);
}

/* Turns the `count` staged columns into slots and writes them contiguously
 * from `start`: only owned candidates pay for the block table, and the
 * stores are whole sectors. */
__device__ void write_staged(const TopkJob &j, const int32_t *table,
                             uint32_t row, const int32_t *stage, int32_t count,
                             uint32_t start, kvr__fault_t *f)
{
    const int32_t *cand = j.a.token_indices + (uint64_t)row * j.a.topk;
#pragma unroll 4
    for (int32_t i = threadIdx.x; i < count; i += TK_THREADS) {
        int32_t col = stage[i];
        j.a.out_slots[start + i] = slot_of(j, table, __ldg(cand + col), row,
                                           (uint32_t)col, f);
    }
}

/* Rows wider than one tile: count again tile by tile (the row's bytes are
 * still in L1/L2), stage and write each. */
template <bool POW2>
__device__ void write_tiles(const TopkJob &j, const int32_t *table,
                            uint32_t row, uint32_t start, int32_t *stage,
                            kvr__fault_t *f)
{
    int32_t v[TK_ITEMS];
    uint32_t own;
    for (uint32_t tile = 0; tile < j.a.topk; tile += TK_TILE) {
        int32_t total = 0;
        int32_t offset = block_scan(
            load_owned<POW2>(j, row, tile, true, f, v, &own), &total);
        stage_columns(stage, tile, own, offset);
        __syncthreads();
        write_staged(j, table, row, stage, total, start, f);
        __syncthreads();
        start += total;
    }
}

/* One row per block: count the owned candidates (no block table needed),
 * stage their columns while warp 0 looks back for the row's start, then
 * convert and write. */
template <bool POW2>
__global__ void __launch_bounds__(TK_THREADS, KVR_TOPK_MIN_BLOCKS)
    topk_kernel(const TopkJob j, State *st, uint64_t *flags)
{
    __shared__ int32_t stage[TK_TILE];
    __shared__ uint32_t s_start;
    uint32_t row = blockIdx.x, epoch = *(volatile uint32_t *)&st->epoch;
    int32_t req = j.a.token_to_seq[row];
    bool req_ok = req >= 0 && (uint32_t)req < j.a.num_reqs;
    bool single = j.a.topk <= TK_TILE;
    const int32_t *table = j.a.block_table +
                           (uint64_t)(req_ok ? req : 0) * j.a.max_blocks;
    int32_t v[TK_ITEMS], n = 0, count = 0;
    uint32_t own = 0;
    for (uint32_t tile = 0; tile < j.a.topk; tile += TK_TILE)
        n += load_owned<POW2>(j, row, tile, req_ok, &st->fault, v, &own);
    if (!req_ok && threadIdx.x == 0)
        record(&st->fault, KVR__FAULT_SEQ, (int32_t)row, -1, req);
    int32_t offset = block_scan(n, &count);
    if (single)
        stage_columns(stage, 0, own, offset);
    if (threadIdx.x < 32) {
        uint32_t start = look_back<KVR_TOPK_FLAGS_PER_LANE, 1>(
            flags, row, epoch, (uint32_t)count);
        if (threadIdx.x == 0) {
            s_start = start;
            j.a.out_indptr[row + 1] = (int32_t)(start + count);
            j.a.owned_counts[row] = count;
            scan_done(j, st, row, epoch);
        }
    }
    __syncthreads();
    if (count == 0)
        return;
    if (single)
        write_staged(j, table, row, stage, count, s_start, &st->fault);
    else
        write_tiles<POW2>(j, table, row, s_start, stage, &st->fault);
}

/* ---- Row tiles: the path for rows that can be read 16 bytes at a time.
 * Block t takes tile t, rows [t * TR_ROWS, (t + 1) * TR_ROWS), one warp
 * per row. A warp reads its row in striped int4 loads (lane L reads vector L,
 * L + 32, ...: each load instruction covers 512 contiguous bytes), keeps
 * the positions this rank owns and compacts them in candidate order into
 * its slice of shared memory, with a ballot per vector element and no
 * branch but the store's. The slice holds `cap` positions, sized from K/W
 * with headroom rather than K (3 KB instead of 8 KB at K = 2048, W = 4),
 * so that registers, not shared memory, bound the rows resident: 32 per
 * SM, 4224 on an H200. A row that owns more (a skewed row, or a slice cut
 * to fit) writes the rest by reading the row again. Warp 0 publishes the
 * tile's count and looks back over tiles, 32 flags per round trip (wider
 * windows measured slower: the polls of hundreds of waiting tiles crowd
 * L2); each warp then converts its staged positions
 * to slots and writes them contiguously. With POW2 (I, W and bs powers of
 * two) the owner test and the slot are masks and shifts.
 *
 * Knobs (bench/gpu/run.sh TUNE=...; docs/gpu.md has the measurements):
 * KVR_TOPK_ROWS rows per tile, KVR_TOPK_UNROLL int4 loads per lane in
 * flight, KVR_TOPK_WRITE_UNROLL block-table loads per lane in flight when
 * writing, KVR_TOPK_CAP_PCT the slice as a percentage of K/W,
 * KVR_TOPK_TILE_FLAGS_PER_LANE the look-back window / 32,
 * KVR_TOPK_FLAG_STRIDE, KVR_TOPK_SPIN_NS and KVR_TOPK_SPIN_STEPS the
 * flags' spacing, first back-off and its doublings,
 * KVR_TOPK_DIAG_NO_LOOKBACK 1: no look-back at all (wrong output; it
 * times the rest), KVR_TOPK_TILE 0: the one-row-per-block kernel for every
 * shape. */
#ifndef KVR_TOPK_TILE
#define KVR_TOPK_TILE                                                          \
    1 /* 0: every launch takes topk_kernel (for comparisons) */
#endif
#ifndef KVR_TOPK_ROWS
#define KVR_TOPK_ROWS 8
#endif
#ifndef KVR_TOPK_UNROLL
#define KVR_TOPK_UNROLL 4 /* int4 loads in flight per lane */
#endif
#ifndef KVR_TOPK_WRITE_UNROLL
#define KVR_TOPK_WRITE_UNROLL 4 /* block-table loads in flight per lane */
#endif
#ifndef KVR_TOPK_CAP_PCT
#define KVR_TOPK_CAP_PCT 150
#endif
#ifndef KVR_TOPK_TILE_MIN_BLOCKS
#define KVR_TOPK_TILE_MIN_BLOCKS (32 / KVR_TOPK_ROWS) /* 64 registers */
#endif
constexpr int TR_ROWS = KVR_TOPK_ROWS, TR_THREADS = 32 * TR_ROWS;
/* The widest rows the row tiles serve. */
constexpr uint32_t TR_KMAX = 16384;
static_assert(TR_ROWS >= 2 && TR_ROWS <= 32 && (TR_ROWS & (TR_ROWS - 1)) == 0,
              "a tile is a power of two of warps, 2 to 32");
static_assert(KVR_TOPK_FLAG_STRIDE >= 1 && KVR_TOPK_FLAG_STRIDE <= TR_ROWS,
              "tile flags must fit in max_rows slots");

/* Whether this rank owns candidate v (v inside the table; -1 and bad
 * positions are not). */
template <bool POW2>
__device__ __forceinline__ bool tile_owned(const TopkJob &j, int32_t v)
{
    uint32_t g = (uint32_t)v;
    bool in = g < j.limit;
    if (POW2)
        return in && (g & j.own_mask) == j.own_bits;
    uint32_t chunk = kvr__div_by(j.by_i, g); /* wraps for g >= 2^31: unused */
    return in && chunk - kvr__div_by(j.by_w, chunk) * j.by_w.d == j.a.rank;
}

/* The row-tile kernel's staging slices: warp w's row stages in
 * tr_stage[w * cap, (w + 1) * cap). */
extern __shared__ int32_t tr_stage[];

/* A store to shared address `at`: written as a plain store through a
 * generic pointer, nvcc rebuilt the shared window's base before each
 * one, six instructions per staged candidate. */
__device__ __forceinline__ void st_shared(uint32_t at, int32_t v)
{
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
}

/* Whether v is neither -1 nor inside the table (every v < -1 included). */
__device__ __forceinline__ bool tile_bad(const TopkJob &j, int32_t v)
{
    return (uint32_t)v + 1u > j.limit;
}

/* The rare path after a scan saw a bad position: records the row's first
 * one with its column. */
__device__ void tile_pos_fault(const TopkJob &j, uint32_t row, kvr__fault_t *f)
{
    const int32_t *cand = j.a.token_indices + (uint64_t)row * j.a.topk;
    for (uint32_t c = 0; c < j.a.topk; c++)
        if (tile_bad(j, cand[c])) {
            record(f, KVR__FAULT_POS, (int32_t)row, (int32_t)c, cand[c]);
            return;
        }
}

/* A negative block-table entry or a slot past INT32_MAX under the row's
 * nth owned candidate: records it with that candidate's column, which the
 * staging dropped, so the row is scanned again (only by the thread whose
 * fault is recorded). */
template <bool POW2>
__device__ void tile_slot_fault(const TopkJob &j, kvr__fault_t *f,
                                int32_t entry, uint32_t row, int32_t nth)
{
    kvr__fault_code_t code = entry < 0 ? KVR__FAULT_BLOCK : KVR__FAULT_SLOT;
    if (atomicCAS(&f->code, 0, (int32_t)code) != 0)
        return;
    const int32_t *cand = j.a.token_indices + (uint64_t)row * j.a.topk;
    int32_t col = -1, n = 0;
    for (uint32_t c = 0; c < j.a.topk && col < 0; c++)
        if (tile_owned<POW2>(j, cand[c]) && n++ == nth)
            col = (int32_t)c;
    f->row = (int32_t)row;
    f->col = col;
    f->value = entry;
}

/* Slot of owned position g whose block-table entry is `entry`; *bad tells
 * a negative entry or a slot past INT32_MAX (the caller writes -1 and
 * records it once, outside its loop). */
template <bool POW2>
__device__ __forceinline__ int32_t tile_slot(const TopkJob &j, uint32_t g,
                                             int32_t entry, bool *bad)
{
    if (POW2) {
        uint32_t r = g & ((1u << j.shift_v) - 1);
        *bad = (uint32_t)entry >= j.entry_lim;
        return (int32_t)(((uint32_t)entry << j.shift_bs) |
                         (r >> j.shift_iw << j.shift_i) |
                         (g & ((1u << j.shift_i) - 1)));
    }
    uint32_t vb = kvr__div_by(j.by_v, g);
    uint32_t local = kvr__div_by(j.by_iw, g - vb * j.by_v.d) * j.by_i.d +
                     (g - kvr__div_by(j.by_i, g) * j.by_i.d);
    uint64_t slot = (uint64_t)(uint32_t)entry * j.a.block_size + local;
    *bad = entry < 0 || slot > INT32_MAX;
    return (int32_t)slot;
}

/* If `live`, writes owned position g's slot to out[i] (-1 for a bad
 * block-table entry e), keeping the lane's first bad one in *first and
 * *first_entry for tile_slot_fault after the loop. (`live` rather than a
 * branch around the call keeps the unrolled write loop predicated.) */
template <bool POW2>
__device__ __forceinline__ void
tile_put_slot(const TopkJob &j, uint32_t g, int32_t e, bool live, int32_t *out,
              int32_t i, int32_t *first, int32_t *first_entry)
{
    bool bad;
    int32_t slot = tile_slot<POW2>(j, g, e, &bad);
    if (live)
        out[i] = bad ? -1 : slot;
    bool note = live && bad && *first < 0;
    *first = note ? i : *first;
    *first_entry = note ? e : *first_entry;
}

template <bool POW2>
__device__ __forceinline__ uint32_t tile_block(const TopkJob &j, uint32_t g)
{
    return POW2 ? g >> j.shift_v : kvr__div_by(j.by_v, g);
}

/* N int4 of the row per lane, striped from vector c0: -1 past the row's
 * end. */
template <int N>
__device__ __forceinline__ void
tile_load(const int4 *p, uint32_t n4, uint32_t c0, uint32_t lane, int4 (&x)[N])
{
#pragma unroll
    for (int u = 0; u < N; u++) {
        uint32_t c = c0 + u * 32 + lane;
        x[u] = c < n4 ? __ldg(p + c) : make_int4(-1, -1, -1, -1);
    }
}

__device__ __forceinline__ void int4_parts(int4 x, int32_t (&v)[4])
{
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
}

/* Walks a row's owned positions in candidate order, N int4 per lane in
 * flight, calling sink(v, pos, owned) for each candidate, pos the index
 * among the row's owned ones that v has if owned; returns how many. The
 * loop has no branch but the sink's: bad positions only set this lane's
 * *bad, and the caller records them after the row (a fault branch per
 * candidate made the loop three times longer, and the kernel
 * issue-bound). */
template <bool POW2, int N, typename Sink>
__device__ __forceinline__ int32_t tile_scan_row(const TopkJob &j, uint32_t row,
                                                 bool *bad, Sink sink)
{
    const int4 *p = (const int4 *)(j.a.token_indices +
                                   (uint64_t)row * j.a.topk);
    uint32_t n4 = j.a.topk >> 2, lane = threadIdx.x & 31, lt = (1u << lane) - 1;
    int32_t count = 0;
    bool seen = false;
    for (uint32_t c0 = 0; c0 < n4; c0 += 32 * N) {
        int4 x[N];
        tile_load(p, n4, c0, lane, x);
#pragma unroll
        for (int u = 0; u < N; u++) {
            int32_t v[4], pre = 0, tot = 0;
            uint32_t m[4];
            int4_parts(x[u], v);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                seen |= tile_bad(j, v[k]);
                m[k] = __ballot_sync(~0u, tile_owned<POW2>(j, v[k]));
                pre += __popc(m[k] & lt);
                tot += __popc(m[k]);
            }
            int32_t pos = count + pre;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                bool o = m[k] >> lane & 1;
                sink(v[k], pos, o);
                pos += o;
            }
            count += tot;
        }
    }
    *bad = seen;
    return count;
}

/* Pass one over a row: stages the first `cap` owned positions in
 * tr_stage[base, base + cap) in candidate order; returns how many the row
 * owns in all. */
template <bool POW2>
__device__ int32_t tile_stage_row(const TopkJob &j, uint32_t row, int32_t base,
                                  int32_t cap, kvr__fault_t *f)
{
    bool bad;
    uint32_t my = (uint32_t)__cvta_generic_to_shared(tr_stage + base);
    int32_t n = tile_scan_row<POW2, KVR_TOPK_UNROLL>(
        j, row, &bad, [=](int32_t v, int32_t pos, bool owned) {
            if (owned && pos < cap)
                st_shared(my + 4 * (uint32_t)pos, v);
        });
    if (__any_sync(~0u, bad) && (threadIdx.x & 31) == 0)
        tile_pos_fault(j, row, f);
    return n;
}

/* Converts the staged positions tr_stage[base, base + n) to slots into
 * out[0, n). */
template <bool POW2>
__device__ void tile_write_staged(const TopkJob &j, const int32_t *table,
                                  uint32_t row, int32_t base, int32_t n,
                                  int32_t *out, kvr__fault_t *f)
{
    constexpr int U = KVR_TOPK_WRITE_UNROLL;
    int32_t lane = (int32_t)(threadIdx.x & 31), first = -1, first_entry = 0;
    for (int32_t i0 = 0; i0 < n; i0 += 32 * U) {
        uint32_t g[U];
        int32_t e[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int32_t i = i0 + u * 32 + lane;
            g[u] = i < n ? (uint32_t)tr_stage[base + i] : 0;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            e[u] = i0 + u * 32 + lane < n
                       ? __ldg(table + tile_block<POW2>(j, g[u]))
                       : 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
            int32_t i = i0 + u * 32 + lane;
            tile_put_slot<POW2>(j, g[u], e[u], i < n, out, i, &first,
                                &first_entry);
        }
    }
    if (first >= 0)
        tile_slot_fault<POW2>(j, f, first_entry, row, first);
}

/* A row that owns more than its slice holds: reads it again and writes
 * the owned positions from index cap on (pass one recorded the position
 * faults; slot faults are recorded here). */
template <bool POW2>
__device__ void tile_write_rest(const TopkJob &j, const int32_t *table,
                                uint32_t row, int32_t cap, int32_t *out,
                                kvr__fault_t *f)
{
    int32_t first = -1, first_entry = 0;
    bool bad_pos;
    /* One int4 per lane in flight: this rare pass must not take the
     * registers that pass one's loads hold. */
    tile_scan_row<POW2, 1>(
        j, row, &bad_pos, [&](int32_t v, int32_t pos, bool owned) {
            if (owned && pos >= cap)
                tile_put_slot<POW2>(
                    j, (uint32_t)v,
                    __ldg(table + tile_block<POW2>(j, (uint32_t)v)), true, out,
                    pos, &first, &first_entry);
        });
    if (first >= 0)
        tile_slot_fault<POW2>(j, f, first_entry, row, first);
}

/* A tile's row as one warp sees it after the staging pass. */
struct TileRow {
    uint32_t row;
    int32_t req, count;
    int32_t before, total; /* the tile's owned positions before this row, all */
};

/* Pass one of a tile: each warp stages its row; the counts are then known
 * to every thread. */
template <bool POW2>
__device__ TileRow tile_stage(const TopkJob &j, kvr__fault_t *f, uint32_t tile,
                              int32_t base, int32_t cap, int32_t *s_count)
{
    uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    TileRow t = {tile * TR_ROWS + warp, -1, 0, 0, 0};
    if (t.row < j.a.num_rows) {
        t.req = j.a.token_to_seq[t.row];
        if (t.req < 0 || (uint32_t)t.req >= j.a.num_reqs) {
            if (lane == 0)
                record(f, KVR__FAULT_SEQ, (int32_t)t.row, -1, t.req);
            t.req = -1;
        } else {
            t.count = tile_stage_row<POW2>(j, t.row, base, cap, f);
        }
    }
    if (lane == 0)
        s_count[warp] = t.count;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < TR_ROWS; w++) {
        t.before = (uint32_t)w == warp ? t.total : t.before;
        t.total += s_count[w];
    }
    return t;
}

/* Pass two: the row's indptr entry and count, and its slots from `start`
 * (the tile's first output index). */
template <bool POW2>
__device__ void tile_write(const TopkJob &j, kvr__fault_t *f, const TileRow &t,
                           uint32_t start, int32_t base, int32_t cap)
{
    if ((threadIdx.x & 31) == 0 && t.row < j.a.num_rows) {
        j.a.out_indptr[t.row + 1] = (int32_t)(start + t.before + t.count);
        j.a.owned_counts[t.row] = t.count;
    }
    if (t.count == 0)
        return;
    const int32_t *table = j.a.block_table + (uint64_t)t.req * j.a.max_blocks;
    int32_t *out = j.a.out_slots + start + t.before;
    int32_t n = t.count < cap ? t.count : cap;
    tile_write_staged<POW2>(j, table, t.row, base, n, out, f);
    if (t.count > cap)
        tile_write_rest<POW2>(j, table, t.row, cap, out, f);
}

/* Block b stages tile b (a warp per row), publishes its count, looks back
 * for the tiles before it (warp 0), then every warp writes its row.
 * Deadlock-free without a cooperative launch: a block waits only for
 * blocks of lower index, which start before it (as CUB's single-pass
 * scans assume), and publishes before it waits. (A persistent grid that
 * deferred each look-back until the block had staged its next tile was
 * slower at 8-row tiles and needed a cooperative launch, which alone cost
 * 0.9 us: docs/gpu.md.) */
template <bool POW2>
__global__ void __launch_bounds__(TR_THREADS, KVR_TOPK_TILE_MIN_BLOCKS)
    topk_tile_kernel(const TopkJob j, State *st, uint64_t *flags, int32_t cap)
{
    __shared__ int32_t s_count[TR_ROWS];
    __shared__ uint32_t s_start;
    uint32_t tile = blockIdx.x;
    uint32_t epoch = *(volatile uint32_t *)&st->epoch;
    int32_t base = (int32_t)(threadIdx.x >> 5) * cap;
    TileRow t = tile_stage<POW2>(j, &st->fault, tile, base, cap, s_count);
    if (threadIdx.x < 32) {
#if KVR_TOPK_DIAG_NO_LOOKBACK /* timing only: wrong output */
        uint32_t start = tile * (uint32_t)t.total;
#else
        uint32_t start =
            look_back<KVR_TOPK_TILE_FLAGS_PER_LANE, KVR_TOPK_FLAG_STRIDE>(
                flags, tile, epoch, (uint32_t)t.total);
#endif
        if (threadIdx.x == 0) {
            s_start = start;
            scan_done(j, st, tile, epoch);
        }
    }
    __syncthreads();
    tile_write<POW2>(j, &st->fault, t, s_start, base, cap);
}

__global__ void rows_kernel(int32_t *out, uint32_t rows, uint32_t per_req)
{
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < rows)
        out[t] = (int32_t)(t / per_req);
}

__global__ void slots_kernel(const kvr_gpu_slots_args_t a, kvr__fault_t *f)
{
    uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t q = a.q_len, V = (uint64_t)a.block_size * a.dcp_size;
    if (t >= (uint64_t)a.num_reqs * q)
        return;
    uint64_t i = t / q, k = t - i * q;
    int32_t L = a.seq_lens[i];
    const int32_t *table = a.block_table + i * a.max_blocks;
    a.out_slots[t] = -1;
    if (L == 0)
        return;
    if (L < 0 || (uint64_t)L < q ||
        kvr__ceil_div((uint64_t)L, V) > a.max_blocks) {
        if (k == 0)
            record(f, KVR__FAULT_SEQ_LEN, (int32_t)i, -1, L);
        return;
    }
    uint64_t pos = (uint64_t)L - q + k;
    if (table[pos / V] < 0) {
        record(f, KVR__FAULT_BLOCK, (int32_t)i, (int32_t)k, table[pos / V]);
        return;
    }
    a.out_slots[t] = (int64_t)kvr__dst_slot_repl((const uint32_t *)table, pos,
                                                 a.block_size, a.dcp_size);
}

constexpr int LSE_THREADS = 256;

__device__ float sane(float x)
{
    return isnan(x) || x == INFINITY ? -INFINITY : x;
}

/* One warp per (b, h); the rank factors go to shared memory first. */
__global__ void __launch_bounds__(LSE_THREADS)
    lse_kernel(const kvr_gpu_lse_args_t a)
{
    __shared__ float factors[LSE_THREADS / 32][KVR__GPU_MAX_RANKS];
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint64_t BH = (uint64_t)a.batch * a.heads, D = a.head_dim;
    uint64_t bh = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (bh >= BH)
        return;
    float m = -INFINITY, sum = 0.0f;
    for (uint32_t i = 0; i < a.ranks; i++)
        m = fmaxf(m, sane(a.lses[i * BH + bh]));
    if (m == -INFINITY)
        m = 0.0f;
    for (uint32_t i = 0; i < a.ranks; i++)
        sum += expf(sane(a.lses[i * BH + bh]) - m);
    float G = logf(sum) + m;
    for (uint32_t i = lane; i < a.ranks; i += 32)
        factors[warp][i] = expf(sane(sane(a.lses[i * BH + bh]) - G));
    __syncwarp();
    for (uint64_t d = lane; d < D; d += 32) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < a.ranks; i++)
            if (factors[warp][i] > 0.0f)
                acc += factors[warp][i] * a.outs[(i * BH + bh) * D + d];
        a.out[bh * D + d] = acc;
    }
    if (lane == 0 && a.lse != nullptr)
        a.lse[bh] = G;
}

kvr_status_t check_device(const kvr_gpu_decode_t *dec, kvr_error_t *err)
{
    int dev = 0;
    if (dec == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "decode state is NULL");
    KVR__CUDA_TRY(cudaGetDevice(&dev), err);
    if (dev != dec->device)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "decode state lives on device %d, current device "
                             "is %d",
                             dec->device, dev);
    return KVR_OK;
}

/* log2 of a power of two; for others, of the next one up. */
uint32_t log2_of(uint32_t x)
{
    uint32_t s = 0;
    while ((1u << s) < x)
        s++;
    return s;
}

bool is_pow2(uint32_t x)
{
    return (x & (x - 1)) == 0;
}

TopkJob topk_job(const kvr_gpu_topk_args_t *a)
{
    TopkJob j;
    uint32_t V = a->block_size * a->dcp_size;
    j.a = *a;
    j.by_i = kvr__div_make(a->interleave);
    j.by_w = kvr__div_make(a->dcp_size);
    j.by_v = kvr__div_make(V);
    j.by_iw = kvr__div_make(a->interleave * a->dcp_size);
    uint64_t limit = (uint64_t)a->max_blocks * V;
    j.limit = (uint32_t)(limit < (1ull << 31) ? limit : 1ull << 31);
    j.vec4 = a->topk % 4 == 0 && (uintptr_t)a->token_indices % 16 == 0;
    j.shift_i = log2_of(a->interleave);
    j.shift_v = log2_of(V);
    j.shift_iw = log2_of(a->interleave * a->dcp_size);
    j.shift_bs = log2_of(a->block_size);
    j.entry_lim = j.shift_bs < 31 ? 1u << (31 - j.shift_bs) : 1u;
    j.own_mask = (a->dcp_size - 1) << j.shift_i;
    j.own_bits = a->rank << j.shift_i;
    return j;
}

/* Staged positions per row: K/W with KVR_TOPK_CAP_PCT headroom, whole
 * warps of them, at most K, and at most what a block may take (rows owning
 * more take the second read). */
int32_t tile_cap(const kvr_gpu_decode_t *dec, const kvr_gpu_topk_args_t *a)
{
    uint64_t cap = ((uint64_t)a->topk * KVR_TOPK_CAP_PCT / 100 + a->dcp_size -
                    1) /
                   a->dcp_size;
    cap = (cap + 31) / 32 * 32;
    cap = cap < a->topk ? cap : a->topk;
    uint64_t most = dec->smem_block / (sizeof(int32_t) * TR_ROWS);
    return (int32_t)(cap < most ? cap : most);
}

/* The row-tile kernel: a block per tile, an ordinary launch. */
kvr_status_t launch_tiles(kvr_gpu_decode_t *dec, const TopkJob &j, bool pow2,
                          cudaStream_t s, kvr_error_t *err)
{
    int32_t cap = tile_cap(dec, &j.a);
    size_t smem = (size_t)TR_ROWS * cap * sizeof(int32_t);
    uint32_t tiles = (j.a.num_rows + TR_ROWS - 1) / TR_ROWS;
    if (pow2)
        topk_tile_kernel<true><<<tiles, TR_THREADS, smem, s>>>(
            j, (State *)dec->mem, scan_flags(dec->mem), cap);
    else
        topk_tile_kernel<false><<<tiles, TR_THREADS, smem, s>>>(
            j, (State *)dec->mem, scan_flags(dec->mem), cap);
    return kvr__launch_status("topk_tile_kernel", err);
}

} // namespace

extern "C" kvr_status_t kvr_gpu_decode_create(uint32_t max_rows,
                                              kvr_gpu_decode_t **out,
                                              kvr_error_t *err)
{
    if (out == NULL)
        return kvr_error_set(err, KVR_ERR_INVALID, "out is NULL");
    kvr_gpu_decode_t *dec = (kvr_gpu_decode_t *)calloc(1, sizeof(*dec));
    if (dec == NULL)
        return kvr_error_set(err, KVR_ERR_NO_MEMORY, "no memory");
    size_t bytes = sizeof(State) + (size_t)max_rows * sizeof(uint64_t);
    dec->max_rows = max_rows;
    cudaError_t e = cudaGetDevice(&dec->device);
    if (e == cudaSuccess)
        e = cudaMalloc(&dec->mem, bytes);
    if (e == cudaSuccess)
        e = cudaMemset(dec->mem, 0, bytes);
    /* The row-tile kernels may take all the shared memory a block may
     * (less their static part); prefer the largest shared-memory carveout
     * so that several tiles fit per SM. */
    int optin = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(
            &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dec->device);
    dec->smem_block = optin > 1024 ? (uint32_t)optin - 1024 : 0;
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(topk_tile_kernel<true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)dec->smem_block);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(topk_tile_kernel<false>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)dec->smem_block);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(topk_tile_kernel<true>,
                                 cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(topk_tile_kernel<false>,
                                 cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess)
        e = cudaMallocHost((void **)&dec->host_fault, sizeof(kvr__fault_t));
    if (e != cudaSuccess) {
        kvr_gpu_decode_destroy(dec);
        return kvr__cuda_status(e, "allocating the decode state", err);
    }
    *out = dec;
    return KVR_OK;
}

extern "C" void kvr_gpu_decode_destroy(kvr_gpu_decode_t *dec)
{
    if (dec == NULL)
        return;
    cudaFree(dec->mem);
    cudaFreeHost(dec->host_fault);
    free(dec);
}

extern "C" kvr_status_t kvr_gpu_decode_check(kvr_gpu_decode_t *dec,
                                             void *stream, kvr_error_t *err)
{
    kvr_status_t st = check_device(dec, err);
    if (st != KVR_OK)
        return st;
    cudaStream_t s = (cudaStream_t)stream;
    kvr__fault_t *f = &((State *)dec->mem)->fault;
    KVR__CUDA_TRY(cudaMemcpyAsync(dec->host_fault, f, sizeof(*f),
                                  cudaMemcpyDeviceToHost, s),
                  err);
    KVR__CUDA_TRY(cudaStreamSynchronize(s), err);
    if (dec->host_fault->code == KVR__FAULT_NONE)
        return KVR_OK;
    kvr__fault_t seen = *dec->host_fault;
    KVR__CUDA_TRY(cudaMemsetAsync(f, 0, sizeof(*f), s), err);
    KVR__CUDA_TRY(cudaStreamSynchronize(s), err);
    return kvr__fault_status(&seen, err);
}

extern "C" kvr_status_t kvr_gpu_topk_filter(kvr_gpu_decode_t *dec,
                                            const kvr_gpu_topk_args_t *a,
                                            void *stream, kvr_error_t *err)
{
    kvr_status_t st = kvr__topk_check(a, err);
    if (st == KVR_OK)
        st = check_device(dec, err);
    if (st != KVR_OK)
        return st;
    if (a->num_rows > dec->max_rows)
        return kvr_error_set(err, KVR_ERR_INVALID,
                             "%u top-k rows, the decode state holds %u",
                             a->num_rows, dec->max_rows);
    cudaStream_t s = (cudaStream_t)stream;
    if (a->num_rows == 0) {
        KVR__CUDA_TRY(cudaMemsetAsync(a->out_indptr, 0, sizeof(int32_t), s),
                      err);
        return KVR_OK;
    }
    TopkJob j = topk_job(a);
    bool pow2 = is_pow2(a->interleave) && is_pow2(a->dcp_size);
    State *state = (State *)dec->mem;
    if (KVR_TOPK_TILE && j.vec4 && a->topk <= TR_KMAX)
        return launch_tiles(dec, j, pow2 && is_pow2(a->block_size), s, err);
    if (pow2)
        topk_kernel<true>
            <<<a->num_rows, TK_THREADS, 0, s>>>(j, state, scan_flags(dec->mem));
    else
        topk_kernel<false>
            <<<a->num_rows, TK_THREADS, 0, s>>>(j, state, scan_flags(dec->mem));
    return kvr__launch_status("topk_kernel", err);
}

extern "C" kvr_status_t kvr_gpu_rows(const kvr_gpu_rows_args_t *a, void *stream,
                                     kvr_error_t *err)
{
    uint32_t rows = 0;
    kvr_status_t st = kvr_gpu_rows_count(a, &rows, err);
    if (st != KVR_OK || rows == 0)
        return st;
    uint32_t per_req = a->step == KVR_GPU_STEP_VERIFY ? a->q_len : 1;
    rows_kernel<<<(rows + 255) / 256, 256, 0, (cudaStream_t)stream>>>(
        a->out, rows, per_req);
    return kvr__launch_status("rows_kernel", err);
}

extern "C" kvr_status_t kvr_gpu_index_slots(kvr_gpu_decode_t *dec,
                                            const kvr_gpu_slots_args_t *a,
                                            void *stream, kvr_error_t *err)
{
    kvr_status_t st = kvr__slots_check(a, err);
    if (st == KVR_OK)
        st = check_device(dec, err);
    uint64_t n = a ? (uint64_t)a->num_reqs * a->q_len : 0;
    if (st != KVR_OK || n == 0)
        return st;
    slots_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
        *a, &((State *)dec->mem)->fault);
    return kvr__launch_status("slots_kernel", err);
}

extern "C" kvr_status_t kvr_gpu_lse_merge(const kvr_gpu_lse_args_t *a,
                                          void *stream, kvr_error_t *err)
{
    kvr_status_t st = kvr__lse_check(a, err);
    if (st != KVR_OK)
        return st;
    if (a->ranks > KVR__GPU_MAX_RANKS)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "LSE merge of %u ranks: at most %d on the GPU",
                             a->ranks, KVR__GPU_MAX_RANKS);
    uint64_t warps = (uint64_t)a->batch * a->heads;
    if (warps == 0)
        return KVR_OK;
    uint64_t blocks = (warps * 32 + LSE_THREADS - 1) / LSE_THREADS;
    if (blocks > INT32_MAX)
        return kvr_error_set(err, KVR_ERR_UNSUPPORTED,
                             "LSE merge of %llu heads is too large",
                             (unsigned long long)warps);
    lse_kernel<<<(unsigned)blocks, LSE_THREADS, 0, (cudaStream_t)stream>>>(*a);
    return kvr__launch_status("lse_kernel", err);
}
