"""The host API as the engine serves it: the SDK's declarations, each bound to its implementation.

The API is declared once, in the SDK (:mod:`inferlet.host`: a typed stub per function). Here
each declaration ``(interface, name)`` is bound to the engine's ``pie_core.host.<interface>.<name>``,
each declared handle kind to the engine class behind it (:data:`HANDLES`), and the value types
that cross by value are listed (:data:`VALUE_TYPES`). Every runner serves exactly these calls:
in-process (:mod:`pie_core.runtime.inprocess`) directly, the sandboxed runners through
:func:`invoke`, which checks a stranger's arguments first.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from inferlet import host as _declared
from inferlet.host import arguments as _arguments
from inferlet.host import types as _types
from pie_core.engine.broker import Subscription
from pie_core.engine.engine import LoadedModel
from pie_core.errors import BackendError, ContractError, InvalidInput, McpError, NotFound, OutOfPages, PieError, Unsupported
from pie_core.host import runtime as host_runtime
from pie_core.host.adapter import HostAdapter
from pie_core.host.binding import is_off_loop, is_ready_first, is_soon, run_off_loop, soon_of
from pie_core.host.context import HostContext
from pie_core.host.grammar import MatcherHandle
from pie_core.mcp.session import ServerSession
from pie_core.models.chat_formats.base import ChatBuilder

__all__ = ["HOST_MODULES", "Key", "HandleKind", "HANDLES", "VALUE_TYPES", "CALLS", "host_functions", "host_function",
           "invoke",
           "start", "Started", "settle", "Done", "is_oneway", "handle_kind", "check_arguments", "parameter_types"]

HOST_MODULES = _declared.INTERFACES
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class HandleKind:
    """A declared handle kind and the engine class behind it. A sandboxed inferlet holds such
    objects as opaque ids: it can pass one to host functions and compare it by identity.

    Attributes:
        name: The declared class's name (``Context``), which the process wire uses.
        cls: The engine class (instances of subclasses count too).
        declared: The SDK's class (:mod:`inferlet.host.types`), whose ``wit`` names the resource.
    """

    name: str
    cls: type
    declared: type[_types.Handle]


HANDLES: tuple[HandleKind, ...] = tuple(HandleKind(declared.__name__, cls, declared) for declared, cls in (
    (_types.Context, HostContext),
    (_types.Matcher, MatcherHandle),
    (_types.ChatBuilder, ChatBuilder),
    (_types.Subscription, Subscription),
    (_types.McpSession, ServerSession),
    (_types.Adapter, HostAdapter),
    (_types.Model, LoadedModel),  # model.resolve's result: only proves the model exists
))
assert {kind.declared for kind in HANDLES} == set(_types.HANDLES), "every declared handle kind needs its engine class"

_BY_NAME = {kind.name: kind for kind in HANDLES}
_BY_CLASS = {kind.cls: kind for kind in HANDLES}

VALUE_TYPES: tuple[type, ...] = (
    *_types.RECORDS, _types.SamplerKind, _types.ProbeKind,
    PieError, InvalidInput, OutOfPages, Unsupported, NotFound, BackendError, ContractError, McpError,
    # builtin errors a host call may raise; any other error crosses as its nearest base here
    Exception, ValueError, TypeError, KeyError, IndexError, LookupError, RuntimeError, PermissionError, TimeoutError,
    NotImplementedError, AttributeError, OverflowError, ZeroDivisionError, ArithmeticError, MemoryError, OSError,
)

_FUNCTIONS: dict[Key, Callable[..., Any]] | None = None

CALLS: collections.Counter[Key] = collections.Counter()
"""Host calls inferlets made, by ``(interface, name)``, over every runner (``/metrics``
reports them as ``pie_host_calls_total``; a sandboxed runner's call is one round trip)."""


def host_functions() -> dict[Key, Callable[..., Any]]:
    """The engine's implementation of every declared host function, by ``(interface, name)``.

    Raises:
        ContractError: A declared function has no implementation in ``pie_core.host``.
    """
    global _FUNCTIONS
    if _FUNCTIONS is None:
        found: dict[Key, Callable[..., Any]] = {}
        for key in _declared.declarations():
            module = importlib.import_module(f"pie_core.host.{key[0]}")
            fn = getattr(module, key[1], None)
            if not callable(fn):
                raise ContractError(f"inferlet.host.{key[0]}.{key[1]} is declared but pie_core.host.{key[0]} does not "
                                    "implement it")
            found[key] = fn
        _FUNCTIONS = found
    return dict(_FUNCTIONS)


def is_oneway(module: str, name: str) -> bool:
    """Whether ``module.name`` is declared one-way (the caller does not wait for it)."""
    decl = _declared.declarations().get((module, name))
    return decl is not None and decl.oneway


def host_function(module: Any, name: Any) -> Callable[..., Any]:
    """The engine's implementation of declared host function ``module.name``.

    Raises:
        PermissionError: It is not a declared host function.
    """
    functions = _FUNCTIONS if _FUNCTIONS is not None else host_functions()
    fn = functions.get((module, name)) if isinstance(module, str) and isinstance(name, str) else None
    if fn is None:
        raise PermissionError(f"{module!r}.{name!r} is not a host function an inferlet may call; "
                              f"the host API is what inferlet.host.{{{','.join(HOST_MODULES)}}} declare")
    return fn


async def invoke(module: str, name: str, fn: Callable[..., Any], args: tuple[Any, ...] | list[Any], *,
                 runner: Any) -> Any:
    """Run declared host function ``fn`` for a sandboxed inferlet, on the event loop, the way
    every sandboxed runner must: arguments checked as a direct call would (handles by class
    too); ``runtime.spawn`` runs the child with ``runner``; :func:`~pie_core.host.binding.off_loop`
    functions (grammar parsing) in a thread; a matcher a :func:`~pie_core.host.binding.ready_first`
    function needs is awaited first; a coroutine's value is awaited. The caller binds the instance.
    """
    args = check_arguments(fn, f"{module}.{name}", tuple(args))
    if (module, name) == ("runtime", "spawn"):
        return await host_runtime.spawn_child(*args, runner=runner)
    if is_off_loop(fn):
        return await run_off_loop(fn, *args)
    if is_ready_first(fn) and args and isinstance(args[0], MatcherHandle):
        await args[0].ready()
    value = fn(*args)
    return await value if inspect.isawaitable(value) else value


Done = Callable[[bool, Any], None]
"""``done(ok, value)``: a host call ended with ``value``, or failed with exception ``value``."""


class Started(NamedTuple):
    """A host call :func:`start` started: what cancels it, and the task running it, if any
    (to wait for before an instance's end is reported)."""

    cancel: Callable[[], None]
    task: asyncio.Task[Any] | None = None


def start(module: str, name: str, fn: Callable[..., Any], args: tuple[Any, ...] | list[Any], *, runner: Any,
          done: Done) -> Started:
    """Start declared host function ``fn`` for a sandboxed inferlet, on the event loop, as
    :func:`invoke` runs it, and call ``done`` when it ended (possibly before this returns).

    A synchronous function that may run on the loop runs at once; one with a callback form
    (:func:`~pie_core.host.binding.soon`, the decode loop's ``forward_next``) is started through
    it; anything else runs as a task. Cancelling the call makes ``done`` get a PieError saying
    so, unless it had ended. The caller binds the instance.
    """
    args = tuple(args)
    CALLS[module, name] += 1
    try:
        args = check_arguments(fn, f"{module}.{name}", args)
        if is_soon(fn):
            cancel = soon_of(fn)(*args, done=done)
            if cancel is not None:
                return Started(cancel)
        elif not (inspect.iscoroutinefunction(fn) or is_off_loop(fn) or is_ready_first(fn)
                  or (module, name) == ("runtime", "spawn")):
            done(True, fn(*args))
            return Started(_nothing)
    except Exception as exc:  # noqa: BLE001 - the inferlet gets it
        done(False, exc)
        return Started(_nothing)
    task = asyncio.get_running_loop().create_task(invoke(module, name, fn, args, runner=runner))
    task.add_done_callback(lambda t: settle(t, done))
    return Started(task.cancel, task)


def _nothing() -> None:
    """Cancels a call that already ended."""


def settle(task: asyncio.Future[Any], done: Done) -> None:
    """Hand a finished task's outcome to ``done`` (a cancelled call fails with a PieError)."""
    if task.cancelled():
        done(False, PieError("the host call was cancelled"))
    elif task.exception() is not None:
        done(False, task.exception())
    else:
        done(True, task.result())


def handle_kind(obj: Any = None, *, name: str | None = None) -> HandleKind | None:
    """The :class:`HandleKind` of engine object ``obj`` (or the one called ``name``), else None."""
    if name is not None:
        return _BY_NAME.get(name)
    kind = _BY_CLASS.get(type(obj))
    if kind is not None:
        return kind
    for kind in HANDLES:
        if isinstance(obj, kind.cls):
            return kind
    return None


def check_arguments(fn: Callable[..., Any], what: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` of declared host function ``fn`` as they cross, checked as the SDK checks them
    before they leave an inferlet (:func:`inferlet.host.arguments.check`: what the wire can
    carry, with the same messages in every runner), and each handle by its engine class (a
    worker holding a context cannot pass it to ``model.chat_copy``). Missing trailing arguments
    take their defaults.

    Returns:
        ``args``, or a copy with the values the SDK's rules convert (an int for a float).

    Raises:
        TypeError: ``args`` do not fit ``fn`` (as a direct call would say), or a handle is not
            of the class the declaration names.
        InvalidInput: A value outside what the declaration admits; the message names it.
    """
    checks = _CHECKS.get(fn)
    if checks is None:
        checks = _CHECKS[fn] = (len(_parameters(fn)), _plan_of(fn))
    count, plan = checks
    if len(args) != count:
        try:
            bound = _signature(fn).bind(*args)
        except TypeError as exc:
            raise TypeError(f"{what}(): {exc}") from None
        bound.apply_defaults()
        args = tuple(bound.arguments.values())
    if plan is None:  # not a declared function: only its handles, by its annotations
        _check_handle_hints(fn, what, _parameters(fn), args)
        return args
    if plan.handles:
        _arguments.check_handles(plan, args, _ENGINE_CLASSES)
    if plan.fast is None or plan.fast(*args):
        return args
    return _arguments.check(plan, args, _ENGINE_CLASSES)  # converts, or says what is wrong


_ENGINE_CLASSES: dict[type, type] = {kind.declared: kind.cls for kind in HANDLES}
_CHECKS: dict[Any, tuple[int, _arguments.Plan | None]] = {}


def _plan_of(fn: Callable[..., Any]) -> _arguments.Plan | None:
    """The argument checks of the declaration ``fn`` implements, or None."""
    functions = _FUNCTIONS if _FUNCTIONS is not None else host_functions()
    return next((_arguments.plan(key, decl.stub) for key, decl in _declared.declarations().items()
                 if functions[key] is fn), None)


def _check_handle_hints(fn: Callable[..., Any], what: str, params: list[inspect.Parameter],
                        args: tuple[Any, ...]) -> None:
    hints = None
    for param, value in zip(params, args):
        if type(value) in _PLAIN:
            continue
        kind = handle_kind(value)
        if kind is not None:
            hints = hints if hints is not None else parameter_types(fn)
            if not _admits(hints.get(param.name, Any), value):
                raise TypeError(f"{what}(): {param.name} cannot be a {kind.name} handle")


_PLAIN = frozenset({int, float, str, bool, bytes, list, tuple, dict, type(None)})


def parameter_types(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s resolved annotations (handle classes resolve even where a module imports them
    only for type checking)."""
    if fn not in _TYPES:
        _TYPES[fn] = typing.get_type_hints(fn, localns={kind.cls.__name__: kind.cls for kind in HANDLES})
    return _TYPES[fn]


def _admits(hint: Any, value: Any) -> bool:
    if hint is Any:
        return True
    try:
        return isinstance(value, hint)
    except TypeError:  # a generic such as Sequence[int]: no handle is one
        return False


_SIGNATURES: dict[Any, inspect.Signature] = {}
_PARAMETERS: dict[Any, list[inspect.Parameter]] = {}
_TYPES: dict[Any, dict[str, Any]] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    if fn not in _SIGNATURES:
        _SIGNATURES[fn] = inspect.signature(fn)
    return _SIGNATURES[fn]


def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    if fn not in _PARAMETERS:
        _PARAMETERS[fn] = list(_signature(fn).parameters.values())
    return _PARAMETERS[fn]
