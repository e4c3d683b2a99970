#!/usr/bin/env bash
# Builds the whole CLI on the GPU machine (nvcc, cmake and ninja there; no
# UCX, libsodium, jansson or cmocka) from packages carried in PKGS, then
# runs the device tests, the GPU demo over the network path and the GPU
# network benchmark. docs/transport.md, CUDA memory, says what it shows.
#
# PKGS (default .gpunet/pkgs) holds, prepared on a Debian 12 machine:
#   debs/  libsodium23 libsodium-dev libjansson4 libjansson-dev libcmocka0
#          libcmocka-dev pkgconf-bin libpkgconf3 (apt-get download ...)
#   ucx/   the libucx-cu13 wheel's libucx/ and libucx_cu13.libs/ folders
#          (UCX 1.22 with cuda_copy and cuda_ipc), e.g.
#            python3 -m pip download --no-deps --only-binary=:all: \
#              --python-version 3.12 --implementation cp \
#              --platform manylinux_2_28_x86_64 -d whl libucx-cu13
#            unzip whl/libucx_cu13-*.whl 'libucx/include/*' \
#              'libucx/lib/*.so*' 'libucx/lib/pkgconfig/*' \
#              'libucx/bin/ucx_info' 'libucx_cu13.libs/libcudart*'
# SRC (default: the repository) is the source tree to build. Results go to
# $OUT (default bench/out), six files (the device returns few): env.txt
# (nvidia-smi, ucx_info -v and -d), build.log, bench.log, gpu-network.json,
# tests.log, demos.log (every demo's output; with DEMO_DEBUG=1 the agents'
# link figures and executor picks, KVR_AGENT_DEBUG, filtered).
# Switches: SERVING=1 runs bench/gpu/serving.sh after the device tests, BENCH=0 skips the
# network benchmark, DEMOS=0 the demos; TARGETS builds only those
# targets, TESTS picks the tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/out}
PKGS=$(readlink -f "${PKGS:-.gpunet/pkgs}")
SRC=$(readlink -f "${SRC:-.}")
B=${BUILD:-/tmp/kvr-gpu-build}
ROOT=/tmp/kvr-gpu-root
mkdir -p "$OUT" "$ROOT"
for f in "$PKGS"/debs/*.deb; do dpkg -x "$f" "$ROOT" || exit 1; done
# the .pc files name /usr and the wheel's build folder: point them here
LIBS=$ROOT/usr/lib/x86_64-linux-gnu
sed -i "s|=/usr|=$ROOT/usr|" "$LIBS"/pkgconfig/*.pc
UCX=$PKGS/ucx/libucx
sed -i "s|^prefix *=.*|prefix = $UCX|" "$UCX"/lib/pkgconfig/*.pc
export LD_LIBRARY_PATH=$LIBS:$UCX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG="$ROOT/usr/bin/pkgconf"
export PKG_CONFIG_LIBDIR=$LIBS/pkgconfig
ENV=$OUT/env.txt
{ nvidia-smi; "$UCX/bin/ucx_info" -v; "$UCX/bin/ucx_info" -d; } > "$ENV" 2>&1
echo "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
echo "== UCX: $(grep -m1 'Library version' "$ENV"); transports: $(grep -o 'Transport: [a-z_]*' "$ENV" | sort -u | cut -d' ' -f2 | tr '\n' ' ')"
t0=$(date +%s)
# every step is bounded (BUILD_S, TEST_S, DEMO_S seconds): a hung step
# must not eat a lease
timeout "${BUILD_S:-240}" cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVR_UCX_PREFIX="$UCX" -DKVR_WERROR=OFF -DCMAKE_EXE_LINKER_FLAGS="-L$LIBS" \
    -DCMAKE_C_FLAGS="-I$ROOT/usr/include -Wno-error=unused-result" \
    > "$OUT/build.log" 2>&1 &&
    timeout "${BUILD_S:-240}" cmake --build "$B" -j"$(nproc)" \
        ${TARGETS:+--target $TARGETS} >> "$OUT/build.log" 2>&1
rc=$?
grep 'kvrelay:' "$OUT/build.log"
echo "== build rc=$rc in $(($(date +%s) - t0)) s"
[ $rc = 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fail=0
if [ "${BENCH:-1}" = 1 ]; then # the GPU network benchmark (gpu-network.json)
  echo "== benchmark"
  timeout "${BENCH_S:-120}" "$B/bench/bench_gpu_net" --tokens "${TOKENS:-262144}" --reps "${REPS:-5}" \
      --out "$OUT/gpu-network.json" 2>&1 | tee "$OUT/bench.log" || fail=1
fi
if [ "${IPC_BESIDE:-0}" = 1 ]; then # UCX's cuda_ipc beside kvrelay's mapping
  echo "== bench_gpu_net --test --ipc-beside-ucx" | tee -a "$OUT/bench.log"
  timeout 30 "$B/bench/bench_gpu_net" --test --ipc-beside-ucx 2>&1 | tee -a "$OUT/bench.log"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
fi
# the device tests before bench serving: in run 2026-12-02m every CUDA process started after two MPS serving
# runs hung on the device, the tests with them (docs/performance.md)
echo "== device tests"
(cd "$B" && timeout "${SUITE_S:-240}" ctest -j4 -R "${TESTS:-test_gpu|test_xfer_(loopback|ucx)}" \
    --timeout "${TEST_S:-60}" --output-on-failure) > "$OUT/tests.log" 2>&1 || fail=1
grep -E 'tests passed|Passed|Failed|Skipped|\*\*\*' "$OUT/tests.log" | tail -20
if [ "${SERVING:-0}" = 1 ]; then # bench serving's GPU form (bench/gpu/serving.sh)
  echo "== bench serving"
  KVRELAY_BUILD=$B OUT=$OUT bash bench/gpu/serving.sh || fail=1
fi
[ "${DEMOS:-1}" = 1 ] || exit $fail # DEMOS=0: no demos
echo "== demo: CUDA KV, stages and ranks as processes (the agent's gpu-direct)"
# the agents' own lines worth keeping (DEMO_DEBUG=1), and any crash
KEEP='GPU figures|transport probe|predicted ms|Caught signal|^ *[0-9]+ 0x|backtrace|rror'
demo() { # SKIP_DEMOS: a regex of demo arguments not to run
    [ -n "${SKIP_DEMOS:-}" ] && [[ "$*" =~ $SKIP_DEMOS ]] && return
    local log=/tmp/kvr-demo.log
    local t0=$(date +%s%N)
    ${DEMO_DEBUG:+env KVR_AGENT_DEBUG=1} timeout "${DEMO_S:-60}" \
        "$B/bin/kvrelay" demo "$@" > $log 2>&1
    local r=$?
    local ms=$((($(date +%s%N) - t0) / 1000000))
    echo "kvrelay demo $* -> rc=$r ($ms ms whole run)"; grep -v '^kvr agent' $log | tail -3
    { echo "### kvrelay demo $* -> rc=$r ($ms ms whole run)"; grep -v '^kvr agent' $log | tail -40
      grep -E "$KEEP" $log | grep -v 'verified' | head -80; } >> "$OUT/demos.log"
    [ $r = 0 ] || fail=1
}
demo --device cuda
demo --device cuda --executor gpu-direct
demo --device cuda --transport tcp ${NET_DEMO:-}
demo --device cuda --transport tcp --executor staged ${NET_DEMO:-}
demo --device cuda --producer-dcp 2 --dcp 4
demo --device cuda --model gqa --dcp 1 --producer-tp 2 --tp 8
exit $fail
