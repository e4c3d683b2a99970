"""kvrelay status codes and the exception that carries them.

``Status`` is built at import from the C library's ``kvr_status_name()`` over
a range of values, so it always matches the library that was loaded (status
codes are stable numbers; they cross the wire and reach Python).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Dict, Optional

from ._lib import LIB
from . import _types as T

_SCAN = range(0, 1024)  # status values are small, stable and explicit


def _status_members() -> Dict[str, int]:
    members = {}
    for value in _SCAN:
        name = LIB.kvr_status_name(value)
        if name is not None:
            members[name.decode()] = value
    return members


#: Every status of the loaded library, e.g. ``Status.ERR_BLOCK_RANGE``.
Status = IntEnum("Status", _status_members())  # type: ignore[misc]


def status_name(code: int) -> str:
    """Symbolic name of a status code ("ERR_VERIFY"), or "UNKNOWN_<n>"."""
    name = LIB.kvr_status_name(int(code))
    return name.decode() if name is not None else f"UNKNOWN_{int(code)}"


def status_str(code: int) -> str:
    """The C library's short text for a status code."""
    return str(LIB.kvr_status_str(int(code)).decode())


class KvrelayError(Exception):
    """A kvrelay call failed.

    Attributes:
        code: the numeric status (``Status`` value), stable across versions.
        name: its symbolic name, e.g. ``"ERR_BLOCK_RANGE"``.
        message: the detail naming the offending values (or the status text).
    """

    def __init__(self, code: int, message: str = "") -> None:
        self.code = int(code)
        self.name = status_name(self.code)
        self.message = message or status_str(self.code)
        super().__init__(f"{self.name} ({self.code}): {self.message}")

    @property
    def status(self) -> Optional[IntEnum]:
        """The code as a ``Status`` member (None if the library lacks it)."""
        try:
            return Status(self.code)
        except ValueError:
            return None


def new_error() -> T.Error:
    """A zeroed ``kvr_error_t`` for a call's detail out-parameter."""
    return T.Error()


def check(code: int, err: Optional[T.Error] = None, what: str = "") -> None:
    """Raises KvrelayError when `code` is not OK, with err's message."""
    if code == 0:
        return
    message = err.msg.decode(errors="replace") if err is not None else ""
    if what:
        message = f"{what}: {message}" if message else what
    raise KvrelayError(code, message)


def invalid(message: str) -> KvrelayError:
    """A Python-side argument check failure, as ERR_INVALID."""
    return KvrelayError(int(Status.ERR_INVALID), message)  # type: ignore[attr-defined]
