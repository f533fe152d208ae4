"""Synchronous forms of the SDK's waits, where the runner lets an inferlet block.

The reference writes every wait as a coroutine (``await ctx.flush()``, ``await sub.next()``);
the readme also shows synchronous forms (``for event in ctx.generate(...)``, ``text =
ctx.generate_text(...)``, ``for msg in sub``). A synchronous form blocks the inferlet's thread
until the wait ends, which only a runner that gives the inferlet a thread of its own can allow:

* the process runner (``pie serve --isolation process``): the worker process runs one inferlet
  on its own event loop;
* the wasm runner (``--isolation wasm``): the guest runs one inferlet, waiting in the host.

Such a runner's transport (:mod:`inferlet.host.transport`) carries a factory of event loops
(``blocking``); a synchronous form then runs its coroutine to the end on one of those loops,
while the inferlet's own loop (if any) simply waits. The in-process transport has none: its
inferlets share the engine's event loop, which must never block, so a synchronous form raises
:class:`~inferlet.host.errors.Unsupported` naming the ``await``/``async for`` form to write
instead.

What each form does, in every runner:

* ``for x in obj`` (generators, event streams, subscriptions) blocks for each item, also inside
  ``async def`` code; ``async for`` is unchanged.
* A call that returns a value (``ctx.generate_text()``, ``g.collect_text()``,
  ``messaging.pull()``, ... - the functions wrapped by :func:`awaitable`)
  cannot return something that is both the value and awaitable, so the caller decides: called
  from coroutine code (an event loop runs in the thread: ``async def main``) it returns the
  coroutine, to ``await`` as the reference writes; called from plain synchronous code (no loop
  runs: a ``def main(input)``, which the process and wasm runners accept) it blocks and returns
  the value.
* The MCP calls, which the reference documents as returning ``str`` (:func:`returns_str`),
  block wherever the runner allows, also from coroutine code, and return a string that can be
  awaited as well; in-process they are coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Iterator
from typing import Any, ParamSpec, TypeVar

from inferlet.host import transport as _transport
from inferlet.host.errors import Unsupported

__all__ = ["prepare", "wait", "awaitable", "returns_str", "Ready", "iterate", "call_synchronously", "Attempt", "WHERE"]

T = TypeVar("T")
P = ParamSpec("P")

WHERE = "synchronous forms need `pie serve --isolation process` or `--isolation wasm`"
"""The end of every error a synchronous form raises where the runner cannot block."""

class _Nesting(threading.local):
    """Per thread: the private loops of the blocking waits, one per nesting depth."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.depth = 0


_nesting = _Nesting()


def _new_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The installed transport's factory of event loops; None where the inferlet may not block."""
    return _transport.SLOT.transport.blocking


def prepare() -> None:
    """Make the first private loop now, where the installed transport lets the inferlet block:
    a runner calls this before it enters a sandbox that may refuse what a loop takes."""
    if _new_loop() is not None:
        _private_loop()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _private_loop() -> asyncio.AbstractEventLoop:
    """The private loop of the current nesting depth (made on first use)."""
    factory = _new_loop()
    assert factory is not None
    n = _nesting
    while len(n.loops) <= n.depth:
        n.loops.append(factory())
    return n.loops[n.depth]


