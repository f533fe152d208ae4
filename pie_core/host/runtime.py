"""Host interface ``runtime``: facts about the engine and the running instance."""

from __future__ import annotations

from typing import Any

from pie_core.errors import NotFound, PieError
from pie_core.host.binding import HostInstance, current

__all__ = ["models", "version", "instance_id", "username", "spawn"]


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
    child = HostInstance(engine=parent.engine, emit=forward, username=parent.username)
    final = await run_inferlet(parent.engine, manifest, dict(args or {}), forward, instance=child)
    if final.kind == "error":
        raise PieError(f"spawned inferlet {name} failed: {final.value}")
    return final.value
