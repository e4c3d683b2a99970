"""Layouts (the consumer DCP topology and page formats both sides agree on),
region descriptions and the DCP layout math, all computed by the C library
(docs/design.md §2-3)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Optional, Sequence

from . import _types as T
from ._lib import LIB
from .errors import check, new_error


class Role(IntEnum):
    """What a region holds (values of the C enum kvr_role_t)."""

    MLA = 1
    INDEX = 2
    DENSE = 3
    STATE = 4
    STAGING = 5
    OTHER = 6


@dataclass(frozen=True)
class Layout:
    """kvr_layout_t. ``tp`` None means ``dcp_size`` (one TP rank per DCP
    rank, as ``kvrelay plan`` defaults)."""

    block_size: int = 64
    dcp_size: int = 1
    interleave: int = 1
    tp: Optional[int] = None
    producer_tp: int = 1
    replicate_index: bool = False
    preshuffle: bool = True

    def to_c(self) -> T.Layout:
        return T.Layout(self.block_size, self.dcp_size, self.interleave,
                        self.dcp_size if self.tp is None else self.tp,
                        self.producer_tp, self.replicate_index, self.preshuffle)

    @classmethod
    def from_c(cls, c: T.Layout) -> "Layout":
        return cls(c.block_size, c.dcp_size, c.interleave, c.tp, c.producer_tp,
                   bool(c.replicate_index), bool(c.preshuffle))

    def check(self, rank: Optional[int] = None) -> "Layout":
        """Raises KvrelayError (ERR_INTERLEAVE_*, ERR_DCP_LT1, ...) unless the
        layout (and `rank` < W when given) is valid; returns self."""
        err, c = new_error(), self.to_c()
        if rank is None:
            check(LIB.kvr_layout_check(ctypes.byref(c), ctypes.byref(err)), err)
        else:
            check(LIB.kvr_layout_check_rank(ctypes.byref(c), rank,
                                            ctypes.byref(err)), err)
        return self

    def with_(self, **changes: object) -> "Layout":
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]

    # ---- geometry (docs/design.md §2) ----
    def _call(self, name: str, *args: object) -> int:
        c = self.to_c()
        return int(getattr(LIB, name)(ctypes.byref(c), *args))

    @property
    def virtual_block(self) -> int:
        """V = bs * W: global tokens one consumer block-table entry covers."""
        return self._call("kvr_virtual_block")

    def owner(self, g: int) -> int:
        """DCP rank that holds token g's MLA latent: (g / I) % W."""
        return self._call("kvr_owner", g)

    def local_index(self, g: int) -> int:
        """Index of token g on its owner: (g / (I*W)) * I + g % I."""
        return self._call("kvr_local_index", g)

    def global_index(self, j: int, rank: int) -> int:
        """Inverse of local_index on `rank`."""
        return self._call("kvr_global_index", j, rank)

    def local_len(self, num_tokens: int, rank: int) -> int:
        """Tokens of an L-token sequence that `rank` holds (sharded)."""
        return self._call("kvr_local_len", num_tokens, rank)

    def num_src_blocks(self, num_tokens: int) -> int:
        return self._call("kvr_num_src_blocks", num_tokens)

    def num_dst_blocks(self, num_tokens: int) -> int:
        """ceil(N / V): consumer block-table entries, shared by all ranks."""
        return self._call("kvr_num_dst_blocks", num_tokens)

    def index_page_tokens(self, consumer: bool) -> int:
        """P of an index page: bs * W on a replicated consumer, else bs."""
        return self._call("kvr_index_page_tokens", consumer)

    def index_key_offset(self, index_dim: int, t: int, d: int) -> int:
        """Byte of key byte d of token t in an index page (preshuffled or
        not, as this layout says)."""
        return self._call("kvr_index_key_offset", index_dim, t, d)


