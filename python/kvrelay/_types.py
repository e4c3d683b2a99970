"""ctypes mirrors of kvrelay's public C structs.

Every class names its C type in ``_c_name_`` and its header in ``_c_header_``;
field names are the C field names, so ``tests/test_abi.py`` can compile a
program that prints the C sizes and offsets and compare them with these.
"""

from __future__ import annotations

import ctypes

import numpy as np

_u8, _u16, _u32, _u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
_int, _bool, _size = ctypes.c_int, ctypes.c_bool, ctypes.c_size_t

ERROR_MSG_MAX = 256
INSPECT_KINDS = 3
INSPECT_EXCERPT = 16


class Error(ctypes.Structure):
    _c_name_ = "kvr_error_t"
    _c_header_ = "kvrelay/status.h"
    _fields_ = [("code", _int), ("msg", ctypes.c_char * ERROR_MSG_MAX)]


class Layout(ctypes.Structure):
    _c_name_ = "kvr_layout_t"
    _c_header_ = "kvrelay/layout.h"
    _fields_ = [
        ("block_size", _u32),
        ("dcp_size", _u32),
        ("interleave", _u32),
        ("tp", _u32),
        ("producer_tp", _u32),
        ("replicate_index", _bool),
        ("preshuffle", _bool),
        ("producer_replicate_index", _bool),
        ("producer_dcp", _u32),
        ("producer_interleave", _u32),
        ("producer_block_size", _u32),
    ]


class RegionDesc(ctypes.Structure):
    _c_name_ = "kvr_region_desc_t"
    _c_header_ = "kvrelay/layout.h"
    _fields_ = [
        ("role", _int),
        ("layer", _u32),
        ("num_blocks", _u64),
        ("page_bytes", _u64),
        ("index_dim", _u32),
        ("quant_block", _u32),
        ("bytes", _u64),
        ("heads", _u32),
        ("head_dim", _u32),
        ("elem_bytes", _u32),
        ("kv_planes", _u32),
        ("hnd", _bool),
    ]


class RegionPair(ctypes.Structure):
    _c_name_ = "kvr_region_pair_t"
    _c_header_ = "kvrelay/plan.h"
    _fields_ = [("src", RegionDesc), ("dst", RegionDesc)]


class Request(ctypes.Structure):
    _c_name_ = "kvr_request_t"
    _c_header_ = "kvrelay/plan.h"
    _fields_ = [
        ("src_blocks", ctypes.POINTER(_u32)),
        ("num_src_blocks", _size),
        ("dst_blocks", ctypes.POINTER(_u32)),
        ("num_dst_blocks", _size),
        ("num_tokens", _u64),
        ("num_computed_blocks", _u64),
    ]


class Run(ctypes.Structure):
    _c_name_ = "kvr_run_t"
    _c_header_ = "kvrelay/plan.h"
    _fields_ = [("src", _u64), ("dst", _u64), ("len", _u64)]


#: numpy view of kvr_run_t: plan runs come back as arrays of this dtype.
RUN_DTYPE = np.dtype([("src", "<u8"), ("dst", "<u8"), ("len", "<u8")])


class InspectDiff(ctypes.Structure):
    _c_name_ = "kvr_inspect_diff_t"
    _c_header_ = "kvrelay/inspect.h"
    _fields_ = [
        ("kind", _int),
        ("request", _u32),
        ("rank", _u32),
        ("parts", _u32),
        ("token", _u64),
        ("part", _u32),
        ("excerpt_len", _u32),
        ("byte", _u64),
        ("src_offset", _u64),
        ("dst_offset", _u64),
        ("expected", _u8 * INSPECT_EXCERPT),
        ("found", _u8 * INSPECT_EXCERPT),
    ]


class InspectResult(ctypes.Structure):
    _c_name_ = "kvr_inspect_result_t"
    _c_header_ = "kvrelay/inspect.h"
    _fields_ = [
        ("checked", _u64 * INSPECT_KINDS),
        ("found", _u64 * INSPECT_KINDS),
        ("diffs", ctypes.POINTER(InspectDiff)),
        ("diffs_cap", _size),
        ("num_diffs", _size),
    ]


