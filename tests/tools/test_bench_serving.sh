#!/usr/bin/env bash
# Smoke test of `kvrelay bench serving` (tiny sizes): every bad flag is
# refused with exit 2 naming its value; a small run with both passes, a
# simulated prefill (layers made ready one by one while pulls stream),
# Poisson arrivals and a destination pool small enough that blocks are
# reused (verify-before-reuse) exits 0 with every request verified,
# LAYERS_LOADED only in the streaming pass, and the JSON fields in place;
# a run with distinct sources, two repetitions and decode ranks on their
# agents' progress threads verifies every request of each and reports both
# (the first run's ranks drive their agents in kvr_agent_wait).
# With "cuda" as $2: the GPU form, and with --prefill gpu (the prefill as
# compute on the stages' GPU, handed over with CUDA events), exit 77
# (skip) without a usable device.
set -u
cli="$1"
mode="${2:-host}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

refused() { # refused WANT_IN_MESSAGE ARGS...
  local want="$1"; shift
  local out rc
  out="$("$cli" bench serving "$@" 2>&1)"; rc=$?
  [ "$rc" -eq 2 ] || fail "bench serving $* exited $rc, not 2: $out"
  grep -qF -- "$want" <<<"$out" || fail "bench serving $*: '$out' does not name '$want'"
}

small=(--layers 4 --pp 2 --dcp 2 --index-every 2 --timeout 120)

if [ "$mode" = cuda ]; then
  out="$("$cli" bench serving "${small[@]}" --requests 2 --tokens-dist fixed:200 \
         --device cuda --json "$dir/gpu.json" 2>&1)"; rc=$?
  if [ "$rc" -eq 2 ] && grep -q "no usable CUDA device" <<<"$out"; then
    echo "SKIP: $out"; exit 77
  fi
  [ "$rc" -eq 0 ] || fail "GPU form exited $rc: $out"
  grep -q '"ok": true' "$dir/gpu.json" || fail "GPU form not ok"
  # the prefill as compute on the stages' GPU, handed over with CUDA events
  # ahead of it: streamed groups still land one by one, every byte right
  "$cli" bench serving "${small[@]}" --requests 3 --tokens-dist fixed:300 \
    --device cuda --prefill gpu --prefill-us-per-layer-per-ktoken 2000 \
    --stream both --reps 1 --json "$dir/gpu-prefill.json" >"$dir/out" 2>&1 \
    || fail "--prefill gpu run failed: $(cat "$dir/out")"
  python3 - "$dir/gpu-prefill.json" <<'PY' || fail "--prefill gpu JSON check"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is True and d["params"]["prefill"] == "gpu"
assert d["runs"][1]["layer_events"] > 0
# nothing loaded before its prefill's end (0.1 ms for a late look at it)
assert all(r["gap_ms"] > -0.1 for r in d["runs"][1]["requests"])
PY
  exit 0
fi

refused "'x'" --rate x
refused "'-1'" --prefill-us-per-layer-per-ktoken -1
refused "'uniform:9:3'" --tokens-dist uniform:9:3
refused "'fixed:0'" --tokens-dist fixed:0
refused "$dir/none" --tokens-dist "$dir/none"
printf '100\n0\n' >"$dir/zero.txt"
refused "'0'" --tokens-dist "$dir/zero.txt"
refused "'maybe'" --stream=maybe
refused "'0'" --requests 0
refused "'0'" --reps 0
refused "'10'" --reps 10
refused "'both'" --sources both
refused "'ordered'" --pages ordered
refused "'poll'" --decode-progress poll
refused "'gpux'" --prefill gpux
refused "--device cuda" --prefill gpu
refused "--tokens" --tokens 5
refused "--pool-tokens 64" "${small[@]}" --tokens-dist fixed:300 --pool-tokens 64
refused "$dir/no/such.json" --json "$dir/no/such.json"

printf '# lengths\n300 60 200\n' >"$dir/lengths.txt"
"$cli" bench serving "${small[@]}" --requests 4 --tokens-dist "$dir/lengths.txt" \
  --rate 400 --prefill-us-per-layer-per-ktoken 200 --layer-group 1 \
  --pool-tokens 512 --stream both --json "$dir/out.json" >"$dir/stdout" 2>"$dir/stderr" \
  || fail "small run failed: $(cat "$dir/stdout" "$dir/stderr")"
grep -q "ratio to ceiling" "$dir/stdout" || fail "no table: $(cat "$dir/stdout")"
grep -q "requests loaded" "$dir/stderr" || fail "no progress line"
python3 - "$dir/out.json" <<'PY' || fail "JSON check"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("ceiling_GBps", "aggregate_GBps", "ratio", "stream", "requests",
          "gap_ms_p50", "gap_ms_p90", "gap_ms_p99", "small_request_us_p50",
          "machine", "command", "runs"):
    assert k in d, k
assert d["ok"] is True
assert d["params"]["decode_progress"] == "wait"  # the host default
assert d["params"]["prefill"] == "host"
assert d["ceiling_GBps"] > 0 and d["small_request_us_p50"] > 0
assert d["small_paced_us_p50"] > 0
assert len(d["small_request_us"]) == len(d["small_paced_us"]) > 0
assert [r["stream"] for r in d["runs"]] == [False, True]
# layer groups land as LAYERS_LOADED only when streaming
assert d["runs"][0]["layer_events"] == 0, d["runs"][0]["layer_events"]
assert d["runs"][1]["layer_events"] > 0
for r in d["runs"]:
    assert r["verified"] == 4, r["verified"]
    toks = [q["tokens"] for q in r["requests"]]
    assert toks == [300, 60, 200, 300], toks
    for q in r["requests"]:
        assert q["bytes"] > 0 and q["verified"]
        assert q["loaded_ns"] > q["prefill_end_ns"] > 0
        assert abs(q["gap_ms"] - (q["loaded_ns"] - q["prefill_end_ns"]) / 1e6) < 1e-3
PY
"$cli" bench serving "${small[@]}" --requests 3 --tokens-dist uniform:60:300 \
  --sources distinct --pages sorted --reps 2 --decode-progress thread --json "$dir/reps.json" >"$dir/stdout" 2>"$dir/stderr" \
  || fail "distinct-source run failed: $(cat "$dir/stdout" "$dir/stderr")"
python3 - "$dir/reps.json" <<'PY' || fail "reps JSON check"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is True and d["reps"] == 2
assert d["params"]["decode_progress"] == "thread"
assert d["params"]["pages"] == "sorted"
assert len(d["ceiling_GBps_each"]) == 2 and len(d["ceiling_seconds_each"]) == 3
r = d["runs"][0]
assert r["verified"] == 3 and len(r["aggregate_GBps_each"]) == 2
assert len(r["ratio_each"]) == 2 and all(x > 0 for x in r["ratio_each"])
assert len(r["seconds_each"]) == 2 and all(x > 0 for x in r["seconds_each"])
assert r["seconds_each"][r["rep"]] == r["seconds"]
assert r["gap_ms_p50_each"][r["rep"]] == r["gap_ms_p50"]
assert all(a <= b for a, b in zip(r["gap_ms_p50_each"], r["gap_ms_p99_each"]))
assert d["ratio_to_best_ceiling"] > 0
PY
echo "bench serving smoke: ok"
