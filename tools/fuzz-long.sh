#!/usr/bin/env bash
# Long fuzz runs, separate from `make test`: every libFuzzer target in the
# sanitizer build for SECONDS each (default 600), corpora kept in fuzz-corpus/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
make asan >/dev/null
mkdir -p fuzz-corpus
for bin in $(find build-asan -type f -name 'fuzz_*' -perm -u+x); do
  name=$(basename "$bin")
  mkdir -p "fuzz-corpus/$name"
  echo "== $name for ${seconds}s"
  # the build's corpus holds the target's seeds (fuzz_inspect_manifest's
  # valid manifest: without it the run never got past the JSON parser,
  # which is not instrumented, and covered 21 edges in 600 000 runs)
  seeds="$(dirname "$bin")/$name-corpus"
  [ -d "$seeds" ] || seeds=
  # shellcheck disable=SC2086 # no seed folder: no argument
  "$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 \
    "fuzz-corpus/$name" $seeds
done
