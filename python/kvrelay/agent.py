"""The agent (kvrelay/agent.h): the one object an engine worker embeds to
move KV cache between prefill (producer) and decode (consumer) instances,
any number of each (docs/agent.md).

An ``Agent`` registers the worker's KV regions, starts, and then takes
requests keyed by (producer instance id, request id): ``send_open`` /
``send_ready`` / ``send_abort`` on a producer, ``recv`` / ``recv_abort`` on a
consumer. Outcomes come back as events (``poll``, ``events``), never as
callbacks.

Threads: every method may be called from any Python thread at any time,
``close`` included (it waits for calls in progress on other threads, then
destroys the C agent). ctypes releases the GIL during each C call, and no C
call waits on a peer: the C side validates, copies and queues, and its
progress thread (or ``progress()`` without one) does the rest.
"""

from __future__ import annotations

import ctypes
import select
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import (Any, Callable, Iterator, List, Optional, Tuple, TypeVar,
                    Union)

import numpy as np

from . import _types as T
from ._buffers import BufferLike, RawBuffer, address_of, array_view, need
from ._lib import LIB
from .errors import KvrelayError, Status, check, invalid, new_error, status_name
from .layout import Layout, RegionDesc
from .plan import block_table

Id = Union[str, bytes]
_E = TypeVar("_E")

#: send_ready's layer_end that covers every layer of the stage
ALL_LAYERS = 1 << 30
#: KVR_AGENT_PARAMS_INIT's timers and limits (what keywords left None get)
#: and KVR_LOOPBACK_PARAMS_INIT's queues; python/tests/test_abi.py checks
#: them against the headers
PARAM_DEFAULTS = {"deadline_ms": 30000, "grace_ms": 5000, "lease_ms": 60000,
                  "unknown_wait_ms": 1000, "idle_close_ms": 60000,
                  "connect_timeout_ms": 5000, "max_requests": 1024,
                  "handshake_timeout_ms": 3000, "max_unauth_links": 64}
LOOPBACK_DEFAULTS = {"max_inflight": 1024, "msg_queue_max": 65536}
# longest wait of one slice in events()/notifications(): close() from
# another thread waits at most this long for a waiting reader
_WAIT_SLICE_S = 0.1


class AgentRole(IntEnum):
    """kvr_agent_role_t."""

    PRODUCER = 1  # prefill: serves pulls of its own KV
    CONSUMER = 2  # decode: pulls KV into its blocks
    BOTH = 3


class Transport(IntEnum):
    """kvr_agent_tl_t: the UCX transport of the data plane."""

    AUTO = 0
    SHM = 1
    TCP = 2


class Executor(IntEnum):
    """kvr_agent_exec_t: how a pull's bytes move (docs/agent.md Executors)."""

    AUTO = 0
    DIRECT = 1
    STAGED = 2


class EventKind(IntEnum):
    """kvr_agent_event_kind_t."""

    SENT = 1           # producer: every group released it
    SEND_EXPIRED = 2   # producer: lease over, not every group pulled
    SEND_FAILED = 3    # producer: aborted, or a group failed
    LOADED = 4         # consumer: every planned byte is in place
    LOAD_FAILED = 5    # consumer: status and message say why
    RELEASED = 6       # consumer: destination blocks reusable
    LAYERS_LOADED = 7  # consumer, recv(stream=True): layers landed
    NOTIFY_FAILED = 8  # a notify() could not be sent
    PEER_REFUSED = 9   # a link refused at its handshake (either side)


#: the producer's one terminal event per request
SEND_TERMINAL = frozenset({EventKind.SENT, EventKind.SEND_EXPIRED,
                           EventKind.SEND_FAILED})
#: the consumer's one outcome per request (RELEASED follows it)
RECV_OUTCOME = frozenset({EventKind.LOADED, EventKind.LOAD_FAILED})


