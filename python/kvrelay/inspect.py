"""Did the KV land where attention reads it? (kvrelay/inspect.h)

Received pages are decoded back into per-token form with the layout math
(not the planner) and diffed against the producer's pages:

- ``Inspection`` checks region images in memory, one (request, rank) per
  call, accumulating findings;
- ``inspect_dump`` checks a dump directory (``kvrelay demo --dump`` or
  ``kvrelay.dump.write_dump``) like ``kvrelay inspect --json`` and returns
  the same report as a dict.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _types as T
from ._buffers import BufferLike, address_of
from ._lib import LIB
from .errors import check, invalid, new_error
from .layout import Layout, RegionPair
from .plan import Request, block_table

KINDS = ("wrong", "scale", "source")
_PART_BITS = (1, 2, 4)


def _part_name(bit: int) -> str:
    return str(LIB.kvr_inspect_part_name(bit).decode())


@dataclass(frozen=True)
class Diff:
    """One wrong token. ``byte`` is the first differing byte in the part
    (token order); offsets are region-relative; ``expected``/``found`` are
    excerpts from that byte."""

    kind: str
    request: int
    rank: int
    token: int
    part: str
    parts: Tuple[str, ...]
    byte: int
    src_offset: int
    dst_offset: int
    expected: bytes
    found: bytes

    @classmethod
    def from_c(cls, d: T.InspectDiff) -> "Diff":
        n = d.excerpt_len
        return cls(KINDS[d.kind], d.request, d.rank, d.token,
                   _part_name(d.part),
                   tuple(_part_name(b) for b in _PART_BITS if d.parts & b),
                   d.byte, d.src_offset, d.dst_offset,
                   bytes(d.expected[:n]), bytes(d.found[:n]))


class Inspection:
    """Findings of one region over many calls (kvr_inspect_result_t); the
    first `max_report` findings of each kind are kept."""

    def __init__(self, max_report: int = 5) -> None:
        if max_report < 1:
            raise invalid(f"max_report {max_report} < 1")
        self.max_report = max_report
        self._diffs = (T.InspectDiff * (len(KINDS) * max_report))()
        self._res = T.InspectResult()
        self._res.diffs = ctypes.cast(self._diffs, ctypes.POINTER(T.InspectDiff))
        self._res.diffs_cap = len(KINDS) * max_report

    def _opts(self, synthetic: bool, seed: int) -> T.InspectOpts:
        return T.InspectOpts(self.max_report, synthetic, seed, False)

    def buffers(self, layout: Layout, rank: int, pair: RegionPair,
                request: Request, src: BufferLike, dst: BufferLike, *,
                synthetic: bool = False, seed: int = 0) -> "Inspection":
        """Checks every token `rank` must hold in `dst` (a consumer region
        image) against `src` (the producer region image); with `synthetic`,
        also each received index token's scale against its keys."""
        s_addr, s_size, keep_s = address_of(src, False, "src")
        d_addr, d_size, keep_d = address_of(dst, False, "dst")
        lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
        req, keep = request.to_c()
        opts = self._opts(synthetic, seed)
        check(LIB.kvr_inspect_buffers(
            ctypes.byref(lay), rank, ctypes.byref(cpair), ctypes.byref(req),
            s_addr, s_size, d_addr, d_size, ctypes.byref(opts),
            ctypes.byref(self._res), ctypes.byref(err)), err)
        del keep, keep_s, keep_d
        return self

    def source(self, layout: Layout, pair: RegionPair, request: Request,
               token_ids: Any, src: BufferLike, *, seed: int) -> "Inspection":
        """Checks the request's tokens in `src` against the synthetic data
        of (seed, layer, position, token id)."""
        ids = block_table(token_ids, "token_ids")
        if ids.size != request.num_tokens:
            raise invalid(f"{ids.size} token ids for {request.num_tokens} tokens")
        s_addr, s_size, keep_s = address_of(src, False, "src")
        lay, cpair, err = layout.to_c(), pair.to_c(), new_error()
        req, keep = request.to_c()
        opts = self._opts(True, seed)
        check(LIB.kvr_inspect_source(
            ctypes.byref(lay), ctypes.byref(cpair), ctypes.byref(req),
            ids.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), s_addr,
            s_size, ctypes.byref(opts), ctypes.byref(self._res),
            ctypes.byref(err)), err)
        del keep, keep_s
        return self

    def checked(self, kind: str = "wrong") -> int:
        """Tokens checked for a kind ("wrong", "scale", "source")."""
        return int(self._res.checked[KINDS.index(kind)])

    def found(self, kind: str = "wrong") -> int:
        """Tokens with a difference of a kind."""
        return int(self._res.found[KINDS.index(kind)])

    @property
    def clean(self) -> bool:
        return all(self._res.found[k] == 0 for k in range(len(KINDS)))

    @property
    def diffs(self) -> List[Diff]:
        return [Diff.from_c(self._diffs[i]) for i in range(self._res.num_diffs)]

    def summary(self) -> Dict[str, int]:
        return {f"{k}_{what}": int(getattr(self._res, what)[i])
                for i, k in enumerate(KINDS) for what in ("checked", "found")}


def inspect_buffers(layout: Layout, rank: int, pair: RegionPair,
                    request: Request, src: BufferLike, dst: BufferLike, *,
                    synthetic: bool = False, seed: int = 0,
                    max_report: int = 5) -> Inspection:
    """One (request, rank) of one region; see Inspection.buffers."""
    return Inspection(max_report).buffers(layout, rank, pair, request, src,
                                          dst, synthetic=synthetic, seed=seed)


def inspect_dump(directory: Union[str, Path], *, max_report: int = 5,
                 seed: Optional[int] = None,
                 synthetic: Optional[bool] = None) -> Dict[str, Any]:
    """Checks a dump directory (docs/dump-format.md) and returns the report
    of ``kvrelay inspect --json`` (``report["clean"]``, per-region counts
    and the first wrong tokens). By default the manifest's seed decides
    whether the data is synthetic; `seed` declares it, `synthetic=False`
    turns the synthetic checks off. A malformed or missing dump raises
    KvrelayError (ERR_INVALID, ERR_IO, ...)."""
    if seed is not None and synthetic is False:
        raise invalid("seed and synthetic=False exclude each other")
    from_manifest = seed is None and synthetic is not False
    opts = T.InspectOpts(max_report, seed is not None, seed or 0,
                         from_manifest)
    handle, err = ctypes.c_void_p(), new_error()
    check(LIB.kvr_inspect_dump(str(directory).encode(), ctypes.byref(opts),
                               ctypes.byref(handle), ctypes.byref(err)), err)
    try:
        text = LIB.kvr_inspect_report_json(handle)
        if not text:
            raise MemoryError("kvrelay: no memory for the inspect report")
        try:
            report: Dict[str, Any] = json.loads(ctypes.string_at(text).decode())
            return report
        finally:
            LIB.kvr_inspect_free(text)
    finally:
        LIB.kvr_inspect_report_destroy(handle)


__all__ = ["Diff", "Inspection", "inspect_buffers", "inspect_dump", "KINDS"]
