"""Host calls from the guest: values converted by the spec of :mod:`pie_core.runtime.wasm.spec`
(written into the generated ``pie_core.host`` modules), errors raised as their classes."""

import asyncio
import builtins
import json

from componentize_py_types import Err
from wit_world.imports import types as _wit_types

from pie_core import errors as _errors
from pie_core import values as _values
from pie_core.host import _records
from pie_core.mcp import errors as _mcp_errors

__all__ = ["call", "start", "error", "to_wit", "from_wit"]

_ERRORS = {cls.__name__.lower(): cls for mod in (builtins, _errors, _mcp_errors) for cls in vars(mod).values()
           if isinstance(cls, type) and issubclass(cls, BaseException)}


def error(err: object) -> BaseException:
    """The exception a host ``error`` record stands for (its class by ``kind``)."""
    name = err.kind.name.replace("_", "").lower()
    cls = _ERRORS.get(name, _errors.PieError)
    return cls(err.message)


def call(fn, args, specs, result):
    """Call binding ``fn`` with ``args`` converted by ``specs``; convert its result back."""
    try:
        raw = fn(*[to_wit(a, s) for a, s in zip(args, specs)])
    except Err as exc:
        raise error(exc.value) from None
    return from_wit(raw, result)


async def start(fn, finish, args, specs, result):
    """Start async host call ``fn``, wait for it on the guest loop, take it with ``finish``."""
    try:
        number = fn(*[to_wit(a, s) for a, s in zip(args, specs)])
    except Err as exc:
        raise error(exc.value) from None
    return from_wit(await asyncio.get_running_loop().started(number, finish), result)


def _value_class(name):
    return getattr(_values, name, None) or getattr(_records, name)


def to_wit(value, spec):
    """An SDK value as componentize-py's binding takes it."""
    if spec is None:
        return None
    tag = spec[0]
    if tag == "v" or tag == "h":
        return value
    if tag == "b":
        return bytes(value)
    if tag == "j":
        return json.dumps(value)
    if tag == "o":
        return None if value is None else to_wit(value, spec[1])
    if tag == "l":
        return [to_wit(v, spec[1]) for v in value]
    if tag == "t":
        return tuple(to_wit(v, s) for v, s in zip(value, spec[1]))
    if tag == "e":
        return getattr(_wit_types, spec[1])[value.name]
    if tag == "r":
        return getattr(_wit_types, spec[1])(**{f: to_wit(getattr(value, f), s) for f, s in spec[2]})
    raise TypeError(f"no conversion for spec {spec!r}")


def from_wit(value, spec):
    """A binding's value as the SDK expects it."""
    if spec is None:
        return None
    tag = spec[0]
    if tag in ("v", "h"):
        return value
    if tag == "b":
        return bytes(value)
    if tag == "j":
        return json.loads(value)
    if tag == "o":
        return None if value is None else from_wit(value, spec[1])
    if tag == "l":
        return [from_wit(v, spec[1]) for v in value]
    if tag == "t":
        return tuple(from_wit(v, s) for v, s in zip(value, spec[1]))
    if tag == "e":
        return getattr(_values, spec[1])[value.name]
    if tag == "r":
        fields = {f: from_wit(getattr(value, f), s) for f, s in spec[2]}
        if spec[1] == "RequestOutput":  # tuples, as in-process
            fields["tokens"] = tuple(tuple(t) for t in fields["tokens"])
            fields["probes"] = tuple(fields["probes"])
        return _value_class(spec[1])(**fields)
    if tag == "p":
        inner = value.value
        return (list(inner[0]), list(inner[1])) if isinstance(inner, tuple) else inner
    raise TypeError(f"no conversion for spec {spec!r}")
