"""Plans: byte runs per region class and DCP rank (docs/design.md §4), the host
reference executor, the verifier, the coverage proof and the layout digest.

``Plan.runs`` is a numpy structured array (fields src, dst, len, uint64)
that views the C plan's memory without copying; the array keeps its plan
alive (through ``runs.base``), so it stays valid after the Plan object is
dropped.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Tuple

import numpy as np

from . import _types as T
from ._buffers import BufferLike, address_of, array_view, need
from ._lib import LIB
from .errors import check, invalid, new_error
from .layout import Layout, RegionDesc, RegionPair, regions_to_c

_U32_MAX = 0xFFFFFFFF


def block_table(ids: Any, what: str) -> np.ndarray:
    """A contiguous uint32 array of block ids (zero-copy when it already is
    one); raises ERR_INVALID for ids outside [0, 2**32)."""
    if isinstance(ids, np.ndarray) and ids.dtype == np.uint32:
        return np.ascontiguousarray(ids)
    arr = np.asarray(ids if not isinstance(ids, range) else list(ids))
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint32)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise invalid(f"{what}: expected a 1-D sequence of integers")
    if int(arr.min()) < 0 or int(arr.max()) > _U32_MAX:
        raise invalid(f"{what}: block ids must be u32")
    return np.ascontiguousarray(arr, dtype=np.uint32)


def _u32_ptr(arr: np.ndarray) -> "ctypes._Pointer[ctypes.c_uint32]":
    return arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))


@dataclass(frozen=True)
class Request:
    """kvr_request_t: the request's full block tables (never pre-sliced),
    its token count and the virtual blocks already on the consumer. For a
    pair plan ``src_blocks`` is that producer rank's own table (a producer
    with DCP shares one table over its ranks, one entry per bs_p * W_p
    tokens, which is each rank's own)."""

    src_blocks: Any
    dst_blocks: Any
    num_tokens: int
    num_computed_blocks: int = 0

    def to_c(self) -> Tuple[T.Request, Any]:
        """The C struct and the arrays it points into (keep them alive)."""
        src = block_table(self.src_blocks, "src_blocks")
        dst = block_table(self.dst_blocks, "dst_blocks")
        c = T.Request(_u32_ptr(src), src.size, _u32_ptr(dst), dst.size,
                      self.num_tokens, self.num_computed_blocks)
        return c, (src, dst)


class Plan:
    """One region class's runs for one DCP rank (kvr_plan_t)."""

    def __init__(self, handle: int, owner: Optional[object] = None) -> None:
        # owner: the PlanSet this plan belongs to (then it is not destroyed
        # here), None when this object owns the C plan.
        self._handle = handle
        self._owner = owner

    def __del__(self) -> None:
        if getattr(self, "_owner", True) is None and self._handle:
            LIB.kvr_plan_destroy(self._handle)
            self._handle = 0

    @classmethod
    def from_runs(cls, runs: Any) -> "Plan":
        """A plan from explicit runs (an (n, 3) integer array or RUN_DTYPE
        array); copied, not validated (for tests, tools and replay)."""
        arr = _runs_array(runs)
        out = ctypes.c_void_p()
        check(LIB.kvr_plan_from_runs(arr.ctypes.data if arr.size else None,
                                     arr.size, ctypes.byref(out)))
        return cls(out.value or 0)

    @property
    def runs(self) -> np.ndarray:
        """Coalesced runs sorted by destination: a read-only RUN_DTYPE array
        over the C memory (no copy)."""
        count = ctypes.c_size_t()
        address = LIB.kvr_plan_runs(self._handle, ctypes.byref(count))
        return array_view(self, address or 0, count.value, T.RUN_DTYPE, True)

    @property
    def runs_u64(self) -> np.ndarray:
        """The same runs as an (n, 3) uint64 view: columns src, dst, len."""
        return self.runs.view(np.uint64).reshape(-1, 3)

    @property
    def num_runs(self) -> int:
        return int(LIB.kvr_plan_num_runs(self._handle))

    def __len__(self) -> int:
        return self.num_runs

    @property
    def runs_uncoalesced(self) -> int:
        return int(LIB.kvr_plan_runs_uncoalesced(self._handle))

    @property
    def bytes(self) -> int:
        return int(LIB.kvr_plan_bytes(self._handle))

    def extents(self) -> Tuple[int, int]:
        """Bytes the runs reach on each side: max(src + len), max(dst + len)."""
        r = self.runs
        if r.size == 0:
            return 0, 0
        return int((r["src"] + r["len"]).max()), int((r["dst"] + r["len"]).max())

    def apply_host(self, src: BufferLike, dst: BufferLike) -> None:
        """Host reference executor: memcpy every run from src to dst
        (region images). Both must hold the runs' extents."""
        s_addr, s_size, keep_s = address_of(src, False, "src")
        d_addr, d_size, keep_d = address_of(dst, True, "dst")
        s_end, d_end = self.extents()
        need(s_size, s_end, "src")
        need(d_size, d_end, "dst")
        LIB.kvr_plan_apply_host(self._handle, s_addr, d_addr)
        del keep_s, keep_d

    def __repr__(self) -> str:
        return (f"Plan(runs={self.num_runs}, runs_uncoalesced="
                f"{self.runs_uncoalesced}, bytes={self.bytes})")


