"""The library exports what the package loads by name: every prototype of
_lib.py, and the version (kvr_version, not an internal kvr__ symbol)."""

import kvrelay as kv
from kvrelay import _lib


def test_every_prototype_is_exported():
    missing = [name for name in _lib._PROTOTYPES if not _lib.LIB.has(name)]
    assert missing == []


def test_library_version_is_the_package_version():
    assert kv.library_version() == kv.__version__


def test_internal_symbols_are_not_exported():
    assert not _lib.LIB.has("kvr__plan_new")
    assert not _lib.LIB.has("kvr__shared_version")
