#!/usr/bin/env python3
"""Moves one request's KV cache between two Python processes with kvrelay.

The parent is the prefill side (a producer Agent): it fills its MLA and
index regions with synthetic KV, opens the request (send_open, send_ready)
and offers it to the decode side in a notification. A child process is the
decode side (a consumer Agent, DCP rank 0 of a group of one, acting as its
own router): it takes destination blocks from its pool, loads the request
with recv, then checks every byte against the synthetic source with the
verifier and ``inspect``. Exit 0 only when the child verified the request;
a failure on either side (for instance ERR_NO_SPACE for more tokens than
the decode pool holds, --tokens 5000) is printed by both sides and the exit
status is 1.

    python3 python/examples/two_process.py [--tokens 3001] [--dump DIR]

(with kvrelay installed by ``pip install ./python``; from a build tree
instead, prefix ``PYTHONPATH=python``). With --dump DIR the consumer also
writes a dump directory; then ``kvrelay inspect DIR`` checks the same bytes
from the command line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Dict, List, Optional

import numpy as np

import kvrelay as kv
from kvrelay import agent, synth

SEED = 11
MLA_LAYERS, INDEX_LAYERS = 4, 2  # index caches on layers 0 and 2
LAYOUT = kv.Layout(block_size=64, dcp_size=1)
SRC_POOL, DST_POOL = 128, 64
PRODUCER, CONSUMER = "prefill-0", "decode-0"
NO_SPACE = int(kv.Status.ERR_NO_SPACE)


def regions(consumer: bool) -> List[kv.RegionDesc]:
    pool = DST_POOL if consumer else SRC_POOL
    descs = [kv.RegionDesc.mla(LAYOUT, layer, 576, pool)
             for layer in range(MLA_LAYERS)]
    descs += [kv.RegionDesc.index(LAYOUT, 2 * i, 128, pool, consumer)
              for i in range(INDEX_LAYERS)]
    return descs


def source_blocks(num_tokens: int) -> np.ndarray:
    # scattered on purpose: the producer's block table is not the identity
    n = LAYOUT.num_src_blocks(num_tokens)
    return (np.arange(n, dtype=np.uint32) * 7 + 3) % SRC_POOL


def fill_sources(images: Dict[int, np.ndarray], descs: List[kv.RegionDesc],
                 src_blocks: np.ndarray, token_ids: np.ndarray) -> None:
    for i, d in enumerate(descs):
        images[i][:] = 0
        synth.fill_source(LAYOUT, d, SEED, src_blocks, token_ids, images[i])


class Loaded:
    """What the consumer checks: the request and both block tables."""

    def __init__(self, request_id: str, num_tokens: int, nbytes: int,
                 src_blocks: np.ndarray, dst_blocks: np.ndarray) -> None:
        self.request_id = request_id
        self.num_tokens = num_tokens
        self.bytes = nbytes
        self.src_blocks = src_blocks
        self.dst_blocks = dst_blocks
        self.num_computed_blocks = 0


# ---------------------------------------------------------------- consumer

def wait_offer(c: agent.Agent, timeout_s: float) -> Optional[agent.Notification]:
    for n in c.notifications(timeout=timeout_s):
        return n
    return None


def consumer(num_tokens: int, dump: str) -> int:
    descs = regions(consumer=True)
    with agent.Agent(CONSUMER, "consumer", LAYOUT, layers=(0, MLA_LAYERS),
                     listen="127.0.0.1:0") as c:
        received = {i: c.alloc_region(d) for i, d in enumerate(descs)}
        for image in received.values():
            image[:] = 0
        c.start()
        print(f"listening {c.address}", flush=True)
        offer_note = wait_offer(c, 60)
        if offer_note is None:
            print("consumer: no offer within 60 s")
            return 1
        offer = json.loads(offer_note.payload)
        rid, tokens = offer["request"], int(offer["tokens"])
        need = LAYOUT.num_dst_blocks(tokens)
        if need > DST_POOL:
            why = (f"offer of {tokens} tokens needs {need} blocks, the decode "
                   f"pool has {DST_POOL}")
            c.notify(offer_note.sender, json.dumps(
                {"request": rid, "status": NO_SPACE, "why": why}).encode(),
                address=offer_note.sender_address)
            print(f"consumer: refused {rid} ERR_NO_SPACE: {why}", flush=True)
            time.sleep(0.5)  # the refusal leaves before the agent closes
            return 1
        dst = np.arange(need, dtype=np.uint32)  # the router's choice
        c.recv(offer_note.sender, offer_note.sender_address, rid, dst, tokens)
        outcome = None
        for e in c.events(timeout=60):
            if e.kind in (agent.EventKind.LOADED, agent.EventKind.LOAD_FAILED):
                outcome = e
            if e.kind == agent.EventKind.RELEASED:
                break
        if outcome is None or not outcome.ok:
            detail = f"{outcome.status_name}: {outcome.message}" if outcome \
                else "no outcome within 60 s"
            print(f"consumer: LOAD_FAILED {rid} {detail}")
            return 1
        loaded = Loaded(rid, tokens, outcome.bytes,
                        np.asarray(offer["src_blocks"], dtype=np.uint32), dst)
        return check(loaded, descs, received, dump)


def check(event: Loaded, dst_descs: List[kv.RegionDesc],
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
    print(f"verified {event.request_id}: {n} tokens, {event.bytes} "
          f"bytes in {len(dst_descs)} regions, {event.dst_blocks.size} "
          f"destination blocks")
    if dump:
        write(dump, src_descs, dst_descs, sources, received, event, token_ids)
    return 0


def write(directory: str, src_descs: List[kv.RegionDesc],
          dst_descs: List[kv.RegionDesc], sources: Dict[int, np.ndarray],
          received: Dict[int, np.ndarray], event: Loaded,
          token_ids: np.ndarray) -> None:
    regs = [kv.DumpRegion(kv.RegionPair(s, d), sources[i], [received[i]])
            for i, (s, d) in enumerate(zip(src_descs, dst_descs))]
    req = kv.DumpRequest(event.request_id,
                         kv.Request(event.src_blocks, event.dst_blocks,
                                    event.num_tokens), token_ids)
    kv.write_dump(directory, LAYOUT, regs, [req], seed=SEED)
    print(f"dump written to {directory} (check it: kvrelay inspect {directory})")


# ---------------------------------------------------------------- producer

def producer(address: str, num_tokens: int) -> bool:
    """Opens and offers the request; True once the consumer released it."""
    descs = regions(consumer=False)
    src_blocks = source_blocks(num_tokens)
    token_ids = synth.token_ids(num_tokens)
    with agent.Agent(PRODUCER, "producer", LAYOUT, layers=(0, MLA_LAYERS),
                     listen="127.0.0.1:0") as p:
        images = {i: p.alloc_region(d) for i, d in enumerate(descs)}
        fill_sources(images, descs, src_blocks, token_ids)
        p.start()
        t0 = time.monotonic()
        p.send_open("req-0", src_blocks, num_tokens, lease_ms=60000)
        p.send_ready("req-0")
        p.notify(CONSUMER, json.dumps(
            {"request": "req-0", "tokens": num_tokens,
             "src_blocks": src_blocks.tolist()}).encode(), address=address)
        done = None
        deadline = time.monotonic() + 60
        while done is None and time.monotonic() < deadline:
            for e in p.events(timeout=0.1):
                if e.final or e.kind == agent.EventKind.NOTIFY_FAILED:
                    done = e
                    break
            for n in p.notifications():
                answer = json.loads(n.payload)  # the router refused it
                p.send_abort(answer["request"])
                print(f"producer: SEND_FAILED {answer['request']} "
                      f"{kv.status_name(answer['status'])}: {answer['why']}",
                      flush=True)
                return False
        if done is None:
            print("producer: no outcome within 60 s", flush=True)
            return False
        detail = f": {done.message}" if done.message else ""
        print(f"producer: {done.kind.name} {done.request.decode() or 'req-0'} "
              f"{done.status_name} in {time.monotonic() - t0:.3f} s{detail}",
              flush=True)
        return done.kind == agent.EventKind.SENT


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
        sent = producer(first[1], args.tokens)
    except kv.KvrelayError as e:
        print(f"producer: {e}", flush=True)
        sent = False
    # The producer's agent is closed by now: a consumer still loading fails
    # (its stage's link is gone), so this wait is bounded by its deadline.
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
