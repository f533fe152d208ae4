"""Runtime information: ``from inferlet import runtime``."""

from __future__ import annotations

from typing import Any

from inferlet.host import runtime as _host

__all__ = ["models", "version", "instance_id", "username", "spawn", "scratch_dir", "scratch_path"]


def models() -> list[str]:
    """Names of every model the engine has loaded."""
    return _host.models()


def version() -> str:
    """Pie runtime version string."""
    return _host.version()


def instance_id() -> str:
    """Unique identifier for this engine instance."""
    return _host.instance_id()


def username() -> str:
    """Username of the user who launched the inferlet."""
    return _host.username()


async def spawn(name: str, args: dict[str, Any] | None = None) -> Any:
    """Start another inferlet (``name`` or ``name@version``) and return its result."""
    return await _host.spawn(name, args)


def scratch_dir() -> str:
    """The launching user's private scratch directory (a Pie for Python addition).

    Each user gets their own directory; it persists across inferlet runs.
    """
    return _host.scratch_dir()


def scratch_path(relative: str) -> str:
    """Absolute path of ``relative`` inside :func:`scratch_dir` (a Pie for Python addition).

    Raises:
        InvalidInput: The path is absolute or escapes the scratch directory.
    """
    return _host.scratch_path(relative)