class InspectOpts(ctypes.Structure):
    _c_name_ = "kvr_inspect_opts_t"
    _c_header_ = "kvrelay/inspect.h"
    _fields_ = [
        ("max_report", _size),
        ("synthetic", _bool),
        ("seed", _u64),
        ("manifest_seed", _bool),
    ]


# ---- wire.h (the agent uses these) ----

WIRE_REQ_ID_MAX = 256
WIRE_KEY_BYTES = 32


class WireTopo(ctypes.Structure):
    _c_name_ = "kvr_wire_topo_t"
    _c_header_ = "kvrelay/wire.h"
    _fields_ = [(name, _u32) for name in (
        "pp_rank", "pp_size", "tp_rank", "tp_size", "dp_rank", "dp_size",
        "layer_start", "layer_end", "dcp_rank")]


class WireId(ctypes.Structure):
    _c_name_ = "kvr_wire_id_t"
    _c_header_ = "kvrelay/wire.h"
    _fields_ = [("len", _u16), ("bytes", _u8 * WIRE_REQ_ID_MAX)]


# ---- xfer.h: the loopback transport (an in-process data plane) ----


class LoopbackParams(ctypes.Structure):
    _c_name_ = "kvr_loopback_params_t"
    _c_header_ = "kvrelay/xfer.h"
    _fields_ = [
        ("id", _u64),
        ("max_inflight", _u32),
        ("msg_queue_max", _u32),
        ("fail_put_at", _u64),
        ("corrupt_put_at", _u64),
        ("drop_msg_at", _u64),
        ("dup_msg_at", _u64),
        ("delay_ms", _u32),
        ("mem_limit", _u64),
        ("no_map", _bool),
    ]


# ---- agent.h ----

AGENT_INSTANCE_MAX = 64
AGENT_NOTIFY_MAX = 16384
AGENT_ADDRESS_MAX = 256  # kvr_agent_notify_t.sender_address


class AgentParams(ctypes.Structure):
    _c_name_ = "kvr_agent_params_t"
    _c_header_ = "kvrelay/agent.h"
    _fields_ = [
        ("instance_id", ctypes.c_char_p),  # const void *: bytes, any content
        ("instance_id_len", _size),
        ("role", _int),
        ("layout", Layout),
        ("topo", WireTopo),
        ("listen", ctypes.c_char_p),
        ("advertise", ctypes.c_char_p),
        ("bootstrap", ctypes.c_char_p),
        ("key", ctypes.POINTER(_u8)),
        ("insecure", _bool),
        ("tl", _int),
        ("loopback_hub", ctypes.c_void_p),
        ("loopback", LoopbackParams),
        ("executor", _int),
        ("progress_thread", _bool),
        ("deadline_ms", _u32),
        ("grace_ms", _u32),
        ("lease_ms", _u32),
        ("unknown_wait_ms", _u32),
        ("idle_close_ms", _u32),
        ("connect_timeout_ms", _u32),
        ("max_requests", _u32),
        ("cuda_device", _int),
        ("handshake_timeout_ms", _u32),
        ("max_unauth_links", _u32),
    ]


class AgentSend(ctypes.Structure):
    _c_name_ = "kvr_agent_send_t"
    _c_header_ = "kvrelay/agent.h"
    _fields_ = [
        ("request_id", ctypes.c_char_p),
        ("request_id_len", _size),
        ("src_blocks", ctypes.POINTER(_u32)),
        ("num_src_blocks", _size),
        ("num_tokens", _u64),
        ("lease_ms", _u32),
        ("groups", _u32),
    ]


class AgentRecv(ctypes.Structure):
    _c_name_ = "kvr_agent_recv_t"
    _c_header_ = "kvrelay/agent.h"
    _fields_ = [
        ("producer_id", ctypes.c_char_p),
        ("producer_id_len", _size),
        ("producer_address", ctypes.c_char_p),
        ("request_id", ctypes.c_char_p),
        ("request_id_len", _size),
        ("dst_blocks", ctypes.POINTER(_u32)),
        ("num_dst_blocks", _size),
        ("num_tokens", _u64),
        ("num_computed_blocks", _u64),
        ("deadline_ms", _u32),
        ("stream", _bool),
    ]


