"""Host interface ``runtime``: facts about the engine and the running instance."""

from __future__ import annotations

from pie_core.host.binding import current

__all__ = ["models", "version", "instance_id", "username"]


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
