#!/usr/bin/env bash
# The full-topology run: four prefill stages (PP4, 78 layers split
# 19/20/20/19, MLA 576 B/token, DSA index D=128 on every third layer) pushing
# into a W=4 decode group with a replicated index, for I in {1, 64}, one
# request of 32k and one of 128k tokens per run, every request verified
# byte-exact on every rank by `kvrelay demo`. Placement:
#   >= 8 GPUs: one GPU per process (stage p on GPU p, rank r on GPU 4+r);
#   2..7 GPUs: the stages share GPU 0, the ranks share GPU 1;
#   1 GPU:     everything on GPU 0;   no GPU: host memory over UCX (CPU run).
# Also measures the cudaMemcpyPeer ceiling of each GPU pair the traffic uses
# and of all of them at once, and writes $OUT/topology-<kind>.json.
# Usage: OUT=dir bench/topology/run.sh [path/to/kvrelay] [TOKENS...]
set -uo pipefail
cd "$(dirname "$0")/../.."
KVR=${1:-build/bin/kvrelay}
shift || true
SIZES=${*:-32768 131072}
REQUESTS=${REQUESTS:-1} # >1: later requests show the warm (steady) rate
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
device=cuda
pairs=""
if [ "$gpus" -ge 8 ]; then
  kind=gpu-x$gpus
  for p in 0 1 2 3; do for r in 4 5 6 7; do pairs="$pairs $p:$r"; done; done
elif [ "$gpus" -ge 2 ]; then kind=gpu-x$gpus; pairs="0:1"
elif [ "$gpus" -eq 1 ]; then kind=gpu-x1; pairs="0:0"
else kind=cpu; device=host
fi
echo "== topology run on $kind ($gpus GPUs), kvrelay $KVR, sizes $SIZES"
ceiling='null'
if [ -n "$pairs" ]; then
  NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  "$NVCC" -O2 -arch=sm_90 -o "$OUT/p2p_ceiling" bench/topology/p2p_ceiling.cu &&
    ceiling=$("$OUT/p2p_ceiling" $((1 << 30)) $pairs) || ceiling='null'
  echo "ceiling: $ceiling"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/topology-card.txt"
fi
runs=()
for I in 1 64; do
  for N in $SIZES; do
    log="$OUT/topology-I$I-N$N.log"
    timeout 900 "$KVR" demo --device "$device" --interleave "$I" --requests "$REQUESTS" \
      --tokens "$N" --no-reuse --json --deadline-ms 600000 --timeout 800 >"$log" 2>&1
    rc=$?
    tail -1 "$log"
    json=$(grep '^{' "$log" | tail -1)
    runs+=("{\"interleave\":$I,\"tokens\":$N,\"exit\":$rc,\"demo\":${json:-null}}")
  done
done
IFS=,
printf '{"kind":"%s","gpus":%s,"date":"%s","requests_per_run":%s,"ceiling":%s,"runs":[%s]}\n' \
  "$kind" "$gpus" "$(date -u +%FT%TZ)" "$REQUESTS" "$ceiling" "${runs[*]}" \
  > "$OUT/topology-$kind.json"
echo "wrote $OUT/topology-$kind.json"
