"""The engine's side of one wasm instance's imports: its handles, its calls in flight, its output.

Each import lifts its arguments from wasmtime's values to the engine's (by the function's
:mod:`.spec`), runs the host function on the event loop through :func:`host_api.invoke` (a
synchronous import waits for it; an async one returns a call number that ``poll.wait`` and
``<name>-result`` settle), and lowers the result, or the exception as the ``error`` record.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from wasmtime import component as wc

from inferlet.host import types as _types
from inferlet.host.wit import Spec, kebab
from pie_core.errors import PieError
from pie_core.host.binding import HostInstance
from pie_core.runtime import host_api

__all__ = ["Guest", "KIND_IDS", "MAX_HANDLES", "MAX_JSON"]

MAX_HANDLES = 2**16
"""Engine objects one wasm instance may hold."""

MAX_JSON = 16 * 2**20
"""Bytes of one JSON value from the guest."""

KIND_IDS = {cls.wit: i + 1 for i, cls in enumerate(_types.HANDLES)}
"""The host resource type id of each handle resource."""

_VALUES = {cls.__name__: cls for cls in (*_types.RECORDS, _types.SamplerKind, _types.ProbeKind)}

_CANCEL_POLL_S = 0.1  # how often a guest blocked in poll.wait looks at its cancellation


@dataclass(eq=False)
class _Handles:
    """Engine objects one instance holds, by number (resource rep)."""

    objs: dict[int, Any] = field(default_factory=dict)
    reps: dict[int, int] = field(default_factory=dict)

    def rep(self, obj: Any) -> int:
        rep = self.reps.get(id(obj))
        if rep is None:
            if len(self.objs) >= MAX_HANDLES:
                raise PieError(f"an inferlet may hold at most {MAX_HANDLES} engine objects; release the ones it no "
                               "longer needs")
            rep = self.reps[id(obj)] = len(self.objs) + 1
            self.objs[rep] = obj
        return rep

    def get(self, rep: int) -> Any:
        return self.objs[rep]


class Guest:
    """One running instance: its handles, pending calls and output, seen from the host."""

    def __init__(self, inst: HostInstance, loop: asyncio.AbstractEventLoop, runner: Any,
                 cancelled: threading.Event) -> None:
        self.inst, self.loop, self.runner, self.cancelled = inst, loop, runner, cancelled
        self.handles = _Handles()
        self.pending: dict[int, concurrent.futures.Future[Any]] = {}
        self.next_pending = 0
        self.decoders: dict[str, Any] = {}
        self.partial: dict[str, str] = {"stdout": "", "stderr": ""}
        self.kinds: dict[int, list[Any]] = {}  # pending forward -> its probes' kinds
        self.probe_kinds: list[Any] = []  # the kinds of the probe values being lowered, in order

    # -- values ----------------------------------------------------------------------------

    def lift(self, store: Any, value: Any, spec: Spec) -> Any:
        """A wasmtime value as the engine's host function takes it."""
        if spec is None:
            return None
        tag = spec[0]
        if tag == "v":
            return value
        if tag == "b":
            return bytes(value)
        if tag == "j":
            if len(value) > MAX_JSON:
                raise ValueError(f"a JSON value from the inferlet is limited to {MAX_JSON} bytes")
            return json.loads(value)
        if tag == "o":
            return None if value is None else self.lift(store, value, spec[1])
        if tag == "l":
            return [self.lift(store, v, spec[1]) for v in value]
        if tag == "t":
            return tuple(self.lift(store, v, s) for v, s in zip(value, spec[1]))
        if tag == "e":
            return _VALUES[spec[1]][value.replace("-", "_").upper()]
        if tag == "r":
            return _VALUES[spec[1]](**{f: self.lift(store, getattr(value, kebab(f)), s) for f, s in spec[2]})
        if tag == "h":
            host = value.to_host(store)
            if host.type != KIND_IDS[spec[1]] or host.rep not in self.handles.objs:
                raise PermissionError(f"that {spec[1]} handle was not given to this inferlet")
            return self.handles.get(host.rep)
        raise TypeError(f"no conversion for spec {spec!r}")

    def lower(self, value: Any, spec: Spec) -> Any:
        """An engine value as wasmtime lowers it into the guest."""
        if spec is None:
            return None
        tag = spec[0]
        if tag == "v":
            return value
        if tag == "b":
            return bytes(value)
        if tag == "j":
            return json.dumps(value)
        if tag == "o":
            return None if value is None else self.lower(value, spec[1])
        if tag == "l":
            return [self.lower(v, spec[1]) for v in value]
        if tag == "t":
            return tuple(self.lower(v, s) for v, s in zip(value, spec[1]))
        if tag == "e":
            return kebab(value.name)
        if tag == "r":
            rec = wc.Record()
            for f, s in spec[2]:
                setattr(rec, kebab(f), self.lower(getattr(value, f), s))
            return rec
        if tag == "p":
            return _probe(value, self.probe_kinds.pop(0) if self.probe_kinds else None)
        if tag == "h":
            return wc.ResourceHost.own(self.handles.rep(value), KIND_IDS[spec[1]])
        raise TypeError(f"no conversion for spec {spec!r}")

    # -- imports -----------------------------------------------------------------------------

    def caller(self, module: str, name: str, fn: Callable[..., Any], params: tuple[tuple[str, Spec], ...],
               result: Spec, wrap: Callable[[bool, Any], Any]) -> Callable[..., Any]:
        def call(store: Any, *raw: Any) -> Any:
            try:
                self.check_running()
                args = [self.lift(store, v, s) for v, (_, s) in zip(raw, params)]
                value = asyncio.run_coroutine_threadsafe(self._invoke(module, name, fn, args), self.loop).result()
                return wrap(True, self.lower(value, result))
            except Exception as exc:  # noqa: BLE001 - the guest gets it as the error record
                return wrap(False, _error(exc))
        return call

    def starter(self, module: str, name: str, fn: Callable[..., Any], params: tuple[tuple[str, Spec], ...],
                wrap: Callable[[bool, Any], Any]) -> Callable[..., Any]:
        def start(store: Any, *raw: Any) -> Any:
            try:
                self.check_running()
                args = [self.lift(store, v, s) for v, (_, s) in zip(raw, params)]
            except Exception as exc:  # noqa: BLE001
                return wrap(False, _error(exc))
            self.next_pending += 1
            if (module, name) == ("inference", "forward"):  # a probe value's case is its probe's kind
                self.kinds[self.next_pending] = [p.kind for p in args[[n for n, _ in params].index("probes")]]
            self.pending[self.next_pending] = asyncio.run_coroutine_threadsafe(
                self._invoke(module, name, fn, args), self.loop)
            return wrap(True, self.next_pending)
        return start

    def finisher(self, result: Spec, wrap: Callable[[bool, Any], Any]) -> Callable[..., Any]:
        def finish(store: Any, call: int) -> Any:
            fut = self.pending.pop(call, None)
            self.probe_kinds = self.kinds.pop(call, [])
            try:
                if fut is None or not fut.done():
                    raise PieError("that host call has not finished (wait for it with poll.wait first)")
                return wrap(True, self.lower(fut.result(), result))
            except concurrent.futures.CancelledError:
                return wrap(False, _error(PieError("the host call was cancelled")))
            except Exception as exc:  # noqa: BLE001
                return wrap(False, _error(exc))
        return finish

    def wait(self, store: Any, calls: list[int], timeout_ms: int | None) -> list[int]:
        futs = [self.pending.get(c) for c in calls]
        live = [f for f in futs if f is not None]
        end = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while live and not any(f.done() for f in live) and not self.cancelled.is_set():
            left = _CANCEL_POLL_S if end is None else min(_CANCEL_POLL_S, end - time.monotonic())
            if left <= 0:
                break
            concurrent.futures.wait(live, left, return_when=concurrent.futures.FIRST_COMPLETED)
        if self.cancelled.is_set():
            self.cancel_all()
        return [i for i, f in enumerate(futs) if f is None or f.done() or self.cancelled.is_set()]

    def check_running(self) -> None:
        """Raise once the instance was cancelled: the guest gets errors, never new work."""
        if self.cancelled.is_set():
            raise PieError("the inferlet was cancelled")

    def cancel(self, store: Any, call: int) -> None:
        self.kinds.pop(call, None)
        fut = self.pending.pop(call, None)
        if fut is not None:
            fut.cancel()

    def cancel_all(self) -> None:
        for fut in self.pending.values():
            fut.cancel()
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


def _error(exc: BaseException) -> wc.Record:
    errors = [t for t in host_api.VALUE_TYPES if isinstance(t, type) and issubclass(t, BaseException)]
    cls = next((c for c in type(exc).__mro__ if c in errors), Exception)
    rec = wc.Record()
    setattr(rec, "kind", re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", cls.__name__).lower())
    setattr(rec, "message", str(exc)[:64 * 1024])
    return rec


def _probe(value: Any, kind: Any) -> wc.Variant:
    """A probe value as the ``probe-value`` case of its probe's kind."""
    if isinstance(value, (bytes, bytearray)):
        return wc.Variant("logits", bytes(value))
    if isinstance(value, tuple):
        return wc.Variant("distribution", (list(value[0]), [float(p) for p in value[1]]))
    if isinstance(value, (int, float)):
        return wc.Variant("entropy", float(value))
    return wc.Variant("embedding" if kind is not None and kind.name == "EMBEDDING" else "logprobs",
                      [float(v) for v in value])
