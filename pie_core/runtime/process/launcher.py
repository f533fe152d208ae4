"""``ProcessLauncher``: each server inferlet runs in its own worker process.

The engine keeps every resource: the worker's host calls run here, bound to the worker's
:class:`HostInstance`, so when the worker ends — normally, by crashing, or killed for passing
a limit — ``release_all`` frees its pages and subscriptions exactly as for an in-process one.

The worker is a stranger: its frames are decoded by :mod:`.wire` (bounded, no code named by
the frame runs), and it may only call what :mod:`.host_api` declares. A frame or message that
breaks the protocol kills the worker with an error event; a declared call that fails (a wrong
argument count, a host error) is re-raised in the worker as it would be in-process.

The first message a worker gets is ``{name, entry, root, input, limits, scratch}``; then the
worker sends ``[op, ...]`` lists (see :meth:`_Session.dispatch`) and gets ``["reply", id, ok,
value]`` for each call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from typing import Any, Awaitable, Callable

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.errors import PieError
from pie_core.host import runtime as host_runtime
from pie_core.host.binding import HostInstance, bind, run_off_loop, unbind
from pie_core.runtime import host_api
from pie_core.runtime.instance import _jsonable
from pie_core.runtime.library import find_program
from pie_core.runtime.manifest import Manifest
from pie_core.runtime.process.limits import WorkerLimits
from pie_core.runtime.process.spawner import Spawner, WorkerProcess
from pie_core.runtime.process.wire import HEADER, Codec, ProtocolError, check_frame_size

__all__ = ["ProcessLauncher", "MAX_CALLS", "MAX_HANDLES", "MAX_UNREAD"]

_log = logging.getLogger(__name__)

MAX_CALLS = 128  # host calls one worker may have in flight; past it the engine stops reading its pipe
MAX_UNREAD = 16 * 2**20  # bytes of replies a worker may leave unread before the engine stops reading its calls
INLINE_DECODE_BYTES = 16 * 2**10  # frames up to this size are decoded on the event loop (a few ms at most)
MAX_HANDLES = 2**16  # engine objects one worker may hold
_MAX_ERROR = 16 * 1024  # characters of a worker's error text that reach the client


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

    def workers_of(self, user: str) -> list[WorkerProcess]:
        """The running workers of ``user``'s inferlets (spawned children included)."""
        return [w for w in self.workers if w.user == user and w.running]

    def users(self) -> set[str]:
        """Users with a running worker."""
        return {w.user for w in self.workers if w.user is not None and w.running}

    def warm_up(self) -> None:
        """Start the zygote now (in the background) rather than on the first launch."""
        self.spawner.warm_up()

    async def aclose(self) -> None:
        """Stop the zygote; call once no inferlet runs any more."""
        await self.spawner.aclose()

    async def _run(self, manifest: Manifest, args: dict[str, Any], inst: HostInstance) -> Event:
        if inst.resolve_program is None:  # no resolver from the server: spawn finds folders and examples by name
            inst.resolve_program = find_program
        token = bind(inst)
        started: list[WorkerProcess] = []
        final = Event("error", "cancelled")
        try:
            try:
                final = await self._launch(manifest, args, started, inst.emit, inst.username)
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

    async def _launch(self, manifest: Manifest, args: dict[str, Any], started: list[WorkerProcess],
                      emit: Callable[[Event], None], user: str | None = None) -> Event:
        payload = manifest.validate_input(args)
        first = {"name": manifest.name, "entry": manifest.entry, "root": str(manifest.root), "input": payload,
                 "limits": dataclasses.asdict(self.limits), "scratch": host_runtime.scratch_dir()}
        phase = f"start-up limit of {self.limits.start_s:g}s"
        loop = asyncio.get_running_loop()
        launched, said_started = loop.time(), False
        try:
            async with asyncio.timeout(self.limits.start_s or None) as deadline:
                worker = await self.spawner.start_worker()
                worker.user = user
                started.append(worker)
                self.workers.add(worker)

                def on_started() -> None:  # imports are done: the wall clock starts, counted from the launch
                    nonlocal phase, said_started
                    if said_started:
                        raise ProtocolError("the worker reported 'started' twice")
                    said_started = True
                    phase = f"wall-time limit of {self.limits.wall_s:g}s"
                    end = None
                    if self.limits.wall_s > 0:
                        end = loop.time() + self.limits.wall_s
                        if self.limits.start_s > 0:
                            end = min(end, launched + self.limits.start_s + self.limits.wall_s)
                    deadline.reschedule(end)

                return await _Session(worker, emit, self._run).serve(first, on_started)
        except TimeoutError:
            return Event("error", f"killed: the inferlet ran past its {phase}")


