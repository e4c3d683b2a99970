"""python/examples/two_process.py moves a request between two processes and
its dump passes `inspect`."""

import os
import subprocess
import sys

import kvrelay as kv
from conftest import ROOT


def test_two_process_example(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python")
    dump = tmp_path / "dump"
    out = subprocess.run(
        [sys.executable, str(ROOT / "python" / "examples" / "two_process.py"),
         "--tokens", "777", "--dump", str(dump)],
        capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "producer: SENT req-0 OK" in out.stdout
    assert "verified req-0: 777 tokens" in out.stdout
    report = kv.inspect_dump(dump)
    assert report["clean"] and report["summary"]["tokens_checked"] == 6 * 777