class SendState(IntEnum):
    """kvr_agent_send_state_t."""

    NONE = 0
    QUEUED = 1
    OPEN = 2
    READY = 3
    SENT = 4
    EXPIRED = 5
    FAILED = 6


class RecvState(IntEnum):
    """kvr_agent_recv_state_t."""

    NONE = 0
    QUEUED = 1
    DIALING = 2
    PULLING = 3
    QUARANTINE = 4
    LOADED = 5
    FAILED = 6


class WireSide(IntEnum):
    """kvr_wire_side_t: the side a notification's sender announced."""

    PRODUCER = 1
    CONSUMER = 2


@dataclass(frozen=True)
class Topology:
    """A worker's place in its deployment (kvr_wire_topo_t); the layer range
    [layer_start, layer_end) is half-open."""

    pp_rank: int = 0
    pp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    layer_start: int = 0
    layer_end: int = 0
    dcp_rank: int = 0

    def to_c(self) -> T.WireTopo:
        return T.WireTopo(*(getattr(self, f.name) for f in fields(self)))

    @classmethod
    def from_c(cls, c: T.WireTopo) -> "Topology":
        return cls(*(getattr(c, f.name) for f in fields(cls)))


def _wire_id(w: T.WireId) -> bytes:
    return bytes(w.bytes[:w.len])


@dataclass(frozen=True)
class Event:
    """kvr_agent_event_t (a copy). ``producer`` and ``request`` are the
    request's key; ``peer`` is the instance a NOTIFY_FAILED was for, or the
    refused peer of a PEER_REFUSED (whose ``bytes`` is 1 when that peer is
    one this agent talks to at all: keyless, its HELLO came; keyed, its
    AUTH verified)."""

    kind: EventKind
    producer: bytes
    request: bytes
    status: int
    message: str
    bytes: int  # LOADED: received; SENT: sent; NOTIFY_FAILED: payload;
    #            LAYERS_LOADED: the group's
    layer_begin: int  # LAYERS_LOADED: layers [layer_begin, layer_end)
    layer_end: int
    peer: bytes

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def status_name(self) -> str:
        return status_name(self.status)

    @property
    def final(self) -> bool:
        """The request's last event: SENT, SEND_EXPIRED or SEND_FAILED on a
        producer, RELEASED on a consumer. Its key may be reused after it."""
        return self.kind in SEND_TERMINAL or self.kind == EventKind.RELEASED

    def raise_for_status(self) -> "Event":
        """Raises KvrelayError carrying the event's status and message."""
        if not self.ok:
            raise KvrelayError(self.status, self.message)
        return self

    @classmethod
    def from_c(cls, e: T.AgentEvent) -> "Event":
        return cls(EventKind(e.kind), _wire_id(e.producer),
                   _wire_id(e.request), e.status,
                   e.message.decode(errors="replace"), e.bytes, e.layer_begin,
                   e.layer_end, _wire_id(e.peer))


@dataclass(frozen=True)
class Notification:
    """kvr_agent_notify_t: a notification received; the sender's identity
    comes from the link's authenticated handshake."""

    sender: bytes
    sender_topology: Topology
    sender_side: WireSide
    sender_incarnation: int
    sender_address: str  # its listener ("" if none): notify() answers there
    dropped: int         # notifications dropped before this one (queue full)
    payload: bytes

    @classmethod
    def from_c(cls, n: T.AgentNotify) -> "Notification":
        return cls(_wire_id(n.sender), Topology.from_c(n.sender_topo),
                   WireSide(n.sender_side), n.sender_incarnation,
                   n.sender_address.decode(errors="replace"), n.dropped,
                   ctypes.string_at(ctypes.addressof(n.payload), n.len))


@dataclass(frozen=True)
class RequestStatus:
    """kvr_agent_req_status_t: a request's state as of the progress loop's
    last step."""

    send: SendState  # this agent serving it
    recv: RecvState  # this agent loading it
    status: int      # outcome once terminal
    message: str

    @property
    def status_name(self) -> str:
        return status_name(self.status)


