"""The host side of a wasm inferlet: wasmtime runs the component in a thread of its own, and
every WIT import is the engine's host function of the same name, run on the engine's loop.

- A synchronous import blocks the guest's thread until the host function ran on the event
  loop, bound to the instance (``asyncio.run_coroutine_threadsafe`` carries the binding).
- An async import starts the host coroutine and returns a call number; the guest's
  loop blocks in ``poll.wait`` until one of its calls finished, then takes the result with the
  ``<name>-result`` import. A call the guest cancels is cancelled on the engine.
- Engine objects cross as resources of :data:`~.build.RESOURCES`; the guest holds only their
  number, and a number the engine never gave this instance is refused.
- A host error crosses as the ``error`` record and is raised in the guest as its class.
- The guest has no filesystem but ``/inferlet`` (its own folder, read-only) and ``/scratch``
  (its user's scratch directory), no sockets and no subprocesses (WASI gives none); its
  memory is capped by the store's limits and its time by epochs (the engine's clock ticks
  every :data:`TICK_S`).
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import inspect
import json
import re
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import wasmtime
from wasmtime import component as wc

from pie_core.errors import PieError
from pie_core.host.binding import HostInstance, bind, unbind
from pie_core.runtime import host_api
from pie_core.runtime.wasm.build import RESOURCES
from pie_core.runtime.wasm.spec import Spec, function_spec, kebab

__all__ = ["WasmHost", "GuestLimits", "GuestResult", "TICK_S", "MAX_HANDLES", "MAX_JSON"]

TICK_S = 0.05
"""Seconds between epoch ticks: how late a guest past its deadline may still run."""

MAX_HANDLES = 2**16
"""Engine objects one wasm instance may hold."""

MAX_JSON = 16 * 2**20
"""Bytes of one JSON value from the guest."""

_CANCEL_POLL_S = 0.1  # how often a guest blocked in poll.wait looks at its cancellation

_PACKAGE = "pie:inferlet"
_KIND_IDS = {name: i + 1 for i, name in enumerate(RESOURCES.values())}


@dataclass(frozen=True, slots=True)
class GuestLimits:
    """What one wasm instance may use: wall seconds (0 = none) and linear memory in MiB."""

    wall_s: float = 600.0
    memory_mb: int = 4096


@dataclass(slots=True)
class GuestResult:
    """How a guest ended: ``ok`` with its JSON value, or not with the reason."""

    ok: bool
    value: Any


class WasmHost:
    """A compiled component and the engine it runs on; one per process, shared by instances.

    Args:
        component: The ``.wasm`` file (:func:`~.build.component_path`); its compiled form is
            cached beside it (``.cwasm``), keyed by the wasmtime version.
    """

    def __init__(self, component: Path) -> None:
        config = wasmtime.Config()
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        compiled = component.with_suffix(f".wasmtime-{metadata.version('wasmtime')}.cwasm")
        if compiled.exists():
            self.component = wc.Component.deserialize_file(self.engine, str(compiled))
        else:
            self.component = wc.Component.from_file(self.engine, str(component))
            part = compiled.with_suffix(".part")
            part.write_bytes(self.component.serialize())
            part.replace(compiled)
        self._types = self._import_types()
        threading.Thread(target=self._tick, name="pie-wasm-epochs", daemon=True).start()

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            self.engine.increment_epoch()

    def _import_types(self) -> dict[tuple[str, str], wc.FuncType]:
        found = {}
        for name, item in self.component.type.imports(self.engine).items():
            if not name.startswith(_PACKAGE + "/"):
                continue
            iface = name.split("/", 1)[1].split("@", 1)[0]
            for fname, ext in item.ty.exports(self.engine).items():
                ftype = ext.ty
                if isinstance(ftype, wc.FuncType):
                    found[iface, fname] = ftype
        return found

    def run(self, root: Path, scratch: str, request: dict[str, Any], inst: HostInstance,
            loop: asyncio.AbstractEventLoop, limits: GuestLimits, runner: Any = None,
            cancelled: threading.Event | None = None) -> GuestResult:
        """Run the inferlet at ``root`` to its end, in the calling thread (not the loop's).

        ``request`` is ``{"entry", "input"}``; host calls run on ``loop`` bound to ``inst``.
        ``runner`` runs ``runtime.spawn``'s children (None: in-process). Once ``cancelled`` is
        set, every host call fails, so a guest waiting on the engine ends at once.
        """
        guest = _Guest(self, inst, loop, runner, cancelled or threading.Event())
        store = wasmtime.Store(self.engine)
        wasi = wasmtime.WasiConfig()
        wasi.preopen_dir(str(root), "/inferlet", fs_mutable=False)
        wasi.preopen_dir(scratch, "/scratch")
        wasi.stdout_custom = guest.output("stdout")
        wasi.stderr_custom = guest.output("stderr")
        store.set_wasi(wasi)
        if limits.memory_mb > 0:
            store.set_limits(memory_size=limits.memory_mb * 2**20)
        store.set_epoch_deadline(max(1, int(limits.wall_s / TICK_S)) if limits.wall_s > 0 else 2**62)
        linker = self._linker(guest)
        token = bind(inst)
        try:
            instance = linker.instantiate(store, self.component)
            run = instance.get_func(store, "run")
            outcome = run(store, json.dumps(request))
        except wasmtime.WasmtimeError as exc:
            return GuestResult(False, _trap(exc, limits))
        except Exception as exc:  # noqa: BLE001 - a host-side failure ends this instance only
            return GuestResult(False, f"{type(exc).__name__}: {exc}")
        finally:
            guest.flush()
            guest.cancel_all()
            unbind(token)
        if isinstance(outcome, wc.Variant):
            outcome = outcome.payload if outcome.tag == "ok" else _Failed(outcome.payload)
        if isinstance(outcome, _Failed):
            return GuestResult(False, outcome.why)
        return GuestResult(True, json.loads(outcome))

    def _linker(self, guest: _Guest) -> wc.Linker:
        handles = {kind.cls: RESOURCES[kind.name] for kind in host_api.HANDLES}
        linker = wc.Linker(self.engine)
        linker.add_wasip2()
        by_module: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        for (module, name), fn in sorted(host_api.host_functions().items()):
            by_module.setdefault(module, []).append((name, fn))
        with linker.root() as root:
            with root.add_instance(f"{_PACKAGE}/types@0.1.0") as types:
                for res, rid in _KIND_IDS.items():
                    types.add_resource(res, wc.ResourceType.host(rid), lambda store, rep: None)
            with root.add_instance(f"{_PACKAGE}/poll@0.1.0") as poll:
                poll.add_func("wait", guest.wait)
                poll.add_func("cancel", guest.cancel)
            for module, fns in by_module.items():
                with root.add_instance(f"{_PACKAGE}/{module}@0.1.0") as iface:
                    for name, fn in fns:
                        spec = function_spec(fn, handles)
                        wit = kebab(name)
                        if spec.is_async:
                            iface.add_func(wit, guest.starter(module, name, fn, spec.params, self._result(module, wit)))
                            iface.add_func(f"{wit}-result", guest.finisher(spec.result, self._result(module, f"{wit}-result")))
                        else:
                            iface.add_func(wit, guest.caller(module, name, fn, spec.params, spec.result,
                                                             self._result(module, wit)))
        return linker

    def _result(self, module: str, wit: str) -> Callable[[bool, Any], Any]:
        """How the import's ``result<T, error>`` is lowered: wasmtime wants a ``Variant`` only
        when the two cases cannot be told apart by Python type."""
        ftype = self._types.get((module, wit))
        if ftype is None:
            raise PieError(f"the component does not import {module}.{wit}; rebuild it (the WIT and the host disagree)")
        tagged = ftype.result._tagged()
        return (lambda ok, v: wc.Variant("ok" if ok else "err", v)) if tagged else (lambda ok, v: v)


class _Failed:
    def __init__(self, why: str) -> None:
        self.why = why


def _trap(exc: wasmtime.WasmtimeError, limits: GuestLimits) -> str:
    text = str(exc)
    if "interrupt" in text:
        return f"killed: the inferlet ran past its wall-time limit of {limits.wall_s:g}s"
    if "memory" in text and ("grow" in text or "limit" in text or "out of" in text):
        return f"killed: the inferlet exceeded its memory limit of {limits.memory_mb} MiB"
    cause = text.split("Caused by:")[-1].strip().splitlines()
    return f"the inferlet's sandbox trapped: {cause[0] if cause else text[:200]}"


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


class _Guest:
    """One running instance: its handles, pending calls and output, seen from the host."""

    def __init__(self, host: WasmHost, inst: HostInstance, loop: asyncio.AbstractEventLoop, runner: Any,
                 cancelled: threading.Event) -> None:
        self.host, self.inst, self.loop, self.runner, self.cancelled = host, inst, loop, runner, cancelled
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
            return _enum(spec[1])[value.replace("-", "_").upper()]
        if tag == "r":
            return _record(spec[1])(**{f: self.lift(store, getattr(value, kebab(f)), s) for f, s in spec[2]})
        if tag == "h":
            host = value.to_host(store)
            if host.type != _KIND_IDS[spec[1]] or host.rep not in self.handles.objs:
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
            return wc.ResourceHost.own(self.handles.rep(value), _KIND_IDS[spec[1]])
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

    async def _invoke(self, module: str, name: str, fn: Callable[..., Any], values: list[Any]) -> Any:
        args, kwargs = _bind(fn, values)
        return await host_api.invoke(module, name, fn, args, kwargs, runner=self.runner)

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


def _bind(fn: Callable[..., Any], values: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """WIT passes every parameter in order; keyword-only ones go by name."""
    params = list(inspect.signature(fn).parameters.values())
    args = [v for p, v in zip(params, values) if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    kwargs = {p.name: v for p, v in zip(params, values) if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return args, kwargs


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


def _enum(name: str) -> Any:
    from pie_core import values

    return getattr(values, name)


def _record(name: str) -> Any:
    from pie_core.grammar.source import GrammarSource
    from pie_core import values
    from pie_core.models.chat_formats.tool_calls import ToolCallSyntax

    return {"GrammarSource": GrammarSource, "ToolCallSyntax": ToolCallSyntax}.get(name) or getattr(values, name)
