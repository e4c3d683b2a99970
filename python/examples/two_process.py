#!/usr/bin/env python3
"""Moves one request's KV cache between two Python processes with kvrelay.

The parent is the prefill side (producer): it fills its MLA and index
regions with synthetic KV and offers the request. A child process is the
decode side (consumer, DCP rank 0 and so the leader): it assigns destination
blocks from its pool, receives, then checks every byte against the
synthetic source with the verifier and ``inspect``. Exit 0 only when the
child verified the request; a failure on either side (for instance
ERR_NO_SPACE for more tokens than the decode pool holds, --tokens 5000) is
printed by both sides and the exit status is 1.

    python3 python/examples/two_process.py [--tokens 3001] [--dump DIR]

(with kvrelay installed by ``pip install ./python``; from a build tree
instead, prefix ``PYTHONPATH=python``). With --dump DIR the consumer also
writes a dump directory; then ``kvrelay inspect DIR`` checks the same bytes
from the command line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np

import kvrelay as kv
from kvrelay import conn, synth

SEED = 11
MLA_LAYERS, INDEX_LAYERS = 4, 2  # index caches on layers 0 and 2
LAYOUT = kv.Layout(block_size=64, dcp_size=1)
SRC_POOL, DST_POOL = 128, 64


def regions(consumer: bool) -> List[kv.RegionDesc]:
    pool = DST_POOL if consumer else SRC_POOL
    descs = [kv.RegionDesc.mla(LAYOUT, layer, 576, pool)
             for layer in range(MLA_LAYERS)]
    descs += [kv.RegionDesc.index(LAYOUT, 2 * i, 128, pool, consumer)
              for i in range(INDEX_LAYERS)]
    return descs


def topology() -> conn.Topology:
    return conn.Topology(layer_start=0, layer_end=MLA_LAYERS)


def source_blocks(num_tokens: int) -> np.ndarray:
    # scattered on purpose: the producer's block table is not the identity
    n = LAYOUT.num_src_blocks(num_tokens)
    return (np.arange(n, dtype=np.uint32) * 7 + 3) % SRC_POOL


def fill_sources(images: Dict[int, np.ndarray], descs: List[kv.RegionDesc],
                 src_blocks: np.ndarray, token_ids: np.ndarray) -> None:
    for i, d in enumerate(descs):
        images[i][:] = 0
        synth.fill_source(LAYOUT, d, SEED, src_blocks, token_ids, images[i])


# ---------------------------------------------------------------- consumer

def consumer(num_tokens: int, dump: str) -> int:
    descs = regions(consumer=True)
    with conn.Connector(conn.Side.CONSUMER, LAYOUT, topology=topology(),
                        producer_stages=1, leader_blocks=DST_POOL) as c:
        received = {i: c.alloc_region(d) for i, d in enumerate(descs)}
        for image in received.values():
            image[:] = 0
        print(f"listening {c.listen('127.0.0.1', 0)}", flush=True)
        try:
            events = c.run_until(consumer_done, timeout_s=60)
        except kv.KvrelayError as e:
            print(f"consumer: {e}")
            return 1
        for _ in range(10):  # let RELEASE reach the producer
            c.progress(5)
        loaded = [e for e in events if e.kind == conn.EventKind.LOADED]
        if not loaded:
            # a refused offer (LOAD_FAILED) or a producer gone (PEER_LOST)
            last = events[-1]
            print(f"consumer: {last.kind.name} {last.request_id.decode()} "
                  f"{last.status_name}: {last.message}")
            return 1
        return check(loaded[0].raise_for_status(), descs, received, dump)


def consumer_done(events: List[conn.Event]) -> bool:
    """The leader's request is over: loaded and released by the group,
    failed, or the producer went away before anything arrived."""
    kinds = {e.kind for e in events}
    if conn.EventKind.LOADED in kinds:
        return conn.EventKind.GROUP_DONE in kinds
    return bool(kinds & {conn.EventKind.LOAD_FAILED, conn.EventKind.PEER_LOST})


def check(event: conn.Event, dst_descs: List[kv.RegionDesc],
          received: Dict[int, np.ndarray], dump: str) -> int:
    """Rebuilds the synthetic source from the event's tables and checks
    every received byte of every region."""
    n = event.num_tokens
    token_ids = synth.token_ids(n)
    src_descs = regions(consumer=False)
    sources = {i: np.zeros(d.nbytes, np.uint8) for i, d in enumerate(src_descs)}
    fill_sources(sources, src_descs, event.src_blocks, token_ids)
    request = kv.Request(event.src_blocks, event.dst_blocks, n,
                         event.num_computed_blocks)
    for i, (s, d) in enumerate(zip(src_descs, dst_descs)):
        pair = kv.RegionPair(s, d)
        kv.verify_region(LAYOUT, 0, pair, request, sources[i], received[i])
        found = kv.inspect_buffers(LAYOUT, 0, pair, request, sources[i],
                                   received[i], synthetic=True, seed=SEED)
        if not found.clean:
            print(f"region {i}: {found.summary()} {found.diffs[:3]}")
            return 1
    print(f"verified {event.request_id.decode()}: {n} tokens, {event.bytes} "
          f"bytes in {len(dst_descs)} regions, {event.dst_blocks.size} "
          f"destination blocks")
    if dump:
        write(dump, src_descs, dst_descs, sources, received, event, token_ids)
    return 0


def write(directory: str, src_descs: List[kv.RegionDesc],
          dst_descs: List[kv.RegionDesc], sources: Dict[int, np.ndarray],
          received: Dict[int, np.ndarray], event: conn.Event,
          token_ids: np.ndarray) -> None:
    regs = [kv.DumpRegion(kv.RegionPair(s, d), sources[i], [received[i]])
            for i, (s, d) in enumerate(zip(src_descs, dst_descs))]
    req = kv.DumpRequest(event.request_id.decode(),
                         kv.Request(event.src_blocks, event.dst_blocks,
                                    event.num_tokens), token_ids)
    kv.write_dump(directory, LAYOUT, regs, [req], seed=SEED)
    print(f"dump written to {directory} (check it: kvrelay inspect {directory})")


# ---------------------------------------------------------------- producer

def producer(port: int, num_tokens: int) -> bool:
    """Offers the request; True once every consumer rank released it."""
    descs = regions(consumer=False)
    src_blocks = source_blocks(num_tokens)
    token_ids = synth.token_ids(num_tokens)
    with conn.Connector(conn.Side.PRODUCER, LAYOUT, topology=topology(),
                        consumer_ranks=1) as p:
        images = {i: p.alloc_region(d) for i, d in enumerate(descs)}
        fill_sources(images, descs, src_blocks, token_ids)
        p.connect("127.0.0.1", port)
        t0 = time.monotonic()
        p.offer("req-0", num_tokens, src_blocks, prompt=token_ids)
        events = p.run_until(
            lambda ev: conn.count(ev, conn.EventKind.SENT)
            + conn.count(ev, conn.EventKind.SEND_FAILED) > 0, timeout_s=60)
        done = events[-1]
        detail = f": {done.message}" if done.message else ""
        print(f"producer: {done.kind.name} {done.request_id.decode()} "
              f"{done.status_name} in {time.monotonic() - t0:.3f} s{detail}",
              flush=True)
        return done.ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=3001)
    ap.add_argument("--dump", default="", help="consumer writes a dump here")
    ap.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consumer:
        return consumer(args.tokens, args.dump)
    child = subprocess.Popen(
        [sys.executable, __file__, "--consumer", "--tokens", str(args.tokens),
         "--dump", args.dump], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    first = child.stdout.readline().split()
    if len(first) != 2 or first[0] != "listening":
        child.kill()
        print(f"consumer did not start: {first}")
        return 1
    try:
        sent = producer(int(first[1]), args.tokens)
    except kv.KvrelayError as e:
        print(f"producer: {e}", flush=True)
        sent = False
    # The producer's connector is closed by now: a consumer still waiting
    # sees PEER_LOST and exits, so this wait is bounded by its own deadline.
    try:
        out, _ = child.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
        out += "consumer: killed after 90 s\n"
    print(out, end="")
    return 0 if sent and child.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