@dataclass(frozen=True)
class LoopbackFaults:
    """Fault injection of an agent's loopback transport
    (kvr_loopback_params_t): counters count that transport's operations
    from 1; 0 is off."""

    fail_put_at: int = 0     # the k-th put fails, its endpoint dies
    corrupt_put_at: int = 0  # the k-th put lands with its first byte flipped
    drop_msg_at: int = 0     # the k-th control message is lost
    dup_msg_at: int = 0      # the k-th control message arrives twice
    delay_ms: int = 0        # puts complete and messages arrive this late
    mem_limit: int = 0       # bytes it may register (0: any)
    no_map: bool = False     # no mapped peer memory (as UCX over tcp)

    def to_c(self) -> T.LoopbackParams:
        c = T.LoopbackParams(**LOOPBACK_DEFAULTS)
        for f in fields(self):
            setattr(c, f.name, getattr(self, f.name))
        return c


def _id(value: Id, what: str, limit: int) -> bytes:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if not 1 <= len(raw) <= limit:
        raise invalid(f"{what} of {len(raw)} bytes (1..{limit})")
    return raw


def _request_id(value: Id) -> bytes:
    return _id(value, "request id", T.WIRE_REQ_ID_MAX)


def _instance_id(value: Id, what: str = "instance id") -> bytes:
    return _id(value, what, T.AGENT_INSTANCE_MAX)


def _u32p(arr: np.ndarray) -> Any:
    return arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))


def _address(value: Optional[str]) -> Optional[bytes]:
    return None if value is None else value.encode()


