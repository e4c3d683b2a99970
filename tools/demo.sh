#!/usr/bin/env bash
# The main job: `kvrelay demo` runs the headline case on this machine:
# a PP4 prefill (78 layers split 19/20/20/19, MLA 576 B/token, DSA index
# D=128 on every third layer) pushing into a W=4, I=1 decode group with a
# replicated index over UCX, 4 requests (the last reuses a cached prefix),
# every byte verified on every rank. Options after the binary go to
# `kvrelay demo` (`make demo ARGS="--requests 8 --json"`).
set -euo pipefail
kvr=${1:-build/bin/kvrelay}
shift || true
exec "$kvr" demo "$@"
