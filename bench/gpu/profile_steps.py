#!/usr/bin/env python3
"""Where a gpu-direct request's time goes, from the agents' debug logs.

Reads stderr of processes run with KVR_AGENT_DEBUG=1 (bench/gpu/serving.sh
PROFILE=1 writes serving-gpu-profile-DATE.log; gzip is fine) and, for every
request whose id starts with --prefix (default "small", the one-block round
trips), times each consumer rank's load of it (its round trip) through the
steps that rank and the producer stages logged:

  asked    consumer: WRITE_REQUEST sent to a stage ("recv 'id': asked")
  chosen   stage: the pull planned and its executor chosen (or its tables made)
  launched stage: kernels launched (tables built and uploaded)
  done     stage: kernels seen complete (the host function woke the loop)
  loaded   consumer: LOADED

Stamps are CLOCK_MONOTONIC of one machine, so processes compare. Prints the
median over requests of each step's span (first to last event of the
request) and of the whole round trip, the host microseconds the stages
logged for making a pull's tables and for its launch, and (--trace PREFIX,
e.g. t0-) the trace's timeline: per request its stages' launches and
completions, per stage how much of the pass some of its kernels were in
flight (launched, not yet seen done).
"""
import argparse
import gzip
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"kvr agent (\S+) pp (\d+) tp (\d+) dcp (\d+) ([\d.]+): (.*)")
STEPS = [  # (step, pattern: request id, then the rank for stage lines)
    ("asked", re.compile(r"recv '([^']+)': asked link")),
    # the executor's choice, or (logged since the choice went for gpu-direct
    # pulls through CUDA IPC) the relayout tables made
    ("chosen", re.compile(r"pull of '([^']+)' for dcp (\d+): (?:gpu-direct|relayout tables)")),
    ("launched", re.compile(r"pull of '([^']+)' for dcp (\d+), layers .*launched")),
    ("done", re.compile(r"pull of '([^']+)' for dcp (\d+): kernels done")),
    ("loaded", re.compile(r"recv '([^']+)' from '[^']*': LOADED")),
]


HOST = {  # host-side costs the stages log, microseconds
    "tables": re.compile(r"pull of '([^']+)' for dcp \d+: relayout tables .* in ([\d.]+) us"),
    "launch": re.compile(r"pull of '([^']+)' for dcp \d+, layers .*launched.* in ([\d.]+) us"),
}


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        yield from f


def collect(paths, prefix):
    """times[(request, consumer rank)][step] = stamps (seconds): a rank's
    load of a request is one round trip (the ranks load on their own)."""
    times = defaultdict(lambda: defaultdict(list))
    for path in paths:
        for line in read(path):
            m = LINE.search(line)
            if not m:
                continue
            t, msg = float(m.group(5)), m.group(6)
            for step, rx in STEPS:
                s = rx.match(msg)
                if s and s.group(1).startswith(prefix):
                    rank = int(s.group(2)) if s.lastindex == 2 else int(m.group(4))
                    times[(s.group(1), rank)][step].append(t)
                    break
    return times


def host_costs(paths, prefix):
    costs = defaultdict(list)
    for path in paths:
        for line in read(path):
            m = LINE.search(line)
            if not m:
                continue
            for what, rx in HOST.items():
                s = rx.match(m.group(6))
                if s and s.group(1).startswith(prefix):
                    costs[what].append(float(s.group(2)))
    return costs


def stage_intervals(paths, prefix):
    """[(pp, request, launched, done)] of the stages' trace pulls."""
    open_at, out = {}, []
    for path in paths:
        for line in read(path):
            m = LINE.search(line)
            if not m:
                continue
            t, msg, pp = float(m.group(5)), m.group(6), int(m.group(2))
            for step in ("launched", "done"):
                s = dict(STEPS)[step].match(msg)
                if s and s.group(1).startswith(prefix):
                    key = (pp, s.group(1), int(s.group(2)))
                    if step == "launched":
                        open_at.setdefault(key, t)
                    elif key in open_at:
                        out.append((pp, s.group(1), open_at.pop(key), t))
    return out


def busy(iv):
    """Length of the union of intervals."""
    total, end = 0.0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def timeline(paths, prefix):
    iv = stage_intervals(paths, prefix)
    times = collect(paths, prefix)
    if not iv or not times:
        print(f"no trace pulls with prefix '{prefix}'")
        return
    t0 = min(min(st["asked"]) for st in times.values() if st["asked"])
    def ms(t):
        return (t - t0) * 1e3
    print(f"trace '{prefix}*', ms after its first WRITE_REQUEST:")
    reqs = sorted({r for _, r, _, _ in iv})
    for r in reqs:
        asked = [t for (q, _), st in times.items() if q == r for t in st["asked"]]
        loaded = [t for (q, _), st in times.items() if q == r for t in st["loaded"]]
        per = []
        for pp in sorted({p for p, q, _, _ in iv if q == r}):
            x = [(a, b) for p, q, a, b in iv if q == r and p == pp]
            per.append(f"pp{pp} {len(x)}x {ms(min(a for a, _ in x)):7.3f}-"
                       f"{ms(max(b for _, b in x)):7.3f}")
        print(f"  {r:10s} asked {ms(min(asked)) if asked else -1:7.3f} "
              f"loaded {ms(max(loaded)) if loaded else -1:7.3f} | " + " | ".join(per))
    for pp in sorted({p for p, _, _, _ in iv}):
        x = [(a, b) for p, _, a, b in iv if p == pp]
        span = max(b for _, b in x) - min(a for a, _ in x)
        print(f"  stage pp{pp}: {len(x)} launches, kernels in flight "
              f"{busy(x) * 1e3:.3f} of {span * 1e3:.3f} ms (first launch to last done)")


def spans(times):
    """Per round trip: each step's first and last stamp after asked."""
    out = []
    for st in times.values():
        if not all(st[s] for s, _ in STEPS):
            continue  # incomplete (cut off, or not gpu-direct)
        t0 = min(st["asked"])
        out.append({s: (min(st[s]) - t0, max(st[s]) - t0) for s, _ in STEPS})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--prefix", default="small")
    ap.add_argument("--trace", help="request id prefix of a trace pass (t0-)")
    a = ap.parse_args()
    if a.trace:
        timeline(a.logs, a.trace)
    rows = spans(collect(a.logs, a.prefix))
    if not rows:
        sys.exit(f"no complete request with prefix '{a.prefix}' in the logs")
    print(f"{len(rows)} loads of '{a.prefix}*' requests (a request by a rank), "
          "microseconds after its first WRITE_REQUEST, median (first stage / "
          "last stage):")
    for step, _ in STEPS:
        first = statistics.median(r[step][0] for r in rows) * 1e6
        last = statistics.median(r[step][1] for r in rows) * 1e6
        print(f"  {step:9s} {first:9.1f} / {last:9.1f}")
    whole = statistics.median(r["loaded"][1] for r in rows) * 1e6
    print(f"  round trip (asked to last LOADED) {whole:.1f}")
    for what, v in host_costs(a.logs, a.prefix).items():
        print(f"  stage host us, {what}: median {statistics.median(v):.1f}, "
              f"p90 {sorted(v)[int(len(v) * 0.9)]:.1f} ({len(v)} pulls)")


if __name__ == "__main__":
    main()
