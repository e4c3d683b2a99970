"""Writing dump directories (docs/dump-format.md) that ``kvrelay inspect``
and ``kvrelay.inspect.inspect_dump`` read: a manifest plus whole region
images of the producer and of every DCP rank."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Union

from ._buffers import BufferLike, address_of
from .errors import invalid
from .layout import Layout, RegionPair, Role
from .plan import Request, block_table


@dataclass
class DumpRegion:
    """One region pair with its producer image and one consumer image per
    DCP rank (0..W-1)."""

    pair: RegionPair
    src: BufferLike
    dst: Sequence[BufferLike]


@dataclass
class DumpRequest:
    """A request of the dump; token_ids (num_tokens u32) enable the source
    check of synthetic data."""

    id: str
    request: Request
    token_ids: Optional[Any] = None


def _image_bytes(mem: BufferLike, want: int, what: str) -> bytes:
    addr, size, keep = address_of(mem, False, what)
    if size != want:
        raise invalid(f"{what}: {size} bytes, the region holds {want}")
    data = ctypes.string_at(addr, size) if size else b""
    del keep
    return data


def _name(used: Set[str], stem: str) -> str:
    name, n = f"{stem}.bin", 1
    while name in used:
        name, n = f"{stem}-{n}.bin", n + 1
    used.add(name)
    return name


def _region_entry(directory: Path, layout: Layout, r: DumpRegion,
                  used: Set[str]) -> Dict[str, Any]:
    role = "mla" if r.pair.src.role == Role.MLA else "index"
    if r.pair.src.role not in (Role.MLA, Role.INDEX):
        raise invalid(f"dump regions are mla or index, not {r.pair.src.role!r}")
    if len(r.dst) != layout.dcp_size:
        raise invalid(f"{len(r.dst)} consumer images for W={layout.dcp_size}")
    layer = r.pair.src.layer
    src_name = _name(used, f"src-L{layer:03d}-{role}")
    (directory / src_name).write_bytes(
        _image_bytes(r.src, r.pair.src.nbytes, src_name))
    dst_names: List[str] = []
    for rank, mem in enumerate(r.dst):
        name = _name(used, f"dst-r{rank}-L{layer:03d}-{role}")
        (directory / name).write_bytes(_image_bytes(mem, r.pair.dst.nbytes, name))
        dst_names.append(name)
    entry: Dict[str, Any] = {"role": role, "layer": layer}
    if role == "index":
        entry["index_dim"] = r.pair.src.index_dim
        entry["quant_block"] = r.pair.src.quant_block or r.pair.src.index_dim
    entry.update({
        "src": {"num_blocks": r.pair.src.num_blocks,
                "page_bytes": r.pair.src.page_bytes},
        "dst": {"num_blocks": r.pair.dst.num_blocks,
                "page_bytes": r.pair.dst.page_bytes},
        "src_file": src_name, "dst_files": dst_names})
    return entry


def _request_entry(q: DumpRequest) -> Dict[str, Any]:
    entry: Dict[str, Any] = {
        "id": q.id, "num_tokens": q.request.num_tokens,
        "num_computed_blocks": q.request.num_computed_blocks,
        "src_blocks": block_table(q.request.src_blocks, "src_blocks").tolist(),
        "dst_blocks": block_table(q.request.dst_blocks, "dst_blocks").tolist()}
    if q.token_ids is not None:
        entry["token_ids"] = block_table(q.token_ids, "token_ids").tolist()
    return entry


def write_dump(directory: Union[str, Path], layout: Layout,
               regions: Sequence[DumpRegion], requests: Sequence[DumpRequest],
               seed: Optional[int] = None) -> Path:
    """Writes DIR/manifest.json and the images; `seed` declares synthetic
    data (kvrelay.synth) so inspect also checks scales and sources."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    used: Set[str] = set()
    lay = layout.to_c()
    manifest = {
        "format": "kvrelay-dump", "version": 1,
        "layout": {"block_size": lay.block_size, "dcp": lay.dcp_size,
                   "interleave": lay.interleave, "tp": lay.tp,
                   "producer_tp": lay.producer_tp,
                   "replicate_index": bool(lay.replicate_index),
                   "preshuffle": bool(lay.preshuffle)},
        "seed": seed,
        "regions": [_region_entry(out, layout, r, used) for r in regions],
        "requests": [_request_entry(q) for q in requests],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


__all__ = ["DumpRegion", "DumpRequest", "write_dump"]
