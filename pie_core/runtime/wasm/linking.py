"""The component's imports, linked once per :class:`~.host.WasmHost` and shared by its instances.

Every declared host function (:mod:`inferlet.host`) is linked under its WIT name; an async one
as its start and its ``-result`` half; ``poll`` beside them. One trampoline serves every import:
it finds the instance's :class:`~.imports.Guest` by the store the call comes from, lifts the
arguments with the converters built for that import (:mod:`.abi`), lets the guest run the host
function, and lowers the ``result<T, error>`` it returns. A Python exception that escapes (a
bug, not a host error) traps the guest, as wasmtime-py's own path does.
"""

from __future__ import annotations

import ctypes
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime import component as wc
from wasmtime.component._enter import catch_exceptions

from inferlet import host as declared
from inferlet.host.wit import function_spec, kebab
from pie_core.errors import ContractError
from pie_core.runtime import host_api
from pie_core.runtime.wasm import abi
from pie_core.runtime.wasm.imports import KIND_IDS, Guest

__all__ = ["link", "attach", "detach", "PACKAGE"]

PACKAGE = "pie:inferlet"

_ERRORS = [t for t in host_api.VALUE_TYPES if isinstance(t, type) and issubclass(t, BaseException)]


@dataclass(slots=True)
class _Import:
    """One linked import: how to lift its arguments, what to run, how to lower its result."""

    lifts: list[abi.Lift]
    run: Callable[[Guest, abi.Call, list[Any]], Any]
    lower: Callable[[abi.Call, Any, Any], None] | None


_IMPORTS: list[_Import | None] = [None]  # index 0 is never an import (a null env)
_GUESTS: dict[int, Guest] = {}  # store context address -> the guest running in it
_lock = threading.Lock()


def attach(store: wasmtime.Store, guest: Guest) -> None:
    """Route the imports called from ``store`` to ``guest`` (before it is instantiated), and
    look at :meth:`Guest.stop_reason` on every epoch tick: the guest's code traps once it was
    cancelled or ran past its wall-time limit."""
    _GUESTS[_address(store._context())] = guest
    store.set_epoch_deadline(1)
    ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), _on_epoch, None, _no_finalizer)


def detach(store: wasmtime.Store) -> None:
    """Forget ``store``'s guest (after it ended)."""
    _GUESTS.pop(_address(store._context()), None)


def _address(context: Any) -> int:
    return ctypes.cast(context, ctypes.c_void_p).value or 0


_NULL_FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_no_finalizer = ctypes.cast(0, _NULL_FINALIZER)
_UPDATE_DEADLINE_CONTINUE = 0  # wasmtime_update_deadline_kind_t


@ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.POINTER(ffi.wasmtime_context_t), ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ffi.wasmtime_update_deadline_kind_t))
def _on_epoch(context, env, delta, kind):  # type: ignore[no-untyped-def]
    """The store's epoch deadline passed (every tick): trap if its guest must stop, else go on."""
    guest = _GUESTS.get(_address(context))
    reason = None if guest is None else guest.stop_reason()
    if reason is not None:
        return ctypes.cast(ffi.wasmtime_error_new(reason.encode("utf-8")), ctypes.c_void_p).value
    delta[0] = 1
    kind[0] = _UPDATE_DEADLINE_CONTINUE
    return 0


@ffi.wasmtime_component_func_callback_t
def _trampoline(env, context, ty, args, nargs, results, nresults):  # type: ignore[no-untyped-def]
    def run(store: Any) -> None:
        entry = _IMPORTS[env or 0]
        assert entry is not None
        guest = _GUESTS[_address(context)]
        call = abi.Call(guest, store)
        values = [lift(call, args[i]) for i, lift in enumerate(entry.lifts)]
        value = entry.run(guest, call, values)
        if entry.lower is not None:
            entry.lower(call, value, results[0])
    return catch_exceptions(context, run)


def _drop(store: Any, rep: int) -> None:
    """A resource's destructor: the guest dropped a handle to ``rep``."""
    guest = _GUESTS.get(_address(store._context()))
    if guest is not None:
        guest.drop(rep)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _finalize(env):  # type: ignore[no-untyped-def]
    return None  # imports live as long as the process: the host and its linker are never freed


