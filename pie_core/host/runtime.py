"""Host interface ``runtime``: facts about the engine and the running instance."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pie_core import safepath
from pie_core.errors import InvalidInput, PieError
from pie_core.host.binding import ChildRunner, HostInstance, any_thread, current

__all__ = ["models", "version", "instance_id", "username", "spawn", "scratch_dir", "scratch_path"]


@any_thread
@any_thread
def models() -> list[str]:
    """Names of every model the engine has loaded."""
    return list(current().engine.models)


@any_thread
@any_thread
def version() -> str:
    """The Pie runtime version string."""
    return current().engine.version


@any_thread
@any_thread
def instance_id() -> str:
    """Unique id of this engine instance."""
    return current().engine.instance_id


@any_thread
@any_thread
def username() -> str:
    """The user who launched the running inferlet."""
    return current().username


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
    return await spawn_child(name, args)


async def spawn_child(name: str, args: dict[str, Any] | None = None, *, runner: ChildRunner | None = None) -> Any:
    """:func:`spawn` with the child run by ``await runner(program, args, child_instance)``
    (default: the instance's ``run_child``), which must emit the child's events through
    ``child_instance.emit`` and return its terminal event. An engine-side seam for launchers
    (process isolation runs the child in a worker of its own); not part of the inferlet API.

    Raises:
        As :func:`spawn`.
    """
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"spawn needs an inferlet name or folder, got {name!r}")
    if args is not None and not isinstance(args, dict):
        raise InvalidInput(f"spawn args must be a dict, got {type(args).__name__}")
    parent = current()
    budget = parent.spawns
    if budget.spawn_depth and parent.depth >= budget.spawn_depth:
        raise InvalidInput(f"runtime.spawn may nest at most {budget.spawn_depth} deep (quota spawn_depth); "
                           f"this inferlet already runs {parent.depth} deep, so do the work here or return it to the caller")
    if budget.processes and budget.running >= budget.processes:
        raise InvalidInput(f"user {parent.username} already runs {budget.running} spawned inferlets, the most allowed at once "
                           "(quota processes); await one before spawning another")
    run = runner or parent.run_child
    if run is None or parent.resolve_program is None:
        raise PieError("this inferlet's runner gave it no way to spawn (its HostInstance has no resolve_program or "
                       "run_child); run it with pie run or pie serve, or set both where the instance is created")
    program = parent.resolve_program(name)
    forward = lambda event: None if event.is_terminal else parent.emit(event)  # noqa: E731
    child = HostInstance(engine=parent.engine, emit=forward, username=parent.username, scratch_root=parent.scratch_root,
                         resolve_program=parent.resolve_program, run_child=parent.run_child, spawns=budget,
                         depth=parent.depth + 1)
    budget.running += 1  # no await since the check above: the count cannot be raced
    try:
        final = await run(program, dict(args or {}), child)
    finally:  # returned, failed or cancelled: the child no longer runs
        budget.running -= 1
    if final.kind == "error":
        raise PieError(f"spawned inferlet {name} failed: {final.value}")
    return final.value


@any_thread
@any_thread
def scratch_dir() -> str:
    """The running user's private scratch directory (created on first use).

    Under ``pie serve`` it is ``<data dir>/scratch/<user>``; under ``pie run`` a per-user
    directory in the system temp dir. Files there outlive the inferlet.
    """
    root, user = scratch_of(current())
    os.close(open_scratch(root, user))
    return str(root / user)


@any_thread
@any_thread
def scratch_path(relative: str) -> str:
    """Absolute path of ``relative`` inside :func:`scratch_dir` (parent folders created).

    Raises:
        InvalidInput: ``relative`` is absolute or leaves the scratch directory (``..``), or
            one of its folders is a link or a file.
    """
    root, user = scratch_of(current())
    parts = safepath.parts_of(relative, "scratch directory")
    scratch = open_scratch(root, user)
    try:
        os.close(safepath.open_dir(scratch, parts[:-1], create=True))
    except OSError:
        raise InvalidInput(f"{relative[:200]!r}: its folders must be folders in your scratch directory, "
                           "not links or files") from None
    finally:
        os.close(scratch)
    return str(root.joinpath(user, *parts))


def scratch_of(inst: HostInstance) -> tuple[Path, str]:
    """The folder holding every user's scratch folder (resolved), and ``inst``'s user name.

    Raises:
        InvalidInput: The user name cannot name a folder.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.@-]+", inst.username) or inst.username in (".", ".."):
        raise InvalidInput(f"user name {inst.username!r} cannot name a scratch directory")
    return (inst.scratch_root or Path(tempfile.gettempdir()) / "pie-scratch").resolve(), inst.username


def open_scratch(root: Path, user: str) -> int:
    """A descriptor of ``user``'s scratch folder in ``root`` (both made if missing; the user's
    folder never through a link). Every user-named path is opened beneath it with
    :mod:`pie_core.safepath`; the caller closes it."""
    base = safepath.open_root(root, create=True)
    try:
        return safepath.open_dir(base, (user,), create=True, mode=0o700)
    finally:
        os.close(base)
