"""kvrelay.plot on a small `kvrelay bench serving` result: the numbers it
draws (gap CDF, throughput that integrates back to the bytes moved) and the
PNG itself when matplotlib is importable."""

from __future__ import annotations

import json

import pytest

from kvrelay import plot


def _run(stream: bool, gaps):
    reqs = []
    for i, gap in enumerate(gaps):
        loaded = (i + 1) * 100_000_000  # 0.1 s apart
        reqs.append({"index": i, "tokens": 2048, "bytes": 1_000_000_000,
                     "arrival_ns": 0, "prefill_end_ns": loaded - int(gap * 1e6),
                     "loaded_ns": loaded, "gap_ms": gap,
                     "transfer_ms": 50.0, "verified": True, "failure": ""})
    return {"stream": stream, "aggregate_GBps": 5.0, "gap_ms_p50": sorted(gaps)[1],
            "requests": reqs}


RESULT = {"bench": "serving", "ceiling_GBps": 9.0,
          "params": {"instances": 1, "pp": 4, "groups": 1, "dcp": 4,
                     "interleave": 1, "requests": 3},
          "runs": [_run(False, [30.0, 10.0, 20.0]), _run(True, [2.0, 1.0, 3.0])]}


def test_gap_cdf_is_sorted_with_fractions():
    gaps, frac = plot.gap_cdf(RESULT["runs"][0])
    assert gaps == [10.0, 20.0, 30.0]
    assert frac == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_throughput_integrates_to_the_bytes_moved():
    t, rate = plot.throughput(RESULT["runs"][1], bins=30)
    assert len(t) == len(rate) == 30
    width = t[1] - t[0]
    moved = sum(r * width for r in rate) * 1e9
    assert moved == pytest.approx(3e9, rel=1e-6)
    # each request moved 1 GB in 50 ms: 20 GB/s while it ran
    assert max(rate) == pytest.approx(20.0, rel=0.35)


def test_refuses_a_file_that_is_not_a_result(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    assert plot.main([str(bad), "-o", str(tmp_path / "x.png")]) == 2
    assert "not a `kvrelay bench serving --json` result" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "serving.json"
    src.write_text(json.dumps(RESULT))
    out = tmp_path / "serving.png"
    assert plot.main([str(src), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
