"""Makes the bare machine able to run Pie, without a network: wheels carried in the working tree,
and the tree's own packages on ``PYTHONPATH`` with their entry points.

* Wheels: every ``*.whl`` in the wheel folder (made here by :mod:`benchmarks.gpu.make_wheels`)
  whose distribution is missing, or present in another version, is installed with the device
  README's recipe (``pip install --no-index --no-deps --target SITE``). ``SITE`` goes first on
  the children's ``PYTHONPATH``.
* The tree's packages (``pie-engine`` and the three backends) are imported from the checkout
  itself, so a fix made during a lease runs at once. What an install would add besides the code is
  its metadata: the ``pie.backends`` and ``pytest11`` entry points by which the engine finds a
  backend and pytest finds the conformance plugin. :func:`write_tree_metadata` writes a
  ``*.dist-info`` folder for each into ``SITE`` from its ``pyproject.toml``.

Standard library only: this runs in the parent, before anything heavy is imported.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

__all__ = ["ROOT", "PACKAGE_DIRS", "install_wheels", "write_tree_metadata", "child_env"]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = (ROOT, ROOT / "plugins" / "pie_backend_cpu", ROOT / "plugins" / "pie_backend_torch",
                ROOT / "plugins" / "pie_backend_tensorrt")
"""Folders holding a ``pyproject.toml`` whose packages are imported from the tree."""


def _wheel_name(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return name, version


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_wheels(wheels: Path, site: Path, timeout: float) -> dict[str, list[str]]:
    """Install the folder's wheels that this Python lacks (or has in another version) into ``site``.

    Returns:
        ``{"installed": [...], "present": [...]}``: ``name==version`` of each wheel.

    Raises:
        subprocess.CalledProcessError: pip failed (its output is in the exception).
    """
    site.mkdir(parents=True, exist_ok=True)
    need, present = [], []
    for whl in sorted(wheels.glob("*.whl")) if wheels.is_dir() else []:
        name, version = _wheel_name(whl)
        (present if _installed(name) == version else need).append((whl, f"{name}=={version}"))
    if need:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
             "--no-cache-dir", "--upgrade", "--target", str(site), *(str(w) for w, _ in need)],
            check=True, capture_output=True, text=True, timeout=timeout,
        )
    return {"installed": [n for _, n in need], "present": [n for _, n in present]}


def write_tree_metadata(site: Path) -> list[str]:
    """Write ``NAME-VERSION.dist-info`` (METADATA, entry_points.txt) of each tree package into ``site``.

    Returns:
        The ``name==version`` of each.
    """
    site.mkdir(parents=True, exist_ok=True)
    written = []
    for folder in PACKAGE_DIRS:
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        name, version = project["name"], project["version"]
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        lines = []
        for group, entries in project.get("entry-points", {}).items():
            lines.append(f"[{group}]")
            lines += [f"{key} = {value}" for key, value in entries.items()]
        if "scripts" in project:
            lines.append("[console_scripts]")
            lines += [f"{key} = {value}" for key, value in project["scripts"].items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        written.append(f"{name}=={version}")
    return written


def child_env(site: Path, work: Path) -> dict[str, str]:
    """The environment of every phase: ``site`` and the tree first on the path, Pie's caches and
    config under ``work``, no network."""
    env = dict(os.environ)
    paths = [str(site), *(str(p) for p in PACKAGE_DIRS)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        PYTHONUNBUFFERED="1",
        PIE_CACHE_DIR=str(work / "pie-cache"),
        PIE_HOME=str(work / "pie-home"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TRITON_DEFAULT_FP_FUSION=env.get("TRITON_DEFAULT_FP_FUSION", "1"),
    )
    return env
