"""Status codes come from the C library, with their stable numbers."""

import re

import pytest

import kvrelay as kv
from conftest import ROOT


def status_h():
    text = (ROOT / "include" / "kvrelay" / "status.h").read_text()
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"X\((\w+), (\d+),", text)}


def test_status_enum_matches_status_h():
    assert {s.name: int(s) for s in kv.Status} == status_h()


def test_error_carries_code_name_and_message():
    lay = kv.Layout(block_size=64, dcp_size=4, interleave=3)
    with pytest.raises(kv.KvrelayError) as e:
        lay.check()
    assert e.value.code == kv.Status.ERR_INTERLEAVE_NOT_DIVISOR == 12
    assert e.value.name == "ERR_INTERLEAVE_NOT_DIVISOR"
    assert "interleave 3" in e.value.message
    assert e.value.status is kv.Status.ERR_INTERLEAVE_NOT_DIVISOR
    assert str(e.value).startswith("ERR_INTERLEAVE_NOT_DIVISOR (12): ")


def test_unknown_code():
    err = kv.KvrelayError(999)
    assert err.name == "UNKNOWN_999" and err.status is None
    assert kv.status_str(999) == "unknown status"
    assert kv.status_name(29) == "ERR_VERIFY"
