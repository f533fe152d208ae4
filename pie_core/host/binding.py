"""Which inferlet instance a host call serves: bound per asyncio task through a ContextVar."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from pie_core.engine.events import Event
from pie_core.errors import BackendError, PieError
from pie_core.threads import lower_priority

if TYPE_CHECKING:
    from pie_core.engine.engine import Engine

__all__ = ["HostInstance", "SpawnBudget", "ProgramResolver", "ChildRunner", "current", "emitting", "bind", "unbind",
           "off_loop", "is_off_loop", "run_off_loop", "run_off_loop_as", "ready_first", "is_ready_first", "any_thread", "is_any_thread",
           "soon", "is_soon", "soon_of"]

OFF_LOOP_THREADS = 2
"""Threads running :func:`off_loop` host calls for workers, shared by every user."""

OFF_LOOP_PER_USER = 1
"""Of those, how many one user's calls may hold at once."""

_off_loop_pool: ThreadPoolExecutor | None = None
_off_loop_lock = threading.Lock()
_off_loop_running: dict[str, int] = {}  # per user: its off-loop calls whose thread has not finished
_OFF_LOOP_TURN_S = 0.01  # how often a call waiting for its user's turn looks again

ProgramResolver = Callable[[str], Any]
"""``resolve(name)`` for ``runtime.spawn``: ``name`` or ``name@version`` to the program the
runner runs (Pie's runners use a ``Manifest``; the host only hands it to a :data:`ChildRunner`).
Raises ``NotFound`` or ``InvalidInput`` with the reason the name cannot be spawned."""

ChildRunner = Callable[[Any, dict[str, Any], "HostInstance"], Awaitable[Event]]
"""``await run(program, args, child)`` runs a spawned child to its end: it emits the child's
events through ``child.emit`` and returns its terminal event (``return`` or ``error``)."""


@dataclass(eq=False)
class SpawnBudget:
    """How far one user's ``runtime.spawn`` may go; one object per user, shared by all of that
    user's instances (the server fills the limits from its quotas; 0 = no limit).

    Attributes:
        processes: Spawned children running at once.
        spawn_depth: How deep spawns may nest (a launched inferlet is depth 0).
        running: Spawned children running now (kept exact by ``runtime.spawn``).
    """

    processes: int = 16
    spawn_depth: int = 4
    running: int = 0


@dataclass(eq=False)
class HostInstance:
    """Per-instance state the host API needs: who runs, where events go, what it holds.

    ``runtime.spawn`` needs ``resolve_program`` and ``run_child``; the host imports no runner,
    so whoever creates or runs the instance sets them. ``pie serve`` resolves names exactly as
    a launch by this user does (names only, never paths); where the creator leaves them
    ``None``, the runner fills in its own (``pie run``: folders and examples by name, children
    run in-process). Spawned children inherit both, and ``spawns``.
    """

    engine: Engine
    emit: Callable[[Event], None]
    username: str = "local"
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    resources: set[Any] = field(default_factory=set)  # objects with .release(), freed at exit
    inbox: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    files: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    scratch_root: Path | None = None  # per-user scratch dirs live under it (server only)
    resolve_program: ProgramResolver | None = None
    run_child: ChildRunner | None = None
    spawns: SpawnBudget = field(default_factory=SpawnBudget)
    depth: int = 0  # how many runtime.spawn calls deep this instance runs
    demand: Any = None  # pie_core.engine.placement.Demand: what placement knows of it (None: nothing)
    placed: dict[str, Any] = field(default_factory=dict)  # model name -> the replica it runs on

    def __post_init__(self) -> None:
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        deliver = self.emit

        def emit(event: Event) -> None:  # what the event's handler prints is the host's, not the inferlet's
            token = _emitting.set(True)
            try:
                deliver(event)
            finally:
                _emitting.reset(token)

        self.emit = emit

    def emit_soon(self, event: Event) -> None:
        """Emit ``event`` from any thread: at once on the instance's event loop, else handed to
        it (events keep the order in which one thread emitted them)."""
        loop = self.loop
        if loop is None or _on_loop(loop):
            self.emit(event)
        else:
            loop.call_soon_threadsafe(self.emit, event)

    def model(self, name: str) -> Any:
        """The replica of model ``name`` this instance runs on: placed by the engine on first
        use (its ``demand`` helps), the same one from then on.

        Raises:
            NotFound: No such model is loaded.
            BackendError: Its replica died (its backend failed a batch); other replicas serve
                new inferlets.
        """
        replica = self.placed.get(name)
        if replica is None:
            replica = self.placed.setdefault(name, self.engine.place(name, self.demand))
            self.resources.add(_Placement(replica))
        if not replica.alive:
            raise BackendError(f"replica {replica.index} of model {replica.name!r} failed; "
                               "this inferlet's contexts are lost, run it again (it is placed on a live replica)")
        return replica

    def release_all(self) -> None:
        """Free every resource the instance still holds (its pages return to the pools)."""
        for res in list(self.resources):
            res.release()
        self.resources.clear()


class _Placement:
    """An instance's hold on its replica: the replica's load counts it until it ends."""

    __slots__ = ("replica", "_held")

    def __init__(self, replica: Any) -> None:
        self.replica, self._held = replica, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.replica.bound -= 1


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


