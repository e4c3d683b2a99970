"""`pip install ./python` gives a working package outside the checkout."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def pip_install(target):
    # from a copy: setuptools writes build/ and *.egg-info next to the sources
    src = target.parent / "src"
    shutil.copytree(ROOT / "python", src, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "tests"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
           "--target", str(target), str(src)]
    if importlib.util.find_spec("wheel") is not None:
        cmd.insert(4, "--no-build-isolation")  # no index needed
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0 and any(s in out.stdout + out.stderr for s in (
            "No matching distribution", "Could not find a version",
            "NewConnectionError", "Temporary failure in name resolution")):
        pytest.skip("pip could not reach a package index for setuptools/wheel")
    assert out.returncode == 0, out.stdout + out.stderr


def run_python(code, cwd, env):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_pip_install_and_import(tmp_path):
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed for this python")
    target = tmp_path / "site"
    pip_install(target)
    assert (target / "kvrelay" / "py.typed").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    code = ("import kvrelay as kv; print(kv.__file__); "
            "print(kv.plan(kv.Layout(block_size=16), 0, "
            "kv.RegionPair.mla(kv.Layout(block_size=16), 0, 64, 2, 2), "
            "kv.Request([1], [0], 16)).bytes)")
    if "KVRELAY_LIB" in env:
        env["KVRELAY_LIB"] = os.path.abspath(env["KVRELAY_LIB"])
        out = run_python(code, tmp_path, env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[0].startswith(str(target))
        assert out.stdout.split()[1] == "1024"
    env.pop("KVRELAY_LIB", None)
    out = run_python("import kvrelay", tmp_path, env)
    assert out.returncode != 0 and "libkvrelay.so not found" in out.stderr
    env["KVRELAY_LIB"] = str(tmp_path / "nope.so")
    out = run_python("import kvrelay", tmp_path, env)
    assert "KVRELAY_LIB=" in out.stderr and "is not a file" in out.stderr
