"""Values across the component ABI for our imports, converted by code built once per type.

wasmtime-py's generic host-function path reflects an import's WIT types on every call and walks
each value through them in Python: ~0.3 ms for a ``forward`` call and most of a decode step's
host time in the sandbox. Here each import gets, once per :class:`~.host.WasmHost`, a converter
per parameter and one for its result, built from the component's own types and the import's
spec (:mod:`inferlet.host.wit`). They read and write wasmtime's C values
(``wasmtime_component_val_t``) directly, with the same ownership rules as wasmtime-py (a lifted
argument is consumed, a lowered result is handed to wasmtime), turn records into the engine's
dataclasses and resources into its objects in the same pass, and move lists of integers with
numpy instead of one Python step per element.
"""

from __future__ import annotations

import ctypes
import json
from ctypes import byref
from typing import Any, Callable

import numpy as np
import wasmtime
from wasmtime import _ffi as ffi
from wasmtime.component import _types as wt

from inferlet.host import types as _types
from inferlet.host.wit import Spec, kebab

__all__ = ["Lift", "Lower", "Call", "lift", "lower", "text", "C", "MAX_JSON"]

MAX_JSON = 16 * 2**20
"""Bytes of one JSON value from the guest."""

Lift = Callable[[Any, Any], Any]
"""``lift(call, c)``: the engine's value of C value ``c`` (consumed), for the import call ``call``."""

Lower = Callable[[Any, Any, Any], None]
"""``lower(call, value, dst)``: write the engine's ``value`` into C value ``dst`` (a
``wasmtime_component_val_t``)."""

class _Held:
    """The C functions the converters call, in forms that keep the GIL: each is a malloc or a
    free, far shorter than the hand-off of the GIL that a plain ctypes call makes around it, and
    with one guest thread per inferlet every such hand-off waits in line behind the others."""

    _NAMES = ("wasmtime_component_vallist_new_uninit", "wasmtime_component_vallist_delete",
              "wasmtime_component_valrecord_new_uninit", "wasmtime_component_valrecord_delete",
              "wasmtime_component_valtuple_new_uninit", "wasmtime_component_valtuple_delete",
              "wasmtime_component_val_new", "wasmtime_component_val_delete", "wasm_byte_vec_new",
              "wasm_byte_vec_new_uninitialized", "wasm_byte_vec_delete", "wasmtime_component_resource_any_to_host",
              "wasmtime_component_resource_any_delete", "wasmtime_component_resource_host_new",
              "wasmtime_component_resource_host_to_any", "wasmtime_component_resource_host_rep",
              "wasmtime_component_resource_host_type", "wasmtime_component_resource_host_delete")

    def __init__(self) -> None:
        from wasmtime import _bindings

        lib = ctypes.PyDLL(_bindings.dll._name)
        for name in self._NAMES:
            plain = getattr(_bindings, "_" + name)
            held = getattr(lib, name)
            held.argtypes, held.restype = plain.argtypes, plain.restype
            setattr(self, name.removeprefix("wasmtime_component_"), held)


C = _Held()

_VAL = ffi.wasmtime_component_val_t
_SMALL = 32  # lists of scalars up to this long are moved element by element, longer ones with numpy
_VAL_SIZE = ctypes.sizeof(_VAL)
_OF = _VAL.of.offset
_VALUES = {cls.__name__: cls for cls in (*_types.RECORDS, _types.SamplerKind, _types.ProbeKind)}

