"""The connector end to end on 127.0.0.1: a producer and W consumer ranks
in this process, each driven by its own thread (ctypes releases the GIL)."""

import threading
import time
from typing import List

import numpy as np
import pytest

import kvrelay as kv
from kvrelay import conn, synth

SEED = 5


class Driver:
    """Drives one connector from its own thread and collects its events."""

    def __init__(self, c: conn.Connector) -> None:
        self.c, self.events, self.lock = c, [], threading.Lock()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            self.c.progress(10)
            for e in self.c.events():
                with self.lock:
                    self.events.append(e)

    def wait(self, kind: conn.EventKind, n: int = 1, timeout: float = 30) -> List[conn.Event]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                got = [e for e in self.events if e.kind == kind]
            if len(got) >= n:
                return got
            time.sleep(0.01)
        raise AssertionError(f"no {kind.name} in {timeout} s: {self.events}")

    def close(self) -> None:
        self.stop = True
        self.thread.join(10)
        self.c.close()


def consumer(layout, rank, regions, pool):
    topo = conn.Topology(tp_rank=rank, tp_size=layout.dcp_size, dcp_rank=rank,
                         layer_end=1)
    c = conn.Connector(conn.Side.CONSUMER, layout, topology=topo,
                       producer_stages=1, leader_blocks=pool if rank == 0 else 0)
    images = [c.alloc_region(d) for d in regions]
    for image in images:
        image[:] = 0
    return c, images


def test_offer_to_w_ranks():
    W, N = 2, 700
    lay = kv.Layout(block_size=64, dcp_size=W, replicate_index=True)
    src_regions = [kv.RegionDesc.mla(lay, 0, 576, 32),
                   kv.RegionDesc.index(lay, 0, 128, 32, consumer=False)]
    dst_regions = [kv.RegionDesc.mla(lay, 0, 576, 16),
                   kv.RegionDesc.index(lay, 0, 128, 16, consumer=True)]
    ranks = [consumer(lay, r, dst_regions, 16) for r in range(W)]
    port0 = ranks[0][0].listen()
    drivers = [Driver(ranks[0][0])]
    port1 = ranks[1][0].listen()
    ranks[1][0].connect("127.0.0.1", port0)
    drivers.append(Driver(ranks[1][0]))
    p = conn.Connector(conn.Side.PRODUCER, lay, topology=conn.Topology(layer_end=1),
                       consumer_ranks=W)
    try:
        sources = [p.alloc_region(d) for d in src_regions]
        src_blocks = np.array([(7 * i + 3) % 32 for i in range(11)], np.uint32)
        for d, image in zip(src_regions, sources):
            image[:] = 0
            synth.fill_source(lay, d, SEED, src_blocks, synth.token_ids(N), image)
        p.connect("127.0.0.1", port0)
        p.connect("127.0.0.1", port1)
        assert p.num_ready == W
        p.offer("req-w", N, src_blocks, prompt=synth.token_ids(N), transfer_id=77)
        sent = p.run_until(lambda ev: conn.count(ev, conn.EventKind.SENT) > 0, 30)
        assert sent[-1].ok and sent[-1].request_id == b"req-w"
        for rank, (d, (c, images)) in enumerate(zip(drivers, ranks)):
            e = d.wait(conn.EventKind.LOADED)[0].raise_for_status()
            assert e.num_tokens == N and e.transfer_id == 77
            req = kv.Request(e.src_blocks, e.dst_blocks, N)
            for s, t, image, source in zip(src_regions, dst_regions, images, sources):
                kv.verify_region(lay, rank, kv.RegionPair(s, t), req, source, image)
        drivers[0].wait(conn.EventKind.GROUP_DONE)
    finally:
        for d in drivers:
            d.close()
        p.close()


