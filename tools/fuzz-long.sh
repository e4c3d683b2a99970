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
  "$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 \
    "fuzz-corpus/$name"
done