_SCALARS: dict[type, tuple[str, Any, str]] = {  # type -> (union field, kind, numpy dtype)
    wt.Bool: ("boolean", ffi.WASMTIME_COMPONENT_BOOL, "?"),
    wt.S8: ("s8", ffi.WASMTIME_COMPONENT_S8, "<i1"),
    wt.U8: ("u8", ffi.WASMTIME_COMPONENT_U8, "<u1"),
    wt.S16: ("s16", ffi.WASMTIME_COMPONENT_S16, "<i2"),
    wt.U16: ("u16", ffi.WASMTIME_COMPONENT_U16, "<u2"),
    wt.S32: ("s32", ffi.WASMTIME_COMPONENT_S32, "<i4"),
    wt.U32: ("u32", ffi.WASMTIME_COMPONENT_U32, "<u4"),
    wt.S64: ("s64", ffi.WASMTIME_COMPONENT_S64, "<i8"),
    wt.U64: ("u64", ffi.WASMTIME_COMPONENT_U64, "<u8"),
    wt.F32: ("f32", ffi.WASMTIME_COMPONENT_F32, "<f4"),
    wt.F64: ("f64", ffi.WASMTIME_COMPONENT_F64, "<f8"),
}


class Call:
    """What converters need of one import call: the guest (its handle table, probe kinds) and
    the store."""

    __slots__ = ("guest", "store", "kinds")

    def __init__(self, guest: Any, store: Any) -> None:
        self.guest, self.store = guest, store
        self.kinds: list[Any] = []  # the probe kinds of a forward result being lowered, in order


def _entries(n: int, dtype: str) -> np.dtype:
    return np.dtype({"names": ["kind", "v"], "formats": ["u1", dtype], "offsets": [0, _OF], "itemsize": _VAL_SIZE})


def _view(address: int, n: int, dtype: np.dtype) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype)
    return np.frombuffer((ctypes.c_char * (n * _VAL_SIZE)).from_address(address), dtype=dtype)


# -- lifting: C value -> engine value ------------------------------------------------------------


def lift(ty: wt.ValType, spec: Spec) -> Lift:
    """The converter of C values of WIT type ``ty`` into the engine's values of ``spec``."""
    tag = None if spec is None else spec[0]
    kind = type(ty)
    if kind in _SCALARS:
        field = _SCALARS[kind][0]
        cast = float if kind in (wt.F32, wt.F64) else bool if kind is wt.Bool else int
        return lambda call, c: cast(getattr(c.of, field))
    if kind is wt.String:
        return _lift_json if tag == "j" else _lift_str
    if isinstance(ty, wt.ListType):
        return _lift_list(ty.element, spec)
    if isinstance(ty, wt.OptionType):
        inner = lift(ty.payload, spec[1] if tag == "o" else spec)
        return _lift_option(inner)
    if isinstance(ty, wt.TupleType):
        elements = ty.elements
        specs = spec[1] if tag == "t" else [None] * len(elements)
        return _lift_tuple([lift(t, s) for t, s in zip(elements, specs)])
    if isinstance(ty, wt.RecordType):
        return _lift_record(_VALUES[spec[1]], [lift(t, s) for (_, t), (_, s) in zip(ty.fields, spec[2])])
    if isinstance(ty, wt.EnumType):
        return _lift_enum(_VALUES[spec[1]])
    if isinstance(ty, (wt.BorrowType, wt.OwnType)):
        return _lift_handle(spec[1])
    raise TypeError(f"no lifting of {ty!r} as {spec!r}")


def _lift_str(call: Call, c: Any) -> str:
    text = ffi.to_str(c.of.string)
    C.wasm_byte_vec_delete(byref(c.of.string))
    return text


def _lift_json(call: Call, c: Any) -> Any:
    size = c.of.string.size
    if size > MAX_JSON:
        C.wasm_byte_vec_delete(byref(c.of.string))
        raise ValueError(f"a JSON value from the inferlet is limited to {MAX_JSON} bytes")
    return json.loads(_lift_str(call, c))


