"""The guest's host transport: every declared host function is the WIT import of its name.

The table of bindings and conversions (:mod:`inferlet.host.wit` specs) is built when this module
is imported, at build time, so it is part of the component's snapshot. A synchronous host
function is one import; a coroutine one is split into ``f`` (start it, get a call number) and
``f-result`` (take its value), with the guest loop (:mod:`pie_guest.loop`) waiting in
``poll.wait`` in between. A host error crosses as the ``error`` record and is raised here as its
class.

The guest sees paths inside its sandbox: ``runtime.scratch_dir`` is ``/scratch`` and
``runtime.scratch_path`` answers there (the engine checks the name).
"""

import asyncio
import builtins
import importlib
import json

from componentize_py_types import Err
from wit_world.imports import types as _wit_types

from inferlet import host as _host
from inferlet.host import errors as _errors
from inferlet.host import types as _types
from inferlet.host.wit import function_spec
from pie_guest.loop import GuestLoop

__all__ = ["WitTransport", "error", "to_wit", "from_wit"]

_ERRORS = {cls.__name__.lower(): cls for mod in (builtins, _errors) for cls in vars(mod).values()
           if isinstance(cls, type) and issubclass(cls, BaseException)}
_VALUES = {cls.__name__: cls for cls in (*_types.RECORDS, _types.SamplerKind, _types.ProbeKind)}
SCRATCH = "/scratch"


def error(err):
    """The exception a host ``error`` record stands for (its class by ``kind``)."""
    name = err.kind.name.replace("_", "").lower()
    cls = _ERRORS.get(name, _errors.PieError)
    return cls(err.message)


def _table():
    """Per declared function: its binding (and result binding, if async) and its specs."""
    table = {}
    for key, decl in _host.declarations().items():
        module = importlib.import_module(f"wit_world.imports.{key[0]}")
        spec = function_spec(decl.stub)
        finish = getattr(module, f"{key[1]}_result") if spec.is_async else None
        table[key] = (getattr(module, key[1]), finish, tuple(s for _, s in spec.params), spec.result)
    return table


class WitTransport:
    """Calls go to the component's imports, converted by each function's spec."""

    blocking = GuestLoop  # the guest runs one inferlet: it may block, waiting in the host

    def __init__(self):
        self._table = _table()

    def call(self, key, args):
        if key == ("runtime", "scratch_dir"):
            return SCRATCH
        fn, _, specs, result = self._table[key]
        try:
            raw = fn(*[to_wit(a, s) for a, s in zip(args, specs)])
        except Err as exc:
            raise error(exc.value) from None
        if key == ("runtime", "scratch_path"):  # the engine checked the name; the guest sees it here
            return SCRATCH + "/" + args[0].strip("/")
        return from_wit(raw, result)

    def tell(self, key, args):
        try:
            self.call(key, args)
        except Exception:  # noqa: BLE001 - a one-way call's failure is the host's to report
            pass

    async def call_async(self, key, args):
        fn, finish, specs, result = self._table[key]
        try:
            number = fn(*[to_wit(a, s) for a, s in zip(args, specs)])
        except Err as exc:
            raise error(exc.value) from None
        return from_wit(await asyncio.get_running_loop().started(number, finish), result)


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
        inner = spec[1]
        if inner[0] == "v":
            return list(value)
        return [to_wit(v, inner) for v in value]
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
        inner = spec[1]
        if inner[0] == "v":
            return list(value)
        return [from_wit(v, inner) for v in value]
    if tag == "t":
        return tuple(from_wit(v, s) for v, s in zip(value, spec[1]))
    if tag == "e":
        return _VALUES[spec[1]][value.name]
    if tag == "r":
        fields = {f: from_wit(getattr(value, f), s) for f, s in spec[2]}
        if spec[1] == "RequestOutput":  # tuples, as in-process
            fields["tokens"] = tuple(tuple(t) for t in fields["tokens"])
            fields["probes"] = tuple(fields["probes"])
        return _VALUES[spec[1]](**fields)
    if tag == "p":
        inner = value.value
        return (list(inner[0]), list(inner[1])) if isinstance(inner, tuple) else inner
    raise TypeError(f"no conversion for spec {spec!r}")