def _runs_array(runs: Any) -> np.ndarray:
    arr = np.asarray(runs)
    if arr.dtype == T.RUN_DTYPE:
        return np.ascontiguousarray(arr)
    if arr.size == 0:
        return np.zeros(0, dtype=T.RUN_DTYPE)
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.dtype.kind not in "iu" or \
            int(arr.min()) < 0:
        raise invalid("runs: expected an (n, 3) array of non-negative "
                      "integers or a RUN_DTYPE array")
    return np.ascontiguousarray(arr, dtype=np.uint64).view(T.RUN_DTYPE).ravel()


def plan(layout: Layout, rank: int, pair: RegionPair, request: Request) -> Plan:
    """Plans one region pair for DCP rank `rank` (kvr_plan_create). Every
    check of docs/design.md §4 raises KvrelayError with its own code."""
    lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
    req, keep = request.to_c()
    out = ctypes.c_void_p()
    check(LIB.kvr_plan_create(ctypes.byref(lay), rank, ctypes.byref(cpair),
                              ctypes.byref(req), ctypes.byref(out),
                              ctypes.byref(err)), err)
    del keep
    return Plan(out.value or 0)


def plan_pair(layout: Layout, producer_rank: int, consumer_rank: int,
              pair: RegionPair, request: Request) -> Plan:
    """What consumer rank `consumer_rank` takes from producer rank
    `producer_rank` (kvr_plan_create_pair; DCP ranks for token-sharded
    regions, TP ranks for head-sharded dense ones, docs/design.md §18).
    ``request.src_blocks`` is that producer rank's table."""
    lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
    req, keep = request.to_c()
    out = ctypes.c_void_p()
    check(LIB.kvr_plan_create_pair(ctypes.byref(lay), producer_rank,
                                   consumer_rank, ctypes.byref(cpair),
                                   ctypes.byref(req), ctypes.byref(out),
                                   ctypes.byref(err)), err)
    del keep
    return Plan(out.value or 0)


def sources(layout: Layout, pair: RegionPair, consumer_rank: int,
            request: Optional[Request] = None) -> "list[int]":
    """The producer ranks `consumer_rank` pulls a region from, ascending
    (kvr_plan_sources): all it may ever pull from, or with a request
    exactly those whose pair plan is not empty."""
    lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
    cap = layout.axis_ranks(pair.src.axis, False)
    ranks = (ctypes.c_uint32 * max(1, cap))()
    num = ctypes.c_size_t()
    keep = None
    req_p = None
    if request is not None:
        req, keep = request.to_c()
        req_p = ctypes.byref(req)
    check(LIB.kvr_plan_sources(ctypes.byref(lay), ctypes.byref(cpair),
                               consumer_rank, req_p, ranks, cap,
                               ctypes.byref(num), ctypes.byref(err)), err)
    del keep
    return [int(r) for r in ranks[:num.value]]


