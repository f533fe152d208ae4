"""The guest's host transport: every declared host function is the WIT import of its name.

The table of bindings and conversions (:mod:`inferlet.host.wit` specs) is built when this module
is imported, at build time, so it is part of the component's snapshot. A synchronous host
function is one import; a coroutine one is split into ``f`` (start it, get a call number) and
``f-result`` (take its value), with the guest loop (:mod:`pie_guest.loop`) waiting in
``poll.wait`` in between. A host error crosses as the ``error`` record and is raised here as its
class.

The guest sees paths inside its sandbox: ``runtime.scratch_dir`` is ``/scratch`` and
``runtime.scratch_path`` answers there (the engine checks the name).

Arguments: the declared functions checked every value against their declaration before the
call got here (:mod:`inferlet.host.arguments`: a value componentize-py cannot lower would
otherwise panic in the canonical ABI and kill the instance); this transport checks what only
it knows, that each handle is a resource of the declared kind that is still held.

Handles: componentize-py drops a resource handle from a ``weakref.finalize`` callback, and
the garbage collector runs those callbacks before any ``__del__`` of the same collection, so a
``Context`` caught in a reference cycle would find its handle gone when its ``__del__`` releases
it ("unknown handle index", a trap). So every handle the host gives is adopted here (see
:func:`adopt`): its finalizer is detached and the resource class's ``__del__`` drops it, after
releasing a context or adapter nobody released (the host's resource destructor frees nothing,
so that is what returns its pages to the pool). A call that passes a dropped handle never
reaches the ABI: a release is a no-op (the handle was released when it was dropped), any other
call raises InvalidInput.
"""

import asyncio
import builtins
import importlib
import json

from componentize_py_types import Err
from wit_world.imports import adapter as _wit_adapter
from wit_world.imports import context as _wit_context
from wit_world.imports import types as _wit_types

from inferlet import host as _host
from inferlet.host import errors as _errors
from inferlet.host import types as _types
from inferlet.host.arguments import check_handles, plan
from inferlet.host.wit import function_spec
from pie_guest.loop import GuestLoop

__all__ = ["WitTransport", "error", "to_wit", "from_wit", "adopt"]

_ERRORS = {cls.__name__.lower(): cls for mod in (builtins, _errors) for cls in vars(mod).values()
           if isinstance(cls, type) and issubclass(cls, BaseException)}
_VALUES = {cls.__name__: cls for cls in (*_types.RECORDS, _types.SamplerKind, _types.ProbeKind)}
SCRATCH = "/scratch"


def error(err):
    """The exception a host ``error`` record stands for (its class by ``kind``)."""
    name = err.kind.name.replace("_", "").lower()
    cls = _ERRORS.get(name, _errors.PieError)
    return cls(err.message)


RESOURCES = {cls: getattr(_wit_types, cls.__name__) for cls in _types.HANDLES}
"""The binding's resource class of each declared handle class."""

RELEASES = {("context", "release"), ("context", "release_soon"), ("adapter", "release"), ("adapter", "release_soon")}
"""Calls that release their handle: a no-op on a dropped one, and no release when it is dropped."""

_RELEASE_ON_DROP = {_wit_types.Context: _wit_context.release_soon, _wit_types.Adapter: _wit_adapter.release_soon}


def _table():
    """Per declared function: its binding (and result binding, if async), its specs, its checks
    (the plan, and ``(index, resource class, may be None)`` of each handle), whether it releases."""
    table = {}
    for key, decl in _host.declarations().items():
        module = importlib.import_module(f"wit_world.imports.{key[0]}")
        spec = function_spec(decl.stub)
        finish = getattr(module, f"{key[1]}_result") if spec.is_async else None
        checks = plan(key, decl.stub)
        handles = tuple((i, RESOURCES[declared], optional) for i, declared, optional in checks.handles)
        table[key] = (getattr(module, key[1]), finish, tuple(s for _, s in spec.params), spec.result, checks, handles,
                      key in RELEASES)
    return table


