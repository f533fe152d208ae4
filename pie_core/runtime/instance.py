"""Running one inferlet in-process: load its module, bind the host, await ``main(input)``."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.errors import Unsupported
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime.library import find_program
from pie_core.runtime.manifest import Manifest
from pie_core.runtime import inprocess
from pie_core.runtime.stdio import flush_stdout, install_stdio_router
from inferlet.host.entry import MAIN_EXITS, exit_outcome
from inferlet.host import entry
from inferlet.host.entry import check_return

__all__ = ["load_entry", "run_inferlet", "run_main", "run_child", "equip_for_spawn", "check_return"]


def load_entry(manifest: Manifest, *, synchronous: bool = False, own_process: bool = False) -> Callable[[Any], Any]:
    """Import the inferlet's entry module under a private name and return its ``main``
    (see :func:`inferlet.host.entry.load_main`).

    Raises:
        InvalidInput: The module has no ``async def main(input)`` (nor, with ``synchronous``,
            a ``def main(input)``).
        Unsupported: The entry is a JS/TS module (those run in the wasm sandbox only).
    """
    if manifest.entry.endswith((".ts", ".js", ".mjs", ".mts")):
        raise Unsupported(f"{manifest.name} is a JavaScript/TypeScript inferlet ({manifest.entry}): it runs only in the "
                          "wasm sandbox (pie run picks it; pie serve runs it there whatever --isolation says)")
    path = manifest.entry_path
    name = f"_pie_inferlet_{manifest.name.replace('-', '_')}_{abs(hash(path))}"
    return entry.load_main(path, name, synchronous=synchronous, own_process=own_process)


async def run_inferlet(
    engine: Engine,
    manifest: Manifest,
    args: dict[str, Any],
    emit: Callable[[Event], None],
    *,
    username: str = "local",
    instance: HostInstance | None = None,
) -> Event:
    """Validate ``args`` against the manifest, then run the inferlet's ``main``.

    Returns:
        The terminal event (also emitted): ``return`` or ``error`` (a module that calls
        ``sys.exit`` as it imports ends as :func:`run_main` says).
    """
    try:
        payload = manifest.validate_input(args)
        main = load_entry(manifest)
    except Exception as exc:
        final = Event("error", entry.describe(exc))
        emit(final)
        return final
    except MAIN_EXITS as exc:
        final = Event(*exit_outcome(exc))
        emit(final)
        return final
    return await run_main(engine, main, payload, emit, username=username, instance=instance)


async def run_main(
    engine: Engine,
    main: Callable[[dict[str, Any]], Awaitable[Any]],
    payload: dict[str, Any],
    emit: Callable[[Event], None],
    *,
    username: str = "local",
    instance: HostInstance | None = None,
) -> Event:
    """Run ``await main(payload)`` as an inferlet instance and emit its events.

    ``print()``/``sys.stdout`` writes from the inferlet's task become Stdout events (one per
    line, see :mod:`pie_core.runtime.stdio`) and ``sys.stderr`` writes Stderr events. Pass
    ``instance`` to pre-load its inbox or file queue (``emit`` and ``username`` are then
    taken from it); what it leaves unset for ``runtime.spawn`` gets :func:`equip_for_spawn`'s.

    Every page and resource the instance held is released before this returns, whether
    ``main`` returned, raised, or was cancelled (cancellation emits an error, then re-raises).

    ``sys.exit()`` and ``KeyboardInterrupt`` in ``main`` end the inferlet, not the server, as
    in the process and wasm runners (:data:`inferlet.host.entry.MAIN_EXITS`): ``sys.exit()``,
    ``sys.exit(None)`` and ``sys.exit(0)`` mean success and end the run like ``return None``;
    ``sys.exit(3)`` ends it with the error ``SystemExit: 3`` and ``raise KeyboardInterrupt``
    with ``KeyboardInterrupt``. A Ctrl-C is not one of these: ``pie serve`` turns SIGINT into
    its shutdown and ``pie run``'s event loop into cancellation, either of which cancels ``main``.

    Returns:
        The terminal event (also emitted).
    """
    inst = equip_for_spawn(instance or HostInstance(engine=engine, emit=emit, username=username))
    emit = inst.emit
    inprocess.install()
    install_stdio_router()
    token = bind(inst)
    try:
        try:
            final = Event("return", check_return(await main(payload)))
        except asyncio.CancelledError as exc:  # task.cancel(reason) puts the reason in the event
            flush_stdout(inst)
            emit(Event("error", f"cancelled: {exc.args[0]}" if exc.args and exc.args[0] else "cancelled"))
            raise
        except Exception as exc:  # the inferlet failed: its message becomes the Error event
            final = Event("error", entry.describe(exc))
        except MAIN_EXITS as exc:  # they end this inferlet; escaping, they would stop the server's loop
            final = Event(*exit_outcome(exc))
        flush_stdout(inst)
        emit(final)
        return final
    finally:
        inst.release_all()
        unbind(token)


async def run_child(manifest: Manifest, args: dict[str, Any], child: HostInstance) -> Event:
    """The in-process :data:`~pie_core.host.binding.ChildRunner`: a spawned child runs as a
    task of this process, like its parent."""
    return await run_inferlet(child.engine, manifest, args, child.emit, instance=child)


def equip_for_spawn(instance: HostInstance) -> HostInstance:
    """Give ``instance`` ``pie run``'s spawning where its creator set none: names resolve to
    folders and examples (:func:`~pie_core.runtime.library.find_program`) and children run
    in-process (:func:`run_child`). The server sets its own resolver (names only). Returns it."""
    if instance.resolve_program is None:
        instance.resolve_program = find_program
    if instance.run_child is None:
        instance.run_child = run_child
    return instance


def _jsonable(value: Any) -> Any:
    """A value a worker or guest already passed through :func:`check_return`, as JSON; one that
    still is not (a guest that tampered with its runner) becomes its repr."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return repr(value)
    return value
