"""python/examples/two_process.py moves a request between two processes and
its dump passes `inspect`; a request the decode pool cannot hold fails on
both sides."""

import os
import subprocess
import sys

import kvrelay as kv
from conftest import ROOT


def run_example(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python")
    return subprocess.run(
        [sys.executable, str(ROOT / "python" / "examples" / "two_process.py"),
         *args], capture_output=True, text=True, env=env, timeout=180)


def test_two_process_example(tmp_path):
    dump = tmp_path / "dump"
    out = run_example("--tokens", "777", "--dump", str(dump))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "producer: SENT req-0 OK" in out.stdout
    assert "verified req-0: 777 tokens" in out.stdout
    report = kv.inspect_dump(dump)
    assert report["clean"] and report["summary"]["tokens_checked"] == 6 * 777


def test_two_process_example_no_space():
    # 5000 tokens need 79 blocks of 64; the decode pool has 64. The consumer
    # (its own router) refuses the offer and tells the producer at once, in
    # a notification, rather than either side waiting for a deadline.
    out = run_example("--tokens", "5000")
    assert out.returncode == 1, out.stdout + out.stderr
    why = "offer of 5000 tokens needs 79 blocks, the decode pool has 64"
    assert f"producer: SEND_FAILED req-0 ERR_NO_SPACE: {why}" in out.stdout, \
        out.stdout
    assert f"consumer: refused req-0 ERR_NO_SPACE: {why}" in out.stdout, \
        out.stdout
    assert "Traceback" not in out.stderr, out.stderr