def _lift_list(element: wt.ValType, spec: Spec) -> Lift:
    inner = spec[1] if spec is not None and spec[0] == "l" else None
    if type(element) in _SCALARS:
        dtype = _entries(0, _SCALARS[type(element)][2])
        as_bytes = spec is not None and spec[0] == "b"

        field = _SCALARS[type(element)][0]

        def scalars(call: Call, c: Any) -> Any:
            n = c.of.list.size
            if n <= _SMALL:  # numpy's set-up costs more than a few steps of ctypes
                data = c.of.list.data
                values = [getattr(data[i].of, field) for i in range(n)]
                C.vallist_delete(byref(c.of.list))
                return bytes(values) if as_bytes else values
            address = ctypes.cast(c.of.list.data, ctypes.c_void_p).value or 0
            array = _view(address, n, dtype)["v"].copy()
            C.vallist_delete(byref(c.of.list))
            return array.tobytes() if as_bytes else array.tolist()

        return scalars
    each = lift(element, inner)

    def items(call: Call, c: Any) -> list[Any]:
        data, n = c.of.list.data, c.of.list.size
        try:
            out = []
            for i in range(n):
                raw = data[i]
                out.append(each(call, raw))
                raw.kind = ffi.WASMTIME_COMPONENT_BOOL
        finally:
            C.vallist_delete(byref(c.of.list))
        return out

    return items


def _lift_option(inner: Lift) -> Lift:
    def option(call: Call, c: Any) -> Any:
        ptr = c.of.option
        if not ptr:
            return None
        inner_c = ptr.contents
        value = inner(call, inner_c)
        inner_c.kind = ffi.WASMTIME_COMPONENT_BOOL
        C.val_delete(ptr)
        return value

    return option


def _lift_tuple(items: list[Lift]) -> Lift:
    def tuple_(call: Call, c: Any) -> tuple[Any, ...]:
        data = c.of.tuple.data
        try:
            out = []
            for i, each in enumerate(items):
                raw = data[i]
                out.append(each(call, raw))
                raw.kind = ffi.WASMTIME_COMPONENT_BOOL
        finally:
            C.valtuple_delete(byref(c.of.tuple))
        return tuple(out)

    return tuple_


def _lift_record(cls: type, fields: list[Lift]) -> Lift:
    def record(call: Call, c: Any) -> Any:
        data = c.of.record.data
        try:
            values = []
            for i, each in enumerate(fields):
                raw = data[i].val
                values.append(each(call, raw))
                raw.kind = ffi.WASMTIME_COMPONENT_BOOL
        finally:
            C.valrecord_delete(c.of.record)
        return cls(*values)

    return record


def _lift_enum(cls: Any) -> Lift:
    by_name = {kebab(m.name): m for m in cls}

    def enum(call: Call, c: Any) -> Any:
        name = ffi.to_str(c.of.enumeration)
        C.wasm_byte_vec_delete(byref(c.of.enumeration))
        return by_name[name]

    return enum


def _lift_handle(resource: str) -> Lift:
    def handle(call: Call, c: Any) -> Any:
        any_ = ffi.take_pointer(c.of, "resource")  # a copy of the pointer, the field cleared
        host = ctypes.POINTER(ffi.wasmtime_component_resource_host_t)()
        try:
            error = C.resource_any_to_host(call.store._context(), any_, byref(host))
            if error:
                raise wasmtime.WasmtimeError._from_ptr(error)
            try:
                type_id = C.resource_host_type(host)
                rep = C.resource_host_rep(host)
            finally:
                C.resource_host_delete(host)
        finally:
            C.resource_any_delete(any_)
        return call.guest.handle(resource, type_id, rep)

    return handle


# -- lowering: engine value -> C value -----------------------------------------------------------