def test_refused_offer_fails_on_both_sides():
    # 700 tokens need 11 blocks; the leader's pool has 4: the producer gets
    # SEND_FAILED and the leader itself LOAD_FAILED, both ERR_NO_SPACE.
    lay = kv.Layout(block_size=64)
    desc = kv.RegionDesc.mla(lay, 0, 576, 16)
    c, _ = consumer(lay, 0, [desc], 4)
    port = c.listen()
    drv = Driver(c)
    p = conn.Connector(conn.Side.PRODUCER, lay, topology=conn.Topology(layer_end=1))
    try:
        p.alloc_region(desc)
        p.connect("127.0.0.1", port)
        p.offer("req-big", 700, np.arange(11, dtype=np.uint32), transfer_id=9)
        done = p.run_until(
            lambda ev: conn.count(ev, conn.EventKind.SEND_FAILED) > 0, 30)[-1]
        assert done.status_name == "ERR_NO_SPACE" and done.request_id == b"req-big"
        e = drv.wait(conn.EventKind.LOAD_FAILED)[0]
        assert (e.status_name, e.request_id, e.transfer_id, e.num_tokens) == (
            "ERR_NO_SPACE", b"req-big", 9, 700)
        assert "4-block decode pool" in e.message, e.message
        assert not [x for x in drv.events if x.kind == conn.EventKind.LOADED]
    finally:
        drv.close()
        p.close()


def test_load_into_engine_memory():
    lay = kv.Layout(block_size=16)
    src_desc = kv.RegionDesc.mla(lay, 0, 128, 8)
    dst_desc = kv.RegionDesc.mla(lay, 0, 128, 8)
    c = conn.Connector(conn.Side.CONSUMER, lay, topology=conn.Topology(layer_end=1))
    engine = np.zeros(dst_desc.nbytes, np.uint8)  # memory the engine owns
    c.add_region(dst_desc, engine)
    port = c.listen()
    drv = Driver(c)
    p = conn.Connector(conn.Side.PRODUCER, lay, topology=conn.Topology(layer_end=1))
    try:
        src = np.zeros(src_desc.nbytes, np.uint8)
        synth.fill_source(lay, src_desc, SEED, [4, 6, 1], synth.token_ids(40), src)
        p.add_region(src_desc, kv.RawBuffer(src.ctypes.data, src.nbytes))
        p.connect("127.0.0.1", port)
        drv.stop = True
        drv.thread.join()
        c.load(b"req-load", [4, 6, 1], [7, 0, 2], 40)
        drv = Driver(c)
        p.run_until(lambda ev: conn.count(ev, conn.EventKind.SENT) > 0, 30)
        e = drv.wait(conn.EventKind.LOADED)[0].raise_for_status()
        assert e.bytes == 40 * 128
        kv.verify_region(lay, 0, kv.RegionPair(src_desc, dst_desc),
                         kv.Request([4, 6, 1], [7, 0, 2], 40), src, engine)
    finally:
        drv.close()
        p.close()


def test_errors_carry_status():
    lay = kv.Layout(block_size=16)
    c = conn.Connector(conn.Side.CONSUMER, lay, topology=conn.Topology(layer_end=1))
    desc = kv.RegionDesc.mla(lay, 0, 128, 8)
    with pytest.raises(kv.KvrelayError, match="the region needs") as e:
        c.add_region(desc, bytearray(10))
    assert e.value.name == "ERR_INVALID"
    with pytest.raises(kv.KvrelayError, match="request id of 300 bytes"):
        c.load(b"x" * 300, [0], [0], 1)
    p = conn.Connector(conn.Side.PRODUCER, lay, topology=conn.Topology(layer_end=1))
    port = c.listen()
    c.close()  # nobody listens there any more
    with pytest.raises(kv.KvrelayError) as e:
        p.connect("127.0.0.1", port, timeout_ms=500)
    assert e.value.code != 0 and "connect 127.0.0.1" in e.value.message
    with pytest.raises(kv.KvrelayError, match="closed"):
        c.progress(0)
    p.close()
    with pytest.raises(kv.KvrelayError, match="key of 3 bytes"):
        conn.Connector(conn.Side.PRODUCER, lay, key=b"abc")
