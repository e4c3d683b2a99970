"""Memory arguments: any object with the buffer protocol (numpy arrays,
bytearray, bytes, memoryview, mmap), or a raw address and size for memory
that Python cannot see (device memory, engine allocations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple, Union

import numpy as np

from .errors import invalid


@dataclass(frozen=True)
class RawBuffer:
    """Memory at a raw address: `address` (an int, e.g. a tensor's
    data_ptr()) and `size` in bytes. The caller keeps it alive."""

    address: int
    size: int


BufferLike = Union[RawBuffer, Tuple[int, int], Any]


def address_of(obj: BufferLike, writable: bool, what: str) -> Tuple[int, int, Any]:
    """(address, size, keepalive) of a memory argument.

    A ``(address, size)`` tuple or RawBuffer is taken as is. Anything else
    must export a C-contiguous buffer (writable when the C side writes it).
    The third value must stay referenced while C uses the address.
    """
    if isinstance(obj, RawBuffer):
        return _raw(obj.address, obj.size, what)
    if isinstance(obj, tuple) and len(obj) == 2 and all(
            isinstance(v, int) for v in obj):
        return _raw(obj[0], obj[1], what)
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        raise invalid(f"{what}: {type(obj).__name__} has no buffer; pass a "
                      "buffer or (address, size)") from None
    if not view.c_contiguous:
        raise invalid(f"{what}: the buffer is not C-contiguous")
    if writable and view.readonly:
        raise invalid(f"{what}: the buffer is read-only")
    arr = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B"
                        else view, dtype=np.uint8)
    return arr.ctypes.data, arr.nbytes, (arr, view)


def _raw(address: int, size: int, what: str) -> Tuple[int, int, Any]:
    if address <= 0 or size < 0:
        raise invalid(f"{what}: address {address:#x} / size {size} invalid")
    return address, size, None


def need(size: int, want: int, what: str) -> None:
    """The memory must hold `want` bytes (C trusts region sizes)."""
    if size < want:
        raise invalid(f"{what}: {size} bytes, the region needs {want}")


class _ArrayView:
    """Exports C memory through the numpy array interface; numpy keeps this
    object as the array's base, and this object keeps `owner` (the C
    object that owns the memory) alive."""

    def __init__(self, owner: object, address: int, count: int,
                 dtype: np.dtype, readonly: bool) -> None:
        self._owner = owner
        self.__array_interface__ = {
            "version": 3,
            "shape": (count,),
            "typestr": dtype.str,
            "descr": dtype.descr,
            "data": (address, readonly),
        }


def array_view(owner: object, address: int, count: int, dtype: np.dtype,
               readonly: bool) -> np.ndarray:
    """A zero-copy numpy array over C memory that keeps `owner` alive."""
    if count == 0 or not address:
        return np.zeros(0, dtype=dtype)
    return np.asarray(_ArrayView(owner, address, count, dtype, readonly))
