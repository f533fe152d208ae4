"""The engine's side of one wasm instance's imports: its handles and its calls in flight.

The arguments of an import arrive lifted (:mod:`.abi`); the guest's thread then runs the host
function: a synchronous one that needs no event loop (:func:`~pie_core.host.binding.any_thread`)
right there, any other on the engine's event loop through :func:`host_api.invoke` (a
synchronous import waits for it; an async one returns a call number that ``poll.wait`` and
``<name>-result`` settle). What it returns, or raises, is lowered as the import's result.

Paths the guest gets are its own: ``runtime.scratch-dir`` is :data:`GUEST_SCRATCH` (where the
user's scratch directory is mounted) and ``runtime.scratch-path`` answers beneath it, never with
the engine's folder (which would name the server's data directory and be useless inside).
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import concurrent.futures
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

from inferlet.host import types as _types
from pie_core.errors import PieError
from pie_core.host import runtime as host_runtime
from pie_core.host.binding import HostInstance, bind, is_any_thread, unbind
from pie_core.runtime import host_api

__all__ = ["Guest", "GUEST_SCRATCH", "KIND_IDS", "MAX_HANDLES"]

GUEST_SCRATCH = "/scratch"
"""Where a wasm guest sees its user's scratch directory."""

MAX_HANDLES = 2**16
"""Engine objects one wasm instance may hold."""

KIND_IDS = {cls.wit: i + 1 for i, cls in enumerate(_types.HANDLES)}
"""The host resource type id of each handle resource."""

_CANCEL_POLL_S = 0.1  # how often a guest blocked in poll.wait looks at its cancellation

Outcome = tuple[bool, Any]
"""What an import returns: (True, value) or (False, the exception)."""

_log = logging.getLogger(__name__)


class _Call:
    """An async import in flight: its outcome once settled (on the loop), and a lock held until
    then, which the guest's thread waits on without the GIL."""

    __slots__ = ("guest", "kinds", "ready", "ok", "value", "cancelled")

    def __init__(self, guest: Guest, kinds: list[Any]) -> None:
        self.guest, self.kinds = guest, kinds  # kinds: the probes' kinds of a forward's result
        self.ready = _thread.allocate_lock()
        self.ready.acquire()
        self.ok: bool | None = None
        self.value: Any = None
        self.cancelled = False

    def settle(self, ok: bool, value: Any) -> None:
        if self.ok is not None:
            return
        self.ok, self.value = ok, value
        self.ready.release()
        if self.guest.waiting_any:
            self.guest.woken.set()


