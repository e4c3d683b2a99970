"""Pair plans (docs/design.md §18) from Python: a sharded producer into a
DCP consumer, a dense TP head reshard, their sources, the pair verifier and
coverage proof, equality with today's plans, and the side-aware digest."""

import numpy as np
import pytest

import kvrelay as kv


def _tables(layout, n, seed):
    rng = np.random.default_rng(seed)
    vp = (layout.producer_block_size or layout.block_size) * layout.producer_dcp
    src = rng.permutation(2 * (-(-n // vp)) + 2)[: -(-n // vp)]
    dst = rng.permutation(2 * layout.num_dst_blocks(n) + 2)[: layout.num_dst_blocks(n)]
    return src, dst


def _all_pairs(layout, pair, request):
    axis = pair.src.axis
    np_, nc = layout.axis_ranks(axis, False), layout.axis_ranks(axis, True)
    return [[kv.plan_pair(layout, p, c, pair, request) for c in range(nc)]
            for p in range(np_)]


def _execute(layout, pair, request, plans, seed=7):
    rng = np.random.default_rng(seed)
    srcs = [rng.integers(0, 256, pair.src.nbytes, dtype=np.uint8)
            for _ in plans]
    for c in range(len(plans[0])):
        dst = np.zeros(pair.dst.nbytes, np.uint8)
        for p, row in enumerate(plans):
            row[c].apply_host(srcs[p], dst)
        for p in range(len(plans)):
            kv.verify_region_pair(layout, p, c, pair, request, srcs[p], dst)
        if any(row[c].bytes for row in plans):  # a wrong byte is named
            p = next(p for p, row in enumerate(plans) if row[c].bytes)
            dst[int(plans[p][c].runs["dst"][0])] ^= 0xFF
            with pytest.raises(kv.KvrelayError) as e:
                kv.verify_region_pair(layout, p, c, pair, request, srcs[p], dst)
            assert e.value.name == "ERR_VERIFY"


@pytest.mark.parametrize("wp,w,i", [(2, 4, 1), (4, 2, 1), (2, 4, 16), (4, 2, 16)])
def test_sharded_producer_mla(wp, w, i):
    lay = kv.Layout(block_size=16, dcp_size=w, interleave=i, producer_dcp=wp,
                    producer_interleave=i, producer_tp=wp)
    n = 16 * 8 * 3 + 5
    src, dst = _tables(lay, n, wp * 10 + w)
    pair = kv.RegionPair.mla(lay, 0, 64, int(src.max()) + 1, int(dst.max()) + 1)
    req = kv.Request(src, dst, n)
    plans = _all_pairs(lay, pair, req)
    kv.check_coverage_pair(lay, pair, [req] * wp, plans)
    assert sum(pl.bytes for row in plans for pl in row) == n * 64
    for c in range(w):
        has = [p for p in range(wp) if plans[p][c].bytes]
        assert kv.sources(lay, pair, c, req) == has
    _execute(lay, pair, req, plans)


@pytest.mark.parametrize("tpp,tpc,heads", [(4, 2, 8), (2, 8, 8), (4, 2, 2), (2, 8, 2)])
@pytest.mark.parametrize("hnd", [False, True])
def test_dense_head_reshard(tpp, tpc, heads, hnd):
    lay = kv.Layout(block_size=16, producer_tp=tpp, tp=tpc)
    n = 16 * 4 + 3
    src, dst = _tables(lay, n, tpp + tpc + heads)
    pair = kv.RegionPair.dense(lay, 3, heads, 8, 2, int(src.max()) + 1,
                               int(dst.max()) + 1, hnd=hnd)
    assert pair.src.axis == kv.Axis.TP
    req = kv.Request(src, dst, n)
    plans = _all_pairs(lay, pair, req)
    kv.check_coverage_pair(lay, pair, [req] * tpp, plans)
    local = max(1, heads // tpc)
    for c in range(tpc):
        assert sum(row[c].bytes for row in plans) == n * local * 8 * 2 * 2
        assert kv.sources(lay, pair, c) == \
            [p for p in range(tpp) if plans[p][c].bytes]
    _execute(lay, pair, req, plans)


def test_equals_todays_plan():
    lay = kv.Layout(block_size=64, dcp_size=4, replicate_index=True)
    req = kv.Request(np.arange(47), np.arange(12), 3001)
    for pair in (kv.RegionPair.mla(lay, 0, 576, 64, 16),
                 kv.RegionPair.index(lay, 1, 128, 64, 16)):
        for r in range(4):
            a, b = kv.plan(lay, r, pair, req), kv.plan_pair(lay, 0, r, pair, req)
            assert np.array_equal(a.runs, b.runs) and a.bytes == b.bytes


def test_refusals_and_sets():
    lay = kv.Layout(block_size=16, dcp_size=4, producer_dcp=2, producer_tp=2,
                    replicate_index=True)
    pair = kv.RegionPair.mla(lay, 0, 64, 64, 64)
    req = kv.Request(np.arange(40), np.arange(16), 600)
    with pytest.raises(kv.KvrelayError) as e:
        kv.plan(lay, 0, pair, req)
    assert e.value.name == "ERR_PAIR_REQUIRED"
    idx = kv.RegionPair.index(lay, 1, 128, 64, 64)
    with pytest.raises(kv.KvrelayError) as e:
        kv.plan_pair(lay, 0, 0, idx, req)
    assert e.value.name == "ERR_PRODUCER_INDEX_INTERLEAVE"
    s = kv.PlanSet(lay, 1, [pair, pair], req, producer_rank=1)
    assert s.num_classes == 1
    assert np.array_equal(s.plan_of(1).runs, kv.plan_pair(lay, 1, 1, pair, req).runs)


def test_digest_both_sides():
    lay = kv.Layout(block_size=64, dcp_size=4, producer_block_size=32)
    prod = kv.RegionDesc.mla(lay, 0, 576, 10, consumer=False)
    cons = kv.RegionDesc.mla(lay, 0, 576, 10)
    assert prod.page_bytes == 32 * 576
    assert kv.layout_digest(lay, [prod], consumer=False) == \
        kv.layout_digest(lay, [cons])
    assert kv.layout_digest(lay, [cons]) != \
        kv.layout_digest(lay.with_(producer_block_size=None), [cons])
