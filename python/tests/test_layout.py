"""Layouts, regions and the DCP math through the C library."""

import pytest

import kvrelay as kv
from kvrelay.layout import index_scale_offset, role_name


@pytest.mark.parametrize("kwargs,code", [
    (dict(interleave=0), "ERR_INTERLEAVE_LT1"),
    (dict(interleave=128), "ERR_INTERLEAVE_GT_BS"),
    (dict(interleave=3), "ERR_INTERLEAVE_NOT_DIVISOR"),
    (dict(dcp_size=0), "ERR_DCP_LT1"),
    (dict(dcp_size=4, tp=6), "ERR_TP_NOT_DIVISIBLE"),
    (dict(block_size=0), "ERR_BLOCK_SIZE"),
])
def test_layout_checks(kwargs, code):
    with pytest.raises(kv.KvrelayError) as e:
        kv.Layout(**kwargs).check()
    assert e.value.name == code


def test_rank_check_and_tp_default():
    lay = kv.Layout(dcp_size=4)
    assert lay.to_c().tp == 4
    assert lay.check(rank=3) is lay
    with pytest.raises(kv.KvrelayError, match="DCP rank 4 out of range"):
        lay.check(rank=4)


@pytest.mark.parametrize("bs,W,I", [(16, 4, 1), (64, 4, 1), (16, 3, 4),
                                    (64, 8, 16), (16, 1, 16)])
def test_geometry_matches_design(bs, W, I):
    lay = kv.Layout(block_size=bs, dcp_size=W, interleave=I)
    assert lay.virtual_block == bs * W
    lens = [0] * W
    for g in range(3 * bs * W + 5):
        r = lay.owner(g)
        assert r == (g // I) % W
        j = lay.local_index(g)
        assert j == (g // (I * W)) * I + g % I
        assert lay.global_index(j, r) == g
        lens[r] += 1
        n = g + 1
        assert [lay.local_len(n, q) for q in range(W)] == lens
    assert lay.num_dst_blocks(bs * W + 1) == 2
    assert lay.num_src_blocks(bs + 1) == 2


def test_index_geometry():
    assert kv.index_stride(128) == 144 and kv.index_stride(64) == 80
    lay = kv.Layout(block_size=64, dcp_size=4, replicate_index=True)
    assert lay.index_page_tokens(consumer=True) == 256
    assert lay.index_page_tokens(consumer=False) == 64
    # preshuffled: (t/16)*16D + (d/16)*256 + (t%16)*16 + d%16
    assert lay.index_key_offset(128, 17, 33) == 1 * 2048 + 2 * 256 + 16 + 1
    assert lay.with_(preshuffle=False).index_key_offset(128, 17, 33) == 17 * 128 + 33
    assert index_scale_offset(256, 128, 5) == 256 * 128 + 20
    src = kv.RegionDesc.index(lay, 1, 128, 10, consumer=False)
    dst = kv.RegionDesc.index(lay, 1, 128, 10, consumer=True)
    assert (src.page_bytes, dst.page_bytes) == (64 * 144, 256 * 144)
    assert dst.nbytes == 10 * 256 * 144


def test_roles_match_the_library():
    for role in kv.Role:
        assert role_name(role) == role.name.lower()


def test_region_check():
    lay = kv.Layout(block_size=64)
    kv.RegionDesc.mla(lay, 0, 576, 8).check(lay, consumer=False)
    with pytest.raises(kv.KvrelayError) as e:
        kv.RegionDesc(kv.Role.MLA, 0, 8, 1000).check(lay, consumer=True)
    assert e.value.name == "ERR_PAGE_NOT_TOKENS"
    with pytest.raises(kv.KvrelayError) as e:
        kv.RegionDesc(kv.Role.INDEX, 0, 8, 64 * 144, 128, 64).check(lay, False)
    assert e.value.name == "ERR_INDEX_QUANT"
