/* Decode-side DCP ops on the GPU (DESIGN.md §10): top-k filter/convert,
 * row-to-request maps, replicated index slot mapping, LSE merge. */
#include <cuda/atomic>

#include "cuda_util.cuh"

struct kvr_gpu_decode {
    int device;
    uint32_t max_rows;
    void *mem;                 /* State, then max_rows scan flags */
    kvr__fault_t *host_fault;  /* pinned mirror for kvr_gpu_decode_check */
};

namespace {

/* Top-k scan state: rows are handed out by ticket in launch order, and each
 * row publishes its count, then its inclusive prefix, in flags[row], tagged
 * with the launch's epoch so that no launch has to clear them. The last
 * block to take a ticket and the last to finish reset the counters and bump
 * the epoch; all of it lives on the device, so launches can be captured in a
 * graph and replayed. */
struct State {
    uint32_t ticket;
    uint32_t done;
    uint32_t epoch;
    uint32_t pad;
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

/* Division by a run-time constant as multiply and shift, for n and d below
 * 2^31 (the top-k filter divides every candidate by I, W and V). */
struct Div {
    uint32_t d, mul, shift;
};

Div make_div(uint32_t d)
{
    uint32_t shift = 0;
    while (shift < 31 && (1u << shift) < d)
        shift++;
    uint64_t mul = ((1ull << 32) * ((1ull << shift) - d)) / d + 1;
    return Div{d, (uint32_t)mul, shift};
}

__device__ __forceinline__ uint32_t div(const Div &d, uint32_t n)
{
    return (__umulhi(n, d.mul) + n) >> d.shift;
}

struct TopkJob {
    kvr_gpu_topk_args_t a;
    Div by_i, by_w, by_v, by_iw;
    uint64_t limit; /* positions must be below max_blocks * V */
    uint32_t vec4;  /* rows can be read 16 bytes at a time */
};

constexpr int TK_THREADS = 128, TK_ITEMS = 16, TK_TILE = TK_THREADS * TK_ITEMS;

/* Slot of candidate g on this rank, or -1 (empty, another rank's, or a
 * fault). Same formulas as kvr__owner and kvr__dst_slot, with g % V /
 * (I*W) * I + g % I for local(g) % bs (V is a multiple of I*W). */
__device__ int32_t classify(const TopkJob &j, const int32_t *table, int32_t v,
                            uint32_t row, uint32_t col, kvr__fault_t *f)
{
    if (v == -1)
        return -1;
    if (v < -1 || (uint64_t)v >= j.limit) {
        record(f, KVR__FAULT_POS, row, col, v);
        return -1;
    }
    uint32_t g = (uint32_t)v, chunk = div(j.by_i, g);
    if (chunk - div(j.by_w, chunk) * j.by_w.d != j.a.rank)
        return -1;
    uint32_t vb = div(j.by_v, g);
    int32_t entry = table[vb];
    if (entry < 0) {
        record(f, KVR__FAULT_BLOCK, row, col, entry);
        return -1;
    }
    uint32_t local = div(j.by_iw, g - vb * j.by_v.d) * j.by_i.d +
                     (g - chunk * j.by_i.d);
    uint64_t slot = (uint64_t)entry * j.a.block_size + local;
    if (slot > INT32_MAX) {
        record(f, KVR__FAULT_SLOT, row, col, entry);
        return -1;
    }
    return (int32_t)slot;
}

/* Loads this thread's TK_ITEMS consecutive candidates of a tile and turns
 * them into slots (-1 where none); returns how many are slots. */
__device__ int32_t load_tile(const TopkJob &j, const int32_t *table,
                             uint32_t row, uint32_t tile, kvr__fault_t *f,
                             int32_t (&v)[TK_ITEMS])
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
    int32_t n = 0;
#pragma unroll
    for (int i = 0; i < TK_ITEMS; i++) {
        v[i] = classify(j, table, v[i], row, col0 + i, f);
        n += v[i] >= 0;
    }
    return n;
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

using flag_ref = cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>;

__device__ unsigned long long flag_word(uint32_t epoch, uint32_t state,
                                        uint32_t value)
{
    return ((epoch & EPOCH_MASK) << 34) | ((uint64_t)state << 32) | value;
}

/* Decoupled look-back (one thread): publish this row's count, add up the
 * rows before it back to the nearest inclusive prefix, publish ours. */
__device__ uint32_t look_back(uint64_t *flags, uint32_t row, uint32_t epoch,
                              uint32_t count)
{
    unsigned long long *f = (unsigned long long *)flags;
    if (row == 0) {
        flag_ref(f[0]).store(flag_word(epoch, FLAG_INCLUSIVE, count),
                             cuda::memory_order_relaxed);
        return 0;
    }
    flag_ref(f[row]).store(flag_word(epoch, FLAG_AGGREGATE, count),
                           cuda::memory_order_relaxed);
    uint32_t prefix = 0;
    for (uint32_t i = row - 1;;) {
        unsigned long long w = flag_ref(f[i]).load(cuda::memory_order_relaxed);
        uint32_t state = (uint32_t)(w >> 32) & 3;
        if ((w >> 34) != (epoch & EPOCH_MASK) || state == 0)
            continue;
        prefix += (uint32_t)w;
        if (state == FLAG_INCLUSIVE)
            break;
        i--;
    }
    flag_ref(f[row]).store(flag_word(epoch, FLAG_INCLUSIVE, prefix + count),
                           cuda::memory_order_relaxed);
    return prefix;
}

/* Pass 2: writes the row's slots from `start`, tile by tile, in order. */
__device__ void write_row(const TopkJob &j, const int32_t *table, uint32_t row,
                          uint32_t start, kvr__fault_t *f,
                          int32_t (&v)[TK_ITEMS])
{
    for (uint32_t tile = 0; tile < j.a.topk; tile += TK_TILE) {
        int32_t n = 0, tile_total = 0;
        if (j.a.topk <= TK_TILE) {
#pragma unroll
            for (int i = 0; i < TK_ITEMS; i++)
                n += v[i] >= 0;
        } else {
            n = load_tile(j, table, row, tile, f, v);
        }
        uint32_t pos = start + block_scan(n, &tile_total);
#pragma unroll
        for (int i = 0; i < TK_ITEMS; i++)
            if (v[i] >= 0)
                j.a.out_slots[pos++] = v[i];
        start += tile_total;
    }
}

__device__ uint32_t take_ticket(State *st, uint32_t *epoch)
{
    __shared__ uint32_t s_row, s_epoch;
    if (threadIdx.x == 0) {
        uint32_t t = atomicAdd(&st->ticket, 1);
        if (t == gridDim.x - 1)
            st->ticket = 0; /* every ticket of this launch is taken */
        s_row = t;
        s_epoch = *(volatile uint32_t *)&st->epoch;
    }
    __syncthreads();
    *epoch = s_epoch;
    return s_row;
}

__device__ void finish_block(State *st, uint32_t epoch)
{
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(&st->done, 1) == gridDim.x - 1) {
        st->done = 0;
        st->epoch = epoch + 1;
    }
}

__global__ void __launch_bounds__(TK_THREADS)
    topk_kernel(const TopkJob j, State *st, uint64_t *flags)
{
    __shared__ uint32_t s_start;
    uint32_t epoch, row = take_ticket(st, &epoch);
    int32_t req = j.a.token_to_seq[row];
    bool req_ok = req >= 0 && (uint32_t)req < j.a.num_reqs;
    const int32_t *table =
        j.a.block_table + (uint64_t)(req_ok ? req : 0) * j.a.max_blocks;
    int32_t v[TK_ITEMS], n = 0, count = 0;
    for (uint32_t tile = 0; req_ok && tile < j.a.topk; tile += TK_TILE)
        n += load_tile(j, table, row, tile, &st->fault, v);
    if (!req_ok && threadIdx.x == 0)
        record(&st->fault, KVR__FAULT_SEQ, (int32_t)row, -1, req);
    block_scan(n, &count);
    if (threadIdx.x == 0) {
        s_start = look_back(flags, row, epoch, (uint32_t)count);
        j.a.out_indptr[row + 1] = (int32_t)(s_start + count);
        j.a.owned_counts[row] = count;
        if (row == 0)
            j.a.out_indptr[0] = 0;
    }
    __syncthreads();
    if (req_ok && count > 0)
        write_row(j, table, row, s_start, &st->fault, v);
    finish_block(st, epoch);
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
    if (L < 0 || (uint64_t)L < q || kvr__ceil_div((uint64_t)L, V) > a.max_blocks) {
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
__global__ void __launch_bounds__(LSE_THREADS) lse_kernel(const kvr_gpu_lse_args_t a)
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
                             "is %d", dec->device, dev);
    return KVR_OK;
}

TopkJob topk_job(const kvr_gpu_topk_args_t *a)
{
    TopkJob j;
    uint32_t V = a->block_size * a->dcp_size;
    j.a = *a;
    j.by_i = make_div(a->interleave);
    j.by_w = make_div(a->dcp_size);
    j.by_v = make_div(V);
    j.by_iw = make_div(a->interleave * a->dcp_size);
    j.limit = (uint64_t)a->max_blocks * V;
    j.vec4 = a->topk % 4 == 0 && (uintptr_t)a->token_indices % 16 == 0;
    return j;
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
                                  cudaMemcpyDeviceToHost, s), err);
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
    topk_kernel<<<a->num_rows, TK_THREADS, 0, s>>>(j, (State *)dec->mem,
                                                   scan_flags(dec->mem));
    return kvr__launch_status("topk_kernel", err);
}

extern "C" kvr_status_t kvr_gpu_rows(const kvr_gpu_rows_args_t *a,
                                     void *stream, kvr_error_t *err)
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
