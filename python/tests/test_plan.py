"""Plans: numbers of the headline case, zero-copy runs, executors, the
verifier and the coverage proof; memory from numpy, bytearray, memoryview
or a raw address."""

import ctypes
import gc

import numpy as np
import pytest

import kvrelay as kv
from conftest import HEADLINE, transfer
from kvrelay import synth

MLA = kv.RegionPair.mla(HEADLINE, 0, 576, 64, 16)
INDEX = kv.RegionPair.index(HEADLINE, 1, 128, 64, 16)
REQ = kv.Request(np.arange(47), np.arange(12), 3001)


def test_headline_numbers():
    # as tests/tools/test_cli_plan.c: owned tokens x 576; 47 pages x 2 planes
    for rank in range(4):
        p = kv.plan(HEADLINE, rank, MLA, REQ)
        assert p.bytes == HEADLINE.local_len(3001, rank) * 576
        assert p.num_runs == len(p) == HEADLINE.local_len(3001, rank)
        q = kv.plan(HEADLINE, rank, INDEX, REQ)
        assert q.runs_uncoalesced == 47 * 2 and q.bytes == 47 * 64 * 132


def test_runs_are_zero_copy_views():
    p = kv.plan(HEADLINE, 1, MLA, REQ)
    runs = p.runs
    assert runs.dtype == kv.RUN_DTYPE and runs.dtype.names == ("src", "dst", "len")
    count = ctypes.c_size_t()
    address = kv._LIB.kvr_plan_runs(p._handle, ctypes.byref(count))
    assert runs.__array_interface__["data"][0] == address
    assert len(runs) == count.value and not runs.flags.writeable
    assert np.shares_memory(runs, p.runs)
    assert (runs["len"] == 576).all() and (np.diff(runs["dst"].astype(np.int64)) > 0).all()
    m = p.runs_u64
    assert m.shape == (len(runs), 3) and np.shares_memory(m, runs)
    first = runs[0].copy()
    del p
    gc.collect()
    assert runs[0] == first  # the array keeps its plan alive


def test_plan_errors_name_the_values():
    with pytest.raises(kv.KvrelayError) as e:
        kv.plan(HEADLINE, 0, MLA, kv.Request(np.arange(47), [1, 99], 3001))
    assert e.value.name == "ERR_DST_TABLE_SHORT"
    with pytest.raises(kv.KvrelayError) as e:
        kv.plan(HEADLINE, 0, MLA, kv.Request(np.arange(47), np.arange(12) + 10, 3001))
    assert e.value.name == "ERR_BLOCK_RANGE" and "16 blocks" in e.value.message
    with pytest.raises(kv.KvrelayError) as e:
        kv.plan(HEADLINE.with_(replicate_index=False), 0, INDEX, REQ)
    assert e.value.name in ("ERR_SHARDED_INDEX_INTERLEAVE", "ERR_PAGE_GEOMETRY")
    with pytest.raises(kv.KvrelayError, match="u32"):
        kv.plan(HEADLINE, 0, MLA, kv.Request([-1], [0], 1))


def test_plan_set_shares_class_plans():
    pairs = [kv.RegionPair.mla(HEADLINE, i, 576, 64, 16) for i in range(3)]
    pairs.append(INDEX)
    s = kv.PlanSet(HEADLINE, 2, pairs, REQ)
    assert s.num_classes == 2
    assert [s.class_of(i) for i in range(4)] == [s.class_of(0)] * 3 + [s.class_of(3)]
    p0 = s.plan_of(0)
    assert np.shares_memory(p0.runs, s.plan_of(1).runs)
    assert s.total_bytes == 3 * p0.bytes + s.plan_of(3).bytes
    runs = p0.runs
    del s, p0
    gc.collect()
    assert runs.size > 0 and int(runs["len"][0]) == 576


def test_digest_matches_the_cli():
    # README: kvrelay plan ... --replicate-index --region mla:576x78 --region index:128x26
    regions = [MLA.src, INDEX.src]
    assert kv.layout_digest(HEADLINE, regions) == "e521eeca1ecf7bf8"
    assert kv.layout_digest(HEADLINE.with_(replicate_index=False), regions) != "e521eeca1ecf7bf8"


