"""Plots of a ``kvrelay bench serving`` result (docs/performance.md).

    python3 -m kvrelay.plot FILE.json -o FILE.png

Left: the distribution (CDF) of each request's gap, from the end of its
prefill to the moment every decode rank had every byte (``gap_ms``).
Right: bytes delivered per second over the run, each request's bytes spread
over its transfer (``loaded_ns - transfer_ms`` to ``loaded_ns``), with the
ceiling of the same run as a line. With ``--stream both`` the streaming and
non-streaming passes are drawn side by side in each panel.

matplotlib is imported only when plotting, so the rest of the package never
needs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Sequence, Tuple

BINS = 60


def _runs(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    runs = result.get("runs")
    if isinstance(runs, list) and runs:
        return runs
    if "requests" in result:  # a single pass written flat
        return [result]
    raise ValueError("no 'runs' or 'requests' in the file: not a "
                     "`kvrelay bench serving --json` result")


def _label(run: Dict[str, Any]) -> str:
    return "stream" if run.get("stream") else "no-stream"


def gap_cdf(run: Dict[str, Any]) -> Tuple[List[float], List[float]]:
    """Sorted gaps (ms) and their cumulative fractions."""
    gaps = sorted(float(q["gap_ms"]) for q in run["requests"]
                  if q.get("gap_ms") is not None)  # null: never loaded
    n = len(gaps)
    return gaps, [(i + 1) / n for i in range(n)]


def throughput(run: Dict[str, Any], bins: int = BINS
               ) -> Tuple[List[float], List[float]]:
    """Bin centres (s from the pass's start) and GB/s delivered in each."""
    spans = []
    for q in run["requests"]:
        if q.get("loaded_ns") is None:  # never loaded: nothing delivered
            continue
        end = float(q["loaded_ns"]) / 1e9
        start = end - max(float(q.get("transfer_ms", 0.0)), 0.0) / 1e3
        spans.append((max(start, 0.0), end, float(q["bytes"])))
    if not spans:
        return [], []
    t_end = max(e for _, e, _ in spans)
    width = t_end / bins if t_end > 0 else 1.0
    rate = [0.0] * bins
    for start, end, nbytes in spans:
        length = max(end - start, 1e-9)
        for b in range(int(start / width), min(int(end / width) + 1, bins)):
            lo, hi = max(start, b * width), min(end, (b + 1) * width)
            if hi > lo:
                rate[b] += nbytes * (hi - lo) / length / width / 1e9
    return [(b + 0.5) * width for b in range(bins)], rate


def _title(result: Dict[str, Any]) -> str:
    p = result.get("params", {})
    return (f"{p.get('instances', '?')} x PP{p.get('pp', '?')} -> "
            f"{p.get('groups', '?')} x W={p.get('dcp', '?')} "
            f"I={p.get('interleave', '?')}, {p.get('requests', '?')} requests "
            f"{p.get('tokens_dist', '')}, rate {p.get('rate', '?')}/s, "
            f"prefill {p.get('prefill_us_per_layer_per_ktoken', '?')} "
            f"us/layer/ktoken, {p.get('device', 'host')}")


def plot(result: Dict[str, Any], out: str) -> None:
    """Writes the two panels of `result` (a parsed JSON) to `out`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(
            "kvrelay.plot needs matplotlib (pip install matplotlib): "
            f"{e}") from None
    runs = _runs(result)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for run in runs:
        gaps, frac = gap_cdf(run)
        left.step(gaps, frac, where="post",
                  label=f"{_label(run)} (p50 {run.get('gap_ms_p50', 0):.1f} ms)")
        t, rate = throughput(run)
        right.plot(t, rate,
                   label=f"{_label(run)} ({run.get('aggregate_GBps', 0):.2f} "
                         f"GB/s aggregate)")
    left.set_xlabel("gap: prefill end to loaded (ms)")
    left.set_ylabel("fraction of requests")
    left.set_ylim(0, 1.02)
    left.grid(alpha=0.3)
    left.legend(loc="lower right")
    ceiling = result.get("ceiling_GBps")
    if ceiling:
        right.axhline(ceiling, color="grey", linestyle="--",
                      label=f"ceiling {ceiling:.2f} GB/s")
    right.set_xlabel("time since the pass started (s)")
    right.set_ylabel("GB/s delivered")
    right.grid(alpha=0.3)
    right.legend(loc="upper right")
    fig.suptitle(_title(result), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m kvrelay.plot",
        description="Plot a `kvrelay bench serving --json` result: the gap "
                    "distribution and throughput over time.")
    ap.add_argument("json", help="the result file")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    try:
        with open(args.json, encoding="utf-8") as f:
            result = json.load(f)
        _runs(result)
    except (OSError, ValueError) as e:
        print(f"kvrelay.plot: {args.json}: {e}", file=sys.stderr)
        return 2
    plot(result, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