def lower(ty: wt.ValType, spec: Spec) -> Lower:
    """The converter of the engine's values of ``spec`` into C values of WIT type ``ty``."""
    tag = None if spec is None else spec[0]
    kind = type(ty)
    if kind in _SCALARS:
        field, code, _ = _SCALARS[kind]
        cast = float if kind in (wt.F32, wt.F64) else bool if kind is wt.Bool else int

        def scalar(call: Call, value: Any, dst: Any) -> None:
            dst.kind = code
            setattr(dst.of, field, cast(value))

        return scalar
    if kind is wt.String:
        return _lower_json if tag == "j" else _lower_str
    if isinstance(ty, wt.ListType):
        return _lower_list(ty.element, spec)
    if isinstance(ty, wt.OptionType):
        return _lower_option(lower(ty.payload, spec[1] if tag == "o" else spec))
    if isinstance(ty, wt.TupleType):
        elements = ty.elements
        specs = spec[1] if tag == "t" else [None] * len(elements)
        return _lower_tuple([lower(t, s) for t, s in zip(elements, specs)])
    if isinstance(ty, wt.RecordType):
        return _lower_record([(name, lower(t, s)) for (name, t), (_, s) in zip(ty.fields, spec[2])],
                             [f for f, _ in spec[2]])
    if isinstance(ty, wt.EnumType):
        return _lower_enum
    if isinstance(ty, wt.VariantType) and tag == "p":
        return _lower_probe({name: lower(t, None) for name, t in ty.cases if t is not None})
    if isinstance(ty, wt.OwnType):
        return _lower_handle(spec[1])
    raise TypeError(f"no lowering of {ty!r} as {spec!r}")


def text(value: str) -> Any:
    """``value`` as a ``wasm_name_t`` (UTF-8) the C side will free."""
    raw = value.encode("utf-8")
    vec = ffi.wasm_byte_vec_t()
    C.wasm_byte_vec_new(byref(vec), len(raw), ctypes.cast(ctypes.c_char_p(raw), ctypes.POINTER(ctypes.c_ubyte)))
    return vec


def _lower_str(call: Call, value: Any, dst: Any) -> None:
    dst.kind = ffi.WASMTIME_COMPONENT_STRING
    dst.of.string = text(value)


def _lower_json(call: Call, value: Any, dst: Any) -> None:
    _lower_str(call, json.dumps(value), dst)


def _lower_list(element: wt.ValType, spec: Spec) -> Lower:
    if type(element) in _SCALARS:
        code = _SCALARS[type(element)][1].value
        dtype = _entries(0, _SCALARS[type(element)][2])
        raw_dtype = np.dtype(_SCALARS[type(element)][2])

        field = _SCALARS[type(element)][0]

        def scalars(call: Call, value: Any, dst: Any) -> None:
            n = len(value)
            raw = ffi.wasmtime_component_vallist_t()
            C.vallist_new_uninit(raw, n)
            if n <= _SMALL:  # numpy's set-up costs more than a few steps of ctypes
                data = raw.data
                for i, v in enumerate(value):
                    entry = data[i]
                    entry.kind = code
                    setattr(entry.of, field, v)
            else:
                values = np.frombuffer(value, dtype=raw_dtype) if isinstance(value, (bytes, bytearray)) else \
                    np.asarray(value, dtype=raw_dtype)
                view = _view(ctypes.cast(raw.data, ctypes.c_void_p).value or 0, n, dtype)
                view["kind"] = code
                view["v"] = values
            dst.kind = ffi.WASMTIME_COMPONENT_LIST
            dst.of.list = raw

        return scalars
    each = lower(element, spec[1] if spec is not None and spec[0] == "l" else spec)

    def items(call: Call, value: Any, dst: Any) -> None:
        raw = ffi.wasmtime_component_vallist_t()
        C.vallist_new_uninit(raw, len(value))
        done = 0
        try:
            for i, v in enumerate(value):
                each(call, v, raw.data[i])
                done += 1
        except BaseException:
            _fill_bools(raw.data, done, len(value))
            C.vallist_delete(byref(raw))
            raise
        dst.kind = ffi.WASMTIME_COMPONENT_LIST
        dst.of.list = raw

    return items


def _fill_bools(data: Any, start: int, stop: int) -> None:
    """Mark uninitialised slots of a half-built C container as plain values, so deleting it
    frees nothing that was never there."""
    for j in range(start, stop):
        data[j].kind = ffi.WASMTIME_COMPONENT_BOOL
        data[j].of.boolean = False


def _lower_option(inner: Lower) -> Lower:
    def option(call: Call, value: Any, dst: Any) -> None:
        dst.kind = ffi.WASMTIME_COMPONENT_OPTION
        if value is None:
            dst.of.option = None
            return
        raw = _VAL()
        inner(call, value, raw)
        dst.of.option = C.val_new(byref(raw))

    return option


