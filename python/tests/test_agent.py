"""kvrelay.Agent in one process: a prefill instance of two PP stages feeds a
decode group of two DCP ranks over the loopback data plane (control links
on 127.0.0.1), bytes verified against the synthetic sources; one set of
agents driven from four Python threads at once; errors, notifications,
close() from another thread and the no-thread mode."""

import random
import select
import socket
import threading
import time
from typing import Dict, List

import numpy as np
import pytest

import kvrelay as kv
from kvrelay import synth
from kvrelay.agent import (Agent, AgentRole, EventKind, LoopbackHub,
                           RecvState, SendState, WireSide)

WAIT = 30.0  # seconds: generous, for a loaded 2-core machine
LEASE = 60.0  # the producer agents' lease (their default lease_ms)
PREFILL, DECODE = "prefill-a", "decode"
# bs 16, W 2 (consumer TP 2), producer TP 1, replicated preshuffled index
LAY = kv.Layout(block_size=16, dcp_size=2, tp=2, producer_tp=1,
                replicate_index=True, preshuffle=True)
LAYERS, TOKEN_BYTES, INDEX_DIM = 4, 96, 64
SRC_POOL, DST_POOL = 256, 160
SRC_SLOT, DST_SLOT = SRC_POOL // 8, DST_POOL // 10  # blocks per request slot


def regions(layers, consumer: bool) -> List[kv.RegionDesc]:
    """MLA on every layer, INDEX on the even ones."""
    pool = DST_POOL if consumer else SRC_POOL
    out = []
    for layer in layers:
        out.append(kv.RegionDesc.mla(LAY, layer, TOKEN_BYTES, pool))
        if layer % 2 == 0:
            out.append(kv.RegionDesc.index(LAY, layer, INDEX_DIM, pool, consumer))
    return out