def _run_private(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to its end on the private loop of this depth, with the thread's own
    loop (if one is running) set aside meanwhile."""
    loop = _private_loop()
    _nesting.depth += 1
    try:
        return _run_on(loop, awaitable)
    finally:
        _nesting.depth -= 1


def wait(awaitable: Awaitable[T], call: str) -> T:
    """Block until ``awaitable`` ends; its value (or its exception, raised here).

    Args:
        awaitable: What to wait for (a coroutine, a future, any awaitable).
        call: The call as the user wrote it, without ``await`` (``"ctx.generate_text(...)"``),
            for the error.

    Raises:
        Unsupported: The runner cannot block (in-process): write ``await <call>``.
    """
    if _new_loop() is None:
        if asyncio.iscoroutine(awaitable):
            awaitable.close()  # never started: no "never awaited" warning
        raise Unsupported(f"{call} is a coroutine here: write `await {call}` ({WHERE})")
    return _run_private(awaitable)


def awaitable(call: str) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """Decorate an ``async def`` of the SDK so that synchronous code gets its value.

    The wrapped function returns its coroutine when an event loop runs in the calling thread
    (the caller is coroutine code and awaits it), and otherwise blocks in :func:`wait` and
    returns the value. It is typed as the coroutine function it wraps.

    Args:
        call: How the user writes the call (``"ctx.generate_text(...)"``), for the error.
    """

    def wrap(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        def either(*args: P.args, **kwargs: P.kwargs) -> Any:
            coro = fn(*args, **kwargs)
            return coro if _loop_running() else wait(coro, call)

        return either

    return wrap


class Ready(str):
    """A string that is also awaitable (``await`` gives the string itself): the value of a call
    that blocked, so ``s = call()`` and ``s = await call()`` read the same."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, str]:
        return str(self)
        yield  # a generator function: awaiting finishes at once with the string


def returns_str(call: str) -> Callable[[Callable[P, Coroutine[Any, Any, str]]], Callable[P, Any]]:
    """Decorate an ``async def`` that the reference documents as returning ``str`` (the MCP calls).

    Where the runner lets the inferlet block (process, wasm), the call always blocks and returns
    a :class:`Ready` string, also from ``async def`` code, so the reference's ``raw =
    s.call_tool(...)`` and ``raw = await s.call_tool(...)`` both work; the inferlet's other tasks
    wait meanwhile. In-process it behaves as :func:`awaitable`: a coroutine to ``await`` from
    coroutine code, and the one-line error naming ``await`` from synchronous code.

    Args:
        call: How the user writes the call (``"s.list_tools()"``), for the error.
    """

    def wrap(fn: Callable[P, Coroutine[Any, Any, str]]) -> Callable[P, Any]:
        @functools.wraps(fn)
        def blocking(*args: P.args, **kwargs: P.kwargs) -> Any:
            coro = fn(*args, **kwargs)
            if _new_loop() is None:
                return coro if _loop_running() else wait(coro, call)
            return Ready(_run_private(coro))

        return blocking

    return wrap


def iterate(source: AsyncIterator[T], loop: str, *, instead: str | None = None) -> Iterator[T]:
    """``for x in obj``: each item of the async iterator ``source``, blocking for it.

    Checked at once (when the ``for`` starts), not at the first item.

    Args:
        source: The async iterator whose items the ``for`` gets.
        loop: The ``for`` header as the user writes it (``"for msg in sub"``), for the error.
        instead: The ``async for`` header to suggest (default: ``async`` + ``loop``).

    Raises:
        Unsupported: The runner cannot block (in-process): write ``async for`` instead.
    """
    if _new_loop() is None:
        raise Unsupported(f"`{loop}` blocks, and this runner cannot block an inferlet: "
                          f"write `{instead or 'async ' + loop}` ({WHERE})")
    return _items(source)


def _items(source: AsyncIterator[T]) -> Generator[T, None, None]:
    while True:
        try:
            item = _run_private(source.__anext__())
        except StopAsyncIteration:
            return
        yield item


def call_synchronously(fn: Callable[..., T], *args: Any) -> T:
    """Call the plain function ``fn`` as synchronous code: with no event loop running in the
    thread (the one running, if any, is set aside meanwhile), so the SDK's value-returning
    calls in it block (:func:`awaitable`). Runners use it for a ``def main(input)``."""
    with _outside():
        return fn(*args)


class Attempt:
    """A coroutine advanced only as far as it goes without waiting (``Subscription.get()``).

    :meth:`poll` runs it until it waits on something unfinished and says whether it ended;
    :meth:`finish` waits for the rest. Where the runner can block, it lives on the private loop
    of the depth it was first polled at (in coroutine code too), which :meth:`poll` lets run
    briefly first so that host replies that arrived settle, and :meth:`finish` runs until it
    ends when awaited from another loop. In-process it lives on the running loop.
    """

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop its futures belong to
        self._waiting: Any = None  # the future the coroutine waits on
        self._ended = False
        self._value: Any = None

    @property
    def value(self) -> Any:
        """The coroutine's value, once :meth:`poll` returned True."""
        return self._value

    def poll(self, call: str) -> bool:
        """Advance it without waiting; True once it ended (then :attr:`value` holds its value).

        Args:
            call: The call as the user writes it, for the error.

        Raises:
            Unsupported: Synchronous code, in-process: call it from ``async def`` code.
            Exception: Whatever the coroutine raised.
        """
        if self._ended:
            return True
        if _new_loop() is None:
            if not _loop_running():
                self._coro.close()
                raise Unsupported(f"{call} needs the inferlet's event loop: call it from `async def` code ({WHERE})")
            self._loop = self._loop or asyncio.get_running_loop()
            self._step()
            return self._ended
        if self._loop is None:
            self._loop = _private_loop()
        with _outside():
            self._loop.run_until_complete(asyncio.sleep(0))  # settle replies that have arrived
            asyncio.events._set_running_loop(self._loop)  # its host calls start on its loop
            self._step()
        return self._ended

    async def finish(self) -> Any:
        """Wait for the coroutine to end; its value. From a loop other than its own (where the
        runner can block), this blocks until it ends."""
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            return _run_on(self._loop, self._rest())
        return await self._rest()

    async def _rest(self) -> Any:
        while not self._ended:
            if self._waiting is not None and not self._waiting.done():
                await asyncio.wait([self._waiting])
            self._step()
        return self._value

    def _step(self) -> None:
        while not self._ended and (self._waiting is None or self._waiting.done()):
            try:
                self._waiting = self._coro.send(None)
            except StopIteration as stop:
                self._ended, self._value, self._waiting = True, stop.value, None


def _run_on(loop: asyncio.AbstractEventLoop, awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to its end on ``loop`` (not running), outside the running loop."""
    with _outside():
        return loop.run_until_complete(awaitable)


@contextlib.contextmanager
def _outside() -> Iterator[None]:
    """Set the thread's running loop and its current task aside for the block (a loop refuses
    to run while another runs in the thread, and the wasm guest's Python keeps one current task
    per thread, not per loop), then put them back."""
    outer = asyncio.events._get_running_loop()
    task = asyncio.current_task(outer) if outer is not None else None
    if task is not None:
        asyncio.tasks._leave_task(outer, task)
    asyncio.events._set_running_loop(None)
    try:
        yield
    finally:
        asyncio.events._set_running_loop(outer)
        if task is not None:
            asyncio.tasks._enter_task(outer, task)
