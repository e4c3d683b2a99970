#!/usr/bin/env bash
# Builds the gpu layer, its device tests and the benchmark with nvcc and cc
# alone (the GPU machine has no cmocka, libsodium, jansson or UCX), runs the
# tests, then the benchmark. Results go to $OUT (default bench/out):
# gpu-bench.json, tests.log, bench.log, nvidia-smi.txt.
#   bench/gpu/run.sh             build, test, bench
#   bench/gpu/run.sh --no-bench  build and test only
#   ONLY=topk bench/gpu/run.sh   only the decode test and the top-k benchmark
#   TUNE="-DA=1;-DB=2"           also benchmark kernel variants, one per
#                                ';'-separated flag set: gpu-bench-tuneN.json,
#                                their logs appended to bench.log; the decode
#                                test runs on each variant too (not counted
#                                in the exit status)
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
INC="-Iinclude -Isrc/base -Isrc/layout -Isrc/gpu -Itests/gpu -I$CUDA_INC"
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
# base and layout: the files the gpu layer needs (base's init.c wants libsodium)
CORE="src/base/status.c src/layout/layout.c src/layout/region_class.c"
SRCS="$CORE $(ls src/gpu/*.c src/gpu/*.cu) tests/gpu/relayout_case.c tests/gpu/merge_case.c
      tests/gpu/decode_case.c tests/gpu/test_gpu_relayout.c tests/gpu/test_gpu_decode.c
      tests/gpu/test_gpu_ipc.c bench/gpu/bench_gpu.c"
pids=()
for f in $SRCS; do compile "$f" & pids+=($!); done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ "$fail" = 0 ] || { echo "build failed"; exit 1; }
LIB=""
for f in $CORE $(ls src/gpu/*.c src/gpu/*.cu); do LIB="$LIB $(obj "$f")"; done
link() { # executable, objects...
    local exe=$1; shift
    "$NVCC" -arch="$ARCH" -o "$B/$exe" "$@" $LIB -lm || exit 1
}
link test_gpu_relayout "$(obj tests/gpu/test_gpu_relayout.c)" "$(obj tests/gpu/relayout_case.c)" \
    "$(obj tests/gpu/merge_case.c)"
link test_gpu_ipc "$(obj tests/gpu/test_gpu_ipc.c)" "$(obj tests/gpu/relayout_case.c)"
link test_gpu_decode "$(obj tests/gpu/test_gpu_decode.c)" "$(obj tests/gpu/decode_case.c)"
link bench_gpu "$(obj bench/gpu/bench_gpu.c)"
IFS=';' read -r -a TUNES <<< "${TUNE:-}" # kernel variants, e.g. TUNE=-DKVR_RL_STEP=4
tune_build() { # index, flags
    local lib="" o pids=()
    for f in $CORE $(ls src/gpu/*.c src/gpu/*.cu); do
        o=$(obj "$f")
        case "$f" in
        *.cu) o="$B/tune$1-$(basename "$f").o"
              "$NVCC" -O3 -std=c++17 -arch="$ARCH" $INC $2 -c "$f" -o "$o" & pids+=($!) ;;
        esac
        lib="$lib $o"
    done
    for p in "${pids[@]}"; do wait "$p" || return 1; done
    "$NVCC" -arch="$ARCH" -o "$B/bench_tune$1" "$(obj bench/gpu/bench_gpu.c)" $lib -lm &&
        "$NVCC" -arch="$ARCH" -o "$B/test_gpu_decode_tune$1" "$(obj tests/gpu/test_gpu_decode.c)" \
            "$(obj tests/gpu/decode_case.c)" $lib -lm
}
tpids=()
for i in "${!TUNES[@]}"; do tune_build "$((i + 1))" "${TUNES[$i]}" & tpids+=($!); done
for p in "${tpids[@]}"; do wait "$p" || { echo "tune build failed"; exit 1; }; done
echo "build: $(( $(date +%s) - t0 )) s"

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 && nvidia-smi topo -m >> "$OUT/nvidia-smi.txt" 2>&1

if [ -n "${PROFILE:-}" ]; then # Nsight Compute on the top-k kernel
    ncu --clock-control none --set full -k regex:topk_ -s 3 -c 1 \
        "$B/bench_gpu" --topk-only "$OUT/topk-profiled.json" > "$OUT/ncu-topk.txt" 2>&1
    tail -c 12000 "$OUT/ncu-topk.txt"
    exit 0
fi
echo "== tests"
status=0
TESTS="test_gpu_relayout test_gpu_decode test_gpu_ipc" BENCH_ARGS=""
[ "${ONLY:-}" = topk ] && { TESTS=test_gpu_decode; BENCH_ARGS=--topk-only; }
for t in $TESTS; do
    t1=$(date +%s)
    "$B/$t" >> "$OUT/tests.log" 2>&1
    rc=$?
    case $rc in
    0) r=PASS ;; 77) r=SKIP ;; *) r="FAIL ($rc)"; status=1 ;;
    esac
    echo "$t: $r ($(( $(date +%s) - t1 )) s)" | tee -a "$OUT/tests.log"
done
for i in "${!TUNES[@]}"; do # the decode test on each variant too
    "$B/test_gpu_decode_tune$((i + 1))" >> "$OUT/tests.log" 2>&1
    rc=$?
    case $rc in
    0) r=PASS ;; 77) r=SKIP ;; *) r="FAIL ($rc)" ;;
    esac
    echo "test_gpu_decode tune$((i + 1)) (${TUNES[$i]}): $r" | tee -a "$OUT/tests.log"
done

if [ "${1:-}" != "--no-bench" ]; then
    echo "== bench"
    "$B/bench_gpu" $BENCH_ARGS "$OUT/gpu-bench.json" 2>&1 | tee "$OUT/bench.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    for i in "${!TUNES[@]}"; do
        echo "== bench tune$((i + 1)): ${TUNES[$i]}" | tee -a "$OUT/bench.log"
        "$B/bench_tune$((i + 1))" $BENCH_ARGS "$OUT/gpu-bench-tune$((i + 1)).json" 2>&1 |
            tee -a "$OUT/bench.log"
    done
fi
exit $status
