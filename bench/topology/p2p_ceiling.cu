/* cudaMemcpyPeer ceilings for the GPU pairs a topology run uses: each pair
 * alone, then all pairs at once (the aggregate ceiling). One JSON object on
 * stdout. Usage: p2p_ceiling BYTES SRC:DST [SRC:DST ...] */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_PAIRS 64
#define CHECK(call)                                                            \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) {                                               \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));        \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

struct pair_t {
    int src, dst;
    void *a, *b;
    cudaStream_t s;
    cudaEvent_t t0, t1;
};

static double run(pair_t *p, int n, size_t bytes, int reps)
{
    for (int i = 0; i < n; i++) {
        CHECK(cudaSetDevice(p[i].src));
        CHECK(cudaEventRecord(p[i].t0, p[i].s));
        for (int r = 0; r < reps; r++)
            CHECK(cudaMemcpyPeerAsync(p[i].b, p[i].dst, p[i].a, p[i].src, bytes,
                                      p[i].s));
        CHECK(cudaEventRecord(p[i].t1, p[i].s));
    }
    float worst = 0;
    for (int i = 0; i < n; i++) {
        float ms = 0;
        CHECK(cudaSetDevice(p[i].src));
        CHECK(cudaEventSynchronize(p[i].t1));
        CHECK(cudaEventElapsedTime(&ms, p[i].t0, p[i].t1));
        worst = ms > worst ? ms : worst;
    }
    return (double)bytes * reps * n / (worst / 1e3) / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return fprintf(stderr, "usage: p2p_ceiling BYTES SRC:DST...\n"), 2;
    size_t bytes = strtoull(argv[1], NULL, 10);
    int n = 0;
    static pair_t p[MAX_PAIRS];
    for (int i = 2; i < argc && n < MAX_PAIRS; i++, n++) {
        if (sscanf(argv[i], "%d:%d", &p[n].src, &p[n].dst) != 2)
            return fprintf(stderr, "bad pair %s\n", argv[i]), 2;
        CHECK(cudaSetDevice(p[n].dst));
        CHECK(cudaMalloc(&p[n].b, bytes));
        CHECK(cudaSetDevice(p[n].src));
        CHECK(cudaMalloc(&p[n].a, bytes));
        if (p[n].src != p[n].dst)
            cudaDeviceEnablePeerAccess(p[n].dst, 0), cudaGetLastError();
        CHECK(cudaStreamCreate(&p[n].s));
        CHECK(cudaEventCreate(&p[n].t0));
        CHECK(cudaEventCreate(&p[n].t1));
    }
    printf("{\"bytes\":%zu,\"pairs\":[", bytes);
    for (int i = 0; i < n; i++) {
        run(&p[i], 1, bytes, 1); /* warm-up */
        double gbs = run(&p[i], 1, bytes, 5);
        printf("%s{\"src\":%d,\"dst\":%d,\"gbps\":%.1f}", i ? "," : "",
               p[i].src, p[i].dst, gbs);
    }
    double all = run(p, n, bytes, 5);
    printf("],\"all_pairs_at_once_gbps\":%.1f}\n", all);
    return 0;
}