class LoopbackHub:
    """An in-process data plane (kvr_transport_loopback_create): agents of
    this process given ``hub=`` move bytes by memcpy through it instead of
    UCX. Control links stay TCP. For tests and single-process setups.

    ``close()`` closes the agents still joined to it first (an agent must
    not outlive its hub)."""

    def __init__(self) -> None:
        out, err = ctypes.c_void_p(), new_error()
        params = LoopbackFaults().to_c()
        check(LIB.kvr_transport_loopback_create(
            None, ctypes.byref(params), ctypes.byref(out), ctypes.byref(err)),
            err, "loopback hub")
        self._handle = out.value or 0
        self._agents: "weakref.WeakSet[Agent]" = weakref.WeakSet()
        self._lock = threading.Lock()

    def _join(self, agent: "Agent") -> int:
        with self._lock:
            if not self._handle:
                raise invalid("the loopback hub is closed")
            self._agents.add(agent)
            return self._handle

    def close(self) -> None:
        with self._lock:
            agents, self._agents = list(self._agents), weakref.WeakSet()
        for a in agents:
            a.close()
        with self._lock:
            handle, self._handle = self._handle, 0
        if handle:
            LIB.kvr_transport_destroy(handle)

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "LoopbackHub":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Agent:
    """One engine worker's agent (kvr_agent_t).

    Arguments (defaults are KVR_AGENT_PARAMS_INIT's):
        instance_id: the engine instance's id (1..64 bytes; every stage of a
            prefill instance and every rank of a decode group share one).
        role: ``AgentRole`` or "producer" / "consumer" / "both".
        layout: the model's full layout (both sides agree).
        topology: this worker's ``Topology``; or give its fields as keywords
            (pp_rank, pp_size, tp_rank, tp_size, dp_rank, dp_size, dcp_rank,
            layers=(start, end)), not both.
        listen: "host:port" to listen on ("127.0.0.1:0" picks a port);
            producers must, consumers may (to receive notifications).
        advertise: the "host:port" peers should dial (default: the bound one).
        bootstrap: non-head producer stages: their PP head's address.
        key: the 32-byte pre-shared key; without one only loopback peers are
            accepted unless ``insecure``.
        hub: a ``LoopbackHub`` for an in-process data plane (``transport``
            is then ignored), with ``loopback`` faults for this agent's side.
        progress_thread: False to drive the agent with ``progress()``.
        deadline_ms, grace_ms, lease_ms, unknown_wait_ms, idle_close_ms,
        connect_timeout_ms, handshake_timeout_ms, max_unauth_links,
        max_requests, cuda_device, executor: as kvr_agent_params_t.

    Regions are added before ``start()``. Close it (or use ``with``) to stop
    its thread and links; arrays from ``alloc_region`` die with it.
    """

    def __init__(self, instance_id: Id, role: Union[AgentRole, str],
                 layout: Layout, *, topology: Optional[Topology] = None,
                 pp_rank: Optional[int] = None, pp_size: Optional[int] = None,
                 tp_rank: Optional[int] = None, tp_size: Optional[int] = None,
                 dp_rank: Optional[int] = None, dp_size: Optional[int] = None,
                 dcp_rank: Optional[int] = None,
                 layers: Optional[Tuple[int, int]] = None,
                 listen: Optional[str] = None, advertise: Optional[str] = None,
                 bootstrap: Optional[str] = None, key: Optional[bytes] = None,
                 insecure: bool = False, transport: Transport = Transport.AUTO,
                 hub: Optional[LoopbackHub] = None,
                 loopback: LoopbackFaults = LoopbackFaults(),
                 executor: Executor = Executor.AUTO,
                 progress_thread: bool = True,
                 deadline_ms: Optional[int] = None,
                 grace_ms: Optional[int] = None,
                 lease_ms: Optional[int] = None,
                 unknown_wait_ms: Optional[int] = None,
                 idle_close_ms: Optional[int] = None,
                 connect_timeout_ms: Optional[int] = None,
                 handshake_timeout_ms: Optional[int] = None,
                 max_unauth_links: Optional[int] = None,
                 max_requests: Optional[int] = None,
                 cuda_device: int = -1) -> None:
        self._handle = 0
        self._calls = 0  # C calls in progress (close waits for them)
        self._cond = threading.Condition(threading.Lock())
        self._keep: List[Any] = []  # memory registered with the C side
        self.instance_id = _instance_id(instance_id)
        self.role = _role(role)
        self.cuda_device = cuda_device
        self.layout = layout
        self.topology = _topology(topology, pp_rank=pp_rank, pp_size=pp_size,
                                  tp_rank=tp_rank, tp_size=tp_size,
                                  dp_rank=dp_rank, dp_size=dp_size,
                                  dcp_rank=dcp_rank, layers=layers)
        if key is not None and len(key) != T.WIRE_KEY_BYTES:
            raise invalid(f"key of {len(key)} bytes, expected {T.WIRE_KEY_BYTES}")
        keybuf = (ctypes.c_uint8 * T.WIRE_KEY_BYTES).from_buffer_copy(key) \
            if key is not None else None
        self._hub = hub
        timers = dict(deadline_ms=deadline_ms, grace_ms=grace_ms,
                      lease_ms=lease_ms, unknown_wait_ms=unknown_wait_ms,
                      idle_close_ms=idle_close_ms,
                      connect_timeout_ms=connect_timeout_ms,
                      handshake_timeout_ms=handshake_timeout_ms,
                      max_unauth_links=max_unauth_links,
                      max_requests=max_requests)
        p = T.AgentParams(
            instance_id=self.instance_id,
            instance_id_len=len(self.instance_id), role=int(self.role),
            layout=layout.to_c(), topo=self.topology.to_c(),
            listen=_address(listen), advertise=_address(advertise),
            bootstrap=_address(bootstrap),
            key=ctypes.cast(keybuf, ctypes.POINTER(ctypes.c_uint8))
            if keybuf is not None else None,
            insecure=insecure, tl=int(transport),
            loopback_hub=hub._join(self) if hub is not None else None,
            loopback=loopback.to_c(), executor=int(executor),
            progress_thread=progress_thread, cuda_device=cuda_device,
            **{k: PARAM_DEFAULTS[k] if v is None else v
               for k, v in timers.items()})
        out, err = ctypes.c_void_p(), new_error()
        check(LIB.kvr_agent_create(ctypes.byref(p), ctypes.byref(out),
                                   ctypes.byref(err)), err)
        self._handle = out.value or 0

    # ---- lifetime ----
    @contextmanager
    def _use(self) -> Iterator[int]:
        """The C handle, counted as in use until the block ends."""
        with self._cond:
            handle = self._handle
            if not handle:
                raise invalid("the agent is closed")
            self._calls += 1
        try:
            yield handle
        finally:
            with self._cond:
                self._calls -= 1
                if self._calls == 0:
                    self._cond.notify_all()

    def close(self) -> None:
        """Stops the progress thread and every link (peers see their
        requests fail) and frees kvrelay-allocated regions. Safe from any
        thread: it waits for calls in progress elsewhere; later calls raise
        ERR_INVALID ("the agent is closed")."""
        with self._cond:
            handle, self._handle = self._handle, 0
            while self._calls:
                self._cond.wait()
        if handle:
            LIB.kvr_agent_destroy(handle)
        self._keep.clear()

    @property
    def closed(self) -> bool:
        return not self._handle

    def __del__(self) -> None:
        if getattr(self, "_cond", None) is not None:
            self.close()

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else (self.address or "not listening")
        return (f"Agent({self.instance_id!r}, {self.role.name.lower()}, "
                f"pp {self.topology.pp_rank}/{self.topology.pp_size} "
                f"tp {self.topology.tp_rank}/{self.topology.tp_size} "
                f"dcp {self.topology.dcp_rank}, {state})")

    def _call(self, what: str, fn: Callable[..., int], *args: Any) -> None:
        """Calls fn(handle, *args); a failure raises KvrelayError with the
        C detail (thread-local, so read on this thread at once)."""
        with self._use() as h:
            code = fn(h, *args)
            if code != 0:
                detail = LIB.kvr_agent_last_error(h).decode(errors="replace")
                raise KvrelayError(code, f"{what}: {detail}")

    # ---- regions (before start) ----
    def add_region(self, desc: RegionDesc, memory: BufferLike, *,
                   consumer_only: bool = False) -> None:
        """Registers engine memory for a region: a writable buffer, or
        (address, size) / RawBuffer for memory Python cannot see (device
        memory of an agent with a cuda_device must come so, e.g. a tensor's
        data_ptr()). It must hold desc.nbytes; the agent keeps a reference
        until close(). consumer_only: a layer no producer has (e.g. an MTP
        draft layer). Device allocations holding regions are best sized in
        multiples of 2 MiB (docs/agent.md, where device regions live)."""
        what = f"add_region {desc.role.name} layer {desc.layer}"
        if self.cuda_device >= 0 and not isinstance(memory, (RawBuffer, tuple)):
            raise invalid(f"{what}: an agent on CUDA device {self.cuda_device} "
                          "takes device memory as RawBuffer(address, size)")
        addr, size, keep = address_of(memory, True, what)
        need(size, desc.nbytes, what)
        c = desc.to_c()
        self._call(what, LIB.kvr_agent_add_region, ctypes.byref(c), addr,
                   _flags(consumer_only))
        with self._cond:
            self._keep.append(keep if keep is not None else memory)

    def alloc_region(self, desc: RegionDesc, *, consumer_only: bool = False
                     ) -> Union[np.ndarray, RawBuffer]:
        """Has kvrelay allocate and register a region, valid until
        close(). Returns a writable uint8 array over it, or, on an agent
        with a cuda_device, a RawBuffer with the device address (device
        memory is not for numpy). Device regions are carved from 2 GiB
        allocations (docs/agent.md, where device regions live)."""
        base, c = ctypes.c_void_p(), desc.to_c()
        self._call(f"alloc_region {desc.role.name} layer {desc.layer}",
                   LIB.kvr_agent_alloc_region, ctypes.byref(c),
                   _flags(consumer_only), ctypes.byref(base))
        if self.cuda_device >= 0:
            return RawBuffer(base.value or 0, desc.nbytes)
        return array_view(self, base.value or 0, desc.nbytes,
                          np.dtype(np.uint8), False)

    def start(self) -> "Agent":
        """Binds the listener (if any), starts joining the PP head (non-head
        producer stages) and the progress thread (if asked)."""
        self._call("start", LIB.kvr_agent_start)
        return self

    @property
    def address(self) -> str:
        """The bound (or advertised) "host:port"; "" before start or
        without a listener."""
        with self._use() as h:
            return str(LIB.kvr_agent_address(h).decode())

    @property
    def incarnation(self) -> int:
        """Random 64-bit value drawn at creation; a restarted peer has
        another."""
        with self._use() as h:
            return int(LIB.kvr_agent_incarnation(h))

    # ---- producer ----
    def send_open(self, request_id: Id, src_blocks: Any, num_tokens: int, *,
                  lease_ms: int = 0, groups: int = 1,
                  ready: bool = False) -> None:
        """The request's KV is (or will be) in this stage's src_blocks (its
        full block table) and may be pulled until the lease ends (0: the
        agent's lease_ms) by `groups` consumer groups. ready=True also calls
        send_ready for every layer. Ends in exactly one SENT, SEND_EXPIRED
        or SEND_FAILED."""
        rid = _request_id(request_id)
        src = block_table(src_blocks, "src_blocks")
        s = T.AgentSend(rid, len(rid), _u32p(src), src.size, num_tokens,
                        lease_ms, groups)
        self._call(f"send_open {rid!r}", LIB.kvr_agent_send_open,
                   ctypes.byref(s))
        if ready:
            self.send_ready(rid)

    def send_ready(self, request_id: Id, layer_begin: int = 0,
                   layer_end: int = ALL_LAYERS, cuda_event: int = 0) -> None:
        """Prefill wrote layers [layer_begin, layer_end) (default: all).
        cuda_event (agents with a cuda_device only, else ERR_UNSUPPORTED):
        a cudaEvent_t as an int (e.g. torch.cuda.Event().cuda_event): the
        layers count as ready once the work it recorded as of this call
        completed, with no host synchronisation (docs/agent.md, CUDA
        events); it may be re-recorded or dropped after the call.
        0: the KV is in place already."""
        rid = _request_id(request_id)
        self._call(f"send_ready {rid!r}", LIB.kvr_agent_send_ready, rid,
                   len(rid), layer_begin, layer_end, cuda_event or None)

    def send_abort(self, request_id: Id) -> None:
        """Stops serving the request: pulls in progress are cut and it ends
        in SEND_FAILED (ERR_CANCELED), unless its outcome was queued."""
        rid = _request_id(request_id)
        self._call(f"send_abort {rid!r}", LIB.kvr_agent_send_abort, rid,
                   len(rid))

    # ---- consumer ----
    def recv(self, producer_id: Id, producer_address: str, request_id: Id,
             dst_blocks: Any, num_tokens: int, *, num_computed_blocks: int = 0,
             deadline_ms: int = 0, stream: bool = False) -> None:
        """Loads a request from producer instance `producer_id` whose PP
        head listens at producer_address ("host:port") into dst_blocks (the
        full destination table); num_computed_blocks counts virtual blocks
        already here. Ends in exactly one LOADED or LOAD_FAILED, then
        exactly one RELEASED. With stream=True the stages serve their layers
        one ready group at a time (as send_ready covers them) and a
        LAYERS_LOADED event (layer_begin, layer_end) comes for each group
        once it is in place, every layer once, all before LOADED."""
        pid = _instance_id(producer_id, "producer id")
        rid = _request_id(request_id)
        dst = block_table(dst_blocks, "dst_blocks")
        r = T.AgentRecv(pid, len(pid), producer_address.encode(), rid,
                        len(rid), _u32p(dst), dst.size, num_tokens,
                        num_computed_blocks, deadline_ms, bool(stream))
        self._call(f"recv {rid!r} from {pid!r}", LIB.kvr_agent_recv,
                   ctypes.byref(r))

    def recv_abort(self, producer_id: Id, request_id: Id) -> None:
        """Fails the load (LOAD_FAILED, ERR_CANCELED) unless its outcome was
        queued; RELEASED follows once no source can still write."""
        pid = _instance_id(producer_id, "producer id")
        rid = _request_id(request_id)
        self._call(f"recv_abort {rid!r} from {pid!r}", LIB.kvr_agent_recv_abort,
                   pid, len(pid), rid, len(rid))

    # ---- events ----
    def poll(self) -> Optional[Event]:
        """The next queued event, or None (never waits)."""
        e = T.AgentEvent()
        with self._use() as h:
            got = LIB.kvr_agent_poll(h, ctypes.byref(e))
        return Event.from_c(e) if got else None

    def events(self, timeout: float = 0.0) -> Iterator[Event]:
        """Yields events as they come until `timeout` seconds have passed
        since the call (0: only those queued now), waiting on the event fd
        in between. Several threads may iterate at once; each event goes to
        one of them."""
        return self._stream(self.poll, timeout)

    def poll_notify(self) -> Optional[Notification]:
        """The next queued notification, or None (never waits)."""
        n = T.AgentNotify()
        with self._use() as h:
            got = LIB.kvr_agent_poll_notify(h, ctypes.byref(n))
        return Notification.from_c(n) if got else None

    def notifications(self, timeout: float = 0.0) -> Iterator[Notification]:
        """As events(), for notifications."""
        return self._stream(self.poll_notify, timeout)

    def _stream(self, poll: Callable[[], Optional[_E]],
                timeout: float) -> Iterator[_E]:
        end = time.monotonic() + timeout
        while True:
            item = poll()
            if item is not None:
                yield item
                continue
            left = end - time.monotonic()
            if left <= 0:
                return
            self._wait_fd(LIB.kvr_agent_event_fd, left)

    def _wait_fd(self, which: Callable[[int], int], seconds: float) -> bool:
        """Waits until the agent's fd is readable or `seconds` pass. It
        waits in slices of at most _WAIT_SLICE_S, holding the handle in use
        during each (so close() cannot pull the fd away) and letting close()
        from another thread in between (the next slice then raises)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            with self._use() as h:
                p = select.poll()
                p.register(which(h), select.POLLIN)
                if p.poll(max(0, int(min(left, _WAIT_SLICE_S) * 1000))):
                    return True
            if left <= _WAIT_SLICE_S:
                return False

    @property
    def event_fd(self) -> int:
        """Readable while events or notifications are queued (for the
        engine's own select/poll loop); never read or close it."""
        with self._use() as h:
            return int(LIB.kvr_agent_event_fd(h))

    # ---- notifications ----
    def notify(self, peer_id: Id, payload: bytes = b"",
               address: Optional[str] = None) -> None:
        """Sends payload (0..16 KiB) to the agent of instance peer_id at
        address (its listener), or with address None over a link this agent
        already has to that instance. NOTIFY_FAILED follows when it cannot
        be sent."""
        pid = _instance_id(peer_id, "peer id")
        data = bytes(payload)
        if len(data) > T.AGENT_NOTIFY_MAX:
            raise invalid(f"notification payload of {len(data)} bytes "
                          f"(0..{T.AGENT_NOTIFY_MAX})")
        self._call(f"notify {pid!r}", LIB.kvr_agent_notify, pid, len(pid),
                   _address(address), data, len(data))

    # ---- status ----
    def status(self, request_id: Id,
               producer_id: Optional[Id] = None) -> Optional[RequestStatus]:
        """The state of request (producer_id, request_id) (producer_id
        None: this agent's own instance, i.e. a request it serves), or None
        when the agent knows no such request (never seen, or its last event
        was polled)."""
        pid = _instance_id(producer_id, "producer id") \
            if producer_id is not None else self.instance_id
        rid = _request_id(request_id)
        out = T.AgentReqStatus()
        with self._use() as h:
            code = LIB.kvr_agent_status(h, pid, len(pid), rid, len(rid),
                                        ctypes.byref(out))
            detail = LIB.kvr_agent_last_error(h) if code else b""
        if code == int(Status.ERR_NOT_FOUND):  # type: ignore[attr-defined]
            return None
        if code != 0:
            raise KvrelayError(code, f"status {rid!r}: {detail.decode()}")
        return RequestStatus(SendState(out.send), RecvState(out.recv),
                             out.status, out.message.decode(errors="replace"))

    def wait(self, timeout: float) -> bool:
        """Waits until an event or notification is queued (True) or
        `timeout` seconds pass (False); takes none. Without a progress
        thread it runs the loop on this thread meanwhile (progress() turns),
        so the answer that completes a load is handled here. In slices of at
        most _WAIT_SLICE_S, as _wait_fd, so that close() can come between."""
        end = time.monotonic() + timeout
        while True:
            left = max(0.0, end - time.monotonic())
            us = int(min(left, _WAIT_SLICE_S) * 1e6)
            with self._use() as h:
                code = LIB.kvr_agent_wait(h, us)
                detail = LIB.kvr_agent_last_error(h) if code else b""
            if code == 0:
                return True
            if code != int(Status.ERR_TIMEOUT):  # type: ignore[attr-defined]
                raise KvrelayError(code, f"wait: {detail.decode()}")
            if left <= _WAIT_SLICE_S:
                return False

    # ---- without a progress thread ----
    def progress(self, timeout_ms: int = 0) -> None:
        """One turn of the progress loop (progress_thread=False only),
        returning within about timeout_ms."""
        self._call("progress", LIB.kvr_agent_progress, timeout_ms)

    @property
    def fd(self) -> int:
        """Readable when progress() has work (progress_thread=False)."""
        with self._use() as h:
            return int(LIB.kvr_agent_fd(h))

    def wait_work(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for fd to become readable; True
        when it is."""
        return self._wait_fd(LIB.kvr_agent_fd, timeout)


def _flags(consumer_only: bool) -> int:
    return 0x1 if consumer_only else 0  # KVR_AGENT_REGION_CONSUMER_ONLY


def _role(role: Union[AgentRole, str]) -> AgentRole:
    if isinstance(role, str):
        try:
            return AgentRole[role.upper()]
        except KeyError:
            raise invalid(f"role {role!r}: producer, consumer or both") from None
    return AgentRole(role)


def _topology(topology: Optional[Topology], *,
              layers: Optional[Tuple[int, int]], **ranks: Optional[int]
              ) -> Topology:
    given = {k: v for k, v in ranks.items() if v is not None}
    if layers is not None:
        given["layer_start"], given["layer_end"] = layers
    if topology is not None:
        if given:
            raise invalid(f"topology given twice: topology= and "
                          f"{', '.join(sorted(given))}")
        return topology
    return Topology(**given)


__all__ = ["ALL_LAYERS", "Agent", "AgentRole", "Event", "EventKind",
           "Executor", "LoopbackFaults", "LoopbackHub", "Notification",
           "RECV_OUTCOME", "RecvState", "RequestStatus", "SEND_TERMINAL",
           "SendState", "Topology", "Transport", "WireSide"]