class _HandleTable:
    """Engine objects a worker holds by id; only the classes :mod:`.host_api` declares."""

    def __init__(self) -> None:
        self._objs: dict[int, Any] = {}
        self._ids: dict[int, int] = {}

    def ref(self, obj: Any) -> tuple[int, str] | None:
        kind = host_api.handle_kind(obj)
        if kind is None:
            return None
        rid = self._ids.get(id(obj))
        if rid is None:
            if len(self._objs) >= MAX_HANDLES:
                raise PieError(f"an inferlet worker may hold at most {MAX_HANDLES} engine objects (contexts, matchers, "
                               "builders...); release the ones it no longer needs")
            rid = self._ids[id(obj)] = len(self._objs) + 1
            self._objs[rid] = obj
        return rid, kind.name

    def get(self, rid: int, kind: str) -> Any:
        obj = self._objs.get(rid)
        if obj is None:
            raise ProtocolError(f"the worker named handle {rid}, which the engine never gave it")
        return obj


_Runner = Callable[[Manifest, dict[str, Any], HostInstance], Awaitable[Event]]


class _Session:
    """The engine's side of one worker's pipe: reads and checks its messages, runs its calls.

    Calls start as :func:`host_api.start` starts them (a quick one answers at once, a decode
    step when its pass lands, the rest as tasks) and each reply is written when its call ends.
    The engine reads no more calls from a worker with :data:`MAX_CALLS` in flight, or whose
    replies wait unread past :data:`MAX_UNREAD` bytes.
    """

    def __init__(self, worker: WorkerProcess, emit: Callable[[Event], None], runner: _Runner) -> None:
        self.worker, self.emit, self.runner = worker, emit, runner
        self.table = _HandleTable()
        self.codec = Codec(self.table.ref, self.table.get)
        self.calls: dict[int, host_api.Started] = {}  # call id -> the call in flight
        self.in_flight, self.room = 0, asyncio.Event()
        self.room.set()

    async def serve(self, first: dict[str, Any], on_started: Callable[[], None]) -> Event:
        self.worker.stdin.write(self.codec.encode(first))
        try:
            while True:
                await self.room.wait()  # MAX_CALLS calls in flight: read no more until one ends
                if self.worker.stdin.transport.get_write_buffer_size() > MAX_UNREAD:
                    await self._drain()  # a worker that does not read its replies gets no more served
                try:
                    (size,) = HEADER.unpack(await self.worker.stdout.readexactly(HEADER.size))
                    check_frame_size(size)
                    payload = await self.worker.stdout.readexactly(size)
                    # a frame's containers cost ~2 us each to check (up to MAX_CONTAINERS: seconds); past a
                    # few thousand the decode runs in an off-loop thread, on this user's turn
                    msg = self.codec.decode(payload) if size <= INLINE_DECODE_BYTES else \
                        await run_off_loop(self.codec.decode, payload)
                    final = self.dispatch(msg, on_started)
                except asyncio.IncompleteReadError:
                    code = await self.worker.wait()
                    return Event("error", self.worker.kill_reason or _death(code))
                except ProtocolError as exc:
                    return Event("error", f"killed: the inferlet's worker broke the host protocol: {exc}")
                if final is not None:
                    return final
        finally:  # open host calls end first: a spawned child's worker is killed and its pages are back
            calls = list(self.calls.values())
            for call in calls:
                call.cancel()
            tasks = [call.task for call in calls if call.task is not None]
            if tasks:
                await asyncio.wait(tasks)

    def dispatch(self, msg: Any, on_started: Callable[[], None]) -> Event | None:
        """Check one message and act on it: ``["call", id, module, name, args]``, ``["cancel", id]``
        (the worker no longer awaits that call: it is cancelled here too, and its reply says so),
        ``["tell", module, name, args]`` (a one-way call: no reply),
        ``["print", "stdout"|"stderr", text]``, ``["started", abi]`` (once) or ``["done",
        "return"|"error", value]``, which ends the session with that event. Handles are opaque:
        a worker reaches an engine object only by passing it to a host function.

        Raises:
            ProtocolError: Anything else, or an undeclared call.
        """
        op = msg[0] if isinstance(msg, list) and msg else None
        fields = {"call": 5, "cancel": 2, "tell": 4, "print": 3, "started": 2, "done": 3}.get(op) if isinstance(op, str) else None
        if fields is None or len(msg) != fields:
            raise ProtocolError(f"unknown message {str(msg)[:120]}; a worker sends call, cancel, tell, print, started "
                                "or done, each with its fields")
        if op == "cancel":  # the inferlet stopped awaiting call msg[1]; one that already ended is no error
            call = self.calls.get(msg[1]) if type(msg[1]) is int else None
            if call is not None:
                call.cancel()
            return None
        if op == "tell":
            self._tell(*msg[1:])
            return None
        if op == "print":
            if msg[1] not in ("stdout", "stderr") or not isinstance(msg[2], str):
                raise ProtocolError("print takes 'stdout' or 'stderr' and a str")
            self.emit(Event(msg[1], msg[2]))
            return None
        if op == "started":
            on_started()
            return None
        if op == "done":
            if msg[1] == "return":
                return Event("return", _jsonable(msg[2]))
            if msg[1] == "error" and isinstance(msg[2], str):
                return Event("error", msg[2] if len(msg[2]) <= _MAX_ERROR else msg[2][:_MAX_ERROR] + " [...]")
            raise ProtocolError("done takes 'return' and a value, or 'error' and a str")
        rid = msg[1]
        if type(rid) is not int or not 0 < rid < 2**63:
            raise ProtocolError(f"call ids are positive 64-bit ints, got {str(rid)[:40]}")
        if rid in self.calls:
            raise ProtocolError(f"call id {rid} is in flight already")
        self._call(rid, *msg[2:])
        return None

    def _call(self, rid: int, module: Any, name: Any, args: Any) -> None:
        """Start checked call ``rid``; ProtocolError for anything undeclared. Handle arguments
        were checked when the frame was decoded: each is one the engine gave this worker
        (:class:`_HandleTable`)."""
        fn = _declared(lambda: host_api.host_function(module, name))
        if not isinstance(args, (list, tuple)):
            raise ProtocolError("a call's arguments are a list")
        self.in_flight += 1
        if self.in_flight >= MAX_CALLS:
            self.room.clear()
        ended = False

        def done(ok: bool, value: Any) -> None:  # once per call
            nonlocal ended
            ended = True
            self.calls.pop(rid, None)
            self.in_flight -= 1
            self.room.set()
            self._reply(rid, ok, value)

        started = host_api.start(module, name, fn, args, runner=self.runner, done=done)
        if not ended:
            self.calls[rid] = started

    def _tell(self, module: Any, name: Any, args: Any) -> None:
        """Run one-way call ``module.name`` (declared ``oneway``); no reply, a failure is logged."""
        fn = _declared(lambda: host_api.host_function(module, name))
        if not host_api.is_oneway(module, name):
            raise ProtocolError(f"{module}.{name} is not a one-way host call: call it")
        if not isinstance(args, (list, tuple)):
            raise ProtocolError("a call's arguments are a list")

        def done(ok: bool, value: Any) -> None:
            if not ok:
                _log.warning("one-way host call %s.%s of a worker failed: %s", module, name, value)

        host_api.start(module, name, fn, args, runner=self.runner, done=done)

    def _reply(self, rid: int, ok: bool, value: Any) -> None:
        """Write the reply to call ``rid`` (an error that cannot cross crosses as its name)."""
        try:
            data = self.codec.encode(["reply", rid, ok, value])
        except (TypeError, ValueError) as exc:  # the result cannot cross: the worker gets why
            problem = value if not ok else exc
            try:
                data = self.codec.encode(["reply", rid, False, problem])
            except (TypeError, ValueError):
                data = self.codec.encode(["reply", rid, False, PieError(f"{type(problem).__name__} (message too large)")])
        if self.worker.running and not self.worker.stdin.is_closing():
            self.worker.stdin.write(data)

    async def _drain(self) -> None:
        try:
            await self.worker.stdin.drain()
        except (ConnectionError, BrokenPipeError):
            pass


def _declared(find: Callable[[], Any]) -> Any:
    try:
        return find()
    except PermissionError as exc:
        raise ProtocolError(str(exc)) from None


def _death(code: int | None) -> str:
    if code is None:
        return "worker ended before the inferlet finished (its exit code was lost with the zygote)"
    if code < 0:
        sig = signal.Signals(-code)
        why = {signal.SIGXCPU: " (CPU-time limit)", signal.SIGKILL: " (CPU-time limit or out of memory)"}.get(sig, "")
        return f"worker killed by {sig.name}{why}"
    return f"worker exited with code {code} before the inferlet finished"
