"""The completion books (docs/completion.md): completion ids, the TP/PP
quorum, send/save pairing, prefix hashes and the offload identity.

Ids are a request id (``bytes`` or ``str``, 1..256 bytes) with an optional
generation: ``generation=None`` is the bare request id, an int makes the
operation id ``(request, generation)`` of a save or load. Objects are not
thread-safe, as in C: one owner thread, or the caller's lock.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _types as T
from ._lib import LIB
from .errors import check, invalid, new_error
from .layout import Layout

RequestId = Union[bytes, str]


class QuorumOutcome(IntEnum):
    PENDING = 0  # recorded; other members have not reported
    DONE = 1  # this report completed the key
    IGNORED = 2  # a late duplicate of a finished key


class PairOutcome(IntEnum):
    HELD = 0  # the send is held until its request's saves complete
    RELEASED = 1  # events queued for poll()
    DUPLICATE = 2  # already known: nothing queued


class ReleaseKind(IntEnum):
    SAVE = 1  # a save finished
    SEND = 2  # a send finished and no save is outstanding: free the blocks


def _bytes(request: RequestId) -> bytes:
    if isinstance(request, str):
        return request.encode()
    if isinstance(request, (bytes, bytearray)):
        return bytes(request)
    raise invalid(f"request id {request!r} is not bytes or str")


class _Id:
    """A kvr_completion_id_t whose bytes live as long as it does."""

    def __init__(self, request: RequestId, generation: Optional[int]) -> None:
        self.raw = ctypes.create_string_buffer(_bytes(request))
        n = len(self.raw.raw) - 1
        self.c = T.CompletionId(ctypes.cast(self.raw, ctypes.c_void_p), n,
                                generation is not None,
                                0 if generation is None else int(generation))

    @property
    def ref(self) -> Any:
        return ctypes.byref(self.c)


@dataclass(frozen=True)
class QuorumReport:
    outcome: QuorumOutcome
    status: int  # 0 when every report succeeded, else the first failure
    reported: int  # distinct members heard for the key


class Quorum:
    """A key completes when every member 0..members-1 reported it; failure
    dominates; finished keys are tombstoned (late duplicates ignored)."""

    def __init__(self, members: int, max_pending: int = 16384,
                 tombstones: int = 4096, tombstone_requests: bool = True) -> None:
        params = T.QuorumParams(members, max_pending, tombstones,
                                tombstone_requests)
        handle = ctypes.c_void_p()
        err = new_error()
        check(LIB.kvr_quorum_create(ctypes.byref(params), ctypes.byref(handle),
                                    ctypes.byref(err)), err)
        self._h = handle

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            LIB.kvr_quorum_destroy(h)

    def report(self, request: RequestId, member: int, status: int = 0,
               generation: Optional[int] = None) -> QuorumReport:
        """Member `member` reports the id with `status` (0: success)."""
        cid, res, err = _Id(request, generation), T.QuorumResult(), new_error()
        check(LIB.kvr_quorum_report(self._h, cid.ref, member, int(status),
                                    ctypes.byref(res), ctypes.byref(err)), err)
        return QuorumReport(QuorumOutcome(res.outcome), res.status,
                            res.reported)

    def cancel(self, request: RequestId, generation: Optional[int] = None) -> None:
        cid, err = _Id(request, generation), new_error()
        check(LIB.kvr_quorum_cancel(self._h, cid.ref, ctypes.byref(err)), err)

    def forget(self, request: RequestId, generation: Optional[int] = None) -> None:
        cid, err = _Id(request, generation), new_error()
        check(LIB.kvr_quorum_forget(self._h, cid.ref, ctypes.byref(err)), err)

    @property
    def num_pending(self) -> int:
        return int(LIB.kvr_quorum_num_pending(self._h))

    @property
    def num_tombstones(self) -> int:
        return int(LIB.kvr_quorum_num_tombstones(self._h))


@dataclass(frozen=True)
class PairRelease:
    kind: ReleaseKind
    request: bytes
    generation: Optional[int]  # None for a send (a bare id)
    status: int


class Pairing:
    """Send/save pairing: a finished send whose request has a declared save
    outstanding is held until that save completes, in either order."""

    def __init__(self, max_requests: int = 16384, max_events: int = 32768,
                 tombstones: int = 4096) -> None:
        params = T.PairingParams(max_requests, max_events, tombstones)
        handle = ctypes.c_void_p()
        err = new_error()
        check(LIB.kvr_pairing_create(ctypes.byref(params),
                                     ctypes.byref(handle), ctypes.byref(err)),
              err)
        self._h = handle

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            LIB.kvr_pairing_destroy(h)

    def expect_save(self, request: RequestId, generation: int) -> None:
        cid, err = _Id(request, generation), new_error()
        check(LIB.kvr_pairing_expect_save(self._h, cid.ref, ctypes.byref(err)),
              err)

    def _done(self, fn: Any, cid: _Id, status: int) -> PairOutcome:
        out, err = ctypes.c_int(), new_error()
        check(fn(self._h, cid.ref, int(status), ctypes.byref(out),
                 ctypes.byref(err)), err)
        return PairOutcome(out.value)

    def send_done(self, request: RequestId, status: int = 0) -> PairOutcome:
        return self._done(LIB.kvr_pairing_send_done, _Id(request, None), status)

    def save_done(self, request: RequestId, generation: int,
                  status: int = 0) -> PairOutcome:
        return self._done(LIB.kvr_pairing_save_done,
                          _Id(request, generation), status)

    def poll(self) -> List[PairRelease]:
        """Every queued release, oldest first."""
        out: List[PairRelease] = []
        buf = (T.Release * 16)()
        while True:
            n, err = ctypes.c_size_t(), new_error()
            check(LIB.kvr_pairing_poll(self._h, buf, 16, ctypes.byref(n),
                                       ctypes.byref(err)), err)
            for r in buf[:n.value]:
                out.append(PairRelease(
                    ReleaseKind(r.kind), bytes(r.req_id[:r.req_id_len]),
                    r.generation if r.is_op else None, r.status))
            if n.value < 16:
                return out

    def forget(self, request: RequestId, generation: Optional[int] = None) -> None:
        cid, err = _Id(request, generation), new_error()
        check(LIB.kvr_pairing_forget(self._h, cid.ref, ctypes.byref(err)), err)

    @property
    def num_requests(self) -> int:
        return int(LIB.kvr_pairing_num_requests(self._h))

    @property
    def num_events(self) -> int:
        return int(LIB.kvr_pairing_num_events(self._h))


def _tokens(tokens: Any) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64))
    if arr.ndim != 1 or (arr.size and (arr.min() < 0 or arr.max() >= 2**32)):
        raise invalid("token ids must be a 1-D sequence of u32 values")
    return np.ascontiguousarray(arr.astype(np.uint32))


def prefix_hashes(tokens: Any, hash_block_size: int,
                  parent: Optional[bytes] = None) -> List[bytes]:
    """h_i = SHA-256(h_{i-1} || block i's token ids as u32 LE), over the full
    blocks of `tokens`; h_{-1} is `parent` or 32 zero bytes."""
    ids = _tokens(tokens)
    cap = ids.size // max(int(hash_block_size), 1) + 1
    out, n, err = (T.BlockHash * cap)(), ctypes.c_size_t(), new_error()
    par = None
    if parent is not None:
        if len(parent) != T.BLOCK_HASH_BYTES:
            raise invalid(f"parent hash of {len(parent)} bytes, not 32")
        par = ctypes.byref(T.BlockHash((ctypes.c_uint8 * 32)(*parent)))
    check(LIB.kvr_prefix_hashes(
        par, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), ids.size,
        int(hash_block_size), out, cap, ctypes.byref(n), ctypes.byref(err)),
        err)
    return [bytes(h.bytes) for h in out[:n.value]]


def prefix_cached(layout: Layout, num_tokens: int,
                  hit_blocks: int) -> Tuple[int, int]:
    """(num_cached_tokens, num_computed_blocks) of a hit of hit_blocks hash
    blocks of bs * W tokens: the computed blocks are virtual blocks."""
    lay = layout.to_c()
    toks, blocks, err = ctypes.c_uint64(), ctypes.c_uint64(), new_error()
    check(LIB.kvr_prefix_cached(ctypes.byref(lay), num_tokens, hit_blocks,
                                ctypes.byref(toks), ctypes.byref(blocks),
                                ctypes.byref(err)), err)
    return toks.value, blocks.value


@dataclass(frozen=True)
class OffloadDesc:
    """What separates offloaded pages of different layouts (§9)."""
    model_tag: str
    dtype: str
    block_size: int
    chunk_size: int
    tp: int = 1
    dcp_size: int = 1
    interleave: int = 1
    replicate_index: bool = False
    preshuffle: bool = False
    indexer_types: Sequence[str] = ()

    def to_c(self) -> Tuple[T.OffloadDesc, Any]:
        types = (ctypes.c_char_p * (len(self.indexer_types) + 1))(
            *[t.encode() for t in self.indexer_types])
        d = T.OffloadDesc(self.model_tag.encode(), self.dtype.encode(),
                          self.block_size, self.chunk_size, self.tp,
                          self.dcp_size, self.interleave, self.replicate_index,
                          self.preshuffle, types, len(self.indexer_types))
        return d, types


def offload_key(desc: OffloadDesc) -> str:
    """32 hex digits: BLAKE2b-128 of the canonical description."""
    d, keep = desc.to_c()
    out, err = (ctypes.c_char * 33)(), new_error()
    check(LIB.kvr_offload_key(ctypes.byref(d), out, ctypes.byref(err)), err)
    del keep
    return out.value.decode()


def offload_namespace(desc: OffloadDesc) -> str:
    """``<model>::kvrelay-page-v3-<key>``."""
    d, keep = desc.to_c()
    buf, err = ctypes.create_string_buffer(512), new_error()
    check(LIB.kvr_offload_namespace(ctypes.byref(d), buf, len(buf),
                                    ctypes.byref(err)), err)
    del keep
    return buf.value.decode()


def aligned_prefix(hit_tokens: int, chunk_size: int) -> int:
    """floor(hit / chunk) * chunk (0 for a hit <= 0)."""
    out, err = ctypes.c_uint64(), new_error()
    check(LIB.kvr_offload_aligned_prefix(hit_tokens, chunk_size,
                                         ctypes.byref(out), ctypes.byref(err)),
          err)
    return out.value
