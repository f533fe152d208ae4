"""``ProcessLauncher``: each server inferlet runs in its own worker process.

The engine keeps every resource: the worker's host calls run here, bound to the worker's
:class:`HostInstance`, so when the worker ends — normally, by crashing, or killed for passing
a limit — ``release_all`` frees its pages and subscriptions exactly as for an in-process one.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import os
import signal
import sys
from typing import Any

from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime.engine import Engine
from pie_core.runtime.events import Event
from pie_core.runtime.manifest import Manifest
from pie_core.server.isolation.limits import WorkerLimits
from pie_core.server.isolation.wire import HEADER, HandleTable, decode_from_worker, encode_for_worker, is_value
from pie_core.server.isolation.worker import HOST_MODULES

__all__ = ["ProcessLauncher"]

_MODULES = frozenset(HOST_MODULES)


class ProcessLauncher:
    """Runs each inferlet in a worker process under :class:`WorkerLimits`."""

    def __init__(self, limits: WorkerLimits | None = None) -> None:
        self.limits = limits or WorkerLimits()
        self.workers: set[asyncio.subprocess.Process] = set()

    def start(self, engine: Engine, manifest: Manifest, args: dict[str, Any], instance: HostInstance) -> asyncio.Task[Event]:
        coro = self._run(manifest, args, instance)
        return asyncio.get_running_loop().create_task(coro, name=f"pie-worker-{manifest.name}-{instance.id}")

    async def _run(self, manifest: Manifest, args: dict[str, Any], inst: HostInstance) -> Event:
        token = bind(inst)
        proc: asyncio.subprocess.Process | None = None
        final = Event("error", "cancelled")
        try:
            try:
                payload = manifest.validate_input(args)
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", "from pie_core.server.isolation.worker import main; main()",
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True)
                self.workers.add(proc)
                final = await self._serve(proc, manifest, payload, inst)
            except asyncio.CancelledError as exc:
                final = Event("error", f"cancelled: {exc.args[0]}" if exc.args and exc.args[0] else "cancelled")
                raise
            except Exception as exc:
                final = Event("error", f"{type(exc).__name__}: {exc}")
            return final
        finally:  # the worker is gone and its pages are back before the client hears the end
            if proc is not None:
                _kill(proc)
            inst.release_all()
            unbind(token)
            inst.emit(final)
            if proc is not None:
                assert proc.stdin is not None
                proc.stdin.close()
                try:
                    await proc.wait()
                finally:  # even when cancelled here (server shutdown): the worker was SIGKILLed above
                    proc._transport.close()  # type: ignore[attr-defined]  # asyncio has no public close
                    self.workers.discard(proc)

    async def _serve(self, proc: asyncio.subprocess.Process, manifest: Manifest, payload: Any, inst: HostInstance) -> Event:
        assert proc.stdin is not None and proc.stdout is not None
        table, calls = HandleTable(), set()
        proc.stdin.write(encode_for_worker((manifest, payload, self.limits), table))
        loop = asyncio.get_running_loop()
        phase = {"limit": f"start-up limit of {self.limits.start_s:g}s"}

        async def session(deadline: asyncio.Timeout) -> Event:
            assert proc.stdout is not None
            while True:
                try:
                    head = await proc.stdout.readexactly(HEADER.size)
                    msg = decode_from_worker(await proc.stdout.readexactly(HEADER.unpack(head)[0]), table)
                except asyncio.IncompleteReadError:
                    return Event("error", _death(await proc.wait()))
                if msg[0] == "done":
                    return Event(msg[2], msg[3])
                if msg[0] == "started":  # imports are done: the wall clock starts now
                    phase["limit"] = f"wall-time limit of {self.limits.wall_s:g}s"
                    deadline.reschedule(loop.time() + self.limits.wall_s if self.limits.wall_s > 0 else None)
                    continue
                task = loop.create_task(self._answer(proc, table, msg))
                calls.add(task)
                task.add_done_callback(calls.discard)

        try:
            async with asyncio.timeout(self.limits.start_s or None) as deadline:
                return await session(deadline)
        except TimeoutError:
            return Event("error", f"killed: the inferlet ran past its {phase['limit']}")
        finally:
            for task in calls:
                task.cancel()

    async def _answer(self, proc: asyncio.subprocess.Process, table: HandleTable, msg: tuple[Any, ...]) -> None:
        op, rid = msg[0], msg[1]
        try:
            value = await _execute(op, msg[2:])
            reply = ("reply", rid, True, value)
            data = encode_for_worker(reply, table)
        except Exception as exc:  # the host call failed: the worker re-raises it
            data = encode_for_worker(("reply", rid, False, _portable(exc)), table)
        assert proc.stdin is not None
        if proc.returncode is None:
            proc.stdin.write(data)
            try:
                await proc.stdin.drain()
            except (ConnectionError, BrokenPipeError):
                pass


async def _execute(op: str, args: tuple[Any, ...]) -> Any:
    if op == "call":
        module, name, pargs, kwargs = args
        if module not in _MODULES:
            raise PermissionError(f"no host module {module!r}")
        mod = importlib.import_module(f"pie_core.host.{module}")
        if name.startswith("_") or name not in getattr(mod, "__all__", ()):
            raise PermissionError(f"pie_core.host.{module} has no public function {name!r}")
        result = getattr(mod, name)(*pargs, **kwargs)
        return await result if inspect.isawaitable(result) else result
    obj, name = args[0], args[1]
    if op == "copy":
        return copy.deepcopy(obj) if name else copy.copy(obj)
    if not isinstance(name, str) or name.startswith("_"):
        raise PermissionError(f"attribute {name!r} is private")
    if op == "getattr":  # methods and properties of the handle's class; data only as values
        static = inspect.getattr_static(type(obj), name, None)
        if inspect.isfunction(static):
            return ("amethod", None) if inspect.iscoroutinefunction(static) else ("method", None)
        value = getattr(obj, name)
        if not is_value(value):
            raise PermissionError(f"{type(obj).__name__}.{name} is not available to inferlets")
        return ("value", value)
    if op == "mcall":
        if not inspect.isfunction(inspect.getattr_static(type(obj), name, None)):
            raise PermissionError(f"{type(obj).__name__}.{name} is not a method")
        result = getattr(obj, name)(*args[2], **args[3])
        return await result if inspect.isawaitable(result) else result
    raise PermissionError(f"unknown worker request {op!r}")


def _portable(exc: Exception) -> Exception:
    """``exc`` if it pickles as a value, else a PieError carrying its text."""
    from pie_core.errors import PieError

    return exc if type(exc).__module__ in ("builtins",) or type(exc).__module__.startswith("pie_core.") else PieError(f"{type(exc).__name__}: {exc}")


def _death(code: int) -> str:
    if code < 0:
        sig = signal.Signals(-code)
        why = {signal.SIGXCPU: " (CPU-time limit)", signal.SIGKILL: " (CPU-time limit or out of memory)"}.get(sig, "")
        return f"worker killed by {sig.name}{why}"
    return f"worker exited with code {code} before the inferlet finished"


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
