"""The offload store (docs/store.md): chunks in canonical form keyed by a
namespace, the prefix hash chain and the PP part, in a bounded host tier
over a disk directory, each checked against its BLAKE2b checksum; saves and
loads go through the planner, so a chunk saved from any PP stage loads into
any W, I and replication. Not thread-safe: one Store per thread.

StoreConnector is the store connector: saves on a worker thread beside the
transfer, with send/save pairing, the PP quorum of saves and generations,
and loads with a quorum over the parts (thread-safe)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypeVar

from . import _types as T
from ._buffers import BufferLike, address_of
from ._lib import BAD_FN, LIB
from .books import OffloadDesc, RequestId, _bytes, _tokens
from .errors import Status, check, invalid, new_error
from .layout import Layout, RegionDesc
from .plan import _u32_ptr, block_table


@dataclass(frozen=True)
class ChunkKey:
    ns: bytes  # 16 bytes (store_namespace)
    chain: bytes  # 32 bytes (store_chains)
    part: int = 0  # the PP stage whose layers the chunk holds

    def to_c(self) -> T.ChunkKey:
        if len(self.ns) != T.STORE_NS_BYTES or len(self.chain) != 32:
            raise invalid(f"chunk key: ns of {len(self.ns)} bytes (16) or "
                          f"chain of {len(self.chain)} bytes (32)")
        k = T.ChunkKey()
        k.ns[:] = list(self.ns)
        k.chain.bytes[:] = list(self.chain)
        k.part = self.part
        return k


def store_namespace(desc: OffloadDesc, regions: Sequence[RegionDesc],
                    spec_config: Optional[str] = None) -> bytes:
    """16-byte namespace: the offload key at the canonical layout plus every
    region's role, layer and widths and the speculative config."""
    d, keep = desc.to_c()
    regs = (T.RegionDesc * (len(regions) + 1))(*[r.to_c() for r in regions])
    out, err = (ctypes.c_uint8 * T.STORE_NS_BYTES)(), new_error()
    check(LIB.kvr_store_namespace(
        ctypes.byref(d), regs, len(regions),
        spec_config.encode() if spec_config is not None else None, out,
        ctypes.byref(err)), err)
    del keep
    return bytes(out)


def store_chains(tokens: Any, chunk: int) -> List[bytes]:
    """Chain hashes of the full chunks of `tokens` (chunk-sized blocks)."""
    ids = _tokens(tokens)
    cap = ids.size // max(int(chunk), 1) + 1
    out, n, err = (T.BlockHash * cap)(), ctypes.c_size_t(), new_error()
    check(LIB.kvr_store_chains(
        ids.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), ids.size,
        int(chunk), out, cap, ctypes.byref(n), ctypes.byref(err)), err)
    return [bytes(h.bytes) for h in out[:n.value]]


def store_verify(directory: str) -> Tuple[int, List[Tuple[str, str]]]:
    """Checks every chunk file of a disk tier without changing anything:
    (number good, [(file, reason) for each bad or unfinished one])."""
    bad: List[Tuple[str, str]] = []

    def on_bad(name: bytes, why: bytes, arg: Any) -> None:
        bad.append((name.decode(errors="replace"), why.decode(errors="replace")))

    fn = BAD_FN(on_bad)
    ok, nbad, err = ctypes.c_uint64(), ctypes.c_uint64(), new_error()
    check(LIB.kvr_store_verify(directory.encode(), fn, None, ctypes.byref(ok),
                               ctypes.byref(nbad), ctypes.byref(err)), err)
    return ok.value, bad


_Owner = TypeVar("_Owner", bound="_Owned")


class _Owned:
    """A C handle this object owns: closed once, by close(), the with
    block's end or the collector; _handle() refuses a closed one."""

    _destroy = ""  # the LIB function that frees the handle
    _what = ""     # for the error once closed
    _h: Optional[ctypes.c_void_p] = None

    def close(self) -> None:
        h, self._h = self._h, None
        if h:
            getattr(LIB, self._destroy)(h)

    def __del__(self) -> None:
        if getattr(self, "_h", None):
            self.close()

    def __enter__(self: _Owner) -> _Owner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise invalid(f"{self._what} is closed")
        return self._h