_current: contextvars.ContextVar[HostInstance | None] = contextvars.ContextVar("pie_instance", default=None)
_emitting: contextvars.ContextVar[bool] = contextvars.ContextVar("pie_emitting", default=False)


def emitting() -> bool:
    """True while an instance's event is being delivered (its handler's own writes are not the
    inferlet's output)."""
    return _emitting.get()


def current() -> HostInstance:
    """The instance the calling task belongs to.

    Raises:
        PieError: Called outside a running inferlet.
    """
    inst = _current.get()
    if inst is None:
        raise PieError("no inferlet instance is bound to this task; run it through the engine (pie run)")
    return inst


def bind(instance: HostInstance) -> contextvars.Token[HostInstance | None]:
    return _current.set(instance)


def unbind(token: contextvars.Token[HostInstance | None]) -> None:
    _current.reset(token)


F = TypeVar("F", bound=Callable[..., Any])


def off_loop(fn: F) -> F:
    """Mark a synchronous host function that may compute for a long time (seconds) without
    touching engine state: a dispatcher serving a worker runs it through :func:`run_off_loop`,
    never on the event loop. An in-process call still runs it in the caller's thread."""
    fn.__pie_off_loop__ = True  # type: ignore[attr-defined]
    return fn


def is_off_loop(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is marked :func:`off_loop`."""
    return getattr(fn, "__pie_off_loop__", False) is True


def any_thread(fn: F) -> F:
    """Mark a synchronous host function that touches no state of the event loop's (it reads the
    engine's tokenizers and chat formats, or only objects its own instance holds): a runner whose
    inferlet has a thread of its own (the wasm guest's) runs it there, bound to the instance,
    instead of hopping to the event loop and back."""
    fn.__pie_any_thread__ = True  # type: ignore[attr-defined]
    return fn


def is_any_thread(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is marked :func:`any_thread`."""
    return getattr(fn, "__pie_any_thread__", False) is True


def soon(form: Callable[..., Callable[[], None] | None]) -> Callable[[F], F]:
    """Give coroutine host function ``fn`` a callback form that a dispatcher serving a worker
    or guest starts instead of a task: ``form(*args, done=done)`` starts the call and returns what
    cancels it, calling ``done(ok, value)`` when it ended; or it returns None, having done
    nothing, when the call must run as the coroutine after all. An in-process call awaits the
    coroutine as usual."""

    def mark(fn: F) -> F:
        fn.__pie_soon__ = form  # type: ignore[attr-defined]
        return fn

    return mark


def is_soon(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has a callback form (:func:`soon`)."""
    return getattr(fn, "__pie_soon__", None) is not None


def soon_of(fn: Callable[..., Any]) -> Callable[..., Callable[[], None] | None]:
    """``fn``'s callback form (:func:`soon`)."""
    return fn.__pie_soon__  # type: ignore[attr-defined,no-any-return]


def ready_first(fn: F) -> F:
    """Mark a synchronous host function whose first argument, a grammar matcher, may still be
    compiling: a dispatcher serving a worker awaits the matcher's ``ready()`` first, so the
    compilation never blocks the event loop. An in-process call compiles in the caller's thread."""
    fn.__pie_ready_first__ = True  # type: ignore[attr-defined]
    return fn


def is_ready_first(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is marked :func:`ready_first`."""
    return getattr(fn, "__pie_ready_first__", False) is True


async def run_off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in one of :data:`OFF_LOOP_THREADS` threads (in the caller's
    context, so :func:`current` works there), awaited without blocking the event loop; the
    bound instance's user's turn (:func:`run_off_loop_as`)."""
    inst = _current.get()
    return await run_off_loop_as(inst.username if inst is not None else None, fn, *args, **kwargs)


async def run_off_loop_as(user: str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """:func:`run_off_loop` on behalf of ``user``: one user runs at most
    :data:`OFF_LOOP_PER_USER` such calls at once (more wait their turn), counted until the
    thread is done, not until its caller stops waiting, so a user whose calls take too long
    holds one thread, never the pool the other users share."""
    global _off_loop_pool
    with _off_loop_lock:
        if _off_loop_pool is None:
            _off_loop_pool = ThreadPoolExecutor(max_workers=OFF_LOOP_THREADS, thread_name_prefix="pie-off-loop",
                                                initializer=lower_priority)  # see pie_core.threads
    key = user if user is not None else ""
    while True:
        with _off_loop_lock:
            if _off_loop_running.get(key, 0) < OFF_LOOP_PER_USER:
                _off_loop_running[key] = _off_loop_running.get(key, 0) + 1
                break
        await asyncio.sleep(_OFF_LOOP_TURN_S)
    context = contextvars.copy_context()

    def free(_: object = None) -> None:
        with _off_loop_lock:
            _off_loop_running[key] -= 1

    try:
        future = _off_loop_pool.submit(context.run, fn, *args, **kwargs)
    except BaseException:
        free()
        raise
    # when the call has run, or was cancelled still queued (a caller that stops waiting cancels
    # it, and a cancelled call never runs: freeing only at its end would hold the turn forever)
    future.add_done_callback(free)
    return await asyncio.wrap_future(future)
