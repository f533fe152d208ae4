"""Runtime information: ``from inferlet import runtime``."""

from __future__ import annotations

from typing import Any

from pie_core.host import runtime as _host

__all__ = ["models", "version", "instance_id", "username", "spawn"]


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