def link(engine: wasmtime.Engine, types: dict[tuple[str, str], wc.FuncType]) -> wc.Linker:
    """A linker with WASI, the handle resources, ``poll`` and every declared host function.

    Args:
        types: The component's import function types, by ``(interface, WIT name)``.
    """
    linker = wc.Linker(engine)
    linker.add_wasip2()
    implementations = host_api.host_functions()
    by_module: dict[str, list[tuple[str, Any]]] = {}
    for (module, name), decl in sorted(declared.declarations().items()):
        by_module.setdefault(module, []).append((name, decl))
    with linker.root() as root:
        with root.add_instance(f"{PACKAGE}/types@0.1.0") as types_:
            for res, rid in KIND_IDS.items():
                types_.add_resource(res, wc.ResourceType.host(rid), _drop)
        with root.add_instance(f"{PACKAGE}/poll@0.1.0") as poll:
            _add(poll, "wait", _poll_wait(types["poll", "wait"]))
            _add(poll, "cancel", _Import([_lift(types["poll", "cancel"], 0, ("v",))],
                                         lambda guest, call, args: guest.cancel(args[0]), None))
        for module, fns in by_module.items():
            with root.add_instance(f"{PACKAGE}/{module}@0.1.0") as iface:
                for name, decl in fns:
                    fn, spec, wit = implementations[module, name], function_spec(decl.stub), kebab(name)
                    ftype = _type(types, module, wit)
                    lifts = [_lift(ftype, i, s) for i, (_, s) in enumerate(spec.params)]
                    if spec.is_async:
                        _add(iface, wit, _Import(lifts, _starter(module, name, fn), _result(ftype, ("v",))))
                        rtype = _type(types, module, f"{wit}-result")
                        _add(iface, f"{wit}-result", _Import([_lift(rtype, 0, ("v",))], _finisher(),
                                                             _result(rtype, spec.result)))
                    else:
                        _add(iface, wit, _Import(lifts, _caller(module, name, fn), _result(ftype, spec.result)))
    return linker


def _type(types: dict[tuple[str, str], wc.FuncType], module: str, wit: str) -> wc.FuncType:
    ftype = types.get((module, wit))
    if ftype is None:
        raise ContractError(f"the component does not import {module}.{wit}; rebuild it (the WIT and the "
                                     "host disagree)")
    return ftype


def _add(iface: Any, name: str, entry: _Import) -> None:
    with _lock:
        _IMPORTS.append(entry)
        index = len(_IMPORTS) - 1
    raw = name.encode("utf-8")
    err = ffi.wasmtime_component_linker_instance_add_func(iface.ptr(), ctypes.create_string_buffer(raw), len(raw),
                                                          _trampoline, index, _finalize)
    if err:
        raise wasmtime.WasmtimeError._from_ptr(err)


def _lift(ftype: wc.FuncType, i: int, spec: Any) -> abi.Lift:
    return abi.lift(ftype.params[i][1], spec)


def _caller(module: str, name: str, fn: Callable[..., Any]) -> Callable[[Guest, abi.Call, list[Any]], Any]:
    return lambda guest, call, args: guest.call(module, name, fn, args)


def _starter(module: str, name: str, fn: Callable[..., Any]) -> Callable[[Guest, abi.Call, list[Any]], Any]:
    return lambda guest, call, args: guest.start(module, name, fn, args)


def _finisher() -> Callable[[Guest, abi.Call, list[Any]], Any]:
    def finish(guest: Guest, call: abi.Call, args: list[Any]) -> Any:
        outcome, call.kinds = guest.finish(args[0])
        return outcome
    return finish


def _poll_wait(ftype: wc.FuncType) -> _Import:
    result = ftype.result
    assert result is not None
    lower = abi.lower(result, ("l", ("v",)))
    return _Import([_lift(ftype, 0, ("l", ("v",))), _lift(ftype, 1, ("o", ("v",)))],
                   lambda guest, call, args: guest.wait(args[0], args[1]), lower)


def _result(ftype: wc.FuncType, spec: Any) -> Callable[[abi.Call, Any, Any], None]:
    """The lowering of an import's ``result<T, error>`` from ``(ok, value or exception)``."""
    rtype = ftype.result
    assert isinstance(rtype, wc.ResultType)
    ok_type, err_type = rtype.ok, rtype.err
    ok = None if ok_type is None else abi.lower(ok_type, spec)
    assert isinstance(err_type, wc.RecordType)
    fields = [name for name, _ in err_type.fields]
    assert fields == ["kind", "message"], fields

    def lower(call: abi.Call, outcome: tuple[bool, Any], dst: Any) -> None:
        good, value = outcome
        raw = ffi.wasmtime_component_val_t()
        if good:
            if ok is not None:
                ok(call, value, raw)
                payload = abi.C.val_new(ctypes.byref(raw))
            else:
                payload = None
        else:
            _lower_error(value, raw)
            payload = abi.C.val_new(ctypes.byref(raw))
        dst.kind = ffi.WASMTIME_COMPONENT_RESULT
        dst.of.result.is_ok = good
        dst.of.result.val = payload

    return lower


def _lower_error(exc: BaseException, dst: Any) -> None:
    """``exc`` as the ``error`` record: its nearest declared class in kebab-case, its message."""
    cls = next((c for c in type(exc).__mro__ if c in _ERRORS), Exception)
    kind = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", cls.__name__).lower()
    raw = ffi.wasmtime_component_valrecord_t()
    abi.C.valrecord_new_uninit(raw, 2)
    kind_entry, message_entry = raw.data[0], raw.data[1]
    kind_entry.name = abi.text("kind")
    kind_entry.val.kind = ffi.WASMTIME_COMPONENT_ENUM
    kind_entry.val.of.enumeration = abi.text(kind)
    message_entry.name = abi.text("message")
    message_entry.val.kind = ffi.WASMTIME_COMPONENT_STRING
    message_entry.val.of.string = abi.text(str(exc)[:64 * 1024])
    dst.kind = ffi.WASMTIME_COMPONENT_RECORD
    dst.of.record = raw
