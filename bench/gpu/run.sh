#!/usr/bin/env bash
# Builds the gpu layer, its device tests and the benchmark with nvcc and cc
# alone (the GPU machine has no cmocka, libsodium, jansson or UCX), runs the
# tests, then the benchmark. Results go to $OUT (default bench/out):
# gpu-bench.json, tests.log, bench.log, nvidia-smi.txt.
#   bench/gpu/run.sh             build, test, bench
#   bench/gpu/run.sh --no-bench  build and test only
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_INC=$(dirname "$(dirname "$(readlink -f "$NVCC")")")/include
ARCH=${ARCH:-sm_90}
CC=${CC:-cc}
B=$(mktemp -d)
trap 'rm -rf "$B"' EXIT
INC="-Iinclude -Isrc/layout -Isrc/gpu -Itests/gpu -I$CUDA_INC"
WARN="-Wall -Wextra -Wshadow -Werror"

obj() { echo "$B/$(basename "$1").o"; }
compile() { # source file
    case "$1" in
    *.cu) "$NVCC" -O3 -lineinfo -std=c++17 -arch="$ARCH" $INC -Xcompiler "${WARN// /,}" \
              -Werror all-warnings -c "$1" -o "$(obj "$1")" ;;
    *) "$CC" -O2 -std=c11 -D_GNU_SOURCE $WARN $INC -c "$1" -o "$(obj "$1")" ;;
    esac
}

echo "== build: $("$NVCC" --version | tail -1), $ARCH"
t0=$(date +%s)
SRCS="src/layout/layout.c $(ls src/gpu/*.c src/gpu/*.cu) tests/gpu/relayout_case.c
      tests/gpu/decode_case.c tests/gpu/test_gpu_relayout.c tests/gpu/test_gpu_decode.c
      tests/gpu/test_gpu_ipc.c bench/gpu/bench_gpu.c"
pids=()
for f in $SRCS; do compile "$f" & pids+=($!); done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ "$fail" = 0 ] || { echo "build failed"; exit 1; }
LIB=""
for f in src/layout/layout.c $(ls src/gpu/*.c src/gpu/*.cu); do LIB="$LIB $(obj "$f")"; done
link() { # executable, objects...
    local exe=$1; shift
    "$NVCC" -arch="$ARCH" -o "$B/$exe" "$@" $LIB -lm || exit 1
}
link test_gpu_relayout "$(obj tests/gpu/test_gpu_relayout.c)" "$(obj tests/gpu/relayout_case.c)"
link test_gpu_ipc "$(obj tests/gpu/test_gpu_ipc.c)" "$(obj tests/gpu/relayout_case.c)"
link test_gpu_decode "$(obj tests/gpu/test_gpu_decode.c)" "$(obj tests/gpu/decode_case.c)"
link bench_gpu "$(obj bench/gpu/bench_gpu.c)"
if [ -n "${TUNE:-}" ]; then # kernel variants to compare, e.g. TUNE=-DKVR_RL_STEP=4
    TUNE_LIB=""
    for f in src/layout/layout.c $(ls src/gpu/*.c src/gpu/*.cu); do
        o=$(obj "$f")
        case "$f" in
        *.cu) o="$B/tune-$(basename "$f").o"
              "$NVCC" -O3 -std=c++17 -arch="$ARCH" $INC $TUNE -c "$f" -o "$o" || exit 1 ;;
        esac
        TUNE_LIB="$TUNE_LIB $o"
    done
    "$NVCC" -arch="$ARCH" -o "$B/bench_tune" "$(obj bench/gpu/bench_gpu.c)" $TUNE_LIB -lm || exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 && nvidia-smi topo -m >> "$OUT/nvidia-smi.txt" 2>&1

if [ -n "${PROFILE:-}" ]; then # Nsight Compute on the top-k kernel
    ncu --clock-control none --set full -k regex:topk_kernel -s 3 -c 1 \
        "$B/bench_gpu" --topk-only "$OUT/topk-profiled.json" > "$OUT/ncu-topk.txt" 2>&1
    tail -c 12000 "$OUT/ncu-topk.txt"
    exit 0
fi
echo "== tests"
status=0
for t in test_gpu_relayout test_gpu_decode test_gpu_ipc; do
    t1=$(date +%s)
    "$B/$t" >> "$OUT/tests.log" 2>&1
    rc=$?
    case $rc in
    0) r=PASS ;; 77) r=SKIP ;; *) r="FAIL ($rc)"; status=1 ;;
    esac
    echo "$t: $r ($(( $(date +%s) - t1 )) s)" | tee -a "$OUT/tests.log"
done

if [ "${1:-}" != "--no-bench" ]; then
    echo "== bench"
    "$B/bench_gpu" "$OUT/gpu-bench.json" 2>&1 | tee "$OUT/bench.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    if [ -n "${TUNE:-}" ]; then
        echo "== bench with $TUNE"
        "$B/bench_tune" "$OUT/gpu-bench-tune.json" 2>&1 | tee "$OUT/bench-tune.log"
    fi
fi
exit $status
