"""capacity(): hand-computed cases (see tests/tools/test_cli_capacity.c) and
the same numbers as `kvrelay capacity --json`."""

import json
import subprocess

import pytest

import kvrelay as kv

GIB = 1 << 30


def test_headline_by_hand():
    # MLA 61 x 64 x 576 = 2248704; replicated index 61 x 256 x 144 = 2248704
    c = kv.capacity(80 * GIB, mla=[(576, 61)], index=[(128, 61)], dcp_size=4,
                    replicate_index=True)
    assert c.chosen.bytes_per_block == 4497408
    assert c.chosen.blocks_per_rank == 19099
    assert c.chosen.tokens_per_rank == 19099 * 64
    assert c.chosen.tokens_per_group == 19099 * 64 * 4
    assert c.sharded.blocks_per_rank == 30559
    assert (c.cost_blocks, c.cost_tokens_per_rank, c.cost_tokens_per_group) == \
        (11460, 733440, 2933760)
    assert c.ratio == pytest.approx(19099 / 30559)


def test_small_and_edges():
    c = kv.capacity(1_000_000, mla=[(576, 1)], index=[(128, 1)], block_size=16,
                    dcp_size=2, replicate_index=True)
    assert (c.chosen.blocks_per_rank, c.sharded.blocks_per_rank) == (72, 86)
    assert kv.capacity(1000, mla=[(576, 1)]).ratio is None
    assert kv.capacity(2 * GIB, mla=[(576, 1)]).cost_blocks == 0
    with pytest.raises(kv.KvrelayError):
        kv.capacity(GIB)


@pytest.mark.parametrize("args,kw", [
    ("--budget 80GiB --dcp 4 --replicate-index --region mla:576x61 --region index:128x61",
     dict(budget=80 * GIB, mla=[(576, 61)], index=[(128, 61)], dcp_size=4,
          replicate_index=True)),
    ("--budget 1M --dcp 2 --block-size 32 --region mla:656x3 --region index:64x2",
     dict(budget=1 << 20, mla=[(656, 3)], index=[(64, 2)], dcp_size=2,
          block_size=32)),
])
def test_same_as_cli(cli, args, kw):
    out = subprocess.run([cli, "capacity", "--json"] + args.split(),
                         capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    c = kv.capacity(**kw)
    assert j["blocks_per_rank"] == c.chosen.blocks_per_rank
    assert j["tokens_per_group"] == c.chosen.tokens_per_group
    assert j["sharded"]["bytes_per_block"] == c.sharded.bytes_per_block
    assert j["replication_cost"]["blocks"] == c.cost_blocks
