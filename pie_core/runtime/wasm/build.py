"""Build the inferlet component: the SDK and the guest runtime, compiled by componentize-py.

One component serves every inferlet: the guest imports the inferlet's own files at start from
``/inferlet`` (a read-only mount of its folder), so an inferlet needs no build of its own. The
component holds:

- ``inferlet/``, the SDK, unchanged;
- ``pie_core/host/<module>.py`` generated from the engine's host functions: each function has
  the engine's signature (names, defaults) and calls the WIT import of the same name, with the
  conversions of :mod:`.spec`;
- ``pie_core/errors.py``, ``pie_core/mcp/errors.py``, ``pie_core/host/{errors,values}.py``,
  the engine's own files (standard library only), so errors and values have the same classes;
- ``pie_guest/`` and ``app.py`` from ``guest/``: the event loop and the ``run`` export.

The result is cached under ``<cache>/wasm/<key>.wasm``; the key hashes every staged file, the
WIT package and the componentize-py version, so a change to any of them builds anew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from pathlib import Path

import pie_core
from pie_core.errors import Unsupported
from pie_core.runtime.wasm.spec import RECORDS, function_spec

__all__ = ["WIT_DIR", "component_path", "toolchain_missing", "stage", "RESOURCES"]

WIT_DIR = Path(pie_core.__file__).resolve().parent.parent / "wit"
_GUEST = Path(__file__).resolve().parent / "guest"
_PACKAGE = Path(pie_core.__file__).resolve().parent
_SDK = Path(pie_core.__file__).resolve().parent.parent / "inferlet"
_COPIED = ("errors.py", "mcp/errors.py", "host/errors.py", "values.py")
_build_lock = threading.Lock()

RESOURCES = {"HostContext": "context", "MatcherHandle": "matcher", "ChatBuilder": "chat-builder",
             "Subscription": "subscription", "ServerSession": "mcp-session", "HostAdapter": "adapter",
             "LoadedModel": "model"}
"""The WIT resource each engine handle class is (``types`` interface)."""

_GUEST_ONLY = {  # host functions whose guest form differs: paths inside the sandbox
    ("runtime", "scratch_dir"): 'def scratch_dir():\n    return "/scratch"\n',
    ("runtime", "scratch_path"): (
        "def scratch_path(relative):\n"
        "    call(_wit.scratch_path, (relative,), (('v',),), ('v',))\n"
        "    return '/scratch/' + relative.strip('/')\n"),
}


def toolchain_missing() -> str | None:
    """Why the wasm runner cannot run here (a one-line fix), or None when it can."""
    for dist, module in (("componentize-py", "componentize_py"), ("wasmtime", "wasmtime")):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            return (f"the wasm runner needs {dist}, which is not installed: pip install 'pie-engine[wasm]' "
                    f"(or run with --isolation process)")
    if not WIT_DIR.is_dir():
        return f"the WIT package {WIT_DIR} is missing (a source checkout has it under wit/)"
    return None


def stage(dest: Path) -> None:
    """Write every file the component holds into ``dest`` (see the module docstring)."""
    shutil.copytree(_GUEST, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(_SDK, dest / "inferlet", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in _COPIED:
        target = dest / "pie_core" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_PACKAGE / rel, target)
    for pkg in ("pie_core", "pie_core/mcp", "pie_core/host"):
        (dest / pkg / "__init__.py").touch()
    (dest / "pie_core/host/_records.py").write_text(_records_source())
    for module, source in _shim_sources().items():
        (dest / "pie_core/host" / f"{module}.py").write_text(source)


def component_path(cache: Path) -> Path:
    """The built component for this engine's SDK and WIT, built now if it is not cached.

    Raises:
        Unsupported: The toolchain is missing, or componentize-py failed (its output says why).
    """
    missing = toolchain_missing()
    if missing:
        raise Unsupported(missing)
    with tempfile.TemporaryDirectory(prefix="pie-wasm-stage-") as tmp:
        staged = Path(tmp) / "app"
        stage(staged)
        key = _key(staged)
        out = cache / "wasm" / f"{key}.wasm"
        if out.exists():
            return out
        with _build_lock:
            if not out.exists():
                _componentize(staged, out)
    return out


def _key(staged: Path) -> str:
    digest = hashlib.sha256(metadata.version("componentize-py").encode())
    for root in (staged, WIT_DIR):
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def _componentize(staged: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(f".{os.getpid()}.part")
    exe = Path(sys.executable).with_name("componentize-py")
    cmd = [str(exe) if exe.exists() else "componentize-py", "-d", str(WIT_DIR), "-w", "inferlet",
           "componentize", "app", "-p", str(staged), "-o", str(part)]
    done = subprocess.run(cmd, cwd=staged, capture_output=True, text=True)
    if done.returncode != 0:
        part.unlink(missing_ok=True)
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[:20])
        raise Unsupported(f"componentize-py could not build the inferlet component:\n{tail}")
    part.replace(out)


def _records_source() -> str:
    """Guest copies of the record dataclasses that do not live in ``pie_core.values``."""
    from pie_core.grammar.source import GrammarSource
    from pie_core.models.chat_formats.tool_calls import ToolCallSyntax

    lines = ['"""Records that cross the host API by value (generated from the engine\'s dataclasses)."""',
             "", "from dataclasses import dataclass", ""]
    for cls in (GrammarSource, ToolCallSyntax):
        assert cls.__name__ in RECORDS
        lines += ["", "@dataclass(frozen=True)", f"class {cls.__name__}:"]
        for f in dataclasses.fields(cls):
            default = "" if f.default is dataclasses.MISSING else f" = {f.default!r}"
            lines.append(f"    {f.name}: object{default}")
    return "\n".join(lines) + "\n"


def _shim_sources() -> dict[str, str]:
    from pie_core.runtime import host_api

    handles = {kind.cls: RESOURCES[kind.name] for kind in host_api.HANDLES}
    modules: dict[str, list[str]] = {m: [] for m in host_api.HOST_MODULES}
    for (module, name), fn in sorted(host_api.host_functions().items()):
        if (module, name) in _GUEST_ONLY:
            modules[module].append(_GUEST_ONLY[module, name])
            continue
        spec = function_spec(fn, handles)
        params = [p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(fn).parameters.values()]
        sig = inspect.Signature(params)
        names = [p.name for p in params]
        args = "(" + "".join(f"{n}, " for n in names) + ")"
        specs = tuple(s for _, s in spec.params)
        if spec.is_async:
            body = (f"async def {name}{sig}:\n"
                    f"    return await start(_wit.{name}, _wit.{name}_result, {args}, {specs!r}, {spec.result!r})\n")
        else:
            body = f"def {name}{sig}:\n    return call(_wit.{name}, {args}, {specs!r}, {spec.result!r})\n"
        modules[module].append(body)
    sources = {}
    for module, bodies in modules.items():
        head = [f'"""pie_core.host.{module} inside the wasm sandbox: each call goes to the WIT import of its name',
                '(generated by pie_core.runtime.wasm.build)."""', "",
                "from pie_core.errors import *  # noqa: F401,F403",
                "from pie_core.host._records import *  # noqa: F401,F403",
                "from pie_core.values import *  # noqa: F401,F403",
                "from pie_core.mcp.errors import McpError  # noqa: F401",
                "from pie_guest.call import call, start",
                f"from wit_world.imports import {module} as _wit", "", ""]
        sources[module] = "\n".join(head) + "\n\n".join(bodies)
    return sources