class _Mailbox:
    """Work the guests' threads hand to one event loop. A ``call_soon_threadsafe`` per call is a
    write to the loop's self-pipe and a GIL handoff each; posted work waits in one queue that a
    single scheduled callback drains, so calls arriving together cost one wakeup."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self.scheduled = False

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        self.items.append((fn, args))
        if not self.scheduled:  # a race only schedules a second, harmless drain
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self.scheduled = False  # before draining: what is posted from now on schedules again
        items = self.items
        while items:
            fn, args = items.popleft()
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one guest's failure must not drop the others' calls
                _log.exception("a wasm guest's host call could not start")


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()
_MAILBOX_LOCK = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _MAILBOXES.get(loop)
    if box is None:
        with _MAILBOX_LOCK:
            box = _MAILBOXES.setdefault(loop, _Mailbox(loop))
    return box


def _guest_path(host_path: str) -> str:
    """``host_path`` (in the running user's scratch directory) as the guest sees it."""
    rel = os.path.relpath(host_path, host_runtime.scratch_dir())
    return GUEST_SCRATCH if rel == "." else f"{GUEST_SCRATCH}/{rel}"


class Guest:
    """One running instance: its handles and pending calls, seen from the host."""

    def __init__(self, inst: HostInstance, loop: asyncio.AbstractEventLoop, runner: Any,
                 cancelled: threading.Event, *, deadline: float = float("inf"), wall_s: float = 0.0) -> None:
        self.inst, self.loop, self.runner, self.cancelled = inst, loop, runner, cancelled
        self.deadline, self.wall_s = deadline, wall_s  # time.monotonic() at which the wall-time limit ends it
        self._objs: dict[int, Any] = {}  # rep -> engine object
        self._reps: dict[int, int] = {}  # id(engine object) -> rep
        self._held: dict[int, int] = {}  # rep -> handles the guest holds to it
        self._next_rep = 0
        self.pending: dict[int, _Call] = {}
        self.next_pending = 0
        self.woken = threading.Event()  # set by every settle while the guest waits on several calls
        self.waiting_any = False
        self.cancels: dict[int, Callable[[], None]] = {}  # call -> what cancels it (touched on the loop only)

    # -- handles -----------------------------------------------------------------------------

    def handle(self, resource: str, type_id: int, rep: int) -> Any:
        """The engine object behind resource ``rep`` the guest passed as a ``resource``.

        Raises:
            PermissionError: The engine never gave this guest such a handle.
        """
        obj = self._objs.get(rep)
        if type_id != KIND_IDS[resource] or obj is None:
            raise PermissionError(f"that {resource} handle was not given to this inferlet")
        return obj

    def resource(self, resource: str, obj: Any) -> tuple[int, int]:
        """``(type id, rep)`` of engine object ``obj`` given to the guest as a ``resource`` (one
        more handle the guest holds to it, until it drops it: :meth:`drop`).

        Raises:
            PieError: The guest holds :data:`MAX_HANDLES` objects already.
        """
        rep = self._reps.get(id(obj))
        if rep is None:
            if len(self._objs) >= MAX_HANDLES:
                raise PieError(f"an inferlet may hold at most {MAX_HANDLES} engine objects; release the ones it no "
                               "longer needs")
            self._next_rep += 1
            rep = self._reps[id(obj)] = self._next_rep
            self._objs[rep] = obj
            self._held[rep] = 0
        self._held[rep] += 1
        return KIND_IDS[resource], rep

    def drop(self, rep: int) -> None:
        """The guest dropped a handle to ``rep`` (the resource's destructor): the engine object
        leaves the table with the last one (releasing a context or adapter is the guest's call;
        the handle table only stops keeping the object alive)."""
        held = self._held.get(rep)
        if held is None:
            return
        if held > 1:
            self._held[rep] = held - 1
            return
        del self._held[rep]
        obj = self._objs.pop(rep)
        del self._reps[id(obj)]

    # -- imports -----------------------------------------------------------------------------

    def call(self, module: str, name: str, fn: Callable[..., Any], args: list[Any]) -> Outcome:
        """A synchronous import: run ``fn`` here if it needs no loop, else on the loop and wait
        (until it ends, the instance is cancelled or its wall-time limit passes)."""
        try:
            self.check_running()
            host_api.CALLS[module, name] += 1  # here for both kinds: host_api.invoke counts nothing
            if is_any_thread(fn):
                host_api.check_arguments(fn, f"{module}.{name}", tuple(args))
                value = fn(*args)
                if module == "runtime" and name in ("scratch_dir", "scratch_path"):
                    value = _guest_path(value)
                return True, value
            future = asyncio.run_coroutine_threadsafe(self._invoke(module, name, fn, args), self.loop)
            while True:
                try:
                    return True, future.result(timeout=self._slice())
                except concurrent.futures.TimeoutError:
                    if self.stop_reason() is not None:
                        future.cancel()
                        self.check_running()
        except Exception as exc:  # noqa: BLE001 - the guest gets it as the error record
            return False, exc

    def start(self, module: str, name: str, fn: Callable[..., Any], args: list[Any]) -> Outcome:
        """The first half of an async import: start ``fn`` on the loop; the call's number."""
        try:
            self.check_running()
        except Exception as exc:  # noqa: BLE001
            return False, exc
        self.next_pending += 1
        number = self.next_pending
        kinds: list[Any] = []
        if (module, name) == ("inference", "forward"):  # a probe value's case is its probe's kind
            kinds = [p.kind for p in args[6]]
        elif (module, name) == ("inference", "forward_next") and getattr(args[0], "chain", None) is not None:
            kinds = [p.kind for p in args[0].chain.probes]
        call = self.pending[number] = _Call(self, kinds)
        _mailbox(self.loop).post(self._begin, number, module, name, fn, args, call)
        return True, number

    def _begin(self, number: int, module: str, name: str, fn: Callable[..., Any], args: list[Any],
               call: _Call) -> None:
        """On the loop, bound to the instance: start the call; its outcome settles ``call``."""
        if call.cancelled:
            return

        def done(ok: bool, value: Any) -> None:
            self.cancels.pop(number, None)
            call.settle(ok, value)

        token = bind(self.inst)
        try:
            started = host_api.start(module, name, fn, args, runner=self.runner, done=done)
        finally:
            unbind(token)
        if call.ok is None:
            self.cancels[number] = started.cancel

    def finish(self, number: int) -> tuple[Outcome, list[Any]]:
        """The second half: the value of call ``number`` (waiting for it if it still runs), and
        its probes' kinds (once per pass of a ``forward_next``)."""
        call = self.pending.get(number)
        if call is not None and call.ok is None:
            self.wait([number], None)
        call = self.pending.pop(number, None)
        if call is None:
            return (False, PieError(f"no host call {number} is pending")), []
        if call.ok is None:
            return (False, PieError("the inferlet was cancelled")), call.kinds
        value, kinds = call.value, call.kinds
        if call.ok and kinds and type(value) is list:  # forward_next: the passes it took
            kinds = kinds * len(value)
        return (call.ok, value), kinds

    def wait(self, numbers: list[int], timeout_ms: int | None) -> list[int]:
        """The indices of ``numbers`` that finished, waiting until one did, ``timeout_ms``
        passed or the instance was cancelled."""
        calls = [self.pending.get(n) for n in numbers]
        live = [c for c in calls if c is not None]
        if not numbers and timeout_ms is not None:  # a sleep (pie_guest.clock): ends early when stopped
            end = min(time.monotonic() + timeout_ms / 1000, self.deadline)
            while self.stop_reason() is None and (left := end - time.monotonic()) > 0:
                self.cancelled.wait(min(left, _CANCEL_POLL_S))
            return []
        if live and all(c.ok is None for c in live):
            end = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
            one = live[0] if len(live) == 1 else None
            if one is None:
                self.woken.clear()
                self.waiting_any = True  # every settle sets ``woken`` from now on
            try:
                while self.stop_reason() is None and all(c.ok is None for c in live):
                    left = self._slice() if end is None else min(self._slice(), end - time.monotonic())
                    if left <= 0:
                        break
                    if one is not None:
                        if one.ready.acquire(timeout=left):
                            one.ready.release()
                    else:
                        self.woken.wait(left)
                        self.woken.clear()
            finally:
                self.waiting_any = False
        stopped = self.stop_reason() is not None
        if stopped:
            self.cancel_all()
        return [i for i, c in enumerate(calls) if c is None or c.ok is not None or stopped]

    def check_running(self) -> None:
        """Raise once the instance was cancelled or ran out of time: the guest gets errors,
        never new work."""
        reason = self.stop_reason()
        if reason is not None:
            raise PieError(reason)

    def stop_reason(self) -> str | None:
        """Why the instance must stop now (cancelled, or past its wall-time limit), else None."""
        if self.cancelled.is_set():
            return "the inferlet was cancelled"
        if time.monotonic() >= self.deadline:
            return f"killed: the inferlet ran past its wall-time limit of {self.wall_s:g}s"
        return None

    def _slice(self) -> float:
        """How long one wait may last before looking at :meth:`stop_reason` again."""
        return max(0.001, min(_CANCEL_POLL_S, self.deadline - time.monotonic()))

    def cancel(self, number: int) -> None:
        call = self.pending.pop(number, None)
        if call is not None:
            call.cancelled = True
            self.loop.call_soon_threadsafe(self._cancel, number)

    def _cancel(self, number: int) -> None:
        cancel = self.cancels.pop(number, None)
        if cancel is not None:
            cancel()

    def cancel_all(self) -> None:
        for number, call in list(self.pending.items()):
            call.cancelled = True
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self._cancel, number)
        self.pending.clear()

    async def _invoke(self, module: str, name: str, fn: Callable[..., Any], args: list[Any]) -> Any:
        return await host_api.invoke(module, name, fn, args, runner=self.runner)
