"""The host API an isolated worker may use: every call and every value type, declared here.

A worker reaches the engine only through what this module names: the ``__all__`` functions of
:data:`HOST_MODULES`, which take and return the engine objects of :data:`HANDLES` (held by the
worker as opaque ids: every operation on one is a host function taking it as its first
argument) and the value types in :data:`VALUE_TYPES` (which cross by value). The engine refuses
anything else; a contract check (``wit/``) can diff this table against the SDK.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable

from pie_core.engine.broker import Subscription
from pie_core.engine.engine import LoadedModel
from pie_core.errors import BackendError, ContractError, InvalidInput, NotFound, OutOfPages, PieError, Unsupported
from pie_core.grammar.source import GrammarSource
from pie_core.host import runtime as host_runtime
from pie_core.host.adapter import HostAdapter
from pie_core.host.binding import is_off_loop, is_ready_first, run_off_loop
from pie_core.host.context import HostContext
from pie_core.host.grammar import MatcherHandle
from pie_core.mcp.errors import McpError
from pie_core.mcp.session import ServerSession
from pie_core.models.chat_formats.base import ChatBuilder
from pie_core.models.chat_formats.tool_calls import ToolCallSyntax
from pie_core.values import ProbeKind, ProbeSpec, RequestOutput, SampleSpec, SamplerKind

__all__ = ["HOST_MODULES", "HandleKind", "HANDLES", "VALUE_TYPES", "host_functions", "host_function", "invoke", "handle_kind",
           "check_arguments", "parameter_types"]

HOST_MODULES = ("adapter", "context", "grammar", "inference", "mcp", "messaging", "model", "runtime", "scheduling",
                "session", "speculation", "tools", "zo")

_ENGINE_ONLY = frozenset({("scheduling", "wallet")})
"""Functions a host module exports for the engine's own use (they take engine objects no worker
holds), never callable from a worker."""


@dataclass(frozen=True, slots=True)
class HandleKind:
    """An engine class whose instances a worker holds as opaque ids: it can pass one to host
    functions and compare it by identity, nothing else.

    Attributes:
        name: The name the wire uses for the class.
        cls: The engine class (instances of subclasses count too).
    """

    name: str
    cls: type


HANDLES: tuple[HandleKind, ...] = (
    HandleKind("HostContext", HostContext),
    HandleKind("MatcherHandle", MatcherHandle),
    HandleKind("ChatBuilder", ChatBuilder),
    HandleKind("Subscription", Subscription),
    HandleKind("ServerSession", ServerSession),
    HandleKind("HostAdapter", HostAdapter),
    HandleKind("LoadedModel", LoadedModel),  # model.resolve's result: only proves the model exists
)

_BY_NAME = {kind.name: kind for kind in HANDLES}

VALUE_TYPES: tuple[type, ...] = (
    SampleSpec, ProbeSpec, RequestOutput, SamplerKind, ProbeKind, GrammarSource, ToolCallSyntax,
    PieError, InvalidInput, OutOfPages, Unsupported, NotFound, BackendError, ContractError, McpError,
    # builtin errors a host call may raise; any other error crosses as its nearest base here
    Exception, ValueError, TypeError, KeyError, IndexError, LookupError, RuntimeError, PermissionError, TimeoutError,
    NotImplementedError, AttributeError, OverflowError, ZeroDivisionError, ArithmeticError, MemoryError, OSError,
)


def host_functions() -> dict[tuple[str, str], Callable[..., Any]]:
    """Every callable host function, keyed by ``(module, name)``: the functions named in the
    ``__all__`` of each of :data:`HOST_MODULES` (classes and constants there are not calls),
    less the engine's own helpers."""
    found: dict[tuple[str, str], Callable[..., Any]] = {}
    for short in HOST_MODULES:
        mod = importlib.import_module(f"pie_core.host.{short}")
        for name in getattr(mod, "__all__", ()):
            fn = getattr(mod, name)
            if inspect.isfunction(fn) and (short, name) not in _ENGINE_ONLY:
                found[short, name] = fn
    return found


_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] | None = None


async def invoke(module: str, name: str, fn: Callable[..., Any], args: tuple[Any, ...] | list[Any],
                 kwargs: dict[str, Any], *, runner: Any) -> Any:
    """Run declared host function ``fn`` for a sandboxed inferlet, on the event loop, the way
    every runner must: arguments checked as a direct call would (handles by class too);
    ``runtime.spawn`` runs the child with ``runner``; :func:`~pie_core.host.binding.off_loop`
    functions (grammar parsing) in a thread; a matcher a :func:`~pie_core.host.binding.ready_first`
    function needs is awaited first; a coroutine's value is awaited. The caller binds the instance.
    """
    check_arguments(fn, f"pie_core.host.{module}.{name}", tuple(args), kwargs)
    if (module, name) == ("runtime", "spawn"):
        return await host_runtime.spawn_child(*args, **kwargs, runner=runner)
    if is_off_loop(fn):
        return await run_off_loop(fn, *args, **kwargs)
    if is_ready_first(fn) and args and isinstance(args[0], MatcherHandle):
        await args[0].ready()
    value = fn(*args, **kwargs)
    return await value if inspect.isawaitable(value) else value


def host_function(module: Any, name: Any) -> Callable[..., Any]:
    """The engine's own ``pie_core.host.<module>.<name>``, if it is declared.

    Raises:
        PermissionError: It is not a declared host function.
    """
    global _FUNCTIONS
    if _FUNCTIONS is None:
        _FUNCTIONS = host_functions()
    fn = _FUNCTIONS.get((module, name)) if isinstance(module, str) and isinstance(name, str) else None
    if fn is None:
        raise PermissionError(f"{module!r}.{name!r} is not a host function an inferlet may call; "
                              f"the host API is the __all__ functions of pie_core.host.{{{','.join(HOST_MODULES)}}}")
    return fn


def handle_kind(obj: Any = None, *, name: str | None = None) -> HandleKind | None:
    """The :class:`HandleKind` of engine object ``obj`` (or the one called ``name``), else None."""
    if name is not None:
        return _BY_NAME.get(name)
    for kind in HANDLES:
        if isinstance(obj, kind.cls):
            return kind
    return None


def check_arguments(fn: Callable[..., Any], what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise TypeError, as a direct call would, when ``args``/``kwargs`` do not fit ``fn``, and
    when a handle is passed for a parameter whose annotation does not admit its class (a worker
    holding a context cannot pass it to ``model.chat_copy``)."""
    try:
        bound = _signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{what}(): {exc}") from None
    for name, value in bound.arguments.items():
        kind = handle_kind(value)
        if kind is not None and not _admits(parameter_types(fn).get(name, Any), value):
            raise TypeError(f"{what}(): {name} cannot be a {kind.name} handle")


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
_TYPES: dict[Any, dict[str, Any]] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    if fn not in _SIGNATURES:
        _SIGNATURES[fn] = inspect.signature(fn)
    return _SIGNATURES[fn]
