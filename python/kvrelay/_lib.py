"""Locating and loading libkvrelay.so, and the C prototypes.

Search order: the ``KVRELAY_LIB`` environment variable when set (a path to
the library; an error if it does not exist), then the ``libkvrelay.so``
that ``pip install`` put in the package (``pip install -e`` too), then ``build/lib/libkvrelay.so``
of the repository checkout this package sits in (``python/kvrelay`` ->
repository root), for use straight from a source tree.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _types as T

LIB_ENV = "KVRELAY_LIB"
_NAME = "libkvrelay.so"
# what libkvrelay.so links from the system (Debian 12 package names)
_RUNTIME_PACKAGES = "libsodium23 libjansson4 libucx0 libssl3"


def _candidates() -> List[Path]:
    here = Path(__file__).resolve().parent
    # every folder of the package: an editable install (pip install -e)
    # has the library in site-packages and the sources in the checkout
    package = getattr(sys.modules.get(__package__ or ""), "__path__", [])
    folders = [Path(f).resolve() for f in package] + [here]
    found = [f / _NAME for i, f in enumerate(folders) if f not in folders[:i]]
    if (here.parent.parent / "CMakeLists.txt").is_file():
        found.append(here.parent.parent / "build" / "lib" / _NAME)
    return found


def _find() -> Path:
    env = os.environ.get(LIB_ENV)
    if env:
        path = Path(env)
        if not path.is_file():
            raise ImportError(f"kvrelay: {LIB_ENV}={env} is not a file")
        return path
    tried: List[str] = []
    for path in _candidates():
        if path.is_file():
            return path
        tried.append(str(path))
    raise ImportError(
        "kvrelay: libkvrelay.so not found (looked in "
        + ", ".join(tried)
        + f"); install the package (pip install ./python), build it "
        f"(cmake --build build) or set {LIB_ENV}"
    )


def _load(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise ImportError(
            f"kvrelay: cannot load {path}: {e} (it needs the system libraries "
            f"of the Debian packages {_RUNTIME_PACKAGES})") from e


c_u32p = ctypes.POINTER(ctypes.c_uint32)
_P = ctypes.c_void_p
_E = ctypes.POINTER(T.Error)
_LAY = ctypes.POINTER(T.Layout)
_DESC = ctypes.POINTER(T.RegionDesc)
_PAIR = ctypes.POINTER(T.RegionPair)
_REQ = ctypes.POINTER(T.Request)
_u32, _u64, _int = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
_CID = ctypes.POINTER(T.CompletionId)
_HASH = ctypes.POINTER(T.BlockHash)
_ODESC = ctypes.POINTER(T.OffloadDesc)
_KEY = ctypes.POINTER(T.ChunkKey)
# kvr_store_bad_fn: void (*)(const char *name, const char *why, void *arg)
BAD_FN = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p)
_BADFN = BAD_FN
_sz, _b, _s = ctypes.c_size_t, ctypes.c_bool, ctypes.c_char_p

# name: (restype, argtypes). Functions of layers absent from a build are
# simply missing; require() names them.
_PROTOTYPES: Dict[str, Tuple[Any, Sequence[Any]]] = {
    # version (older libraries have only the kvr__shared_version array)
    "kvr_version": (_s, []),
    # status.h / layout.h
    "kvr_status_str": (_s, [_int]),
    "kvr_status_name": (_s, [_int]),
    "kvr_role_name": (_s, [_int]),
    "kvr_layout_check": (_int, [_LAY, _E]),
    "kvr_layout_check_rank": (_int, [_LAY, _u32, _E]),
    "kvr_virtual_block": (_u64, [_LAY]),
    "kvr_owner": (_u32, [_LAY, _u64]),
    "kvr_local_index": (_u64, [_LAY, _u64]),
    "kvr_global_index": (_u64, [_LAY, _u64, _u32]),
    "kvr_local_len": (_u64, [_LAY, _u64, _u32]),
    "kvr_num_dst_blocks": (_u64, [_LAY, _u64]),
    "kvr_num_src_blocks": (_u64, [_LAY, _u64]),
    "kvr_index_stride": (_u64, [_u32]),
    "kvr_index_page_tokens": (_u64, [_LAY, _b]),
    "kvr_index_key_offset": (_u64, [_LAY, _u32, _u64, _u32]),
    "kvr_index_scale_offset": (_u64, [_u64, _u32, _u64]),
    "kvr_region_bytes": (_u64, [_DESC]),
    "kvr_region_check": (_int, [_LAY, _DESC, _b, _E]),
    "kvr_region_token_bytes": (_u64, [_LAY, _DESC]),
    "kvr_region_token_bytes_side": (_u64, [_LAY, _DESC, _b]),
    "kvr_producer_dcp": (_u32, [_LAY]),
    "kvr_producer_interleave": (_u32, [_LAY]),
    "kvr_producer_block_size": (_u32, [_LAY]),
    "kvr_layout_producer_plain": (_b, [_LAY]),
    "kvr_dense_local_heads": (_u32, [_LAY, _DESC, _b]),
    "kvr_dense_first_head": (_u32, [_LAY, _DESC, _b, _u32]),
    "kvr_dense_page_bytes": (_u64, [_LAY, _DESC, _b]),
    # plan.h
    "kvr_plan_create": (_int, [_LAY, _u32, _PAIR, _REQ, ctypes.POINTER(_P), _E]),
    "kvr_plan_destroy": (None, [_P]),
    "kvr_plan_runs": (_P, [_P, ctypes.POINTER(_sz)]),
    "kvr_plan_num_runs": (_sz, [_P]),
    "kvr_plan_runs_uncoalesced": (_sz, [_P]),
    "kvr_plan_bytes": (_u64, [_P]),
    "kvr_plan_set_create": (
        _int, [_LAY, _u32, _PAIR, _sz, _REQ, ctypes.POINTER(_P), _E]),
    "kvr_plan_set_destroy": (None, [_P]),
    "kvr_plan_set_num_classes": (_sz, [_P]),
    "kvr_plan_set_class": (_P, [_P, _sz]),
    "kvr_plan_set_class_of": (_sz, [_P, _sz]),
    "kvr_plan_set_plan_of": (_P, [_P, _sz]),
    "kvr_plan_set_total_bytes": (_u64, [_P]),
    "kvr_plan_set_total_runs": (_u64, [_P]),
    "kvr_layout_digest": (
        _int, [_LAY, _DESC, _sz, ctypes.POINTER(_u64), _E]),
    "kvr_digest_hex": (None, [_u64, ctypes.c_char * 17]),
    "kvr_plan_apply_host": (None, [_P, _P, _P]),
    "kvr_verify_region": (_int, [_LAY, _u32, _PAIR, _REQ, _P, _P, _E]),
    "kvr_plan_check_coverage": (
        _int, [_LAY, _PAIR, _REQ, ctypes.POINTER(_P), _E]),
    "kvr_plan_from_runs": (_int, [_P, _sz, ctypes.POINTER(_P)]),
    "kvr_layout_digest_side": (
        _int, [_LAY, _DESC, _sz, _b, ctypes.POINTER(_u64), _E]),
    "kvr_region_axis": (_int, [_DESC]),
    "kvr_axis_ranks": (_u32, [_LAY, _int, _b]),
    "kvr_plan_create_pair": (
        _int, [_LAY, _u32, _u32, _PAIR, _REQ, ctypes.POINTER(_P), _E]),
    "kvr_plan_set_create_pair": (
        _int, [_LAY, _u32, _u32, _PAIR, _sz, _REQ, ctypes.POINTER(_P), _E]),
    "kvr_plan_sources": (
        _int, [_LAY, _PAIR, _u32, _REQ, c_u32p, _sz, ctypes.POINTER(_sz), _E]),
    "kvr_verify_region_pair": (
        _int, [_LAY, _u32, _u32, _PAIR, _REQ, _P, _P, _E]),
    "kvr_plan_check_coverage_pair": (
        _int, [_LAY, _PAIR, _REQ, ctypes.POINTER(_P), _E]),
    # synth.h
    "kvr_synth_latent": (None, [_u64, _u32, _u64, _u32, _P, _sz]),
    "kvr_synth_index_key": (None, [_u64, _u32, _u64, _u32, _P, _u32]),
    "kvr_synth_index_scale": (ctypes.c_float, [_P, _u32]),
    "kvr_synth_fill_source": (
        _int, [_LAY, _DESC, _u64, c_u32p, _sz, c_u32p, _u64, _P, _E]),
    "kvr_synth_check_index_token": (
        _int, [_LAY, _P, _u64, _u64, _u32, _u64, _E]),
    # inspect.h
    "kvr_inspect_buffers": (
        _int, [_LAY, _u32, _PAIR, _REQ, _P, _u64, _P, _u64,
               ctypes.POINTER(T.InspectOpts), ctypes.POINTER(T.InspectResult),
               _E]),
    "kvr_inspect_source": (
        _int, [_LAY, _PAIR, _REQ, c_u32p, _P, _u64,
               ctypes.POINTER(T.InspectOpts), ctypes.POINTER(T.InspectResult),
               _E]),
    "kvr_inspect_dump": (
        _int, [_s, ctypes.POINTER(T.InspectOpts), ctypes.POINTER(_P), _E]),
    "kvr_inspect_report_destroy": (None, [_P]),
    "kvr_inspect_report_clean": (_b, [_P]),
    # returns malloc'd text: keep it a raw pointer to free it
    "kvr_inspect_report_json": (_P, [_P]),
    "kvr_inspect_free": (None, [_P]),
    "kvr_inspect_part_name": (_s, [_u32]),
    "kvr_inspect_kind_name": (_s, [_int]),
    # xfer.h: the loopback data plane agents of one process can share
    "kvr_transport_loopback_create": (
        _int, [_P, ctypes.POINTER(T.LoopbackParams), ctypes.POINTER(_P), _E]),
    "kvr_transport_destroy": (None, [_P]),
    # agent.h (ids are (pointer, length) pairs: bytes go as c_char_p)
    "kvr_agent_create": (
        _int, [ctypes.POINTER(T.AgentParams), ctypes.POINTER(_P), _E]),
    "kvr_agent_destroy": (None, [_P]),
    "kvr_agent_last_error": (_s, [_P]),
    "kvr_agent_add_region": (_int, [_P, _DESC, _P, _u32]),
    "kvr_agent_alloc_region": (_int, [_P, _DESC, _u32, ctypes.POINTER(_P)]),
    "kvr_agent_start": (_int, [_P]),
    "kvr_agent_address": (_s, [_P]),
    "kvr_agent_incarnation": (_u64, [_P]),
    "kvr_agent_send_open": (_int, [_P, ctypes.POINTER(T.AgentSend)]),
    "kvr_agent_send_ready": (_int, [_P, _s, _sz, _u32, _u32, _P]),
    "kvr_agent_send_abort": (_int, [_P, _s, _sz]),
    "kvr_agent_recv": (_int, [_P, ctypes.POINTER(T.AgentRecv)]),
    "kvr_agent_recv_abort": (_int, [_P, _s, _sz, _s, _sz]),
    "kvr_agent_event_name": (_s, [_int]),
    "kvr_agent_poll": (_b, [_P, ctypes.POINTER(T.AgentEvent)]),
    "kvr_agent_event_fd": (_int, [_P]),
    "kvr_agent_notify": (_int, [_P, _s, _sz, _s, _s, _sz]),
    "kvr_agent_poll_notify": (_b, [_P, ctypes.POINTER(T.AgentNotify)]),
    "kvr_agent_send_state_name": (_s, [_int]),
    "kvr_agent_recv_state_name": (_s, [_int]),
    "kvr_agent_status": (
        _int, [_P, _s, _sz, _s, _sz, ctypes.POINTER(T.AgentReqStatus)]),
    "kvr_agent_progress": (_int, [_P, _u32]),
    "kvr_agent_wait": (_int, [_P, _u32]),
    # completion.h: the books (ids as kvr_completion_id_t)
    "kvr_quorum_create": (
        _int, [ctypes.POINTER(T.QuorumParams), ctypes.POINTER(_P), _E]),
    "kvr_quorum_destroy": (None, [_P]),
    "kvr_quorum_report": (
        _int, [_P, _CID, _u32, _int, ctypes.POINTER(T.QuorumResult), _E]),
    "kvr_quorum_cancel": (_int, [_P, _CID, _E]),
    "kvr_quorum_forget": (_int, [_P, _CID, _E]),
    "kvr_quorum_num_pending": (_sz, [_P]),
    "kvr_quorum_num_tombstones": (_sz, [_P]),
    "kvr_pairing_create": (
        _int, [ctypes.POINTER(T.PairingParams), ctypes.POINTER(_P), _E]),
    "kvr_pairing_destroy": (None, [_P]),
    "kvr_pairing_expect_save": (_int, [_P, _CID, _E]),
    "kvr_pairing_send_done": (
        _int, [_P, _CID, _int, ctypes.POINTER(_int), _E]),
    "kvr_pairing_save_done": (
        _int, [_P, _CID, _int, ctypes.POINTER(_int), _E]),
    "kvr_pairing_poll": (
        _int, [_P, ctypes.POINTER(T.Release), _sz, ctypes.POINTER(_sz), _E]),
    "kvr_pairing_forget": (_int, [_P, _CID, _E]),
    "kvr_pairing_num_requests": (_sz, [_P]),
    "kvr_pairing_num_events": (_sz, [_P]),
    "kvr_prefix_hashes": (
        _int, [_HASH, c_u32p, _sz, _u64, _HASH, _sz, ctypes.POINTER(_sz), _E]),
    "kvr_prefix_cached": (
        _int, [_LAY, _u64, _u64, ctypes.POINTER(_u64), ctypes.POINTER(_u64),
               _E]),
    "kvr_offload_key": (_int, [_ODESC, ctypes.c_char * 33, _E]),
    "kvr_offload_namespace": (_int, [_ODESC, _P, _sz, _E]),
    "kvr_offload_aligned_prefix": (
        _int, [ctypes.c_int64, _u64, ctypes.POINTER(_u64), _E]),
    # store.h
    "kvr_store_open": (
        _int, [ctypes.POINTER(T.StoreOpts), ctypes.POINTER(_P), _E]),
    "kvr_store_close": (None, [_P]),
    "kvr_store_stats": (None, [_P, ctypes.POINTER(T.StoreStats)]),
    "kvr_store_backend": (_s, [_P]),
    "kvr_store_put": (_int, [_P, _KEY, _P, _u64, _E]),
    "kvr_store_get": (_int, [_P, _KEY, _P, _u64, ctypes.POINTER(_u64), _E]),
    "kvr_store_contains": (_b, [_P, _KEY]),
    "kvr_store_verify": (
        _int, [_s, _BADFN, _P, ctypes.POINTER(_u64), ctypes.POINTER(_u64),
               _E]),
    "kvr_store_namespace": (
        _int, [_ODESC, _DESC, _sz, _s, ctypes.POINTER(ctypes.c_uint8), _E]),
    "kvr_store_chains": (
        _int, [c_u32p, _sz, _u64, _HASH, _sz, ctypes.POINTER(_sz), _E]),
    "kvr_store_save": (
        _int, [_P, ctypes.POINTER(T.StoreIO), ctypes.POINTER(_sz), _E]),
    "kvr_store_load": (
        _int, [_P, ctypes.POINTER(T.StoreIO), ctypes.POINTER(_u64), _E]),
    "kvr_store_conn_create": (
        _int, [ctypes.POINTER(T.StoreConnParams), ctypes.POINTER(_P), _E]),
    "kvr_store_conn_destroy": (None, [_P]),
    "kvr_store_conn_save": (_int, [_P, ctypes.POINTER(T.StoreSaveReq), _E]),
    "kvr_store_conn_part_saved": (
        _int, [_P, _P, _sz, ctypes.c_int64, ctypes.c_uint32, _int, _E]),
    "kvr_store_conn_send_done": (_int, [_P, _P, _sz, _int, _E]),
    "kvr_store_conn_poll": (_b, [_P, ctypes.POINTER(T.StoreEvent)]),
    "kvr_store_conn_event_fd": (_int, [_P]),
    "kvr_store_conn_load": (
        _int, [_P, ctypes.POINTER(T.StoreLoadReq), ctypes.POINTER(_u64),
               ctypes.POINTER(_u64), _E]),
    "kvr_store_conn_forget": (_int, [_P, _P, _sz, _E]),
    "kvr_store_event_name": (_s, [_int]),
    "kvr_agent_fd": (_int, [_P]),
}


class _Library:
    """The loaded library with prototypes applied."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dll = _load(path)
        self._missing: List[str] = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            self.declare(name, restype, argtypes)

    def declare(self, name: str, restype: Any, argtypes: Sequence[Any]) -> None:
        try:
            fn = getattr(self.dll, name)
        except AttributeError:
            self._missing.append(name)
            return
        fn.restype = restype
        fn.argtypes = list(argtypes)

    def has(self, name: str) -> bool:
        return hasattr(self.dll, name)

    def require(self, name: str) -> Any:
        """The C function `name`, or RuntimeError naming the library."""
        if not self.has(name):
            raise RuntimeError(
                f"kvrelay: {self.path} has no {name} (built without that layer?)")
        return getattr(self.dll, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("kvr_"):
            return self.require(name)
        raise AttributeError(name)

    def version(self) -> Optional[str]:
        """The library's version string: kvr_version() where the library
        has it, else its older kvr__shared_version array (None for a
        library with neither)."""
        if self.has("kvr_version"):
            return str(self.dll.kvr_version().decode())
        try:
            text = (ctypes.c_char * 64).in_dll(self.dll, "kvr__shared_version")
        except ValueError:
            return None
        return text.value.decode()


LIB = _Library(_find())
