#!/usr/bin/env bash
# Runs the Python package's pytest suite for ctest; exit 77 (SKIP) with the
# reason when python3, numpy or pytest is missing. KVRELAY_LIB (the
# non-sanitized libkvrelay.so) and KVRELAY_CLI come from ctest.
set -u
repo="$(cd "$(dirname "$0")/../.." && pwd)"
if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIP: python3 not found (make deps installs numpy and pytest for it)"
  exit 77
fi
if ! python3 -c "import numpy, pytest" >/dev/null 2>&1; then
  echo "SKIP: numpy or pytest missing for $(command -v python3) (run make deps)"
  exit 77
fi
cd "$repo"
# -p no:cacheprovider: the source tree stays clean
exec python3 -m pytest -q -p no:cacheprovider python/tests "$@"
