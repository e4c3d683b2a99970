"""Bindings of the completion books: quorum (failure dominates, tombstones,
generations apart), send/save pairing in either order, prefix hashes (the
documented Python recipe), prefix_cached in virtual blocks, offload keys."""

import hashlib
import struct

import pytest

import kvrelay as kv
from kvrelay import KvrelayError


def test_quorum_pp_failure_dominates_and_tombstones():
    q = kv.Quorum(members=4)
    assert q.report("req-1", 0, generation=2).outcome == kv.QuorumOutcome.PENDING
    assert q.report("req-1", 1, status=kv.Status.ERR_IO, generation=2).status \
        == kv.Status.ERR_IO
    assert q.report("req-1", 2, generation=2).outcome == kv.QuorumOutcome.PENDING
    done = q.report("req-1", 3, generation=2)
    assert done.outcome == kv.QuorumOutcome.DONE
    assert done.status == kv.Status.ERR_IO and done.reported == 4
    # a late duplicate is ignored; another generation is another key
    assert q.report("req-1", 0, generation=2).outcome == kv.QuorumOutcome.IGNORED
    assert q.report("req-1", 0, generation=3).outcome == kv.QuorumOutcome.PENDING
    assert q.num_pending == 1 and q.num_tombstones == 1
    q.cancel("req-1", generation=3)
    assert q.num_pending == 0


def test_quorum_bad_input_names_the_value():
    with pytest.raises(KvrelayError) as e:
        kv.Quorum(members=0)
    assert e.value.name == "ERR_INVALID"
    q = kv.Quorum(members=2)
    with pytest.raises(KvrelayError) as e:
        q.report(b"", 0)
    assert e.value.name == "ERR_INVALID"
    with pytest.raises(KvrelayError):
        q.report("r", 0, generation=-1)


def test_pairing_send_first_then_save():
    p = kv.Pairing()
    p.expect_save("r", 0)
    assert p.send_done("r") == kv.PairOutcome.HELD
    assert p.poll() == []
    assert p.save_done("r", 0) == kv.PairOutcome.RELEASED
    ev = p.poll()
    assert [(e.kind, e.request, e.generation) for e in ev] == [
        (kv.ReleaseKind.SAVE, b"r", 0), (kv.ReleaseKind.SEND, b"r", None)]
    # a save declared after the send went out: its blocks may be gone
    with pytest.raises(KvrelayError) as e:
        p.expect_save("r", 1)
    assert e.value.name == "ERR_EXISTS"


def test_pairing_save_first_and_failed_send():
    p = kv.Pairing()
    p.expect_save("s", 5)
    assert p.save_done("s", 5, status=kv.Status.ERR_IO) == kv.PairOutcome.RELEASED
    assert p.send_done("s", status=kv.Status.ERR_PEER_DEAD) == \
        kv.PairOutcome.RELEASED
    ev = p.poll()
    assert ev[0].status == kv.Status.ERR_IO
    assert ev[1].kind == kv.ReleaseKind.SEND
    assert ev[1].status == kv.Status.ERR_PEER_DEAD
    assert p.num_events == 0


def test_prefix_hashes_match_the_recipe():
    tokens = list(range(1000, 1300))
    got = kv.prefix_hashes(tokens, 64)
    h = bytes(32)
    want = []
    for i in range(len(tokens) // 64):
        block = tokens[64 * i:64 * (i + 1)]
        h = hashlib.sha256(h + b"".join(struct.pack("<I", t) for t in block)
                           ).digest()
        want.append(h)
    assert got == want
    # hashing in pieces equals hashing at once
    assert kv.prefix_hashes(tokens[128:256], 64, parent=got[1]) == got[2:4]


def test_prefix_cached_in_virtual_blocks():
    lay = kv.Layout(block_size=64, dcp_size=4, replicate_index=True)
    assert kv.prefix_cached(lay, 1000, 3) == (768, 3)
    with pytest.raises(KvrelayError):
        kv.prefix_cached(lay, 1000, 4)


def test_offload_key_and_aligned_prefix():
    d = kv.OffloadDesc("glm-5.2", "fp8", 64, 256, tp=4, dcp_size=4,
                       replicate_index=True, preshuffle=True,
                       indexer_types=("full", "shared", "full"))
    assert kv.offload_key(d) == "2bc96a45246819dee77c79e340586ac0"
    assert kv.offload_namespace(d) == \
        "glm-5.2::kvrelay-page-v3-2bc96a45246819dee77c79e340586ac0"
    assert kv.aligned_prefix(1000, 256) == 768
    assert kv.aligned_prefix(-5, 256) == 0
    with pytest.raises(KvrelayError) as e:
        kv.offload_key(kv.OffloadDesc("m", "fp8", 64, 100, tp=4, dcp_size=4))
    assert e.value.name == "ERR_CHUNK_SIZE"
