"""Host interface ``runtime``: facts about the engine and the running instance."""

from __future__ import annotations

from typing import Any

from inferlet.host._declare import host

__all__ = ["instance_id", "models", "scratch_dir", "scratch_path", "spawn", "username", "version"]


@host
def instance_id() -> str:
    """Unique id of this engine instance."""


@host
def models() -> list[str]:
    """Names of every model the engine has loaded."""


@host
def scratch_dir() -> str:
    """The running user's private scratch directory (created on first use).

    Under ``pie serve`` it is ``<data dir>/scratch/<user>``; under ``pie run`` a per-user
    directory in the system temp dir. Files there outlive the inferlet.
    """


@host
def scratch_path(relative: str) -> str:
    """Absolute path of ``relative`` inside :func:`scratch_dir` (parent folders created).

    Raises:
        InvalidInput: ``relative`` is absolute or leaves the scratch directory (``..``, links).
    """


@host
async def spawn(name: str, args: dict[str, Any] | None = None) -> Any:
    """Run another inferlet (``name`` or ``name@version``) as the same user and return its
    result. Its Stdout/Stderr/File events reach the caller's client.

    Under ``pie serve``, ``name`` is resolved as a launch by the same user resolves it (the
    user's uploads, then built-ins and examples; never a path); under ``pie run`` it may also
    be a folder. Spawns nest at most ``spawn_depth`` deep and at most ``processes`` children
    of one user run at once (server quotas; 4 and 16 under ``pie run``).

    Raises:
        NotFound: No such inferlet, or the version differs.
        InvalidInput: ``args`` do not fit its manifest, ``name`` is a path under ``pie serve``,
            or the spawn would pass the depth or running-children limit.
        PieError: The child failed (the message carries its error), or the instance's runner
            gave it no way to spawn.
    """


@host
def username() -> str:
    """The user who launched the running inferlet."""


@host
def version() -> str:
    """The Pie runtime version string."""