def index_stride(index_dim: int) -> int:
    """C = ceil16(D + 4): bytes per token of an index page, padding included."""
    return int(LIB.kvr_index_stride(index_dim))


def index_scale_offset(page_tokens: int, index_dim: int, t: int) -> int:
    """Byte of token t's fp32 scale in an index page of P tokens."""
    return int(LIB.kvr_index_scale_offset(page_tokens, index_dim, t))


@dataclass(frozen=True)
class RegionDesc:
    """kvr_region_desc_t: one registered KV tensor on one side."""

    role: Role
    layer: int
    num_blocks: int
    page_bytes: int
    index_dim: int = 0
    quant_block: int = 0
    bytes: int = 0

    def to_c(self) -> T.RegionDesc:
        return T.RegionDesc(int(self.role), self.layer, self.num_blocks,
                            self.page_bytes, self.index_dim, self.quant_block,
                            self.bytes)

    @classmethod
    def from_c(cls, c: T.RegionDesc) -> "RegionDesc":
        return cls(Role(c.role), c.layer, c.num_blocks, c.page_bytes,
                   c.index_dim, c.quant_block, c.bytes)

    @classmethod
    def mla(cls, layout: Layout, layer: int, token_bytes: int,
            num_blocks: int) -> "RegionDesc":
        """An MLA latent region: pages of bs * token_bytes."""
        return cls(Role.MLA, layer, num_blocks, layout.block_size * token_bytes)

    @classmethod
    def index(cls, layout: Layout, layer: int, index_dim: int,
              num_blocks: int, consumer: bool) -> "RegionDesc":
        """A DSA index region: pages of P * C bytes (P = bs * W on a
        replicated consumer), Q = D."""
        page = layout.index_page_tokens(consumer) * index_stride(index_dim)
        return cls(Role.INDEX, layer, num_blocks, page, index_dim, index_dim)

    @property
    def nbytes(self) -> int:
        """Registered length: `bytes`, or num_blocks * page_bytes."""
        c = self.to_c()
        return int(LIB.kvr_region_bytes(ctypes.byref(c)))

    def check(self, layout: Layout, consumer: bool) -> "RegionDesc":
        """Raises KvrelayError unless the geometry is valid for its side."""
        err, c, lay = new_error(), self.to_c(), layout.to_c()
        check(LIB.kvr_region_check(ctypes.byref(lay), ctypes.byref(c),
                                   consumer, ctypes.byref(err)), err)
        return self


@dataclass(frozen=True)
class RegionPair:
    """A producer region and the consumer region it maps to."""

    src: RegionDesc
    dst: RegionDesc

    def to_c(self) -> T.RegionPair:
        return T.RegionPair(self.src.to_c(), self.dst.to_c())

    @classmethod
    def mla(cls, layout: Layout, layer: int, token_bytes: int,
            src_blocks: int, dst_blocks: int) -> "RegionPair":
        return cls(RegionDesc.mla(layout, layer, token_bytes, src_blocks),
                   RegionDesc.mla(layout, layer, token_bytes, dst_blocks))

    @classmethod
    def index(cls, layout: Layout, layer: int, index_dim: int,
              src_blocks: int, dst_blocks: int) -> "RegionPair":
        return cls(RegionDesc.index(layout, layer, index_dim, src_blocks, False),
                   RegionDesc.index(layout, layer, index_dim, dst_blocks, True))


def regions_to_c(regions: Sequence[RegionDesc]) -> "ctypes.Array[T.RegionDesc]":
    arr = (T.RegionDesc * max(1, len(regions)))()
    for i, r in enumerate(regions):
        arr[i] = r.to_c()
    return arr


def role_name(role: int) -> str:
    """The C library's name of a role ("mla", "index", ...)."""
    return str(LIB.kvr_role_name(int(role)).decode())


__all__ = ["Role", "Layout", "RegionDesc", "RegionPair", "index_stride",
           "index_scale_offset", "role_name"]

