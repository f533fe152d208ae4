"""Host interface ``runtime``: facts about the engine and the running instance."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from pie_core.errors import InvalidInput, NotFound, PieError
from pie_core.host.binding import HostInstance, current

__all__ = ["models", "version", "instance_id", "username", "spawn", "scratch_dir", "scratch_path"]


def models() -> list[str]:
    """Names of every model the engine has loaded."""
    return list(current().engine.models)


def version() -> str:
    """The Pie runtime version string."""
    return current().engine.version


def instance_id() -> str:
    """Unique id of this engine instance."""
    return current().engine.instance_id


def username() -> str:
    """The user who launched the running inferlet."""
    return current().username


async def spawn(name: str, args: dict[str, Any] | None = None) -> Any:
    """Run another inferlet (``name`` or ``name@version``) as the same user and return its
    result. Its Stdout/Stderr/File events reach the caller's client.

    Raises:
        NotFound: No such inferlet, or the version differs.
        InvalidInput: ``args`` do not fit its manifest.
        PieError: The child failed; the message carries its error.
    """
    from pie_core.runtime.instance import run_inferlet
    from pie_core.runtime.library import find_inferlet
    from pie_core.runtime.manifest import load_manifest

    parent = current()
    base, _, version = name.partition("@")
    manifest = load_manifest(find_inferlet(base))
    if version and version != manifest.version:
        raise NotFound(f"{base} is installed at version {manifest.version}, not {version}")
    forward = lambda event: None if event.is_terminal else parent.emit(event)  # noqa: E731
    child = HostInstance(engine=parent.engine, emit=forward, username=parent.username, scratch_root=parent.scratch_root)
    final = await run_inferlet(parent.engine, manifest, dict(args or {}), forward, instance=child)
    if final.kind == "error":
        raise PieError(f"spawned inferlet {name} failed: {final.value}")
    return final.value


def scratch_dir() -> str:
    """The running user's private scratch directory (created on first use).

    Under ``pie serve`` it is ``<data dir>/scratch/<user>``; under ``pie run`` a per-user
    directory in the system temp dir. Files there outlive the inferlet.
    """
    inst = current()
    if not re.fullmatch(r"[A-Za-z0-9_.@-]+", inst.username) or inst.username in (".", ".."):
        raise InvalidInput(f"user name {inst.username!r} cannot name a scratch directory")
    root = inst.scratch_root or Path(tempfile.gettempdir()) / "pie-scratch"
    path = (root / inst.username).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def scratch_path(relative: str) -> str:
    """Absolute path of ``relative`` inside :func:`scratch_dir` (parent folders created).

    Raises:
        InvalidInput: ``relative`` is absolute or leaves the scratch directory (``..``, links).
    """
    base = Path(scratch_dir())
    if not isinstance(relative, str) or not relative or Path(relative).is_absolute():
        raise InvalidInput(f"scratch paths are non-empty and relative, got {relative!r}")
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise InvalidInput(f"{relative!r} leaves the scratch directory; use a path inside it")
    target.parent.mkdir(parents=True, exist_ok=True)
    return str(target)
