"""kvrelay.Store: raw chunks put/get on disk and host tiers, stats, a
flipped byte as a miss named by store_verify, and a PP2 save through the
planner loaded into W = 2 ranks (replicated and sharded index) checked
byte-exact with verify_region; another namespace never hits; the store
connector's pairing, PP quorum and generations."""

import os

import numpy as np
import pytest

import kvrelay as kv
from kvrelay import synth

BS, CHUNK, N = 16, 32, 100


def ns_of(token_bytes=576, spec=None):
    lay = kv.Layout(block_size=BS, replicate_index=False, preshuffle=False)
    regions = [kv.RegionDesc.mla(lay, l, token_bytes, 8) for l in range(4)]
    d = kv.OffloadDesc("test", "fp8", BS, CHUNK)
    return kv.store_namespace(d, regions, spec)


def test_put_get_stats_and_corruption(tmp_path):
    key = kv.ChunkKey(ns_of(), bytes(range(32)), part=1)
    data = np.arange(50000, dtype=np.uint8)
    with kv.Store(str(tmp_path), host_bytes=1 << 20) as st:
        assert st.backend in ("io_uring+O_DIRECT", "io_uring",
                              "pread/pwrite+O_DIRECT", "pread/pwrite")
        st.put(key, data)
        assert st.contains(key)
        assert st.get(key) == data.tobytes()
        assert st.stats()["saved_bytes"] == 50000
        assert st.get(kv.ChunkKey(key.ns, bytes(32), 1)) is None
    ok, bad = kv.store_verify(str(tmp_path))
    assert (ok, bad) == (1, [])
    name = next(f for f in os.listdir(tmp_path) if f.endswith(".kvc"))
    with open(tmp_path / name, "r+b") as f:
        f.seek(30000)
        b = f.read(1)
        f.seek(30000)
        f.write(bytes([b[0] ^ 1]))
    ok, bad = kv.store_verify(str(tmp_path))
    assert ok == 0 and bad[0][0] == name
    with kv.Store(str(tmp_path), quick_scan=True) as st:  # disk only
        assert st.get(key) is None
        assert st.stats()["corrupt"] == 1


def test_namespace_separates_geometry_and_spec():
    assert ns_of() != ns_of(token_bytes=1152)
    assert ns_of() != ns_of(spec="mtp:1")
    assert len(ns_of()) == 16


def producer(lay, layers, tokens, seed=7):
    regions = []
    nsrc = lay.num_src_blocks(N)
    src_blocks = np.arange(nsrc, dtype=np.uint32)[::-1].copy()
    for l in layers:
        d = kv.RegionDesc.mla(lay, l, 576, nsrc)
        buf = np.zeros(d.nbytes, np.uint8)
        synth.fill_source(lay, d, seed, src_blocks, tokens, buf)
        regions.append((d, buf))
    return regions, src_blocks


@pytest.mark.parametrize("repl", [True, False])
def test_save_pp2_load_w2(tmp_path, repl):
    tokens = np.arange(3000, 3000 + N, dtype=np.uint32)
    chains = kv.store_chains(tokens, CHUNK)
    assert len(chains) == N // CHUNK
    ns = ns_of()
    play = kv.Layout(block_size=BS, preshuffle=False)
    clay = kv.Layout(block_size=BS, dcp_size=2, tp=2, replicate_index=repl,
                     preshuffle=False)
    stages = [producer(play, [0, 1], tokens), producer(play, [2, 3], tokens)]
    with kv.Store(str(tmp_path)) as st:
        for part, (regions, src) in enumerate(stages):
            assert st.save(ns, part, BS, CHUNK, chains, play, regions, src) \
                == len(chains)
        ndst = clay.num_dst_blocks(N)
        for rank in range(2):
            dst = np.arange(ndst, dtype=np.uint32)
            for part, (regions, src) in enumerate(stages):
                mine = [(kv.RegionDesc.mla(clay, d.layer, 576, ndst),
                         np.zeros(kv.RegionDesc.mla(clay, d.layer, 576,
                                                    ndst).nbytes, np.uint8))
                        for d, _ in regions]
                got = st.load(ns, part, BS, CHUNK, chains, clay, rank, mine,
                              dst)
                assert got == len(chains) * CHUNK
                req = kv.Request(src, dst, got)
                for (sd, sb), (dd, db) in zip(regions, mine):
                    kv.verify_region(clay, rank, kv.RegionPair(sd, dd), req,
                                     sb, db)
                assert st.load(ns_of(spec="x"), part, BS, CHUNK, chains, clay,
                               rank, mine, dst) == 0


def wait_events(conn, n, timeout=10.0):
    import select
    import time
    got, end = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        select.select([conn], [], [], 0.05)
        got += conn.poll()
    assert len(got) >= n, got
    return got


def test_connector_generations_and_quorum(tmp_path):
    tokens = np.arange(3000, 3000 + N, dtype=np.uint32)
    chains = kv.store_chains(tokens, CHUNK)
    ns = ns_of()
    play = kv.Layout(block_size=BS, preshuffle=False)
    regions, src = producer(play, [0, 1], tokens)
    with kv.Store(str(tmp_path)) as st:
        with kv.StoreConnector(st, ns, BS, CHUNK, play, [2, 4],
                               regions) as conn:
            conn.save("r", 0, chains, src)
            conn.send_done("r")
            ev = wait_events(conn, 2)  # the local save and the send: free
            assert [(e.kind, e.part, e.status) for e in ev] == \
                [("PART_SAVED", 0, 0), ("RELEASE", 0, 0)]
            # part 1 belongs to another process: generation 1's report
            # does not complete generation 0, generation 0's does
            conn.part_saved("r", 1, 1)
            assert conn.poll() == []
            conn.part_saved("r", 0, 1)
            ev = wait_events(conn, 1)
            assert [(e.kind, e.generation) for e in ev] == [("SAVED", 0)]
            with pytest.raises(kv.KvrelayError) as e:
                conn.save("r", 0, chains, src)  # released: refused
            conn.save("q", 3, chains, src)
            with pytest.raises(kv.KvrelayError) as e:
                conn.save("q", 2, chains, src)
            assert e.value.name == "ERR_CANCELED"
            assert "superseded by generation 3" in str(e.value)
        clay = kv.Layout(block_size=BS, dcp_size=2, tp=2, preshuffle=False)
        ndst = clay.num_dst_blocks(N)
        mine = [(kv.RegionDesc.mla(clay, l, 576, ndst),
                 np.zeros(kv.RegionDesc.mla(clay, l, 576, ndst).nbytes,
                          np.uint8)) for l in range(2)]
        dst = np.arange(ndst, dtype=np.uint32)
        with kv.StoreConnector(st, ns, BS, CHUNK, clay, [2], mine) as conn:
            tokens_loaded, nbytes = conn.load("r", 2, chains, dst)
            assert tokens_loaded == len(chains) * CHUNK and nbytes > 0
            with pytest.raises(kv.KvrelayError) as e:
                conn.load("r", 1, chains, dst)
            assert e.value.name == "ERR_CANCELED"
            conn.forget("r")
            assert conn.load("r", 1, chains, dst)[0] == tokens_loaded