class Req:
    """A request in slot `slot`: its blocks are disjoint from other slots'
    and permuted so runs do not coalesce."""

    def __init__(self, rid: str, slot: int, tokens: int, seq: int) -> None:
        self.id, self.tokens, self.seq = rid, tokens, seq
        nsrc, ndst = LAY.num_src_blocks(tokens), LAY.num_dst_blocks(tokens)
        assert nsrc <= SRC_SLOT and ndst <= DST_SLOT
        s0, d0 = (slot % 8) * SRC_SLOT, (slot % 10) * DST_SLOT
        self.src = np.array([s0 + nsrc - 1 - k for k in range(nsrc)], np.uint32)
        self.dst = np.array([d0 + (ndst - 1 - k // 2 if k % 2 else k // 2)
                             for k in range(ndst)], np.uint32)


class World:
    """One prefill instance (PP 2) and one decode group (DCP 2) on a
    loopback hub. Producers use kvrelay-allocated regions; consumers use
    engine memory (numpy) plus a consumer-only MLA layer."""

    def __init__(self) -> None:
        self.hub = LoopbackHub()
        self.stages: List[Agent] = []
        self.src: List[List] = []  # per stage: [(desc, array)]
        for s in range(2):
            a = Agent(PREFILL, "producer", LAY, pp_rank=s, pp_size=2,
                      layers=(2 * s, 2 * s + 2), listen="127.0.0.1:0",
                      bootstrap=self.stages[0].address if s else None,
                      hub=self.hub, deadline_ms=20000, grace_ms=2000)
            mem = [(d, a.alloc_region(d)) for d in regions(range(2 * s, 2 * s + 2), False)]
            for _, arr in mem:
                arr[:] = 0
            self.stages.append(a.start())
            self.src.append(mem)
        self.ranks: List[Agent] = []
        self.dst: List[List] = []
        for r in range(2):
            a = Agent(DECODE, AgentRole.CONSUMER, LAY, tp_rank=r, tp_size=2,
                      dcp_rank=r, layers=(0, LAYERS), hub=self.hub,
                      deadline_ms=20000, grace_ms=2000)
            mem = []
            for d in regions(range(LAYERS), True):
                arr = np.zeros(d.nbytes, np.uint8)  # engine memory
                a.add_region(d, arr)
                mem.append((d, arr))
            draft = kv.RegionDesc.mla(LAY, LAYERS, TOKEN_BYTES, DST_POOL)
            a.alloc_region(draft, consumer_only=True)
            self.ranks.append(a.start())
            self.dst.append(mem)
        self.agents = self.stages + self.ranks
        self.log: Dict[int, list] = {i: [] for i in range(len(self.agents))}
        self.lock = threading.Lock()

    @property
    def head(self) -> str:
        return self.stages[0].address

    def close(self) -> None:
        self.hub.close()  # closes the agents first
        assert all(a.closed for a in self.agents)

    # ---- requests ----
    def fill(self, r: Req) -> None:
        ids = np.arange(r.tokens, dtype=np.uint32) + r.seq * 100000
        for mem in self.src:
            for d, arr in mem:
                synth.fill_source(LAY, d, 1234 + r.seq, r.src, ids, arr)

    def open(self, r: Req) -> None:
        for a in self.stages:
            a.send_open(r.id, r.src, r.tokens, ready=True)

    def recv(self, r: Req) -> None:
        for a in self.ranks:
            a.recv(PREFILL, self.head, r.id, r.dst, r.tokens)

    def verify(self, r: Req, rank: int) -> None:
        req = kv.Request(r.src, r.dst, r.tokens)
        checked = 0
        for d, dst in self.dst[rank]:
            for mem in self.src:
                for s, src in mem:
                    if (s.role, s.layer) == (d.role, d.layer):
                        kv.verify_region(LAY, rank, kv.RegionPair(s, d), req,
                                         src, dst)
                        checked += 1
        assert checked == len(self.dst[rank])

    # ---- events ----
    def pump(self, wait_s: float = 0.005) -> None:
        """Moves every queued event into the log (tagged by agent), then
        waits up to wait_s for any agent's event fd."""
        # polled and logged under one lock: otherwise a thread could log a
        # RELEASED while another still holds the LOADED it polled first
        for i, a in enumerate(self.agents):
            with self.lock:
                for e in a.events():
                    self.log[i].append(e)
        p = select.poll()
        for a in self.agents:
            p.register(a.event_fd, select.POLLIN)
        p.poll(int(wait_s * 1000))

    def count(self, agent: int, rid: str, *kinds: EventKind) -> int:
        with self.lock:
            return sum(1 for e in self.log[agent]
                       if e.request == rid.encode() and e.kind in kinds)

    def finals(self, rid: str) -> int:
        """Final events so far: one per stage, one RELEASED per rank."""
        return sum(self.count(i, rid, EventKind.SENT, EventKind.SEND_EXPIRED,
                              EventKind.SEND_FAILED) for i in (0, 1)) + \
            sum(self.count(i, rid, EventKind.RELEASED) for i in (2, 3))

    def wait_finals(self, rid: str) -> None:
        # a consumer rank that aborted before its pull left the stages
        # nothing to answer: they end at the lease (the agents' default,
        # 60 s), which a loaded machine can reach
        end = time.monotonic() + LEASE + WAIT
        while self.finals(rid) < 4 and time.monotonic() < end:
            self.pump()
        assert self.finals(rid) == 4, (rid, self.log)


@pytest.fixture
def world():
    w = World()
    yield w
    w.close()


def test_two_stages_into_two_ranks(world):
    reqs = [Req(f"req-{i}", i, tokens, i)
            for i, tokens in enumerate((40, 300, 512))]
    for i, r in enumerate(reqs):
        world.fill(r)
        if i == 1:  # the pulls arrive before send_open: held, then served
            world.recv(r)
            world.open(r)
        else:
            world.open(r)
            world.recv(r)
    for r in reqs:
        world.wait_finals(r.id)
        for i in (0, 1):
            sent = [e for e in world.log[i] if e.request == r.id.encode()]
            assert [e.kind for e in sent] == [EventKind.SENT]
            assert sent[0].ok and sent[0].producer == PREFILL.encode()
            assert sent[0].final
        for rank in (0, 1):
            got = [e for e in world.log[2 + rank] if e.request == r.id.encode()]
            assert [e.kind for e in got] == [EventKind.LOADED, EventKind.RELEASED]
            loaded = got[0].raise_for_status()
            assert loaded.producer == PREFILL.encode() and loaded.bytes > 0
            assert got[1].ok and got[1].final and not loaded.final
            world.verify(r, rank)
            # the key is free once its last event was polled
            assert world.ranks[rank].status(r.id, PREFILL) is None
        assert world.stages[0].status(r.id) is None


def test_status_while_live(world):
    r = Req("req-live", 0, 100, 7)
    world.fill(r)
    world.ranks[0].recv(PREFILL, world.head, r.id, r.dst, r.tokens)
    st = world.ranks[0].status(r.id, PREFILL)
    assert st is not None and st.recv in (RecvState.QUEUED, RecvState.DIALING,
                                          RecvState.PULLING)
    assert st.send == SendState.NONE
    world.ranks[0].recv_abort(PREFILL, r.id)
    end = time.monotonic() + WAIT
    while world.count(2, r.id, EventKind.RELEASED) == 0 and time.monotonic() < end:
        world.pump()
    failed = [e for e in world.log[2] if e.kind == EventKind.LOAD_FAILED]
    assert len(failed) == 1 and failed[0].status_name == "ERR_CANCELED", world.log[2]
    assert world.count(2, r.id, EventKind.RELEASED) == 1
    with pytest.raises(kv.KvrelayError) as e:
        failed[0].raise_for_status()
    assert e.value.name == "ERR_CANCELED"


def test_stream_layer_by_layer(world):
    """recv(stream=True): each layer made ready alone lands alone, its
    bytes in place when its LAYERS_LOADED comes, the layers not yet ready
    untouched; LOADED after the last."""
    r = Req("req-stream", 3, 300, 9)
    world.fill(r)
    for a in world.stages:
        a.send_open(r.id, r.src, r.tokens)
    for a in world.ranks:
        a.recv(PREFILL, world.head, r.id, r.dst, r.tokens, stream=True)

    def landed(rank: int, layer: int) -> bool:
        return any(e.kind == EventKind.LAYERS_LOADED and
                   e.layer_begin <= layer < e.layer_end
                   for e in world.log[2 + rank] if e.request == r.id.encode())

    for layer in (2, 0, 3, 1):  # the two stages in turn
        world.stages[layer // 2].send_ready(r.id, layer, layer + 1)
        end = time.monotonic() + WAIT
        while not all(landed(k, layer) for k in (0, 1)) and \
                time.monotonic() < end:
            world.pump()
        for rank in (0, 1):
            got = [e for e in world.log[2 + rank]
                   if e.request == r.id.encode() and
                   e.kind == EventKind.LAYERS_LOADED and e.layer_begin == layer]
            assert len(got) == 1 and got[0].layer_end == layer + 1, world.log
            assert got[0].ok and got[0].bytes > 0
            for d, arr in world.dst[rank]:
                if not landed(rank, d.layer):
                    assert not arr.any(), (rank, d.layer)
    world.wait_finals(r.id)
    for rank in (0, 1):
        kinds = [e.kind for e in world.log[2 + rank]
                 if e.request == r.id.encode()]
        assert kinds == [EventKind.LAYERS_LOADED] * 4 + [EventKind.LOADED,
                                                       EventKind.RELEASED]
        world.verify(r, rank)


THREADS, PER_THREAD = 4, 5


def late_abort(abort, *key) -> None:
    """An abort that may come after the request ended and another thread
    polled its last event: then the key is gone (ERR_NOT_FOUND)."""
    try:
        abort(*key)
    except kv.KvrelayError as e:
        if e.name != "ERR_NOT_FOUND":
            raise


def test_one_agent_from_four_threads(world):
    """Four threads share the agents: each opens, receives, sometimes
    aborts (consumer rank 0 mid-pull, or the producer), asks status and
    polls every agent, and every request ends in exactly one terminal event
    per stage and exactly one outcome plus one RELEASED per rank."""
    outcomes: Dict[str, str] = {}
    errors: List[BaseException] = []

    def run_one(t: int, k: int, rng: random.Random) -> None:
        r = Req(f"t{t}-r{k}", t, 64 + rng.randrange(400), 10 * t + k)
        world.fill(r)
        mode = ("plain", "recv_abort", "send_abort")[rng.randrange(3)]
        if rng.randrange(2):
            world.open(r)
            world.recv(r)
        else:
            world.recv(r)
            world.open(r)
        if mode == "recv_abort":
            # once rank 0 pulls: a rank that never pulled would leave the
            # producer to its lease
            end = time.monotonic() + WAIT
            while time.monotonic() < end:
                st = world.ranks[0].status(r.id, PREFILL)
                if st is None or st.recv >= RecvState.PULLING:
                    break
                world.pump()
            late_abort(world.ranks[0].recv_abort, PREFILL, r.id)
        elif mode == "send_abort":
            for a in world.stages:
                late_abort(a.send_abort, r.id)
        world.ranks[1].status(r.id, PREFILL)  # any thread may ask
        world.wait_finals(r.id)
        for i in (0, 1):
            assert world.count(i, r.id, EventKind.SENT, EventKind.SEND_EXPIRED,
                               EventKind.SEND_FAILED) == 1
        for rank in (0, 1):
            ok = world.count(2 + rank, r.id, EventKind.LOADED)
            bad = world.count(2 + rank, r.id, EventKind.LOAD_FAILED)
            assert ok + bad == 1, (r.id, rank, world.log[2 + rank])
            assert world.count(2 + rank, r.id, EventKind.RELEASED) == 1
            if ok:
                world.verify(r, rank)
            if mode != "send_abort" and rank == 1:
                assert ok == 1, (r.id, world.log[3])
        if mode == "plain":
            assert world.count(0, r.id, EventKind.SENT) == 1
            assert world.count(2, r.id, EventKind.LOADED) == 1
        with world.lock:
            outcomes[r.id] = mode

    def worker(t: int) -> None:
        rng = random.Random(77 + t)
        try:
            for k in range(PER_THREAD):
                run_one(t, k, rng)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(THREADS * PER_THREAD * (LEASE + WAIT))
    if errors:
        raise errors[0]
    assert len(outcomes) == THREADS * PER_THREAD
    # nothing more arrived for any request after it ended
    for i, events in world.log.items():
        for e in events:
            assert e.request.decode() in outcomes, e


def test_bad_calls_raise_with_the_reason(world):
    stage, rank = world.stages[0], world.ranks[0]
    with pytest.raises(kv.KvrelayError) as e:
        Agent("x" * 65, "producer", LAY, listen="127.0.0.1:0")
    assert e.value.name == "ERR_INVALID" and "65 bytes" in e.value.message
    with pytest.raises(kv.KvrelayError) as e:
        Agent("p", "sideways", LAY)
    assert "sideways" in e.value.message
    with pytest.raises(kv.KvrelayError) as e:
        Agent("p", "consumer", LAY, topology=kv.Topology(layer_end=1), pp_rank=0)
    assert "topology given twice" in e.value.message
    with pytest.raises(kv.KvrelayError) as e:
        Agent("p", "producer", LAY, layers=(0, 1))  # producers must listen
    assert e.value.name == "ERR_INVALID" and "listen" in e.value.message
    with pytest.raises(kv.KvrelayError) as e:
        rank.send_open("r", [1], 16)
    assert e.value.name == "ERR_INVALID" and "not a producer" in e.value.message
    stage.send_open("dup", [1], 16)
    with pytest.raises(kv.KvrelayError) as e:
        stage.send_open("dup", [1], 16)
    assert e.value.name == "ERR_EXISTS" and "dup" in e.value.message
    stage.send_abort("dup")
    with pytest.raises(kv.KvrelayError) as e:
        stage.send_ready("dup", cuda_event=0x1234)
    assert e.value.name == "ERR_UNSUPPORTED"
    with pytest.raises(kv.KvrelayError) as e:
        stage.send_ready("dup", 3, 3)
    assert "[3, 3)" in e.value.message
    with pytest.raises(kv.KvrelayError) as e:
        rank.recv(PREFILL, world.head, "", [0], 16)
    assert "request id of 0 bytes" in e.value.message
    with pytest.raises(kv.KvrelayError) as e:
        rank.notify("peer", bytes(kv.agent.T.AGENT_NOTIFY_MAX + 1))
    assert "16385 bytes" in e.value.message


def test_unreachable_producer_fails_with_its_address(world):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()  # nobody listens there: connection refused
    r = Req("req-nowhere", 1, 64, 1)
    world.ranks[1].recv("prefill-b", address, r.id, r.dst, r.tokens,
                        deadline_ms=10000)
    end = time.monotonic() + WAIT
    while world.count(3, r.id, EventKind.RELEASED) == 0 and time.monotonic() < end:
        world.pump()
    failed = [e for e in world.log[3] if e.kind == EventKind.LOAD_FAILED]
    assert len(failed) == 1 and address in failed[0].message, world.log[3]
    assert failed[0].producer == b"prefill-b"
    assert world.count(3, r.id, EventKind.RELEASED) == 1


def test_notify_and_answer(world):
    rank, head = world.ranks[1], world.stages[0]
    rank.notify(PREFILL, b"hello \x00 head", address=world.head)
    got = next(head.notifications(WAIT))
    assert got.payload == b"hello \x00 head" and got.sender == DECODE.encode()
    assert got.sender_side == WireSide.CONSUMER
    assert got.sender_topology.dcp_rank == 1 and got.dropped == 0
    head.notify(got.sender, b"ack")  # over the link it already has
    back = next(rank.notifications(WAIT))
    assert back.payload == b"ack" and back.sender == PREFILL.encode()
    assert back.sender_address == world.head
    head.notify("nobody", b"x")  # no link to that instance, no address
    failed = next(e for e in head.events(WAIT)
                  if e.kind == EventKind.NOTIFY_FAILED)
    assert failed.peer == b"nobody" and failed.status_name == "ERR_NOT_FOUND"


def test_close_from_another_thread_ends_a_waiting_reader():
    hub = LoopbackHub()
    a = Agent("c", "consumer", LAY, tp_size=2, layers=(0, 1), hub=hub).start()
    seen: List[BaseException] = []

    def reader() -> None:
        try:
            for _ in a.events(WAIT):
                pass
        except kv.KvrelayError as e:
            seen.append(e)

    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.2)  # let it wait on the event fd
    a.close()
    th.join(WAIT)
    assert not th.is_alive()
    assert len(seen) == 1 and "closed" in str(seen[0])
    with pytest.raises(kv.KvrelayError) as e:
        a.poll()
    assert "closed" in e.value.message
    a.close()  # twice is fine
    hub.close()


def _started_pair(hub, n: int, producer_thread: bool):
    """Producer "p<n>" (its progress thread as asked) and consumer "d<n>"
    (none), one MLA layer each, started: (lay, desc, p, src, c, dst)."""
    lay = kv.Layout(block_size=16, dcp_size=1)
    desc = kv.RegionDesc.mla(lay, 0, 64, 32)
    p = Agent(f"p{n}", "producer", lay, layers=(0, 1), listen="127.0.0.1:0",
              hub=hub, progress_thread=producer_thread)
    src = p.alloc_region(desc)
    p.start()
    c = Agent(f"d{n}", "consumer", lay, layers=(0, 1), hub=hub,
              progress_thread=False)
    dst = c.alloc_region(desc)
    dst[:] = 0
    c.start()
    return lay, desc, p, src, c, dst


def test_wait_drives_a_consumer_without_thread():
    """wait() alone drives a consumer without a progress thread through a
    load (the producer has its thread); it returns with the events still
    queued, and False when none comes."""
    with LoopbackHub() as hub:
        lay, desc, p, src, c, dst = _started_pair(hub, 2, True)
        assert c.wait(0.005) is False
        blocks, tokens = [4, 1], 20
        synth.fill_source(lay, desc, 9, blocks, synth.token_ids(tokens), src)
        p.send_open("w", blocks, tokens, ready=True)
        c.recv("p2", p.address, "w", [2, 6], tokens)
        got: List = []
        end = time.monotonic() + WAIT
        while len(got) < 2 and time.monotonic() < end:
            if c.wait(0.05):
                assert c.wait(0) is True  # still queued
                got.extend(c.events())
        assert [e.kind.name for e in got] == ["LOADED", "RELEASED"]
        kv.verify_region(lay, 0, kv.RegionPair(desc, desc),
                         kv.Request(blocks, [2, 6], tokens), src, dst)
        c.close()
        p.close()


def test_without_progress_threads():
    """Both agents driven by progress() from this thread; a progress()
    call on an agent with its own thread is refused."""
    with LoopbackHub() as hub:
        lay, desc, p, src, c, dst = _started_pair(hub, 1, False)
        blocks, tokens = [5, 2, 9], 40
        synth.fill_source(lay, desc, 9, blocks, synth.token_ids(tokens), src)
        p.send_open("one", blocks, tokens, ready=True)
        c.recv("p1", p.address, "one", [3, 0, 7], tokens)
        got: List = []
        end = time.monotonic() + WAIT
        while len(got) < 3 and time.monotonic() < end:
            for a in (p, c):
                a.wait_work(0.01)
                a.progress(0)
                got.extend(a.events())
        assert sorted(e.kind.name for e in got) == ["LOADED", "RELEASED", "SENT"]
        kv.verify_region(lay, 0, kv.RegionPair(desc, desc),
                         kv.Request(blocks, [3, 0, 7], tokens), src, dst)
        t = Agent("t1", "consumer", lay, layers=(0, 1), hub=hub).start()
        with pytest.raises(kv.KvrelayError) as e:
            t.progress(0)
        assert e.value.name == "ERR_INVALID"
