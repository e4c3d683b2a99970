"""Shared fixtures: the package from this checkout (python/), the library
from KVRELAY_LIB (set by ctest) and the CLI from KVRELAY_CLI."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Tuple

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import kvrelay as kv  # noqa: E402
from kvrelay import synth  # noqa: E402


@pytest.fixture(scope="session")
def cli() -> str:
    """Path of the kvrelay binary; tests that need it skip without it."""
    path = os.environ.get("KVRELAY_CLI") or str(ROOT / "build" / "bin" / "kvrelay")
    if not Path(path).is_file():
        pytest.skip(f"kvrelay CLI not found at {path} (set KVRELAY_CLI)")
    return path


HEADLINE = kv.Layout(block_size=64, dcp_size=4, replicate_index=True)


def transfer(layout: kv.Layout, pair: kv.RegionPair, request: kv.Request,
             token_ids: np.ndarray, seed: int = 3,
             mutate: Callable[[int, np.ndarray], np.ndarray] = lambda r, x: x
             ) -> Tuple[np.ndarray, list]:
    """A synthetic source image and each rank's image after applying its
    plan (runs optionally rewritten by mutate(rank, runs))."""
    src = np.zeros(pair.src.nbytes, np.uint8)
    synth.fill_source(layout, pair.src, seed, request.src_blocks, token_ids, src)
    dsts = []
    for rank in range(layout.dcp_size):
        p = kv.plan(layout, rank, pair, request)
        runs = mutate(rank, p.runs.copy())
        dst = np.zeros(pair.dst.nbytes, np.uint8)
        kv.Plan.from_runs(runs).apply_host(src, dst)
        dsts.append(dst)
    return src, dsts
