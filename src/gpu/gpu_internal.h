/* Internals shared by the gpu layer's C and CUDA files. */
#ifndef KVRELAY_GPU_INTERNAL_H
#define KVRELAY_GPU_INTERNAL_H

#include "kvrelay/gpu.h"
#include "relayout_map.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVR__GPU_MAX_DEVICES 32
#define KVR__GPU_MAX_RANKS 64

/* Releases a table's device copy of `bytes`: cudaFree, cudaFreeAsync on the
 * stream `owner`, or back into the kvr_gpu_pool_t `owner`. */
typedef void (*kvr__gpu_free_fn)(void *ptr, size_t bytes, void *owner);

struct kvr_gpu_relayout {
    kvr__rl_geom_t geom; /* tables point into `tables` */
    uint32_t *tables;    /* src [end_src] | dst [first + blocks] | order */
    size_t table_words;
    /* Per-device copies of `tables`, made by kvr_gpu_relayout_upload (or
     * its _async form, which frees them on the stream in device_owner, or
     * its _pool form, which gives them back to the pool there); the CUDA
     * library sets free_device so this C layer can release them. */
    void *device[KVR__GPU_MAX_DEVICES];
    void *device_owner[KVR__GPU_MAX_DEVICES];
    kvr__gpu_free_fn free_device;
};

/* One piece of a run table: stream bytes [off, off + len) go from src to
 * dst (absolute addresses). */
typedef struct kvr__run_item {
    uint64_t src, dst, off, len;
} kvr__run_item_t;

struct kvr_gpu_runs {
    kvr__run_item_t *items; /* stream order */
    size_t n;
    uint64_t bytes;
    bool some_without_src, some_without_dst; /* a 0 address among items */
    void *device; /* the uploaded items (kvr_gpu_runs_upload) */
    void *device_owner;
    kvr__gpu_free_fn free_device;
};

/* Pieces [*first, *last) of rt that meet stream bytes [pos, pos + len),
 * after checking that range and the buffers (at most one). */
kvr_status_t kvr__runs_span(const kvr_gpu_runs_t *rt, uint64_t pos,
                            uint64_t len, const void *src_buf,
                            const void *dst_buf, size_t *first, size_t *last,
                            kvr_error_t *err);

/* (CUDA) Benchmark knobs, 0 for the defaults: items a relayout warp copies
 * at once (2, 4, 8 or 16); the run copy's form (1: a warp a piece, one
 * vector a lane at a time, as before). bench_rl_kernel and the device
 * tests set them. */
extern int kvr__rl_tune_step;
/* (CUDA) 1: one-rank MLA scatters through relayout_kernel's items of up
 * to 1024 bytes instead of chunk_kernel's one source chunk an item (the
 * default, teams of 8 lanes of 5 vectors); 3, 4: other team shapes
 * (relayout.cu). */
extern int kvr__rl_tune_chunks;
/* (CUDA) At most this many blocks a relayout launch, 0: as many as fit. */
extern int kvr__rl_tune_grid;
/* (CUDA) 1: kvr_gpu_scatter_requests keeps the caller's slot order (in
 * its groups of 8 relayouts) instead of region-major: the control that
 * tells the order's effect from the launches' (bench_rl_trace). */
extern int kvr__rl_tune_merge_order;
extern int kvr__runs_tune_unroll;

/* (CUDA) One empty launch of every relayout kernel, and of the run copy,
 * on stream: loads their code on the current device. */
kvr_status_t kvr__relayout_warm(void *stream, kvr_error_t *err);
kvr_status_t kvr__runs_warm(void *stream, kvr_error_t *err);

/* (CUDA) A pool block of at least `bytes` on the pool's device (current),
 * reused in the pool stream's order; kvr__pool_put (a kvr__gpu_free_fn,
 * owner the pool) gives it back. */
kvr_status_t kvr__pool_get(kvr_gpu_pool_t *pool, size_t bytes, void **ptr,
                           kvr_error_t *err);
void kvr__pool_put(void *ptr, size_t bytes, void *owner);
/* The other kvr__gpu_free_fn: cudaFreeAsync on the stream `stream` when
 * the table was uploaded on one (freed after the launches queued there,
 * without the device-wide wait of cudaFree), else cudaFree. */
void kvr__cuda_free_on(void *ptr, size_t bytes, void *stream);
void *kvr__pool_stream(const kvr_gpu_pool_t *pool);
/* (CUDA) A slot of the pool's mapped pinned memory for a table of
 * `bytes`, *host to write it and *dev for the kernels to read it there
 * (kvr_gpu_relayout_upload_mapped); KVR_ERR_NO_MEMORY when the table is
 * larger than a slot or every slot is taken. kvr__pool_mapped_put (a
 * kvr__gpu_free_fn, owner the pool) gives it back. */
kvr_status_t kvr__pool_mapped_get(kvr_gpu_pool_t *pool, size_t bytes,
                                  void **host, void **dev);
void kvr__pool_mapped_put(void *dev, size_t bytes, void *owner);

/* Checks rank and that [offset, offset + len) lies inside rank's stream. */
kvr_status_t kvr__rl_check_range(const kvr_gpu_relayout_t *rl, uint32_t rank,
                                 uint64_t offset, uint64_t len,
                                 kvr_error_t *err);

/* Sorted destination blocks [s0, s1) whose stream bytes meet
 * [offset, offset + len); len > 0. */
void kvr__rl_block_span(const kvr__rl_geom_t *g, uint32_t rank, uint64_t offset,
                        uint64_t len, uint32_t *s0, uint32_t *s1);

/* Data faults the decode ops record (the first one wins). */
typedef enum {
    KVR__FAULT_NONE = 0,
    KVR__FAULT_SEQ = 1,     /* token_to_seq outside [0, num_reqs) */
    KVR__FAULT_POS = 2,     /* position < -1 or past the block table */
    KVR__FAULT_BLOCK = 3,   /* negative block-table entry */
    KVR__FAULT_SLOT = 4,    /* slot past INT32_MAX */
    KVR__FAULT_SEQ_LEN = 5, /* seq_len < 0, < q_len, or past the table */
} kvr__fault_code_t;

typedef struct kvr__fault {
    int32_t code;
    int32_t row;   /* top-k row, or request */
    int32_t col;   /* top-k column, or -1 */
    int32_t value; /* the offending value */
} kvr__fault_t;

/* Turns a fault record into a status and message (the same text for the
 * reference and the device path). */
kvr_status_t kvr__fault_status(const kvr__fault_t *f, kvr_error_t *err);

/* Host argument checks shared by the reference and the CUDA launchers. */
kvr_status_t kvr__topk_check(const kvr_gpu_topk_args_t *a, kvr_error_t *err);
kvr_status_t kvr__slots_check(const kvr_gpu_slots_args_t *a, kvr_error_t *err);
kvr_status_t kvr__lse_check(const kvr_gpu_lse_args_t *a, kvr_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
