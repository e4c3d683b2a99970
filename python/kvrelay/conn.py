"""The connector (kvrelay/conn.h): one producer (a PP stage) or consumer (a
DCP decode rank; rank 0 leads) over a TCP control channel and a UCX
transport for the bytes (docs/design.md §6-8).

Register regions (any buffer, a raw address + size, or memory kvrelay
allocates), listen or connect, submit a request (``offer`` on the producer's
PP head, or ``load`` on a consumer whose engine router computed the tables)
and drive ``progress`` while polling completions. One thread drives a
Connector; nothing waits without a deadline.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _types as T
from ._buffers import BufferLike, address_of, array_view, need
from ._lib import LIB
from .agent import Topology  # one definition for both connectors
from .errors import KvrelayError, Status, check, invalid, new_error, status_name
from .layout import Layout, RegionDesc
from .plan import block_table

RequestId = Union[str, bytes]


class Side(IntEnum):
    PRODUCER = 1
    CONSUMER = 2


class Transport(IntEnum):
    """UCX transport choice (kvr_conn_tl_t)."""

    AUTO = 0
    SHM = 1
    TCP = 2


class Executor(IntEnum):
    """The consumer's wish for how bytes move (kvr_conn_exec_t)."""

    AUTO = 0
    DIRECT = 1
    STAGED = 2


class EventKind(IntEnum):
    LOADED = 1       # consumer: every planned byte is in place
    LOAD_FAILED = 2  # consumer: refused, failed or deadline
    SENT = 3         # producer: every rank released; sources free
    SEND_FAILED = 4  # producer: a transfer failed or timed out
    GROUP_DONE = 5   # leader: every rank released the request
    PEER_LOST = 6    # a link closed (status says why)
    PEER_REFUSED = 7  # a peer that dialled us was refused at handshake


@dataclass(frozen=True)
class Event:
    """A completion (kvr_conn_event_t); block tables are copies."""

    kind: EventKind
    request_id: bytes
    transfer_id: int
    status: int
    message: str
    bytes: int
    num_tokens: int
    num_computed_blocks: int
    src_blocks: np.ndarray
    dst_blocks: np.ndarray
    peer_rank: int

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def status_name(self) -> str:
        return status_name(self.status)

    def raise_for_status(self) -> "Event":
        """Raises KvrelayError carrying the event's status and message."""
        if not self.ok:
            raise KvrelayError(self.status, self.message)
        return self

    @classmethod
    def from_c(cls, e: T.ConnEvent) -> "Event":
        return cls(EventKind(e.kind),
                   bytes(e.request_id.bytes[:e.request_id.len]),
                   e.transfer_id, e.status,
                   e.message.decode(errors="replace"), e.bytes, e.num_tokens,
                   e.num_computed_blocks,
                   _copy_ids(e.src_blocks, e.num_src_blocks),
                   _copy_ids(e.dst_blocks, e.num_dst_blocks), e.peer_rank)


def _copy_ids(ptr: Any, n: int) -> np.ndarray:
    # event arrays live only until the next poll
    if n == 0 or not ptr:
        return np.zeros(0, dtype=np.uint32)
    return np.ctypeslib.as_array(ptr, shape=(n,)).copy()


def _id_bytes(request_id: RequestId) -> bytes:
    raw = request_id.encode() if isinstance(request_id, str) else bytes(request_id)
    if not 1 <= len(raw) <= T.WIRE_REQ_ID_MAX:
        raise invalid(f"request id of {len(raw)} bytes (1..{T.WIRE_REQ_ID_MAX})")
    return raw


def _u32p(arr: np.ndarray) -> Any:
    return arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))


