#!/usr/bin/env bash
# The main job. Until the end-to-end `kvrelay demo` exists, this prints the
# headline case's plan for every decode rank: PP4 prefill -> W=4 DCP decode,
# I=1, 78 MLA layers of 576 B/token, 26 DSA index layers (D=128), replicated.
set -euo pipefail
kvr=${1:-build/bin/kvrelay}
echo "make demo: the end-to-end demo is not built yet; showing the headline plan"
for rank in 0 1 2 3; do
  "$kvr" plan --block-size 64 --dcp 4 --rank "$rank" --interleave 1 \
    --tokens 4000 --replicate-index --region mla:576x78 --region index:128x26
  echo
done