class Store(_Owned):
    """A store: ``Store(dir, host_bytes=...)``; a context manager."""

    _destroy, _what = "kvr_store_close", "store"

    def __init__(self, directory: Optional[str] = None, host_bytes: int = 0,
                 verify_host: bool = False, quick_scan: bool = False,
                 fast_checksum: bool = False) -> None:
        opts = T.StoreOpts(directory.encode() if directory else None,
                           host_bytes, verify_host, quick_scan, fast_checksum)
        handle, err = ctypes.c_void_p(), new_error()
        check(LIB.kvr_store_open(ctypes.byref(opts), ctypes.byref(handle),
                                 ctypes.byref(err)), err)
        self._h = handle

    @property
    def backend(self) -> str:
        return str(LIB.kvr_store_backend(self._handle()).decode())

    def stats(self) -> Dict[str, int]:
        s = T.StoreStats()
        LIB.kvr_store_stats(self._handle(), ctypes.byref(s))
        return {name: int(getattr(s, name)) for name, _ in T.StoreStats._fields_}

    def put(self, key: ChunkKey, data: BufferLike) -> None:
        addr, size, keep = address_of(data, False, "data")
        k, err = key.to_c(), new_error()
        check(LIB.kvr_store_put(self._handle(), ctypes.byref(k), addr, size,
                                ctypes.byref(err)), err)
        del keep

    def get(self, key: ChunkKey) -> Optional[bytes]:
        """The chunk's payload, or None on a miss or a corrupt chunk."""
        k, n, err = key.to_c(), ctypes.c_uint64(), new_error()
        code = LIB.kvr_store_get(self._handle(), ctypes.byref(k), None, 0,
                                 ctypes.byref(n), ctypes.byref(err))
        if code == int(Status.ERR_NOT_FOUND):  # type: ignore[attr-defined]
            return None
        if code != int(Status.ERR_BUFFER_SMALL) or n.value == 0:  # type: ignore[attr-defined]
            check(code, err)
        buf = ctypes.create_string_buffer(max(n.value, 1))
        code = LIB.kvr_store_get(self._handle(), ctypes.byref(k), buf, n.value,
                                 ctypes.byref(n), ctypes.byref(err))
        if code == int(Status.ERR_NOT_FOUND):  # type: ignore[attr-defined]
            return None
        check(code, err)
        return buf.raw[:n.value]

    def contains(self, key: ChunkKey) -> bool:
        k = key.to_c()
        return bool(LIB.kvr_store_contains(self._handle(), ctypes.byref(k)))

    def _io(self, ns: bytes, part: int, block_size: int, chunk: int,
            chains: Sequence[bytes], layout: Layout, rank: int,
            regions: Sequence[Tuple[RegionDesc, BufferLike]], blocks: Any,
            writable: bool) -> Tuple[T.StoreIO, List[Any]]:
        if len(ns) != T.STORE_NS_BYTES:
            raise invalid(f"namespace of {len(ns)} bytes, not 16")
        keep: List[Any] = []
        regs = (T.StoreRegion * (len(regions) + 1))()
        for i, (desc, buf) in enumerate(regions):
            addr, size, k = address_of(buf, writable, f"region {i}")
            if size < desc.nbytes:
                raise invalid(f"region {i}: buffer of {size} bytes, the "
                              f"region needs {desc.nbytes}")
            regs[i] = T.StoreRegion(desc.to_c(), addr)
            keep.append(k)
        hashes = (T.BlockHash * (len(chains) + 1))()
        for i, c in enumerate(chains):
            if len(c) != 32:
                raise invalid(f"chain {i} of {len(c)} bytes, not 32")
            hashes[i].bytes[:] = list(c)
        table = block_table(blocks, "blocks")
        lay = layout.to_c()
        nsb = (ctypes.c_uint8 * T.STORE_NS_BYTES)(*ns)
        keep += [regs, hashes, table, lay, nsb]
        io = T.StoreIO(nsb, part, block_size, chunk, hashes, len(chains),
                       ctypes.pointer(lay), rank, regs, len(regions),
                       _u32_ptr(table), table.size)
        return io, keep

    def save(self, ns: bytes, part: int, block_size: int, chunk: int,
             chains: Sequence[bytes], layout: Layout,
             regions: Sequence[Tuple[RegionDesc, BufferLike]],
             blocks: Any) -> int:
        """Saves the request's full chunks of this stage's regions (a
        producer layout, W_p = 1) in canonical form; the chunks written."""
        io, keep = self._io(ns, part, block_size, chunk, chains, layout, 0,
                            regions, blocks, False)
        n, err = ctypes.c_size_t(), new_error()
        check(LIB.kvr_store_save(self._handle(), ctypes.byref(io),
                                 ctypes.byref(n), ctypes.byref(err)), err)
        del keep
        return n.value

    def load(self, ns: bytes, part: int, block_size: int, chunk: int,
             chains: Sequence[bytes], layout: Layout, rank: int,
             regions: Sequence[Tuple[RegionDesc, BufferLike]],
             blocks: Any) -> int:
        """Loads the longest run of leading chunks present and valid into a
        consumer rank's regions (any W, I, replication); the tokens loaded."""
        io, keep = self._io(ns, part, block_size, chunk, chains, layout, rank,
                            regions, blocks, True)
        n, err = ctypes.c_uint64(), new_error()
        check(LIB.kvr_store_load(self._handle(), ctypes.byref(io),
                                 ctypes.byref(n), ctypes.byref(err)), err)
        del keep
        return n.value


