"""The engine's side of one wasm instance's imports: its handles, its calls in flight, its output.

The arguments of an import arrive lifted (:mod:`.abi`); the guest's thread then runs the host
function: a synchronous one that needs no event loop (:func:`~pie_core.host.binding.any_thread`)
right there, any other on the engine's event loop through :func:`host_api.invoke` (a
synchronous import waits for it; an async one returns a call number that ``poll.wait`` and
``<name>-result`` settle). What it returns, or raises, is lowered as the import's result.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import threading
import time
from typing import Any, Callable

from inferlet.host import types as _types
from pie_core.errors import PieError
from pie_core.host.binding import HostInstance, is_any_thread
from pie_core.runtime import host_api

__all__ = ["Guest", "KIND_IDS", "MAX_HANDLES"]

MAX_HANDLES = 2**16
"""Engine objects one wasm instance may hold."""

KIND_IDS = {cls.wit: i + 1 for i, cls in enumerate(_types.HANDLES)}
"""The host resource type id of each handle resource."""

_CANCEL_POLL_S = 0.1  # how often a guest blocked in poll.wait looks at its cancellation

Outcome = tuple[bool, Any]
"""What an import returns: (True, value) or (False, the exception)."""


class Guest:
    """One running instance: its handles, pending calls and output, seen from the host."""

    def __init__(self, inst: HostInstance, loop: asyncio.AbstractEventLoop, runner: Any,
                 cancelled: threading.Event) -> None:
        self.inst, self.loop, self.runner, self.cancelled = inst, loop, runner, cancelled
        self._objs: dict[int, Any] = {}  # rep -> engine object
        self._reps: dict[int, int] = {}  # id(engine object) -> rep
        self.pending: dict[int, concurrent.futures.Future[Any]] = {}
        self.next_pending = 0
        self.partial: dict[str, str] = {"stdout": "", "stderr": ""}
        self.kinds: dict[int, list[Any]] = {}  # pending forward -> its probes' kinds
        self.cancels: dict[int, Callable[[], None]] = {}  # call -> what cancels it (touched on the loop only)
        self.decoders: dict[str, Any] = {}

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
        """``(type id, rep)`` of engine object ``obj`` given to the guest as a ``resource``.

        Raises:
            PieError: The guest holds :data:`MAX_HANDLES` objects already.
        """
        rep = self._reps.get(id(obj))
        if rep is None:
            if len(self._objs) >= MAX_HANDLES:
                raise PieError(f"an inferlet may hold at most {MAX_HANDLES} engine objects; release the ones it no "
                               "longer needs")
            rep = self._reps[id(obj)] = len(self._objs) + 1
            self._objs[rep] = obj
        return KIND_IDS[resource], rep

    # -- imports -----------------------------------------------------------------------------

    def call(self, module: str, name: str, fn: Callable[..., Any], args: list[Any]) -> Outcome:
        """A synchronous import: run ``fn`` here if it needs no loop, else on the loop and wait."""
        try:
            self.check_running()
            if is_any_thread(fn):
                host_api.CALLS[module, name] += 1
                host_api.check_arguments(fn, f"{module}.{name}", tuple(args))
                return True, fn(*args)
            return True, asyncio.run_coroutine_threadsafe(self._invoke(module, name, fn, args), self.loop).result()
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
        if (module, name) == ("inference", "forward"):  # a probe value's case is its probe's kind
            self.kinds[number] = [p.kind for p in args[6]]
        elif (module, name) == ("inference", "forward_next") and getattr(args[0], "chain", None) is not None:
            self.kinds[number] = [p.kind for p in args[0].chain.probes]
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.pending[number] = future
        self.loop.call_soon_threadsafe(self._begin, number, module, name, fn, args, future)
        return True, number

    def _begin(self, number: int, module: str, name: str, fn: Callable[..., Any], args: list[Any],
               future: concurrent.futures.Future[Any]) -> None:
        """On the loop (bound to the instance, whose context the guest's thread carries): start
        the call; its outcome settles ``future``, which the guest's thread waits on."""
        if future.cancelled():
            return

        def done(ok: bool, value: Any) -> None:
            self.cancels.pop(number, None)
            if not future.done():
                future.set_result(value) if ok else future.set_exception(value)

        started = host_api.start(module, name, fn, args, runner=self.runner, done=done)
        if not future.done():
            self.cancels[number] = started.cancel

    def finish(self, call: int) -> tuple[Outcome, list[Any]]:
        """The second half: the value of call ``call`` (waiting for it if it still runs), and
        its probes' kinds."""
        fut = self.pending.get(call)
        if fut is not None and not fut.done():
            self.wait([call], None)
        fut = self.pending.pop(call, None)
        kinds = self.kinds.pop(call, [])
        try:
            if fut is None:
                raise PieError(f"no host call {call} is pending")
            if not fut.done():
                raise PieError("the inferlet was cancelled")
            return (True, fut.result()), kinds
        except concurrent.futures.CancelledError:
            return (False, PieError("the host call was cancelled")), kinds
        except Exception as exc:  # noqa: BLE001
            return (False, exc), kinds

    def wait(self, calls: list[int], timeout_ms: int | None) -> list[int]:
        """The indices of ``calls`` that finished, waiting until one did, ``timeout_ms`` passed
        or the instance was cancelled."""
        futs = [self.pending.get(c) for c in calls]
        live = [f for f in futs if f is not None]
        if live and not any(f.done() for f in live):
            end = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
            while not self.cancelled.is_set():
                left = _CANCEL_POLL_S if end is None else min(_CANCEL_POLL_S, end - time.monotonic())
                if left <= 0:
                    break
                done, _ = concurrent.futures.wait(live, left, return_when=concurrent.futures.FIRST_COMPLETED)
                if done:
                    break
        if self.cancelled.is_set():
            self.cancel_all()
        return [i for i, f in enumerate(futs) if f is None or f.done() or self.cancelled.is_set()]

    def check_running(self) -> None:
        """Raise once the instance was cancelled: the guest gets errors, never new work."""
        if self.cancelled.is_set():
            raise PieError("the inferlet was cancelled")

    def cancel(self, call: int) -> None:
        self.kinds.pop(call, None)
        fut = self.pending.pop(call, None)
        if fut is not None:
            fut.cancel()
            self.loop.call_soon_threadsafe(self._cancel, call)

    def _cancel(self, call: int) -> None:
        cancel = self.cancels.pop(call, None)
        if cancel is not None:
            cancel()

    def cancel_all(self) -> None:
        for call, fut in list(self.pending.items()):
            fut.cancel()
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self._cancel, call)
        self.pending.clear()

    async def _invoke(self, module: str, name: str, fn: Callable[..., Any], args: list[Any]) -> Any:
        return await host_api.invoke(module, name, fn, args, runner=self.runner)

    # -- output ------------------------------------------------------------------------------

    def output(self, stream: str) -> Callable[[bytes], None]:
        decoder = self.decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")

        def write(data: bytes) -> None:
            text = self.partial[stream] + decoder.decode(bytes(data))
            cut = text.rfind("\n") + 1 if stream == "stdout" else len(text)
            self.partial[stream] = text[cut:]
            if cut:
                self._emit(stream, text[:cut])
        return write

    def flush(self) -> None:
        for stream, text in self.partial.items():
            if text:
                self._emit(stream, text)
        self.partial = {"stdout": "", "stderr": ""}

    def _emit(self, stream: str, text: str) -> None:
        from pie_core.engine.events import Event

        self.loop.call_soon_threadsafe(self.inst.emit, Event(stream, text))
