/* Direct scatter into another process's memory through CUDA IPC: the child
 * (a consumer rank) allocates its region, exports an interior pointer and
 * checks the bytes it received; the parent (the producer) maps the handle
 * and scatters, after a refused open that must leave no error behind for
 * the launch. Fork happens before either side touches CUDA. Exit 77
 * without a CUDA device. */
#include <cuda_runtime_api.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "relayout_case.h"

#define CUDA_OK(call)                                                          \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        CHECK(e_ == cudaSuccess, "%s", cudaGetErrorString(e_));                \
    } while (0)

enum { RANK = 1, HEAD = 4096 };

static const case_shape_t SHAPE = {KVR_ROLE_MLA, 64, 2, 4, 0, 0, 576, 5000, 1};

static void same_case(relayout_case_t *c)
{
    uint64_t rng = 0x1bc;
    case_make(c, &SHAPE, &rng);
}

static void write_all(int fd, const void *p, size_t n)
{
    CHECK(write(fd, p, n) == (ssize_t)n, "pipe write");
}

static int read_all(int fd, void *p, size_t n)
{
    return read(fd, p, n) == (ssize_t)n;
}

static int consumer(int out_fd, int in_fd)
{
    int devices = 0;
    CHECK_KVR(kvr_gpu_device_count(&devices, &err));
    kvr_gpu_ipc_handle_t h = {{0}, UINT64_MAX};
    if (devices == 0) {
        write_all(out_fd, &h, sizeof(h)); /* offset UINT64_MAX: no device */
        return 77;
    }
    CUDA_OK(cudaSetDevice(devices - 1));
    relayout_case_t c;
    same_case(&c);
    unsigned char *img = xmalloc(c.dst_bytes), *base = NULL;
    case_poison(img, c.dst_bytes, 9);
    CUDA_OK(cudaMalloc((void **)&base, HEAD + c.dst_bytes));
    CUDA_OK(cudaMemcpy(base + HEAD, img, c.dst_bytes, cudaMemcpyHostToDevice));
    CHECK_KVR(kvr_gpu_ipc_export(base + HEAD, &h, &err));
    CHECK(h.offset == HEAD, "offset %llu", (unsigned long long)h.offset);
    write_all(out_fd, &h, sizeof(h));
    char done = 0;
    CHECK(read_all(in_fd, &done, 1) && done == 1, "producer failed");
    unsigned char *got = xmalloc(c.dst_bytes);
    CUDA_OK(cudaMemcpy(got, base + HEAD, c.dst_bytes, cudaMemcpyDeviceToHost));
    case_expect(&c, RANK, img);
    CHECK(memcmp(got, img, c.dst_bytes) == 0, "received bytes differ");
    printf("test_gpu_ipc: rank %u received %llu bytes through CUDA IPC\n", RANK,
           (unsigned long long)c.dst_bytes);
    return 0;
}

static void producer(int in_fd, int out_fd)
{
    kvr_gpu_ipc_handle_t h;
    CHECK(read_all(in_fd, &h, sizeof(h)), "no handle from the consumer");
    if (h.offset == UINT64_MAX)
        return;
    relayout_case_t c;
    same_case(&c);
    kvr_gpu_relayout_t *rl = NULL;
    void *src = NULL, *dst = NULL;
    CUDA_OK(cudaSetDevice(0));
    CHECK_KVR(
        kvr_gpu_relayout_create(&c.lay, &c.src, &c.dst, &c.req, &rl, &err));
    CHECK_KVR(kvr_gpu_relayout_upload(rl, &err));
    CUDA_OK(cudaMalloc(&src, c.src_bytes));
    CUDA_OK(cudaMemcpy(src, c.src_img, c.src_bytes, cudaMemcpyHostToDevice));
    /* a handle CUDA refuses: the failure is reported, and it must not stay
     * behind as CUDA's last error for the launch below to report */
    kvr_gpu_ipc_handle_t bad = {{0}, 0};
    void *nowhere = NULL;
    kvr_error_t bad_err = {0};
    CHECK(kvr_gpu_ipc_open(&bad, &nowhere, &bad_err) == KVR_ERR_CUDA,
          "a zeroed IPC handle opened (%s)", bad_err.msg);
    CHECK_KVR(kvr_gpu_ipc_open(&h, &dst, &err));
    CHECK_KVR(kvr_gpu_scatter_rank(rl, RANK, src, dst, NULL, &err));
    CUDA_OK(cudaDeviceSynchronize());
    kvr_gpu_ipc_close(&h, dst);
    char done = 1;
    write_all(out_fd, &done, 1);
    kvr_gpu_relayout_destroy(rl);
    case_free(&c);
}

int main(void)
{
    int up[2], down[2];
    CHECK(pipe(up) == 0 && pipe(down) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0)
        _exit(consumer(up[1], down[0]));
    producer(up[0], down[1]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status), "consumer crashed");
    if (WEXITSTATUS(status) == 77)
        printf("SKIP: no CUDA device\n");
    return WEXITSTATUS(status);
}
