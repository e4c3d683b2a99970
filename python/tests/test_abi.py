"""The ctypes mirrors match the C headers: a C program compiled from the
headers prints every struct's size and its fields' offsets and sizes, the
enum values and the defaults (KVR_AGENT_PARAMS_INIT,
KVR_LOOPBACK_PARAMS_INIT) the package hard-codes; skipped without a C
compiler."""

import ctypes
import shutil
import subprocess

import pytest

from conftest import ROOT
from kvrelay import _types as T
from kvrelay import agent, conn
from kvrelay.layout import Role

ENUMS = {f"KVR_ROLE_{r.name}": int(r) for r in Role}
ENUMS.update({f"KVR_WIRE_{s.name}": int(s) for s in conn.Side})
ENUMS.update({f"KVR_CONN_TL_{t.name}": int(t) for t in conn.Transport})
ENUMS.update({f"KVR_CONN_EXEC_{x.name}": int(x) for x in conn.Executor})
ENUMS.update({f"KVR_EVENT_{k.name}": int(k) for k in conn.EventKind})
ENUMS.update({f"KVR_AGENT_{r.name}": int(r) for r in agent.AgentRole})
ENUMS.update({f"KVR_AGENT_TL_{t.name}": int(t) for t in agent.Transport})
ENUMS.update({f"KVR_AGENT_EXEC_{x.name}": int(x) for x in agent.Executor})
ENUMS.update({f"KVR_AGENT_{k.name}": int(k) for k in agent.EventKind})
ENUMS.update({f"KVR_SEND_{s.name}": int(s) for s in agent.SendState})
ENUMS.update({f"KVR_RECV_{s.name}": int(s) for s in agent.RecvState})
ENUMS.update({f"KVR_WIRE_{s.name}": int(s) for s in agent.WireSide})
ENUMS.update({"KVR_AGENT_INSTANCE_MAX": T.AGENT_INSTANCE_MAX,
              "KVR_AGENT_NOTIFY_MAX": T.AGENT_NOTIFY_MAX,
              "KVR_AGENT_REGION_CONSUMER_ONLY": agent._flags(True)})
ENUMS.update({"KVR_INSPECT_WRONG": 0, "KVR_INSPECT_SCALE": 1,
              "KVR_INSPECT_SOURCE": 2, "KVR_INSPECT_KINDS": T.INSPECT_KINDS,
              "KVR_INSPECT_EXCERPT": T.INSPECT_EXCERPT,
              "KVR_ERROR_MSG_MAX": T.ERROR_MSG_MAX,
              "KVR_WIRE_REQ_ID_MAX": T.WIRE_REQ_ID_MAX,
              "KVR_WIRE_KEY_BYTES": T.WIRE_KEY_BYTES})


DEFAULTS = [("KVR_AGENT_PARAMS_INIT", "kvr_agent_params_t", agent.PARAM_DEFAULTS),
            ("KVR_LOOPBACK_PARAMS_INIT", "kvr_loopback_params_t",
             agent.LOOPBACK_DEFAULTS)]


def c_program() -> str:
    headers = sorted({cls._c_header_ for cls in T.ALL})
    lines = [f'#include "{h}"' for h in headers]
    lines += ["#include <stddef.h>", "#include <stdio.h>", "int main(void)", "{"]
    for cls in T.ALL:
        c = cls._c_name_
        lines.append(f'printf("{c} %zu\\n", sizeof({c}));')
        for name, _ in cls._fields_:
            lines.append(f'printf("{c}.{name} %zu\\n", offsetof({c}, {name}));')
            lines.append(f'printf("{c}.{name}.size %zu\\n", '
                         f'sizeof((({c} *)0)->{name}));')
    for name in ENUMS:
        lines.append(f'printf("{name} %lld\\n", (long long){name});')
    for init, c_type, values in DEFAULTS:
        lines.append(f"{{ {c_type} d = {init};")
        for field in values:
            lines.append(f'printf("{init}.{field} %lld\\n", (long long)d.{field});')
        lines.append("}")
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def python_side():
    want = {}
    for cls in T.ALL:
        want[cls._c_name_] = ctypes.sizeof(cls)
        for name, _ in cls._fields_:
            want[f"{cls._c_name_}.{name}"] = getattr(cls, name).offset
            want[f"{cls._c_name_}.{name}.size"] = getattr(cls, name).size
    want.update(ENUMS)
    for init, _, values in DEFAULTS:
        want.update({f"{init}.{k}": v for k, v in values.items()})
    return want


def test_structs_and_enums_match_headers(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to read the headers with")
    src = tmp_path / "abi.c"
    src.write_text(c_program())
    exe = tmp_path / "abi"
    subprocess.run([cc, "-std=c11", "-I", str(ROOT / "include"), "-o", str(exe),
                    str(src)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    got = {k: int(v) for k, v in (line.split() for line in out.stdout.splitlines())}
    assert got == python_side()
