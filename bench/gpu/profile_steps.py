#!/usr/bin/env python3
"""Where a gpu-direct request's time goes, from the agents' debug logs.

Reads stderr of processes run with KVR_AGENT_DEBUG=1 (bench/gpu/serving.sh
PROFILE=1 writes serving-gpu-profile-DATE.log; gzip is fine) and, for every
request whose id starts with --prefix (default "small", the one-block round
trips), times the steps every consumer rank and producer stage logged:

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
STEPS = [
    ("asked", re.compile(r"recv '([^']+)': asked link")),
    ("chosen", re.compile(r"pull of '([^']+)' for dcp \d+: gpu-direct")),
    ("launched", re.compile(r"pull of '([^']+)' for dcp \d+, layers .*launched")),
    ("done", re.compile(r"pull of '([^']+)' for dcp \d+: kernels done")),
    ("loaded", re.compile(r"recv '([^']+)' from '[^']*': LOADED")),
]


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        yield from f


def collect(paths, prefix):
    """times[request][step] = list of stamps (seconds)."""
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
                    times[s.group(1)][step].append(t)
                    break
    return times


def spans(times):
    """Per request: each step's first and last stamp, relative to asked."""
    out = []
    for req, st in times.items():
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
    print(f"{len(rows)} requests '{a.prefix}*', microseconds after the first "
          "WRITE_REQUEST, median (first event / last event):")
    for step, _ in STEPS:
        first = statistics.median(r[step][0] for r in rows) * 1e6
        last = statistics.median(r[step][1] for r in rows) * 1e6
        print(f"  {step:9s} {first:9.1f} / {last:9.1f}")
    whole = statistics.median(r["loaded"][1] for r in rows) * 1e6
    print(f"  round trip (asked to last LOADED) {whole:.1f}")


if __name__ == "__main__":
    main()