class PlanSet:
    """Plans for many region pairs, computed once per region class
    (kvr_plan_set_t). ``plan_of(i)`` is pair i's (shared) plan. With
    `producer_rank` given it is the set of one (producer, consumer) pair
    (kvr_plan_set_create_pair; all pairs on one axis)."""

    def __init__(self, layout: Layout, rank: int, pairs: Sequence[RegionPair],
                 request: Request, producer_rank: Optional[int] = None) -> None:
        lay, err = layout.to_c(), new_error()
        cpairs = (T.RegionPair * max(1, len(pairs)))(*[p.to_c() for p in pairs])
        req, keep = request.to_c()
        out = ctypes.c_void_p()
        self._handle = 0
        if producer_rank is None:
            code = LIB.kvr_plan_set_create(ctypes.byref(lay), rank, cpairs,
                                           len(pairs), ctypes.byref(req),
                                           ctypes.byref(out), ctypes.byref(err))
        else:
            code = LIB.kvr_plan_set_create_pair(
                ctypes.byref(lay), producer_rank, rank, cpairs, len(pairs),
                ctypes.byref(req), ctypes.byref(out), ctypes.byref(err))
        check(code, err)
        del keep
        self._handle = out.value or 0
        self.num_pairs = len(pairs)

    def __del__(self) -> None:
        if getattr(self, "_handle", 0):
            LIB.kvr_plan_set_destroy(self._handle)
            self._handle = 0

    @property
    def num_classes(self) -> int:
        return int(LIB.kvr_plan_set_num_classes(self._handle))

    def class_of(self, pair: int) -> int:
        self._check_pair(pair)
        return int(LIB.kvr_plan_set_class_of(self._handle, pair))

    def plan_of(self, pair: int) -> Plan:
        """Pair i's plan; it keeps this set alive."""
        self._check_pair(pair)
        return Plan(LIB.kvr_plan_set_plan_of(self._handle, pair), owner=self)

    def class_plan(self, cls: int) -> Plan:
        if not 0 <= cls < self.num_classes:
            raise invalid(f"class {cls} outside [0, {self.num_classes})")
        return Plan(LIB.kvr_plan_set_class(self._handle, cls), owner=self)

    @property
    def total_bytes(self) -> int:
        return int(LIB.kvr_plan_set_total_bytes(self._handle))

    @property
    def total_runs(self) -> int:
        return int(LIB.kvr_plan_set_total_runs(self._handle))

    def _check_pair(self, pair: int) -> None:
        if not 0 <= pair < self.num_pairs:
            raise invalid(f"pair {pair} outside [0, {self.num_pairs})")


def layout_digest(layout: Layout, regions: Iterable[RegionDesc],
                  consumer: bool = True) -> str:
    """The 64-bit layout digest both sides compare at handshake, as the 16
    hex digits ``kvrelay plan`` prints. Token widths are read with the
    consumer's block size, or the producer's when not `consumer` (both
    sides' regions give one digest)."""
    regs = list(regions)
    lay, arr, err = layout.to_c(), regions_to_c(regs), new_error()
    out = ctypes.c_uint64()
    check(LIB.kvr_layout_digest_side(ctypes.byref(lay), arr, len(regs),
                                     consumer, ctypes.byref(out),
                                     ctypes.byref(err)), err)
    text = (ctypes.c_char * 17)()
    LIB.kvr_digest_hex(out.value, text)
    return text.value.decode()