def _lower_tuple(items: list[Lower]) -> Lower:
    def tuple_(call: Call, value: Any, dst: Any) -> None:
        raw = ffi.wasmtime_component_valtuple_t()
        C.valtuple_new_uninit(raw, len(items))
        done = 0
        try:
            for i, (each, v) in enumerate(zip(items, value)):
                each(call, v, raw.data[i])
                done += 1
        except BaseException:
            _fill_bools(raw.data, done, len(items))
            C.valtuple_delete(byref(raw))
            raise
        dst.kind = ffi.WASMTIME_COMPONENT_TUPLE
        dst.of.tuple = raw

    return tuple_


def _name(text: str) -> Callable[[], Any]:
    """A maker of ``wasm_name_t`` copies of ``text`` (the C side frees each)."""
    raw = text.encode("utf-8")
    buf = (ctypes.c_ubyte * len(raw)).from_buffer_copy(raw)

    def make() -> Any:
        vec = ffi.wasm_byte_vec_t()
        C.wasm_byte_vec_new(byref(vec), len(raw), buf)
        return vec

    return make


def _lower_record(fields: list[tuple[str, Lower]], attrs: list[str]) -> Lower:
    names = [_name(name) for name, _ in fields]

    def record(call: Call, value: Any, dst: Any) -> None:
        raw = ffi.wasmtime_component_valrecord_t()
        C.valrecord_new_uninit(raw, len(fields))
        done = 0
        try:
            for i, ((_, each), attr, name) in enumerate(zip(fields, attrs, names)):
                entry = raw.data[i]
                each(call, getattr(value, attr), entry.val)
                entry.name = name()
                done += 1
        except BaseException:
            for j in range(done, len(fields)):
                raw.data[j].val.kind = ffi.WASMTIME_COMPONENT_BOOL
                raw.data[j].val.of.boolean = False
            C.valrecord_delete(byref(raw))
            raise
        dst.kind = ffi.WASMTIME_COMPONENT_RECORD
        dst.of.record = raw

    return record


def _lower_enum(call: Call, value: Any, dst: Any) -> None:
    dst.kind = ffi.WASMTIME_COMPONENT_ENUM
    dst.of.enumeration = text(kebab(value.name))


def _lower_probe(cases: dict[str, Lower]) -> Lower:
    def probe(call: Call, value: Any, dst: Any) -> None:
        kind = call.kinds.pop(0) if call.kinds else None
        case, payload = _probe_case(value, kind)
        raw = _VAL()
        cases[case](call, payload, raw)
        dst.kind = ffi.WASMTIME_COMPONENT_VARIANT
        dst.of.variant.discriminant = text(case)
        dst.of.variant.val = C.val_new(byref(raw))

    return probe


def _probe_case(value: Any, kind: Any) -> tuple[str, Any]:
    """A probe value as the ``probe-value`` case of its probe's kind, and its payload."""
    if isinstance(value, (bytes, bytearray)):
        return "logits", bytes(value)
    if isinstance(value, tuple):
        return "distribution", (list(value[0]), [float(p) for p in value[1]])
    if isinstance(value, (int, float)):
        return "entropy", float(value)
    return ("embedding" if kind is not None and kind.name == "EMBEDDING" else "logprobs"), [float(v) for v in value]


def _lower_handle(resource: str) -> Lower:
    def handle(call: Call, value: Any, dst: Any) -> None:
        type_id, rep = call.guest.resource(resource, value)
        host = C.resource_host_new(True, rep, type_id)
        any_ = ctypes.POINTER(ffi.wasmtime_component_resource_any_t)()
        try:
            error = C.resource_host_to_any(call.store._context(), host, byref(any_))
        finally:
            C.resource_host_delete(host)
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
        dst.kind = ffi.WASMTIME_COMPONENT_RESOURCE
        dst.of.resource = any_

    return handle
