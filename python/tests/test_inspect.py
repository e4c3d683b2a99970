"""inspect: per-token diffs in memory and over dump directories, and the
same answers as `kvrelay inspect --json`."""

import json
import subprocess

import pytest

import kvrelay as kv
from conftest import HEADLINE, transfer
from kvrelay import synth

LAY = HEADLINE.with_(block_size=16)
MLA = kv.RegionPair.mla(LAY, 3, 64, 16, 8)
INDEX = kv.RegionPair.index(LAY, 3, 128, 16, 8)
REQ = kv.Request([9, 2, 7, 11, 4, 0, 13, 5, 1, 8], [5, 0, 3], 150)
IDS = synth.token_ids(150)


def shift_one_token(rank, runs):
    runs["src"] += 64
    return runs


def test_clean_and_counts():
    src, dsts = transfer(LAY, INDEX, REQ, IDS)
    found = kv.Inspection()
    for rank in range(4):
        found.buffers(LAY, rank, INDEX, REQ, src, dsts[rank], synthetic=True, seed=3)
    found.source(LAY, INDEX, REQ, IDS, src, seed=3)
    assert found.clean and found.diffs == []
    assert found.checked("wrong") == 4 * 150 and found.checked("scale") == 4 * 150
    assert found.checked("source") == 150
    wrong_seed = kv.Inspection().source(LAY, INDEX, REQ, IDS, src, seed=4)
    assert wrong_seed.found("source") == 150


def test_shifted_plan_names_the_tokens():
    src, dsts = transfer(LAY, MLA, REQ, IDS, mutate=shift_one_token)
    found = kv.inspect_buffers(LAY, 2, MLA, REQ, src, dsts[2], max_report=3)
    assert found.found("wrong") == LAY.local_len(150, 2)
    d = found.diffs
    assert [x.token for x in d] == [2, 6, 10]  # rank 2 owns 2, 6, 10, ...
    assert d[0].kind == "wrong" and d[0].part == "latent" and d[0].rank == 2
    want = synth.latent(3, 3, 2, int(IDS[2]), 64)
    got = synth.latent(3, 3, 3, int(IDS[3]), 64)
    assert d[0].expected == want[d[0].byte:d[0].byte + 16]
    assert d[0].found == got[d[0].byte:d[0].byte + 16]


def test_dump_round_trip(tmp_path, cli):
    src, dsts = transfer(LAY, MLA, REQ, IDS, mutate=shift_one_token)
    isrc, idsts = transfer(LAY, INDEX, REQ, IDS)
    regions = [kv.DumpRegion(MLA, src, dsts), kv.DumpRegion(INDEX, isrc, idsts)]
    kv.write_dump(tmp_path, LAY, regions, [kv.DumpRequest("req-0", REQ, IDS)], seed=3)
    report = kv.inspect_dump(tmp_path, max_report=2)
    assert not report["clean"] and report["seed"] == 3
    mla, index = report["regions"]
    assert mla["tokens_wrong"] == 150 and index["tokens_wrong"] == 0
    assert [d["token"] for d in mla["diffs"]] == [0, 4]
    assert index["scales_checked"] == 600
    out = subprocess.run([cli, "inspect", "--json", "--max-report", "2",
                          str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1 and json.loads(out.stdout) == report
    off = kv.inspect_dump(tmp_path, synthetic=False)
    assert off["synthetic"] is False and off["regions"][1]["scales_checked"] == 0


def test_clean_dump_exit_zero(tmp_path, cli):
    src, dsts = transfer(LAY, MLA, REQ, IDS)
    kv.write_dump(tmp_path, LAY, [kv.DumpRegion(MLA, src, dsts)],
                  [kv.DumpRequest("req-0", REQ)])
    assert kv.inspect_dump(tmp_path)["clean"]
    out = subprocess.run([cli, "inspect", str(tmp_path)], capture_output=True,
                         text=True)
    assert out.returncode == 0 and "summary: clean" in out.stdout


def test_bad_dumps_raise(tmp_path):
    with pytest.raises(kv.KvrelayError) as e:
        kv.inspect_dump(tmp_path / "none")
    assert e.value.name == "ERR_IO"
    src, dsts = transfer(LAY, MLA, REQ, IDS)
    kv.write_dump(tmp_path, LAY, [kv.DumpRegion(MLA, src, dsts)],
                  [kv.DumpRequest("req-0", REQ)])
    (tmp_path / "dst-r1-L003-mla.bin").write_bytes(b"short")
    with pytest.raises(kv.KvrelayError, match="5 bytes, the manifest says") as e:
        kv.inspect_dump(tmp_path)
    assert e.value.name == "ERR_INVALID"
    with pytest.raises(kv.KvrelayError, match="consumer images for W=4"):
        kv.write_dump(tmp_path, LAY, [kv.DumpRegion(MLA, src, dsts[:2])], [])


def test_buffer_errors():
    src, dsts = transfer(LAY, MLA, REQ, IDS)
    with pytest.raises(kv.KvrelayError, match="image holds 100 bytes") as e:
        kv.inspect_buffers(LAY, 0, MLA, REQ, src[:100], dsts[0])
    assert e.value.name == "ERR_INVALID"
    with pytest.raises(kv.KvrelayError) as e:
        kv.inspect_buffers(LAY, 0, MLA, kv.Request(REQ.src_blocks, [5, 0, 30], 150),
                           src, dsts[0])
    assert e.value.name == "ERR_BLOCK_RANGE"
    with pytest.raises(kv.KvrelayError):
        kv.Inspection(max_report=0)
