#!/usr/bin/env bash
# GPU runs of the agent (bench/results/agent-gpu-*.txt): device tests and demos over CUDA.
# Expects .devlibs/ (not tracked) holding build/{kvrelay,test_gpu_*} from a CUDA release build and
# root/ with Debian 12 libucx0 libsodium23 libjansson4 libnuma1 (dpkg -x); run it from the repo root.
set -u
D=${DEVLIBS:-.devlibs}; D=$(cd "$D" && pwd)
export LD_LIBRARY_PATH=$D/root/usr/lib/x86_64-linux-gnu UCX_MODULE_DIR=$D/root/usr/lib/x86_64-linux-gnu/ucx
B=$D/build
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in test_gpu_agent test_gpu_ipc test_gpu_relayout; do
  (cd "$B" && timeout 300 ./$t > "$OUT/$t.log" 2>&1); echo "$t rc=$?"; tail -2 "$OUT/$t.log"
done
run() { echo "== kvrelay demo $*"; timeout 240 "$B/kvrelay" demo "$@" > "$OUT/demo-$N.log" 2>&1; echo "rc=$?"; tail -2 "$OUT/demo-$N.log"; N=$((N+1)); }
N=1
run --device cuda
run --device cuda --instances 2 --groups 2 --requests 8 --tokens 2000
run --device cuda --instances 3 --groups 2 --requests 24 --tokens 2000 --abort 5
run --device cuda --interleave 64 --tokens 32768 --requests 4 --no-reuse --json
run --instances 3 --groups 2 --requests 24 --tokens 2000