@pytest.mark.parametrize("pair", [MLA, INDEX], ids=["mla", "index"])
def test_apply_verify_and_coverage(pair):
    ids = synth.token_ids(3001)
    src, dsts = transfer(HEADLINE, pair, REQ, ids)
    for rank, dst in enumerate(dsts):
        kv.verify_region(HEADLINE, rank, pair, REQ, src, dst)
    plans = [kv.plan(HEADLINE, r, pair, REQ) for r in range(4)]
    kv.check_coverage(HEADLINE, pair, REQ, plans)
    broken = [plans[0], kv.Plan.from_runs(plans[1].runs[1:]), plans[2], plans[3]]
    with pytest.raises(kv.KvrelayError) as e:
        kv.check_coverage(HEADLINE, pair, REQ, broken)
    assert e.value.name == "ERR_VERIFY"


def test_verify_names_the_wrong_token():
    ids = synth.token_ids(3001)
    src, dsts = transfer(HEADLINE, MLA, REQ, ids)
    p = kv.plan(HEADLINE, 1, MLA, REQ)
    dsts[1][int(p.runs["dst"][7]) + 3] ^= 1  # rank 1's 8th token: g = 29
    with pytest.raises(kv.KvrelayError) as e:
        kv.verify_region(HEADLINE, 1, MLA, REQ, src, dsts[1])
    assert e.value.name == "ERR_VERIFY"
    assert "token 29 wrong: latent byte 3" in e.value.message


def test_memory_kinds():
    lay = kv.Layout(block_size=16)
    pair = kv.RegionPair.mla(lay, 0, 64, 4, 4)
    req = kv.Request([2, 0], [1, 3], 20)
    src = np.zeros(pair.src.nbytes, np.uint8)
    synth.fill_source(lay, pair.src, 5, req.src_blocks, synth.token_ids(20), src)
    p = kv.plan(lay, 0, pair, req)
    raw = (ctypes.c_uint8 * pair.dst.nbytes)()
    targets = [bytearray(pair.dst.nbytes), np.zeros(pair.dst.nbytes, np.uint8),
               memoryview(bytearray(pair.dst.nbytes)),
               np.zeros((4, 16, 64), np.uint8),  # any C-contiguous shape
               kv.RawBuffer(ctypes.addressof(raw), pair.dst.nbytes),
               (ctypes.addressof(raw), pair.dst.nbytes)]
    for dst in targets:
        p.apply_host(bytes(src), dst)
        kv.verify_region(lay, 0, pair, req, memoryview(src), dst)


def test_memory_checks():
    lay = kv.Layout(block_size=16)
    pair = kv.RegionPair.mla(lay, 0, 64, 4, 4)
    req = kv.Request([2, 0], [1, 3], 20)
    p = kv.plan(lay, 0, pair, req)
    src = np.zeros(pair.src.nbytes, np.uint8)
    for bad, what in [(bytes(pair.dst.nbytes), "read-only"),
                      (bytearray(10), "bytes, the region needs"),
                      (np.zeros((64, 64), np.uint8)[:, ::2], "not C-contiguous"),
                      (object(), "has no buffer")]:
        with pytest.raises(kv.KvrelayError, match=what) as e:
            p.apply_host(src, bad)
        assert e.value.name == "ERR_INVALID"
    with pytest.raises(kv.KvrelayError, match="the region needs"):
        kv.verify_region(lay, 0, pair, req, src, bytearray(100))


def test_from_runs():
    runs = np.array([[0, 64, 64], [128, 0, 64]], dtype=np.uint64)
    p = kv.Plan.from_runs(runs)
    assert p.num_runs == 2 and p.bytes == 128
    src = np.arange(256, dtype=np.uint8)
    dst = np.zeros(128, np.uint8)
    p.apply_host(src, dst)
    assert (dst[64:] == src[:64]).all() and (dst[:64] == src[128:192]).all()
    with pytest.raises(kv.KvrelayError, match="bytes, the region needs 192"):
        p.apply_host(src[:100], dst)
    assert kv.Plan.from_runs(np.zeros((0, 3), np.int64)).num_runs == 0
