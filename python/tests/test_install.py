"""`pip install ./python` builds libkvrelay.so into the package
(scikit-build-core over the repository's CMake build): a fresh venv imports
it from outside the checkout with no environment variables, and `pip wheel`
gives a wheel that installs into another venv.

The venvs see the running Python's packages (--system-site-packages), so
numpy needs no download; pip fetches the build backend from PyPI (or its
cache), or, when PyPI cannot be reached, the test builds without isolation
if the base Python has scikit-build-core (`pip install scikit-build-core`).
Skipped when venv/pip are missing or neither way can build."""

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

import kvrelay

NETWORK_ERRORS = ("No matching distribution", "Could not find a version",
                  "NewConnectionError", "Temporary failure in name resolution",
                  "Network is unreachable", "ConnectTimeoutError",
                  "Max retries exceeded")

# Plans a small layout through the installed package and says where it came
# from.
CHECK = """
import kvrelay as kv
lay = kv.Layout(block_size=16)
p = kv.plan(lay, 0, kv.RegionPair.mla(lay, 0, 64, 2, 2), kv.Request([1], [0], 16))
print(kv.__file__)
print(kv.library_path())
print(kv.library_version())
print(p.bytes)
"""


def clean_env():
    """The environment without anything that points at this checkout."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "KVRELAY_LIB", "KVRELAY_CLI")}


def make_venv(path: Path) -> Path:
    if importlib.util.find_spec("ensurepip") is None:
        pytest.skip("this python has no ensurepip for venvs "
                    "(Debian: apt-get install python3-venv)")
    out = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                          str(path)], capture_output=True, text=True,
                         env=clean_env(), timeout=600)
    if out.returncode != 0:
        pytest.skip(f"python -m venv failed: {out.stderr.strip()[-400:]}")
    return path / "bin" / "python"


def pip(python: Path, *args: str) -> str:
    """Runs the venv's pip from the repository root (so ./python is the
    package); skips when no build backend can be had."""
    def run(*extra):
        out = subprocess.run([str(python), "-m", "pip", *args, *extra],
                             cwd=ROOT, capture_output=True, text=True,
                             env=clean_env(), timeout=900)
        return out.returncode, out.stdout + out.stderr
    code, text = run()
    offline = [line for line in text.splitlines()
               if any(s in line for s in NETWORK_ERRORS)]
    if code != 0 and offline:
        has_backend = subprocess.run(
            [str(python), "-c", "import scikit_build_core"],
            capture_output=True, env=clean_env(), timeout=120).returncode == 0
        if not has_backend:
            pytest.skip("PyPI unreachable and no scikit-build-core in the "
                        f"base python for an offline build: {offline[0].strip()}")
        code, text = run("--no-build-isolation")
    assert code == 0, text[-6000:]
    return text


def check_installed(python: Path, cwd: Path, **env: str) -> list:
    """Runs CHECK with the venv's python outside the checkout."""
    full = clean_env()
    full.update(env)
    out = subprocess.run([str(python), "-c", CHECK], cwd=cwd, env=full,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split("\n")


def assert_from_venv(lines: list, venv: Path) -> None:
    package = Path(os.path.realpath(lines[0])).parent
    assert str(package).startswith(os.path.realpath(venv) + os.sep), lines
    assert lines[1] == str(package / "libkvrelay.so"), lines
    assert lines[2] == kvrelay.__version__, lines
    assert lines[3] == "1024", lines


def test_pip_install_and_import(tmp_path):
    venv = tmp_path / "venv"
    python = make_venv(venv)
    pip(python, "install", "./python")
    assert_from_venv(check_installed(python, tmp_path), venv)
    # KVRELAY_LIB still overrides the bundled library
    if "KVRELAY_LIB" in os.environ:
        lib = os.path.abspath(os.environ["KVRELAY_LIB"])
        assert check_installed(python, tmp_path, KVRELAY_LIB=lib)[1] == lib
    full = clean_env()
    full["KVRELAY_LIB"] = str(tmp_path / "nope.so")
    out = subprocess.run([str(python), "-c", "import kvrelay"], cwd=tmp_path,
                         env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"KVRELAY_LIB={tmp_path / 'nope.so'} is not a file" in out.stderr


def test_pip_wheel_installs_elsewhere(tmp_path):
    python = make_venv(tmp_path / "builder")
    dist = tmp_path / "dist"
    pip(python, "wheel", "--no-deps", "-w", str(dist), "./python")
    wheels = list(dist.glob("kvrelay-*.whl"))
    assert len(wheels) == 1, wheels
    assert wheels[0].name.startswith(f"kvrelay-{kvrelay.__version__}-py3-none-linux_")
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "kvrelay/libkvrelay.so" in names and "kvrelay/py.typed" in names
    assert not [n for n in names if n.startswith("kvrelay/tests")]
    # a second venv, with nothing of the build left to find
    target = tmp_path / "target"
    python = make_venv(target)
    pip(python, "install", str(wheels[0]))
    assert_from_venv(check_installed(python, tmp_path), target)


def test_unloadable_library_names_runtime_packages(tmp_path):
    bad = tmp_path / "libkvrelay.so"
    bad.write_text("not an ELF file")
    env = clean_env()
    env.update(PYTHONPATH=str(ROOT / "python"), KVRELAY_LIB=str(bad))
    out = subprocess.run([sys.executable, "-c", "import kvrelay"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"kvrelay: cannot load {bad}" in out.stderr, out.stderr
    assert "libsodium23 libjansson4 libucx0" in out.stderr, out.stderr