class AgentEvent(ctypes.Structure):
    _c_name_ = "kvr_agent_event_t"
    _c_header_ = "kvrelay/agent.h"
    _fields_ = [
        ("kind", _int),
        ("producer", WireId),
        ("request", WireId),
        ("status", _int),
        ("message", ctypes.c_char * ERROR_MSG_MAX),
        ("bytes", _u64),
        ("layer_begin", _u32),
        ("layer_end", _u32),
        ("peer", WireId),
    ]


class AgentNotify(ctypes.Structure):
    _c_name_ = "kvr_agent_notify_t"
    _c_header_ = "kvrelay/agent.h"
    _fields_ = [
        ("sender", WireId),
        ("sender_topo", WireTopo),
        ("sender_side", _int),
        ("sender_incarnation", _u64),
        ("sender_address", ctypes.c_char * AGENT_ADDRESS_MAX),
        ("dropped", _u32),
        ("len", _size),
        ("payload", _u8 * AGENT_NOTIFY_MAX),
    ]


class AgentReqStatus(ctypes.Structure):
    _c_name_ = "kvr_agent_req_status_t"
    _c_header_ = "kvrelay/agent.h"
    _fields_ = [
        ("send", _int),
        ("recv", _int),
        ("status", _int),
        ("message", ctypes.c_char * ERROR_MSG_MAX),
    ]


REQ_ID_MAX = 256
BLOCK_HASH_BYTES = 32
STORE_NS_BYTES = 16


class CompletionId(ctypes.Structure):
    _c_name_ = "kvr_completion_id_t"
    _c_header_ = "kvrelay/completion.h"
    _fields_ = [
        ("req_id", ctypes.c_void_p),
        ("req_id_len", _size),
        ("is_op", _bool),
        ("generation", ctypes.c_int64),
    ]


class QuorumParams(ctypes.Structure):
    _c_name_ = "kvr_quorum_params_t"
    _c_header_ = "kvrelay/completion.h"
    _fields_ = [
        ("members", _u32),
        ("max_pending", _size),
        ("tombstones", _size),
        ("tombstone_requests", _bool),
    ]


class QuorumResult(ctypes.Structure):
    _c_name_ = "kvr_quorum_result_t"
    _c_header_ = "kvrelay/completion.h"
    _fields_ = [("outcome", _int), ("status", _int), ("reported", _u32)]


class PairingParams(ctypes.Structure):
    _c_name_ = "kvr_pairing_params_t"
    _c_header_ = "kvrelay/completion.h"
    _fields_ = [
        ("max_requests", _size),
        ("max_events", _size),
        ("tombstones", _size),
    ]


class Release(ctypes.Structure):
    _c_name_ = "kvr_release_t"
    _c_header_ = "kvrelay/completion.h"
    _fields_ = [
        ("kind", _int),
        ("status", _int),
        ("is_op", _bool),
        ("generation", ctypes.c_int64),
        ("req_id_len", _size),
        ("req_id", _u8 * REQ_ID_MAX),
    ]


class BlockHash(ctypes.Structure):
    _c_name_ = "kvr_block_hash_t"
    _c_header_ = "kvrelay/completion.h"
    _fields_ = [("bytes", _u8 * BLOCK_HASH_BYTES)]


class OffloadDesc(ctypes.Structure):
    _c_name_ = "kvr_offload_desc_t"
    _c_header_ = "kvrelay/completion.h"
    _fields_ = [
        ("model_tag", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("block_size", _u32),
        ("chunk_size", _u32),
        ("tp", _u32),
        ("dcp_size", _u32),
        ("interleave", _u32),
        ("replicate_index", _bool),
        ("preshuffle", _bool),
        ("indexer_types", ctypes.POINTER(ctypes.c_char_p)),
        ("num_indexer_types", _size),
    ]


class ChunkKey(ctypes.Structure):
    _c_name_ = "kvr_chunk_key_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [
        ("ns", _u8 * STORE_NS_BYTES),
        ("chain", BlockHash),
        ("part", _u32),
    ]


