#!/usr/bin/env bash
# GPU runs of `kvrelay bench serving` (bench/results/serving-gpu-*.json): the trace through
# prefill stages and decode ranks whose KV is in GPU memory (gpu-direct through CUDA IPC; every
# process on one GPU, or spread over the GPUs lent), the ceiling and the one-block round trip of
# the same run; then the same trace with KV in host memory on that machine, for comparison.
# With KVRELAY_BUILD (a build folder, as bench/gpu/build-and-run.sh makes and calls it with,
# its libraries already on LD_LIBRARY_PATH) it runs $KVRELAY_BUILD/bin/kvrelay; otherwise it expects
# .devlibs/ (not tracked) holding build/kvrelay from a CUDA release build and root/ with Debian 12
# libucx0 libsodium23 libjansson4 libnuma1 (dpkg -x). Run it from the repo root. RUN_S bounds each
# run (seconds); HOST=0 skips the host-memory run, BASE=0 the first two; PROFILE=1 adds a debug-logged run, PP1=1 one
# from a single stage process, MPS=1 one under CUDA MPS. Results go to $OUT, else bench/results.
set -u
export CUDA_MODULE_LOADING=EAGER # the first launch in a process must not wait for the device
if [ -n "${KVRELAY_BUILD:-}" ]; then
  B=$KVRELAY_BUILD/bin
  LIBKVR=$(find "$KVRELAY_BUILD" -name libkvrelay.so | head -1)
else
  D=${DEVLIBS:-.devlibs}; D=$(cd "$D" && pwd)
  export LD_LIBRARY_PATH=$D/root/usr/lib/x86_64-linux-gnu UCX_MODULE_DIR=$D/root/usr/lib/x86_64-linux-gnu/ucx
  B=$D/build
  LIBKVR=$D/build/libkvrelay.so
fi
R=${OUT:-bench/results}; mkdir -p "$R"
DAY=$(date -u +%F)
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# TRACE_ARGS replaces the trace's arguments (a list, split on spaces), for experiments. Every
# request reads its own source blocks and the ceiling exactly those (--sources distinct): with
# one shared source the ceiling re-read a layer's few MB from the GPU's L2 and ran 2.2x faster
# than the same kernels on distinct data (docs/performance.md, run 2026-12-02m)
# shellcheck disable=SC2206 # TRACE_ARGS is a list of arguments
TRACE=(${TRACE_ARGS:---requests 16 --tokens-dist uniform:2048:16384 --sources distinct --timeout 500})
run() { # run NAME ARGS...: one bench serving run, its JSON and log in $R
  local name=$1; shift
  echo "== kvrelay bench serving $* ($name)"
  timeout "${RUN_S:-560}" "$B/kvrelay" bench serving "$@" --json "$R/serving-$name-$DAY.json" \
    > "$R/serving-$name-$DAY.log" 2>&1
  echo "rc=$?"; tail -12 "$R/serving-$name-$DAY.log"
  if python3 -c "import matplotlib" 2>/dev/null && [ -s "$R/serving-$name-$DAY.json" ]; then
    PYTHONPATH=python KVRELAY_LIB=$LIBKVR \
      python3 -m kvrelay.plot "$R/serving-$name-$DAY.json" -o "$R/serving-$name-$DAY.png"
  fi
}
# ratio, gaps and the one-block round trip, all requests at once; then streaming against
# not, with a prefill of 1 ms per layer per 1k tokens, Poisson arrivals (BASE=0 skips both)
if [ "${BASE:-1}" = 1 ]; then
  run gpu --device cuda "${TRACE[@]}"
  run gpu-stream --device cuda "${TRACE[@]}" --stream both \
    --prefill-us-per-layer-per-ktoken 1000 --rate 3
fi
# PROFILE=1: two 2048-token requests (PROFILE_ARGS: others, e.g. the trace's) and the
# one-block round trips with every agent's debug log (KVR_AGENT_DEBUG, microsecond stamps),
# for where a request's time goes; with MPS=1 it runs under the MPS server instead (profile
# NAME: gpu-profile or gpu-mps-profile)
profile() {
  # shellcheck disable=SC2086 # PROFILE_ARGS is a list of arguments
  KVR_AGENT_DEBUG=1 run "$1" --device cuda ${PROFILE_ARGS:---requests 2 --tokens-dist fixed:2048} \
    --timeout 500
  python3 bench/gpu/profile_steps.py --trace t0- "$R/serving-$1-$DAY.log" |
    tee "$R/profile-steps-$1-$DAY.txt"
}
[ "${PROFILE:-0}" = 1 ] && [ "${MPS:-0}" != 1 ] && profile gpu-profile
# PP1=1: the same trace from one prefill stage process (78 layers): no other stage's process
# shares the GPU's time with it, as when each stage has a GPU of its own
[ "${PP1:-0}" = 1 ] && run gpu-pp1 --device cuda --pp 1 "${TRACE[@]}"
# MPS=1: the same trace with every process a client of one MPS server (started here with its
# pipe and log folders under /tmp, quit afterwards): the processes' kernels share the GPU at
# once instead of taking turns in time slices, as when stages and ranks share a GPU in service
if [ "${MPS:-0}" = 1 ]; then
  if command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/kvr-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/kvr-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      run gpu-mps --device cuda "${TRACE[@]}"
      # MPS_RUNS=N: N runs of it (gpu-mps, gpu-mps-2, ...), for run-to-run spread
      for k in $(seq 2 "${MPS_RUNS:-1}"); do run "gpu-mps-$k" --device cuda "${TRACE[@]}"; done
      [ "${PROFILE:-0}" = 1 ] && profile gpu-mps-profile
      echo quit | nvidia-cuda-mps-control
      # the server leaves once its last client has; in run 2026-12-02m every CUDA process
      # started after two MPS runs and the quit (device tests, demos) hung on the device: wait
      # for the daemons to leave, bounded, and say so when they did not
      for _ in $(seq 60); do
        pgrep -x nvidia-cuda-mps-server > /dev/null || pgrep -x nvidia-cuda-mps-control > /dev/null || break
        sleep 0.5
      done
      pgrep -ax 'nvidia-cuda-mps-(server|control)' && echo "MPS: still running 30 s after quit"
    else
      echo "MPS: the control daemon did not start"
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  else
    echo "MPS: nvidia-cuda-mps-control not found, skipped"
  fi
fi
# the same trace with KV in host memory on this machine (UCX shared memory)
[ "${HOST:-1}" != 1 ] || run host-h200 --transport shm "${TRACE[@]}"
