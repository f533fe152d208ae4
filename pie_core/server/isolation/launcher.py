"""``ProcessLauncher``: each server inferlet runs in its own worker process.

The engine keeps every resource: the worker's host calls run here, bound to the worker's
:class:`HostInstance`, so when the worker ends — normally, by crashing, or killed for passing
a limit — ``release_all`` frees its pages and subscriptions exactly as for an in-process one.
The first message a worker gets is ``(manifest, input, limits, scratch dir)``.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import signal
from typing import Any, Callable

from pie_core.host import runtime as host_runtime
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime.engine import Engine
from pie_core.runtime.events import Event
from pie_core.runtime.manifest import Manifest
from pie_core.server.isolation.limits import WorkerLimits
from pie_core.server.isolation.spawner import Spawner, WorkerProcess
from pie_core.server.isolation.wire import HEADER, HandleTable, decode_from_worker, encode_for_worker, is_value
from pie_core.server.isolation.worker import HOST_MODULES

__all__ = ["ProcessLauncher"]

_MODULES = frozenset(HOST_MODULES)


class ProcessLauncher:
    """Runs each inferlet in a worker process under :class:`WorkerLimits`.

    Workers are forked from a zygote that has already imported Pie and the SDK (``zygote=False``,
    or a zygote that fails to start, execs a fresh interpreter per launch instead). A worker's
    ``runtime.spawn`` runs the child in a worker of its own, with the same user and limits.
    """

    def __init__(self, limits: WorkerLimits | None = None, *, zygote: bool = True) -> None:
        self.limits = limits or WorkerLimits()
        self.workers: set[WorkerProcess] = set()
        self.spawner = Spawner(zygote=zygote)

    def start(self, engine: Engine, manifest: Manifest, args: dict[str, Any], instance: HostInstance) -> asyncio.Task[Event]:
        coro = self._run(manifest, args, instance)
        return asyncio.get_running_loop().create_task(coro, name=f"pie-worker-{manifest.name}-{instance.id}")

    def warm_up(self) -> None:
        """Start the zygote now (in the background) rather than on the first launch."""
        self.spawner.warm_up()

    async def aclose(self) -> None:
        """Stop the zygote; call once no inferlet runs any more."""
        await self.spawner.aclose()

    async def _run(self, manifest: Manifest, args: dict[str, Any], inst: HostInstance) -> Event:
        token = bind(inst)
        started: list[WorkerProcess] = []
        final = Event("error", "cancelled")
        try:
            try:
                final = await self._launch(manifest, args, started)
            except asyncio.CancelledError as exc:
                final = Event("error", f"cancelled: {exc.args[0]}" if exc.args and exc.args[0] else "cancelled")
                raise
            except Exception as exc:
                final = Event("error", f"{type(exc).__name__}: {exc}")
            return final
        finally:  # the worker is gone and its pages are back before the client hears the end
            for worker in started:
                worker.kill()
            inst.release_all()
            unbind(token)
            try:
                for worker in started:
                    await worker.reap()
            finally:
                inst.emit(final)
                for worker in started:
                    worker.close()
                    self.workers.discard(worker)

    async def _launch(self, manifest: Manifest, args: dict[str, Any], started: list[WorkerProcess]) -> Event:
        payload = manifest.validate_input(args)
        scratch = host_runtime.scratch_dir()
        phase = f"start-up limit of {self.limits.start_s:g}s"
        try:
            async with asyncio.timeout(self.limits.start_s or None) as deadline:
                worker = await self.spawner.start_worker()
                started.append(worker)
                self.workers.add(worker)

                def on_started() -> None:  # imports are done: the wall clock starts now
                    nonlocal phase
                    phase = f"wall-time limit of {self.limits.wall_s:g}s"
                    deadline.reschedule(asyncio.get_running_loop().time() + self.limits.wall_s if self.limits.wall_s > 0 else None)

                return await self._serve(worker, (manifest, payload, self.limits, scratch), on_started)
        except TimeoutError:
            return Event("error", f"killed: the inferlet ran past its {phase}")

    async def _serve(self, worker: WorkerProcess, first: tuple[Any, ...], on_started: Callable[[], None]) -> Event:
        table, calls = HandleTable(), set[asyncio.Task[None]]()
        worker.stdin.write(encode_for_worker(first, table))
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    head = await worker.stdout.readexactly(HEADER.size)
                    msg = decode_from_worker(await worker.stdout.readexactly(HEADER.unpack(head)[0]), table)
                except asyncio.IncompleteReadError:
                    return Event("error", _death(await worker.wait()))
                if msg[0] == "done":
                    return Event(msg[2], msg[3])
                if msg[0] == "started":
                    on_started()
                    continue
                task = loop.create_task(self._answer(worker, table, msg))
                calls.add(task)
                task.add_done_callback(calls.discard)
        finally:  # open host calls end first: a spawned child's worker is killed and its pages are back
            for task in calls:
                task.cancel()
            if calls:
                await asyncio.wait(list(calls))

    async def _answer(self, worker: WorkerProcess, table: HandleTable, msg: tuple[Any, ...]) -> None:
        op, rid = msg[0], msg[1]
        try:
            if op == "call" and msg[2:4] == ("runtime", "spawn"):
                value = await host_runtime.spawn_child(*msg[4], **msg[5], runner=self._run)
            else:
                value = await _execute(op, msg[2:])
            data = encode_for_worker(("reply", rid, True, value), table)
        except Exception as exc:  # the host call failed: the worker re-raises it
            data = encode_for_worker(("reply", rid, False, _portable(exc)), table)
        if worker.running and not worker.stdin.is_closing():
            worker.stdin.write(data)
            try:
                await worker.stdin.drain()
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


def _death(code: int | None) -> str:
    if code is None:
        return "worker ended before the inferlet finished (its exit code was lost with the zygote)"
    if code < 0:
        sig = signal.Signals(-code)
        why = {signal.SIGXCPU: " (CPU-time limit)", signal.SIGKILL: " (CPU-time limit or out of memory)"}.get(sig, "")
        return f"worker killed by {sig.name}{why}"
    return f"worker exited with code {code} before the inferlet finished"