def _usable(checks, handles, releases, args):
    """Whether the call may go ahead: False for a release of a dropped handle (nothing to do).

    Raises:
        TypeError: A handle argument is not a resource of its declared kind.
        InvalidInput: A handle argument was dropped (and the call is no release).
    """
    for i, cls, optional in handles:
        value = args[i]
        if type(value) is not cls:
            if value is None and optional:
                continue
            check_handles(checks, args, RESOURCES)  # says which kind it is instead
        if value.handle is None:
            if releases:
                return False
            raise _errors.InvalidInput(
                f"{checks.what}: {checks.names[i]} is a handle the inferlet no longer holds (it was collected as "
                f"garbage, or closed with `with`), so it cannot be used; keep a reference to its owner while you "
                f"use it")
    return True


class WitTransport:
    """Calls go to the component's imports, converted by each function's spec."""

    blocking = GuestLoop  # the guest runs one inferlet: it may block, waiting in the host

    def __init__(self):
        self._table = _table()

    def call(self, key, args):
        if key == ("runtime", "scratch_dir"):
            return SCRATCH
        fn, _, specs, result, checks, handles, releases = self._table[key]
        if handles and not _usable(checks, handles, releases, args):
            return None
        try:
            raw = fn(*[to_wit(a, s) for a, s in zip(args, specs)])
        except Err as exc:
            raise error(exc.value) from None
        if releases:
            args[0]._pie_released = True  # nothing to release when it is dropped
        if key == ("runtime", "scratch_path"):  # the engine checked the name; the guest sees it here
            return SCRATCH + "/" + args[0].strip("/")
        return from_wit(raw, result)

    def tell(self, key, args):
        try:
            self.call(key, args)
        except Exception:  # noqa: BLE001 - a one-way call's failure is the host's to report
            pass

    async def call_async(self, key, args):
        fn, finish, specs, result, checks, handles, _ = self._table[key]
        if handles:
            _usable(checks, handles, False, args)
        try:
            number = fn(*[to_wit(a, s) for a, s in zip(args, specs)])
        except Err as exc:
            raise error(exc.value) from None
        loop = asyncio.get_running_loop()
        # A task awaits it and nothing else could run meanwhile: wait here. (No task: a coroutine
        # stepped by hand, as ``Subscription.get()`` does, which must never wait.)
        if type(loop) is GuestLoop and loop.quiet() and asyncio.current_task(loop) is not None:
            try:
                return from_wit(finish(number), result)
            except Err as exc:
                raise error(exc.value) from None
        return from_wit(await loop.started(number, finish), result)


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
    if tag == "v":
        return value
    if tag == "h":
        return adopt(value)
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
        if isinstance(inner, tuple):  # a distribution: the binding's lists already (no copy of 2 x vocab items)
            return tuple(v if type(v) is list else list(v) for v in inner)
        return inner
    raise TypeError(f"no conversion for spec {spec!r}")


# -- handles: dropped by their class's __del__, after a release if nobody released them -------------


def adopt(resource):
    """Take over dropping a handle the host just gave (see the module docstring): detach the
    binding's ``weakref.finalize``, so the resource class's ``__del__`` (:func:`_drop`) drops
    it, in the order the garbage collector finalises, not before every ``__del__``."""
    detached = None if resource.finalizer is None else resource.finalizer.detach()
    if detached is not None:
        resource.finalizer = None  # adopted: _drop drops it
        cls = type(resource)
        if "_pie_drop" not in cls.__dict__:
            cls._pie_drop = (detached[1], detached[2][0])  # (drop_resource, the resource type's index)
    return resource


def _drop(resource):
    """``__del__`` of every resource class: release an adopted context or adapter nobody
    released, then drop its handle. Handles not adopted keep the binding's finalizer."""
    state = resource.__dict__
    handle = state.get("handle")
    if handle is None or state.get("finalizer", False) is not None:
        return
    release = _RELEASE_ON_DROP.get(type(resource))
    if release is not None and not state.get("_pie_released"):
        try:
            release(resource)
        except Exception:  # noqa: BLE001 - never raise from a finaliser; the host logs a failed release
            pass
    resource.handle = None
    drop, index = type(resource)._pie_drop
    drop(index, handle)


def _exit_of(binding_exit):
    def __exit__(self, *exc):
        """Drop this handle now (a context or adapter is released first, unless it was)."""
        if self.__dict__.get("finalizer", False) is None:
            _drop(self)
        else:
            binding_exit(self, *exc)
    return __exit__


for _cls in RESOURCES.values():
    _cls.__del__ = _drop
    _cls.__exit__ = _exit_of(_cls.__exit__)