class StoreOpts(ctypes.Structure):
    _c_name_ = "kvr_store_opts_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [
        ("dir", ctypes.c_char_p),
        ("host_bytes", _u64),
        ("verify_host", _bool),
        ("quick_scan", _bool),
        ("fast_checksum", _bool),
    ]


class StoreStats(ctypes.Structure):
    _c_name_ = "kvr_store_stats_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [(name, _u64) for name in (
        "host_bytes", "host_chunks", "host_hits", "disk_hits", "misses",
        "corrupt", "evictions", "scan_ok", "scan_dropped_temp",
        "scan_dropped_corrupt", "saved_bytes", "loaded_bytes")]


class StoreRegion(ctypes.Structure):
    _c_name_ = "kvr_store_region_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [("desc", RegionDesc), ("base", ctypes.c_void_p)]


class StoreIO(ctypes.Structure):
    _c_name_ = "kvr_store_io_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [
        ("ns", ctypes.POINTER(_u8)),
        ("part", _u32),
        ("block_size", _u32),
        ("chunk", _u64),
        ("chains", ctypes.POINTER(BlockHash)),
        ("num_chains", _size),
        ("lay", ctypes.POINTER(Layout)),
        ("rank", _u32),
        ("regions", ctypes.POINTER(StoreRegion)),
        ("num_regions", _size),
        ("blocks", ctypes.POINTER(_u32)),
        ("num_blocks", _size),
    ]


class StoreConnParams(ctypes.Structure):
    _c_name_ = "kvr_store_conn_params_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [
        ("store", ctypes.c_void_p),
        ("ns", ctypes.POINTER(_u8)),
        ("block_size", _u32),
        ("chunk", _u64),
        ("lay", Layout),
        ("parts", _u32),
        ("part_ends", ctypes.POINTER(_u32)),
        ("regions", ctypes.POINTER(StoreRegion)),
        ("num_regions", _size),
        ("remote_wait_ms", _u32),
    ]


class StoreEvent(ctypes.Structure):
    _c_name_ = "kvr_store_event_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [
        ("kind", _int),
        ("request", _u8 * REQ_ID_MAX),
        ("request_len", _size),
        ("generation", ctypes.c_int64),
        ("part", _u32),
        ("status", _int),
        ("message", ctypes.c_char * ERROR_MSG_MAX),
        ("bytes", _u64),
        ("chunks", _u64),
    ]


class StoreSaveReq(ctypes.Structure):
    _c_name_ = "kvr_store_save_req_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [
        ("request_id", ctypes.c_void_p),
        ("request_id_len", _size),
        ("generation", ctypes.c_int64),
        ("chains", ctypes.POINTER(BlockHash)),
        ("num_chains", _size),
        ("src_blocks", ctypes.POINTER(_u32)),
        ("num_src_blocks", _size),
    ]


class StoreLoadReq(ctypes.Structure):
    _c_name_ = "kvr_store_load_req_t"
    _c_header_ = "kvrelay/store.h"
    _fields_ = [
        ("request_id", ctypes.c_void_p),
        ("request_id_len", _size),
        ("generation", ctypes.c_int64),
        ("chains", ctypes.POINTER(BlockHash)),
        ("num_chains", _size),
        ("dst_blocks", ctypes.POINTER(_u32)),
        ("num_dst_blocks", _size),
        ("rank", _u32),
        ("max_tokens", _u64),
    ]


ALL = [Error, Layout, RegionDesc, RegionPair, Request, Run, InspectDiff,
       InspectResult, InspectOpts, WireTopo, WireId, LoopbackParams, AgentParams, AgentSend, AgentRecv,
       AgentEvent, AgentNotify, AgentReqStatus, CompletionId, QuorumParams,
       QuorumResult, PairingParams, Release, BlockHash, OffloadDesc, ChunkKey,
       StoreOpts, StoreStats, StoreRegion, StoreIO, StoreConnParams,
       StoreEvent, StoreSaveReq, StoreLoadReq]
