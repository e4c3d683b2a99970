#!/usr/bin/env python3
"""Reads the `kvr gpu job:` lines that KVR_AGENT_GPU_TIMES=1 makes every
CUDA agent print (one per job: its launch, and its kernels' start and end on
the device, all on the host's monotonic clock in microseconds) from a
`kvrelay bench serving` log, cuts them into passes at quiet spells, and
prints per pass and per stage process: jobs, bytes, how long its stream was
busy and idle, and the rate of its jobs while they ran, by request length;
then for the pass as a whole how many stages' kernels ran at once
(docs/performance.md, run 2026-12-02m).

Usage: job_times.py LOG [--gap-ms 20]"""
import argparse
import re
import signal
from collections import defaultdict

from profile_steps import busy as union  # the union of intervals' length

LINE = re.compile(r"kvr gpu job: pid (\d+) tokens (\d+) pulls (\d+) kernels (\d+) "
                  r"slots (\d+) bytes (\d+) launch_us ([\d.]+) start_us ([\d.]+) "
                  r"end_us ([\d.]+)$")


def read(path):
    jobs = []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line.rstrip())
            if m:
                v = m.groups()
                jobs.append(dict(pid=int(v[0]), tokens=int(v[1]), pulls=int(v[2]),
                                 kernels=int(v[3]), slots=int(v[4]), bytes=int(v[5]),
                                 launch=float(v[6]), start=float(v[7]), end=float(v[8])))
    return sorted(jobs, key=lambda j: j["launch"])


def passes(jobs, gap_us):
    out, cur, last = [], [], None
    for j in jobs:
        if last is not None and j["launch"] - last > gap_us:
            out.append(cur)
            cur = []
        cur.append(j)
        last = max(last or 0, j["end"])
    if cur:
        out.append(cur)
    return out


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0


def stage(js):
    js = sorted(js, key=lambda j: j["start"])
    busy = union([(j["start"], j["end"]) for j in js])
    span = max(j["end"] for j in js) - min(j["launch"] for j in js)
    idle = [b["start"] - a["end"] for a, b in zip(js, js[1:])]
    wait = [j["start"] - j["launch"] for j in js]
    gb = sum(j["bytes"] for j in js) / 1e9
    print(f"    pid {js[0]['pid']}: {len(js)} jobs {gb:.2f} GB, span {span/1e3:.2f} ms, "
          f"stream busy {busy/1e3:.2f} ms ({gb/(busy/1e6):.0f} GB/s busy), idle between "
          f"jobs p50 {q(idle,.5):.1f} max {max(idle or [0]):.1f} us, launch to start "
          f"p50 {q(wait,.5):.1f} us")
    for j in js:
        d = j["end"] - j["start"]
        rate = j["bytes"] / 1e3 / d if d > 0 else 0
        print(f"      tokens {j['tokens']:6d} pulls {j['pulls']} kernels {j['kernels']} "
              f"slots {j['slots']:3d} MB {j['bytes']/1e6:7.1f} start {j['start']-js[0]['launch']:8.1f} "
              f"us, {d:7.1f} us on the device, {rate:6.0f} GB/s")


def concurrency(js):
    ev = sorted([(j["start"], 1) for j in js] + [(j["end"], -1) for j in js])
    last, n, hist = None, 0, defaultdict(float)
    for t, d in ev:
        if last is not None:
            hist[n] += t - last
        n += d
        last = t
    tot = sum(hist.values()) or 1
    return ", ".join(f"{k} at once {100*v/tot:.0f}%" for k, v in sorted(hist.items()))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--gap-ms", type=float, default=20)
    ap.add_argument("--brief", action="store_true", help="no per-job lines")
    a = ap.parse_args()
    jobs = read(a.log)
    if not jobs:
        print("no `kvr gpu job:` lines (run with KVR_AGENT_GPU_TIMES=1)")
        return
    for k, p in enumerate(passes(jobs, a.gap_ms * 1e3)):
        gb = sum(j["bytes"] for j in p) / 1e9
        span = max(j["end"] for j in p) - min(j["launch"] for j in p)
        print(f"pass {k}: {len(p)} jobs, {gb:.2f} GB in {span/1e3:.2f} ms "
              f"({gb/(span/1e6):.0f} GB/s), stages' kernels: {concurrency(p)}")
        by = defaultdict(list)
        for j in p:
            by[j["pid"]].append(j)
        for pid in sorted(by):
            if a.brief:
                js = by[pid]
                busy = union([(j["start"], j["end"]) for j in js])
                g = sum(j["bytes"] for j in js) / 1e9
                print(f"    pid {pid}: {len(js)} jobs {g:.2f} GB busy {busy/1e3:.2f} ms "
                      f"({g/(busy/1e6):.0f} GB/s)")
            else:
                stage(by[pid])


if __name__ == "__main__":
    main()
