"""kvrelay: move LLM KV cache from prefill (producer) to decode (consumer)
nodes whose parallel layouts differ: ctypes bindings of libkvrelay.so.

The C API shows through: every call maps to one kvr_* function, every
failure raises ``KvrelayError`` carrying kvrelay's status code, name and
message, and plan runs are numpy views of the C memory.

Modules: ``layout`` (Layout, RegionDesc, RegionPair, Role and the DCP math),
``plan`` (plan, PlanSet, verify_region, check_coverage, layout_digest),
``inspect`` (per-token diff of received pages), ``dump`` (dump directories),
``synth`` (synthetic KV), ``capacity``, ``agent`` (``Agent``: the connector
an engine worker embeds, any number of prefill and decode instances, callable
from any thread), ``books`` (Quorum, Pairing, prefix hashes, offload keys),
``store`` (Store: the offload tier's chunks, saved and loaded through the
planner; StoreConnector: saves beside the transfer with send/save pairing,
the PP quorum and generations).
"""

from __future__ import annotations

from ._buffers import RawBuffer
from ._lib import LIB as _LIB
from .agent import Agent, AgentRole, LoopbackHub, Topology
from .books import (OffloadDesc, PairOutcome, PairRelease, Pairing, Quorum,
                    QuorumOutcome, QuorumReport, ReleaseKind, aligned_prefix,
                    offload_key, offload_namespace, prefix_cached,
                    prefix_hashes)
from .capacity import Capacity, CapacityOption, capacity
from .dump import DumpRegion, DumpRequest, write_dump
from .errors import KvrelayError, Status, status_name, status_str
from .inspect import Diff, Inspection, inspect_buffers, inspect_dump
from .layout import Axis, Layout, RegionDesc, RegionPair, Role, index_stride
from .plan import (Plan, PlanSet, Request, check_coverage, check_coverage_pair,
                   layout_digest, plan, plan_pair, sources, verify_region,
                   verify_region_pair)
from .store import (ChunkKey, Store, StoreConnector, StoreEvent,
                    store_chains, store_namespace, store_verify)
from ._types import RUN_DTYPE

__version__ = "0.1.0"


def library_path() -> str:
    """Path of the libkvrelay.so this package loaded."""
    return str(_LIB.path)


def library_version() -> "str | None":
    """Version string built into the loaded library."""
    return _LIB.version()


__all__ = [
    "Agent", "AgentRole", "Axis", "Capacity", "CapacityOption", "ChunkKey",
    "Diff", "OffloadDesc", "PairOutcome", "PairRelease", "Pairing", "Quorum",
    "QuorumOutcome", "QuorumReport", "ReleaseKind", "Store",
    "StoreConnector", "StoreEvent", "aligned_prefix",
    "offload_key", "offload_namespace", "prefix_cached", "prefix_hashes",
    "store_chains", "store_namespace", "store_verify",
    "DumpRegion", "DumpRequest", "Inspection", "KvrelayError", "Layout",
    "LoopbackHub", "Plan", "PlanSet", "RUN_DTYPE", "RawBuffer",
    "RegionDesc", "RegionPair", "Request", "Role", "Status", "Topology",
    "capacity", "check_coverage", "check_coverage_pair", "index_stride",
    "inspect_buffers", "inspect_dump", "layout_digest", "library_path",
    "library_version", "plan", "plan_pair", "sources", "status_name",
    "status_str", "verify_region", "verify_region_pair", "write_dump",
]
