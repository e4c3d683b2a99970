"""How many KV blocks does a decode rank hold? (``kvrelay capacity``)

blocks per rank = floor(budget / (L_mla * bs * token_bytes + L_idx * P * C)),
P = bs * W when the index is replicated, bs when sharded, C = ceil16(D + 4)
(from the C library) including padding (docs/design.md §11).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .errors import invalid
from .layout import index_stride


@dataclass(frozen=True)
class CapacityOption:
    """What the budget holds with the index replicated or sharded."""

    mla_bytes_per_block: int
    index_bytes_per_block: int
    bytes_per_block: int
    blocks_per_rank: int
    tokens_per_rank: int   # blocks * bs: KV slots on each rank
    tokens_per_group: int  # blocks * bs * W: context of the W ranks together


@dataclass(frozen=True)
class Capacity:
    """The chosen option, both options and the cost of replication."""

    budget: int
    block_size: int
    dcp_size: int
    replicate_index: bool
    chosen: CapacityOption
    sharded: CapacityOption
    replicated: CapacityOption

    @property
    def cost_blocks(self) -> int:
        """Blocks per rank a replicated index loses against a sharded one."""
        return self.sharded.blocks_per_rank - self.replicated.blocks_per_rank

    @property
    def cost_tokens_per_rank(self) -> int:
        return self.cost_blocks * self.block_size

    @property
    def cost_tokens_per_group(self) -> int:
        return self.cost_blocks * self.block_size * self.dcp_size

    @property
    def ratio(self) -> Optional[float]:
        """Replicated / sharded blocks per rank (None when sharded holds 0)."""
        if self.sharded.blocks_per_rank == 0:
            return None
        return self.replicated.blocks_per_rank / self.sharded.blocks_per_rank


def _option(budget: int, bs: int, W: int, mla: Sequence[Tuple[int, int]],
            index: Sequence[Tuple[int, int]], replicated: bool) -> CapacityOption:
    P = bs * W if replicated else bs
    mla_bytes = sum(layers * bs * tb for tb, layers in mla)
    index_bytes = sum(layers * P * index_stride(D) for D, layers in index)
    per_block = mla_bytes + index_bytes
    blocks = budget // per_block
    return CapacityOption(mla_bytes, index_bytes, per_block, blocks,
                          blocks * bs, blocks * bs * W)


def capacity(budget: int, *, mla: Sequence[Tuple[int, int]] = (),
             index: Sequence[Tuple[int, int]] = (), block_size: int = 64,
             dcp_size: int = 1, replicate_index: bool = False) -> Capacity:
    """Blocks and tokens a decode rank holds in `budget` bytes.

    mla: (token_bytes, layers) pairs, e.g. [(576, 61)]; index: (D, layers)
    pairs, e.g. [(128, 61)]. The same numbers as ``kvrelay capacity``.
    """
    if budget < 0 or block_size < 1 or dcp_size < 1:
        raise invalid(f"budget {budget}, bs {block_size}, W {dcp_size}")
    if not mla and not index:
        raise invalid("capacity needs at least one mla or index region")
    if any(w < 1 or n < 1 for w, n in list(mla) + list(index)):
        raise invalid("widths and layer counts must be >= 1")
    args = (budget, block_size, dcp_size, mla, index)
    rep, shard = _option(*args, replicated=True), _option(*args, replicated=False)
    return Capacity(budget, block_size, dcp_size, replicate_index,
                    rep if replicate_index else shard, shard, rep)


__all__ = ["Capacity", "CapacityOption", "capacity"]
