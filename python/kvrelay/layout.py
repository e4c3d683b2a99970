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


class Axis(IntEnum):
    """The ranks a pair plan names (kvr_axis_t): DCP ranks for token-sharded
    regions, TP ranks for head-sharded dense ones (docs/design.md §18)."""

    DCP = 0
    TP = 1


@dataclass(frozen=True)
class Layout:
    """kvr_layout_t. ``tp`` None means ``dcp_size`` (one TP rank per DCP
    rank, as ``kvrelay plan`` defaults). The producer fields describe a
    producer with DCP of its own (docs/design.md §18); their defaults are
    today's unsharded producer with the consumer's block size
    (``producer_block_size`` None)."""

    block_size: int = 64
    dcp_size: int = 1
    interleave: int = 1
    tp: Optional[int] = None
    producer_tp: int = 1
    replicate_index: bool = False
    preshuffle: bool = True
    producer_dcp: int = 1
    producer_interleave: int = 1
    producer_block_size: Optional[int] = None
    producer_replicate_index: bool = False

    def to_c(self) -> T.Layout:
        return T.Layout(self.block_size, self.dcp_size, self.interleave,
                        self.dcp_size if self.tp is None else self.tp,
                        self.producer_tp, self.replicate_index, self.preshuffle,
                        self.producer_replicate_index, self.producer_dcp,
                        self.producer_interleave,
                        self.producer_block_size or 0)

    @classmethod
    def from_c(cls, c: T.Layout) -> "Layout":
        return cls(c.block_size, c.dcp_size, c.interleave, c.tp, c.producer_tp,
                   bool(c.replicate_index), bool(c.preshuffle),
                   c.producer_dcp or 1, c.producer_interleave or 1,
                   c.producer_block_size or None,
                   bool(c.producer_replicate_index))

    def axis_ranks(self, axis: "Axis", consumer: bool) -> int:
        """Ranks on an axis of one side: W or TP of the consumer or the
        producer."""
        return self._call("kvr_axis_ranks", int(axis), consumer)

    @property
    def producer_plain(self) -> bool:
        """True for today's producer: W_p == 1 and bs_p == bs."""
        c = self.to_c()
        return bool(LIB.kvr_layout_producer_plain(ctypes.byref(c)))

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
    """kvr_region_desc_t: one registered KV tensor on one side. The head
    fields describe a head-sharded dense region (``heads`` 0: none)."""

    role: Role
    layer: int
    num_blocks: int
    page_bytes: int
    index_dim: int = 0
    quant_block: int = 0
    bytes: int = 0
    heads: int = 0
    head_dim: int = 0
    elem_bytes: int = 0
    kv_planes: int = 0
    hnd: bool = False

    def to_c(self) -> T.RegionDesc:
        return T.RegionDesc(int(self.role), self.layer, self.num_blocks,
                            self.page_bytes, self.index_dim, self.quant_block,
                            self.bytes, self.heads, self.head_dim,
                            self.elem_bytes, self.kv_planes, self.hnd)

    @classmethod
    def from_c(cls, c: T.RegionDesc) -> "RegionDesc":
        return cls(Role(c.role), c.layer, c.num_blocks, c.page_bytes,
                   c.index_dim, c.quant_block, c.bytes, c.heads, c.head_dim,
                   c.elem_bytes, c.kv_planes, bool(c.hnd))

    @classmethod
    def mla(cls, layout: Layout, layer: int, token_bytes: int,
            num_blocks: int, consumer: bool = True) -> "RegionDesc":
        """An MLA latent region: pages of bs * token_bytes (the producer's
        bs_p when not `consumer`)."""
        bs = layout.block_size if consumer else \
            layout._call("kvr_producer_block_size")
        return cls(Role.MLA, layer, num_blocks, bs * token_bytes)

    @classmethod
    def dense(cls, layout: Layout, layer: int, heads: int, head_dim: int,
              elem_bytes: int, num_blocks: int, consumer: bool,
              hnd: bool = False, kv_planes: int = 2) -> "RegionDesc":
        """A head-sharded dense K/V region: pages of kv_planes planes of
        bs * local heads * head_dim * elem_bytes, NHD or HND."""
        r = cls(Role.DENSE, layer, num_blocks, 0, heads=heads,
                head_dim=head_dim, elem_bytes=elem_bytes, kv_planes=kv_planes,
                hnd=hnd)
        c, lay = r.to_c(), layout.to_c()
        page = LIB.kvr_dense_page_bytes(ctypes.byref(lay), ctypes.byref(c),
                                        consumer)
        return replace(r, page_bytes=int(page))

    @property
    def axis(self) -> Axis:
        """The ranks its pair plans name: TP for head-sharded dense."""
        c = self.to_c()
        return Axis(LIB.kvr_region_axis(ctypes.byref(c)))

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
        return cls(RegionDesc.mla(layout, layer, token_bytes, src_blocks,
                                  False),
                   RegionDesc.mla(layout, layer, token_bytes, dst_blocks))

    @classmethod
    def dense(cls, layout: Layout, layer: int, heads: int, head_dim: int,
              elem_bytes: int, src_blocks: int, dst_blocks: int,
              hnd: bool = False, kv_planes: int = 2) -> "RegionPair":
        return cls(RegionDesc.dense(layout, layer, heads, head_dim,
                                    elem_bytes, src_blocks, False, hnd,
                                    kv_planes),
                   RegionDesc.dense(layout, layer, heads, head_dim,
                                    elem_bytes, dst_blocks, True, hnd,
                                    kv_planes))

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


__all__ = ["Axis", "Role", "Layout", "RegionDesc", "RegionPair",
           "index_stride", "index_scale_offset", "role_name"]

