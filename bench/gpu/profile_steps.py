#!/usr/bin/env python3
"""Where a gpu-direct request's time goes, from the agents' debug logs.

Reads stderr of processes run with KVR_AGENT_DEBUG=1 (bench/gpu/serving.sh
PROFILE=1 writes serving-gpu-profile-DATE.log; gzip is fine) and, for every
request whose id starts with --prefix (default "small", the one-block round
trips), times each consumer rank's load of it (its round trip) through the
steps that rank and the producer stages logged:

  asked    consumer: WRITE_REQUEST sent to a stage ("recv 'id': asked")
  chosen   stage: the pull planned and its executor chosen
  launched stage: kernels launched (tables built and uploaded)
  done     stage: kernels seen complete (the host function woke the loop)
  loaded   consumer: LOADED

Stamps are CLOCK_MONOTONIC of one machine, so processes compare. Prints the
median over requests of each step's span (first to last event of the
request) and of the whole round trip.
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
    ("chosen", re.compile(r"pull of '([^']+)' for dcp (\d+): gpu-direct")),
    ("launched", re.compile(r"pull of '([^']+)' for dcp (\d+), layers .*launched")),
    ("done", re.compile(r"pull of '([^']+)' for dcp (\d+): kernels done")),
    ("loaded", re.compile(r"recv '([^']+)' from '[^']*': LOADED")),
]


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
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