def _hash_array(chains: Sequence[bytes]) -> Any:
    hashes = (T.BlockHash * (len(chains) + 1))()
    for i, c in enumerate(chains):
        if len(c) != 32:
            raise invalid(f"chain {i} of {len(c)} bytes, not 32")
        hashes[i].bytes[:] = list(c)
    return hashes


@dataclass(frozen=True)
class StoreEvent:
    """kind: "PART_SAVED" (one part held here saved: bytes, chunks),
    "SAVED" (every part answered: the PP quorum) or "RELEASE" (the
    request's send and saves completed: free its sources)."""
    kind: str
    request: bytes
    generation: int
    part: int
    status: int
    message: str
    bytes: int
    chunks: int


class StoreConnector(_Owned):
    """``StoreConnector(store, ns, block_size, chunk, layout, part_ends,
    regions)``: part p of the producer holds layers [part_ends[p-1],
    part_ends[p]); regions are this process's (desc, buffer) pairs, kept
    alive here. remote_wait_ms > 0: the parts of other processes come from
    their records in the store's directory (the connector holding part 0
    counts the quorum). The store must outlive the connector. close()
    waits for the save in progress (queued ones are dropped)."""

    _destroy, _what = "kvr_store_conn_destroy", "store connector"

    def __init__(self, store: Store, ns: bytes, block_size: int, chunk: int,
                 layout: Layout, part_ends: Sequence[int],
                 regions: Sequence[Tuple[RegionDesc, BufferLike]],
                 remote_wait_ms: int = 0, writable: bool = True) -> None:
        if len(ns) != T.STORE_NS_BYTES:
            raise invalid(f"namespace of {len(ns)} bytes, not 16")
        self._keep: List[Any] = [store]
        regs = (T.StoreRegion * (len(regions) + 1))()
        for i, (desc, buf) in enumerate(regions):
            addr, size, k = address_of(buf, writable, f"region {i}")
            if size < desc.nbytes:
                raise invalid(f"region {i}: buffer of {size} bytes, the "
                              f"region needs {desc.nbytes}")
            regs[i] = T.StoreRegion(desc.to_c(), addr)
            self._keep += [k, buf]
        ends = (ctypes.c_uint32 * (len(part_ends) + 1))(*part_ends)
        nsb = (ctypes.c_uint8 * T.STORE_NS_BYTES)(*ns)
        prm = T.StoreConnParams(store._handle(), nsb, block_size, chunk,
                                layout.to_c(), len(part_ends), ends, regs,
                                len(regions), remote_wait_ms)
        handle, err = ctypes.c_void_p(), new_error()
        check(LIB.kvr_store_conn_create(ctypes.byref(prm),
                                        ctypes.byref(handle),
                                        ctypes.byref(err)), err)
        self._h = handle

    def save(self, request: RequestId, generation: int,
             chains: Sequence[bytes], src_blocks: Any) -> None:
        """Queues the save of operation (request, generation); a newer
        generation of a request drops its older saves still queued (they
        end CANCELED), an older or repeated one is refused."""
        rid, hashes = _bytes(request), _hash_array(chains)
        table = block_table(src_blocks, "src_blocks")
        r = T.StoreSaveReq(ctypes.cast(ctypes.c_char_p(rid), ctypes.c_void_p),
                           len(rid), generation, hashes, len(chains),
                           _u32_ptr(table), table.size)
        err = new_error()
        check(LIB.kvr_store_conn_save(self._handle(), ctypes.byref(r),
                                      ctypes.byref(err)), err)

    def part_saved(self, request: RequestId, generation: int, part: int,
                   status: int = 0) -> None:
        """A part held by another process reported its save."""
        rid, err = _bytes(request), new_error()
        check(LIB.kvr_store_conn_part_saved(self._handle(), rid, len(rid),
                                            generation, part, status,
                                            ctypes.byref(err)), err)

    def send_done(self, request: RequestId, status: int = 0) -> None:
        """The request's send finished (the agent's SENT or a failure)."""
        rid, err = _bytes(request), new_error()
        check(LIB.kvr_store_conn_send_done(self._handle(), rid, len(rid),
                                           status, ctypes.byref(err)), err)

    def poll(self) -> List[StoreEvent]:
        """Every event queued now, oldest first."""
        out: List[StoreEvent] = []
        ev = T.StoreEvent()
        while LIB.kvr_store_conn_poll(self._handle(), ctypes.byref(ev)):
            out.append(StoreEvent(
                LIB.kvr_store_event_name(ev.kind).decode(),
                bytes(ev.request[:ev.request_len]), ev.generation, ev.part,
                ev.status, ev.message.decode(errors="replace"), ev.bytes,
                ev.chunks))
        return out

    def fileno(self) -> int:
        """Readable while events are queued (for select/poll)."""
        return int(LIB.kvr_store_conn_event_fd(self._handle()))

    def load(self, request: RequestId, generation: int,
             chains: Sequence[bytes], dst_blocks: Any, rank: int = 0,
             max_tokens: Optional[int] = None) -> Tuple[int, int]:
        """Loads the longest prefix present in every part into this rank's
        regions: (tokens, chunk bytes read). A generation older than the
        request's latest load is refused (ERR_CANCELED)."""
        rid, hashes = _bytes(request), _hash_array(chains)
        table = block_table(dst_blocks, "dst_blocks")
        cap = (1 << 64) - 1 if max_tokens is None else max_tokens
        r = T.StoreLoadReq(ctypes.cast(ctypes.c_char_p(rid), ctypes.c_void_p),
                           len(rid), generation, hashes, len(chains),
                           _u32_ptr(table), table.size, rank, cap)
        tokens, nbytes, err = ctypes.c_uint64(), ctypes.c_uint64(), new_error()
        check(LIB.kvr_store_conn_load(self._handle(), ctypes.byref(r),
                                      ctypes.byref(tokens),
                                      ctypes.byref(nbytes),
                                      ctypes.byref(err)), err)
        return tokens.value, nbytes.value

    def forget(self, request: RequestId) -> None:
        """Drops the request's latest save and load generations."""
        rid, err = _bytes(request), new_error()
        check(LIB.kvr_store_conn_forget(self._handle(), rid, len(rid),
                                        ctypes.byref(err)), err)


__all__ = ["ChunkKey", "Store", "StoreConnector", "StoreEvent",
           "store_chains", "store_namespace", "store_verify"]
