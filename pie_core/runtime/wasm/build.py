"""Build the inferlet component: the SDK and the guest runtime, compiled by componentize-py.

One component serves every inferlet: the guest imports the inferlet's own files at start from
``/inferlet`` (a read-only mount of its folder), so an inferlet needs no build of its own. The
component holds:

- ``inferlet/``, the SDK, unchanged: its host declarations, value types and errors are the
  engine's own (:mod:`inferlet.host`);
- ``pie_guest/`` and ``app.py`` from ``guest/``: the event loop, the WIT transport the SDK's
  host calls go through, and the ``run`` export.

The result is cached under ``<cache>/wasm/<key>.wasm``; the key hashes every staged file, the
WIT package, the componentize-py version and the cache layout, so a change to any of them builds
anew.

Beside it, ``<key>.stdlib/`` holds the guest's pure-Python standard library with its bytecode
(:func:`stdlib_path`): componentize-py has it only while it builds, so the build asks the guest
to copy it out (``pie_guest/stdlib.py``), and the host mounts it read-only at ``/python``, where
the guest's ``sys.path`` looks. A cache with the ``.wasm`` but not the folder builds anew.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import inferlet
from pie_core.bundled import wit_dir
from pie_core.errors import Unsupported

__all__ = ["WIT_DIR", "component_path", "stdlib_path", "toolchain_missing", "stage"]

WIT_DIR = wit_dir()
_GUEST = Path(__file__).resolve().parent / "guest"
_SDK = Path(inferlet.__file__).resolve().parent
_build_lock = threading.Lock()
_LAYOUT = b"stdlib-1"  # the cache layout (the .wasm and its stdlib folder): part of the key
# The guest's names for the export (pie_guest/stdlib.py: EXPORT_MARKER, EXPORT_DIR).
_EXPORT_MARKER = ".pie-export-stdlib"
_EXPORT_DIR = "pie-stdlib"


def toolchain_missing() -> str | None:
    """Why the wasm runner cannot run here (a one-line fix), or None when it can."""
    for dist, module in (("componentize-py", "componentize_py"), ("wasmtime", "wasmtime")):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            return (f"the wasm runner needs {dist}, which is not installed: pip install 'pie-engine[wasm]' "
                    f"(or run with --isolation process)")
    if not WIT_DIR.is_dir():
        return f"the WIT package {WIT_DIR} is missing: reinstall pie-engine (its wheel carries wit/)"
    return None


def stage(dest: Path) -> None:
    """Write every file the component holds into ``dest`` (see the module docstring)."""
    shutil.copytree(_GUEST, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(_SDK, dest / "inferlet", ignore=shutil.ignore_patterns("__pycache__"))


def component_path(cache: Path, on_build: Callable[[], None] | None = None) -> Path:
    """The built component for this engine's SDK and WIT, built now if it is not cached.

    Args:
        cache: The cache folder (the component is kept under ``<cache>/wasm/``).
        on_build: Called (in this thread) just before a build, which takes tens of seconds, so
            a caller can tell its user to wait; not called when the component is cached.

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
        if _built(out):
            return out
        with _build_lock:
            if not _built(out):
                if on_build is not None:
                    on_build()
                _componentize(staged, out)
    return out


def stdlib_path(component: Path) -> Path:
    """The standard-library folder built with ``component`` (mounted at ``/python``)."""
    return component.with_suffix(".stdlib")


def _built(out: Path) -> bool:
    return out.exists() and stdlib_path(out).is_dir()


def _key(staged: Path) -> str:
    digest = hashlib.sha256(metadata.version("componentize-py").encode() + b"\0" + _LAYOUT)
    for root in (staged, WIT_DIR):
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def _componentize(staged: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(f".{os.getpid()}.part")
    (staged / _EXPORT_MARKER).write_text("copy the standard library to " + _EXPORT_DIR + "\n")
    exe = Path(sys.executable).with_name("componentize-py")
    cmd = [str(exe) if exe.exists() else "componentize-py", "-d", str(WIT_DIR), "-w", "inferlet",
           "componentize", "app", "-p", str(staged), "-o", str(part)]
    done = subprocess.run(cmd, cwd=staged, capture_output=True, text=True)
    if done.returncode != 0:
        part.unlink(missing_ok=True)
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[:20])
        raise Unsupported(f"componentize-py could not build the inferlet component:\n{tail}")
    try:
        _keep_stdlib(staged / _EXPORT_DIR, stdlib_path(out))
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    for stale in out.parent.glob(f"{out.stem}.wasmtime-*.cwasm"):  # compiled from a former build of this key
        stale.unlink(missing_ok=True)
    part.replace(out)


def _keep_stdlib(exported: Path, dest: Path) -> None:
    """Move the guest's exported standard library to ``dest``, whole or not at all."""
    if not (exported / "os.py").is_file():
        raise Unsupported(f"the component build exported no standard library ({exported}/os.py is missing); "
                          "the guest's app.py must call pie_guest.stdlib.export_if_asked")
    if dest.is_dir():  # another process built the same key
        return
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    shutil.rmtree(part, ignore_errors=True)
    shutil.move(exported, part)
    try:
        part.rename(dest)
    except OSError:  # lost a race to another process: its copy is the same
        shutil.rmtree(part, ignore_errors=True)
