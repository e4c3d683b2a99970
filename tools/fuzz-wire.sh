#!/usr/bin/env bash
# Long libFuzzer run of the wire decoder (tests/wire/fuzz_wire.c), apart from
# `make test` (which runs it for KVR_FUZZ_SECONDS). Builds a clang ASan+UBSan
# tree, seeds the corpus with one frame of every message type, then fuzzes.
#   tools/fuzz-wire.sh [SECONDS=600] [JOBS=1]
# Env: KVR_FUZZ_BUILD (build dir, default build-fuzz-wire), KVR_FUZZ_CORPUS
# (kept between runs, default fuzz-corpus-tmp/wire). Findings are written as
# fuzz-corpus-tmp/wire-crash-* (and -leak-*, -timeout-*); replay one with
#   $KVR_FUZZ_BUILD/tests/wire/fuzz_wire FILE
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${1:-600}
jobs=${2:-1}
build=${KVR_FUZZ_BUILD:-build-fuzz-wire}
corpus=$root/${KVR_FUZZ_CORPUS:-fuzz-corpus-tmp/wire}
seeds=$corpus-seeds

cmake -S . -B "$build" -G Ninja -DKVR_SANITIZE=ON -DKVR_FUZZ=ON -DKVR_CUDA=OFF \
  -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build "$build" --target fuzz_wire gen_wire_corpus >/dev/null
mkdir -p "$corpus" "$seeds"
"$build/tests/wire/gen_wire_corpus" "$seeds"

parallel=()
if [ "$jobs" -gt 1 ]; then
  parallel=(-jobs="$jobs" -workers="$jobs") # logs: fuzz-N.log next to corpus
fi
echo "fuzz-wire: ${seconds}s, ${jobs} job(s), corpus $corpus"
cd "$(dirname "$corpus")"
exec "$root/$build/tests/wire/fuzz_wire" -max_total_time="$seconds" \
  "${parallel[@]}" -timeout=10 -max_len=65536 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$corpus-" "$corpus" "$seeds"
