"""kvrelay.Agent with KV in CUDA memory (gpu-direct, docs/agent.md): a
producer in this process and a decode rank in a spawned child (CUDA IPC maps
another process's memory), regions allocated by kvrelay on device 0, the
source copied in and handed over with a CUDA event, every byte the child
received verified. Skipped without a CUDA build and a device."""

import ctypes
import multiprocessing

import numpy as np
import pytest

import kvrelay as kv
from kvrelay import _lib, synth
from kvrelay.agent import Agent, EventKind

WAIT = 60.0
LAY = kv.Layout(block_size=16, dcp_size=1)
DESC = kv.RegionDesc.mla(LAY, 0, 96, 32)
SRC, DST, TOKENS, SEED = [5, 2, 9, 11], [3, 0, 7, 1], 60, 21

_P, _E = ctypes.c_void_p, ctypes.c_void_p  # err may be NULL
for name, res, args in (
        ("kvr_gpu_device_count", ctypes.c_int, [ctypes.POINTER(ctypes.c_int), _E]),
        ("kvr_gpu_memcpy", ctypes.c_int, [_P, _P, ctypes.c_size_t, _E]),
        ("kvr_gpu_stream_create", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_P), _E]),
        ("kvr_gpu_stream_destroy", None, [_P]),
        ("kvr_gpu_event_create", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_P), _E]),
        ("kvr_gpu_event_destroy", None, [_P]),
        ("kvr_gpu_event_record", ctypes.c_int, [_P, _P, _E])):
    _lib.LIB.declare(name, res, args)
GPU = _lib.LIB


def source() -> np.ndarray:
    src = np.zeros(DESC.nbytes, np.uint8)
    synth.fill_source(LAY, DESC, SEED, SRC, synth.token_ids(TOKENS), src)
    return src


def device_count() -> int:
    if not GPU.has("kvr_gpu_device_count"):
        return 0
    n = ctypes.c_int(0)
    return n.value if GPU.kvr_gpu_device_count(ctypes.byref(n), None) == 0 else 0


def consumer(address: str, out) -> None:
    """The decode rank (a spawned process): loads the request into device
    memory, copies it back and verifies it; sends "ok" or the failure."""
    try:
        with Agent("decode-gpu", "consumer", LAY, layers=(0, 1),
                   cuda_device=0) as c:
            dst = c.alloc_region(DESC)
            c.start()
            c.recv("prefill-gpu", address, "req-gpu", DST, TOKENS)
            kinds = []
            for e in c.events(WAIT):
                kinds.append((e.kind.name, e.status_name, e.message))
                if e.kind == EventKind.RELEASED:
                    break
            assert [k[0] for k in kinds] == ["LOADED", "RELEASED"], kinds
            host = np.zeros(DESC.nbytes, np.uint8)
            assert GPU.kvr_gpu_memcpy(host.ctypes.data, dst.address,
                                      host.nbytes, None) == 0
            kv.verify_region(LAY, 0, kv.RegionPair(DESC, DESC),
                             kv.Request(SRC, DST, TOKENS), source(), host)
        out.send("ok")
    except BaseException as e:  # the parent reports it
        out.send(repr(e))


def test_gpu_direct_from_python():
    if device_count() == 0:
        pytest.skip("no CUDA device, or kvrelay built without CUDA")
    stream, event = ctypes.c_void_p(), ctypes.c_void_p()
    assert GPU.kvr_gpu_stream_create(0, ctypes.byref(stream), None) == 0
    assert GPU.kvr_gpu_event_create(0, ctypes.byref(event), None) == 0
    ctx = multiprocessing.get_context("spawn")  # no fork after CUDA
    parent, child = ctx.Pipe()
    proc = None
    try:
        with Agent("prefill-gpu", "producer", LAY, layers=(0, 1),
                   listen="127.0.0.1:0", cuda_device=0) as p:
            src = p.alloc_region(DESC)
            assert isinstance(src, kv.RawBuffer) and src.size == DESC.nbytes
            with pytest.raises(kv.KvrelayError) as e:
                p.add_region(kv.RegionDesc.mla(LAY, 1, 96, 32),
                             np.zeros(DESC.nbytes, np.uint8))
            assert "RawBuffer" in e.value.message
            p.start()
            host = source()
            assert GPU.kvr_gpu_memcpy(src.address, host.ctypes.data,
                                      host.nbytes, None) == 0
            assert GPU.kvr_gpu_event_record(event, stream, None) == 0
            p.send_open("req-gpu", SRC, TOKENS)
            p.send_ready("req-gpu", cuda_event=event.value)
            proc = ctx.Process(target=consumer, args=(p.address, child))
            proc.start()
            verdict = parent.recv() if parent.poll(WAIT) else "no answer"
            assert verdict == "ok", verdict
            sent = next((e for e in p.events(WAIT)
                         if e.kind == EventKind.SENT), None)
            assert sent is not None and sent.ok and sent.bytes > 0
    finally:
        if proc is not None:
            proc.join(WAIT)
            if proc.is_alive():
                proc.kill()
        GPU.kvr_gpu_event_destroy(event)
        GPU.kvr_gpu_stream_destroy(stream)