def _verify(fn: Any, layout: Layout, ranks: Tuple[int, ...], pair: RegionPair,
            request: Request, src: BufferLike, dst: BufferLike) -> None:
    """Calls a C verifier fn(layout, *ranks, pair, request, src, dst, err)
    on region images checked against the pair's sizes."""
    s_addr, s_size, keep_s = address_of(src, False, "src")
    d_addr, d_size, keep_d = address_of(dst, False, "dst")
    need(s_size, pair.src.nbytes, "src")
    need(d_size, pair.dst.nbytes, "dst")
    lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
    req, keep = request.to_c()
    check(fn(ctypes.byref(lay), *ranks, ctypes.byref(cpair), ctypes.byref(req),
             s_addr, d_addr, ctypes.byref(err)), err)
    del keep, keep_s, keep_d


def verify_region(layout: Layout, rank: int, pair: RegionPair,
                  request: Request, src: BufferLike, dst: BufferLike) -> None:
    """Checks that every token `rank` must hold sits where docs/design.md §2-3
    put it in `dst` (the consumer region image), against `src` (the producer
    region image). Raises KvrelayError(ERR_VERIFY) naming the first wrong
    token, byte, expected and found values."""
    _verify(LIB.kvr_verify_region, layout, (rank,), pair, request, src, dst)


def check_coverage(layout: Layout, pair: RegionPair, request: Request,
                   rank_plans: Sequence[Plan]) -> None:
    """Coverage proof: the W ranks' plans together write every token exactly
    once (replicated: on every rank) and nothing outside the request's
    pages. Raises KvrelayError otherwise."""
    if len(rank_plans) != layout.dcp_size:
        raise invalid(f"{len(rank_plans)} plans for W={layout.dcp_size} ranks")
    lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
    req, keep = request.to_c()
    handles = (ctypes.c_void_p * len(rank_plans))(
        *[p._handle for p in rank_plans])
    check(LIB.kvr_plan_check_coverage(ctypes.byref(lay), ctypes.byref(cpair),
                                      ctypes.byref(req), handles,
                                      ctypes.byref(err)), err)
    del keep


def verify_region_pair(layout: Layout, producer_rank: int, consumer_rank: int,
                       pair: RegionPair, request: Request, src: BufferLike,
                       dst: BufferLike) -> None:
    """Checks every byte consumer rank `consumer_rank` takes from producer
    rank `producer_rank` in `dst`, against `src` (that producer rank's
    region image). Raises KvrelayError(ERR_VERIFY) naming the first wrong
    byte."""
    _verify(LIB.kvr_verify_region_pair, layout, (producer_rank, consumer_rank),
            pair, request, src, dst)


def check_coverage_pair(layout: Layout, pair: RegionPair,
                        requests: Sequence[Request],
                        plans: Sequence[Sequence[Plan]]) -> None:
    """Coverage proof over every pair: requests[p] is producer rank p's
    request, plans[p][c] pair (p, c)'s plan. Every token (every head, for
    dense) reaches every consumer rank that owns it exactly once, from the
    right producer's right byte, and nothing else is written."""
    axis = pair.src.axis
    np_, nc = layout.axis_ranks(axis, False), layout.axis_ranks(axis, True)
    if len(requests) != np_ or len(plans) != np_ or \
            any(len(row) != nc for row in plans):
        raise invalid(f"need {np_} requests and {np_} x {nc} plans")
    lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
    converted = [r.to_c() for r in requests]
    reqs = (T.Request * np_)(*[c for c, _ in converted])
    handles = (ctypes.c_void_p * (np_ * nc))(
        *[plans[p][c]._handle for p in range(np_) for c in range(nc)])
    check(LIB.kvr_plan_check_coverage_pair(ctypes.byref(lay),
                                           ctypes.byref(cpair), reqs, handles,
                                           ctypes.byref(err)), err)
    del converted


__all__ = ["Request", "Plan", "PlanSet", "plan", "plan_pair", "sources",
           "layout_digest", "verify_region", "verify_region_pair",
           "check_coverage", "check_coverage_pair", "block_table"]
