"""Synthetic KV (kvrelay/synth.h): every byte a pure function of (seed,
layer, role, position, token id); index scales derived from their keys, so
key/scale consistency can be checked on received pages alone."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ._buffers import BufferLike, address_of, need
from ._lib import LIB
from .errors import check, invalid, new_error
from .layout import Layout, RegionDesc
from .plan import block_table


def latent(seed: int, layer: int, pos: int, token_id: int,
           token_bytes: int) -> bytes:
    """token_bytes bytes of one MLA latent."""
    out = (ctypes.c_uint8 * token_bytes)()
    LIB.kvr_synth_latent(seed, layer, pos, token_id, out, token_bytes)
    return bytes(out)


def index_key(seed: int, layer: int, pos: int, token_id: int,
              index_dim: int) -> bytes:
    """D key bytes of one index token, in token order."""
    out = (ctypes.c_uint8 * index_dim)()
    LIB.kvr_synth_index_key(seed, layer, pos, token_id, out, index_dim)
    return bytes(out)


def index_scale(key: bytes) -> float:
    """The fp32 scale derived from a token's key bytes."""
    buf = (ctypes.c_uint8 * len(key)).from_buffer_copy(key)
    return float(LIB.kvr_synth_index_scale(buf, len(key)))


def fill_source(layout: Layout, region: RegionDesc, seed: int,
                src_blocks: Any, token_ids: Any, memory: BufferLike) -> None:
    """Writes tokens [0, len(token_ids)) of a request into a producer region
    image (token g at its producer slot; index keys preshuffled as the
    layout says, scales in the scale plane)."""
    table = block_table(src_blocks, "src_blocks")
    ids = block_table(token_ids, "token_ids")
    addr, size, keep = address_of(memory, True, "memory")
    need(size, region.nbytes, "memory")
    lay, desc, err = layout.to_c(), region.to_c(), new_error()
    u32p = ctypes.POINTER(ctypes.c_uint32)
    check(LIB.kvr_synth_fill_source(
        ctypes.byref(lay), ctypes.byref(desc), seed,
        table.ctypes.data_as(u32p), table.size, ids.ctypes.data_as(u32p),
        ids.size, addr, ctypes.byref(err)), err)
    del keep


def check_index_token(layout: Layout, page: BufferLike, page_tokens: int,
                      t: int, index_dim: int, g: int) -> None:
    """Raises KvrelayError(ERR_VERIFY) when token t of an index page (P =
    page_tokens) has a scale that does not match its keys."""
    addr, size, keep = address_of(page, False, "page")
    if t >= page_tokens:
        raise invalid(f"token slot {t} outside a page of {page_tokens}")
    need(size, page_tokens * (index_dim + 4), "page")
    lay, err = layout.to_c(), new_error()
    check(LIB.kvr_synth_check_index_token(ctypes.byref(lay), addr, page_tokens,
                                          t, index_dim, g, ctypes.byref(err)),
          err)
    del keep


def token_ids(num_tokens: int, first: int = 1000) -> np.ndarray:
    """Arbitrary distinct prompt token ids for examples and tests."""
    return np.arange(first, first + num_tokens, dtype=np.uint32)