class Connector:
    """One side of kvrelay's protocol (kvr_conn_t)."""

    def __init__(self, side: Side, layout: Layout, *,
                 topology: Topology = Topology(), producer_stages: int = 1,
                 consumer_ranks: int = 1, key: Optional[bytes] = None,
                 insecure: bool = False, transport: Transport = Transport.AUTO,
                 executor: Executor = Executor.AUTO, deadline_ms: int = 30000,
                 release_grace_ms: int = 5000, max_requests: int = 1024,
                 leader_blocks: int = 0, cuda_device: int = -1) -> None:
        """Consumer arguments: producer_stages (PP stages that must answer),
        leader_blocks (rank 0's destination pool). Producer: consumer_ranks
        (DCP ranks that must release). key: the 32-byte pre-shared key;
        without one only loopback peers are accepted unless insecure.
        cuda_device >= 0 puts the KV regions in that GPU's memory (moved by
        the gpu-direct executor; needs a CUDA build)."""
        self._handle = 0
        self._keep: List[Any] = []  # memory registered with the C side
        if key is not None and len(key) != T.WIRE_KEY_BYTES:
            raise invalid(f"key of {len(key)} bytes, expected {T.WIRE_KEY_BYTES}")
        self._key = (ctypes.c_uint8 * T.WIRE_KEY_BYTES).from_buffer_copy(key) \
            if key is not None else None
        params = T.ConnParams(
            side=int(side), layout=layout.to_c(), topo=topology.to_c(),
            producer_stages=producer_stages, consumer_ranks=consumer_ranks,
            key=ctypes.cast(self._key, ctypes.POINTER(ctypes.c_uint8))
            if self._key is not None else None,
            insecure=insecure, tl=int(transport), executor=int(executor),
            deadline_ms=deadline_ms, release_grace_ms=release_grace_ms,
            max_requests=max_requests, leader_blocks=leader_blocks,
            cuda_device=cuda_device)
        out, err = ctypes.c_void_p(), new_error()
        check(LIB.kvr_conn_create(ctypes.byref(params), ctypes.byref(out),
                                  ctypes.byref(err)), err)
        self._handle = out.value or 0
        self.side, self.layout = side, layout

    # ---- lifetime ----
    def close(self) -> None:
        """Closes every link and frees kvrelay-allocated regions (arrays
        from alloc_region must not be used afterwards)."""
        if self._handle:
            LIB.kvr_conn_destroy(self._handle)
            self._handle = 0
        self._keep.clear()

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "Connector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _h(self) -> int:
        if not self._handle:
            raise invalid("the connector is closed")
        return self._handle

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise KvrelayError(code, f"{what}: {self.last_error}")

    @property
    def last_error(self) -> str:
        """Detail of the last failure ("" if none)."""
        if not self._handle:
            return ""
        return str(LIB.kvr_conn_last_error(self._handle).decode(errors="replace"))

    # ---- regions ----
    def add_region(self, desc: RegionDesc, memory: BufferLike) -> None:
        """Registers engine memory: a writable buffer, or (address, size) /
        RawBuffer for memory Python cannot see. It must hold desc.nbytes;
        the connector keeps a reference until close()."""
        addr, size, keep = address_of(memory, True, f"region layer {desc.layer}")
        need(size, desc.nbytes, f"region layer {desc.layer}")
        c = desc.to_c()
        self._check(LIB.kvr_conn_add_region(self._h(), ctypes.byref(c), addr),
                    f"add_region layer {desc.layer}")
        self._keep.append(keep if keep is not None else memory)

    def alloc_region(self, desc: RegionDesc) -> np.ndarray:
        """Has kvrelay allocate a region (true one-sided puts on shared
        memory); returns a writable uint8 array over it, valid until
        close()."""
        base, c = ctypes.c_void_p(), desc.to_c()
        self._check(LIB.kvr_conn_alloc_region(self._h(), ctypes.byref(c),
                                              ctypes.byref(base)),
                    f"alloc_region layer {desc.layer}")
        return array_view(self, base.value or 0, desc.nbytes,
                          np.dtype(np.uint8), False)

    # ---- links ----
    def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Consumer: accepts producers (rank 0: the other decode ranks too).
        Returns the bound port (port 0 picks one)."""
        bound = ctypes.c_uint16()
        self._check(LIB.kvr_conn_listen(self._h(), host.encode(), port,
                                        ctypes.byref(bound)),
                    f"listen {host}:{port}")
        return bound.value

    def connect(self, host: str, port: int, timeout_ms: int = 10000) -> None:
        """Producer -> a consumer rank; consumer rank > 0 -> the leader.
        Returns once the handshake finished; raises if it failed."""
        self._check(LIB.kvr_conn_connect(self._h(), host.encode(), port,
                                         timeout_ms),
                    f"connect {host}:{port}")

    @property
    def num_ready(self) -> int:
        """Links whose handshake completed (producer: REGIONS arrived too)."""
        return int(LIB.kvr_conn_num_ready(self._h()))

    @property
    def num_live(self) -> int:
        """Requests still in flight here (quarantined ones included)."""
        return int(LIB.kvr_conn_num_live(self._h()))

    def progress(self, timeout_ms: int = 0) -> None:
        """One turn of the event loop, waiting up to timeout_ms for input."""
        self._check(LIB.kvr_conn_progress(self._h(), timeout_ms), "progress")

    # ---- requests ----
    def offer(self, request_id: RequestId, num_tokens: int, src_blocks: Any, *,
              prompt: Any = None, transfer_id: int = 0) -> None:
        """Producer PP head: a finished prefill for the decode leader, which
        assigns destination blocks and has every rank load it."""
        rid = _id_bytes(request_id)
        src = block_table(src_blocks, "src_blocks")
        ids = block_table(prompt if prompt is not None else [], "prompt")
        rbuf = ctypes.create_string_buffer(rid, len(rid))
        o = T.ConnOffer(ctypes.addressof(rbuf), len(rid), transfer_id, num_tokens, _u32p(src),
                        src.size, _u32p(ids), ids.size)
        self._check(LIB.kvr_conn_offer(self._h(), ctypes.byref(o)),
                    f"offer {rid!r}")

    def load(self, request_id: RequestId, src_blocks: Any, dst_blocks: Any,
             num_tokens: int, *, num_computed_blocks: int = 0,
             transfer_id: int = 0, deadline_ms: int = 0) -> None:
        """Consumer: load a request whose full block tables an engine's
        router computed; num_computed_blocks counts virtual blocks already
        cached here. Completion arrives as LOADED or LOAD_FAILED."""
        rid = _id_bytes(request_id)
        src = block_table(src_blocks, "src_blocks")
        dst = block_table(dst_blocks, "dst_blocks")
        rbuf = ctypes.create_string_buffer(rid, len(rid))
        q = T.ConnLoad(ctypes.addressof(rbuf), len(rid), transfer_id, _u32p(src), src.size,
                       _u32p(dst), dst.size, num_tokens, num_computed_blocks,
                       deadline_ms)
        self._check(LIB.kvr_conn_load(self._h(), ctypes.byref(q)),
                    f"load {rid!r}")

    # ---- completions ----
    def poll(self) -> Optional[Event]:
        """The next queued event, or None."""
        e = T.ConnEvent()
        if not LIB.kvr_conn_poll_event(self._h(), ctypes.byref(e)):
            return None
        return Event.from_c(e)

    def events(self) -> Iterator[Event]:
        """Every queued event."""
        while True:
            e = self.poll()
            if e is None:
                return
            yield e

    def run_until(self, done: Callable[[List[Event]], bool],
                  timeout_s: float = 30.0, step_ms: int = 20) -> List[Event]:
        """Progresses and collects events until done(events) is true; raises
        KvrelayError(ERR_TIMEOUT) with the events seen if the time runs
        out."""
        seen: List[Event] = []
        end = time.monotonic() + timeout_s
        while not done(seen):
            if time.monotonic() > end:
                raise KvrelayError(int(Status.ERR_TIMEOUT),  # type: ignore[attr-defined]
                                   f"{timeout_s} s passed; events: "
                                   f"{[(e.kind.name, e.request_id) for e in seen]}")
            self.progress(step_ms)
            seen.extend(self.events())
        return seen


def count(events: Sequence[Event], kind: EventKind) -> int:
    """How many events of a kind (for run_until predicates)."""
    return sum(1 for e in events if e.kind == kind)


__all__ = ["Connector", "Event", "EventKind", "Executor", "Side", "Topology",
           "Transport", "count"]
