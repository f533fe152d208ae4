"""Messaging with other inferlets: ``from inferlet import messaging``.

The waiting calls (``await sub.next()``, ``await messaging.pull(topic)``, ``async for msg in
sub``) are coroutines, as in the reference. Where the runner lets an inferlet block
(``pie serve --isolation process`` or ``--isolation wasm``, see :mod:`inferlet._blocking`) the
readme's synchronous forms work too: ``for msg in sub``, and ``sub.next()`` /
``messaging.pull(topic)`` called from synchronous code (``def main``) return the message.
"""

from __future__ import annotations

from typing import Iterator

from inferlet.host import messaging as _host
from inferlet.host import types as _types
from inferlet import _blocking

__all__ = ["broadcast", "subscribe", "push", "pull", "Subscription"]


class Subscription:
    """A subscription to a broadcast topic: ``await sub.next()``, ``async for msg in sub``,
    ``sub.get()`` (never waits), or ``with messaging.subscribe(topic) as sub``; where the
    runner lets an inferlet block, also ``for msg in sub``."""

    def __init__(self, handle: _types.Subscription) -> None:
        self._h = handle
        self._fetch: _blocking.Attempt | None = None  # a fetch get() started and next() goes on with

    @_blocking.awaitable("sub.next()")
    async def next(self) -> str | None:
        """Wait for the next broadcast; None after :meth:`unsubscribe`."""
        fetch = self._fetch
        if fetch is None:
            return await _host.next_message(self._h)
        try:
            return await fetch.finish()
        finally:
            self._fetch = None

    def get(self) -> str | None:
        """The next broadcast if one has arrived, else None at once: it never waits.

        In-process a message is there as soon as it was broadcast. In the process and wasm
        runners it travels to the inferlet in the background: ``get()`` asks for it, and a
        later ``get()`` (or ``next()``) returns it once it came; nothing is lost or reordered.
        None also after :meth:`unsubscribe` (``next()`` tells the two apart: it waits).
        """
        if self._fetch is None:
            self._fetch = _blocking.Attempt(_host.next_message(self._h))
        fetch = self._fetch
        try:
            ended = fetch.poll("sub.get()")
        except BaseException:
            self._fetch = None
            raise
        if not ended:
            return None
        self._fetch = None
        return fetch.value

    def unsubscribe(self) -> None:
        """Drop the subscription."""
        _host.unsubscribe(self._h)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> str:
        msg = await self.next()
        if msg is None:
            raise StopAsyncIteration
        return msg

    def __iter__(self) -> Iterator[str]:
        """``for msg in sub``: each broadcast, blocking for it, until :meth:`unsubscribe`.

        Raises:
            Unsupported: The runner cannot block (in-process): write ``async for msg in sub``.
        """
        return _blocking.iterate(self, "for msg in sub")

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unsubscribe()


def broadcast(topic: str, message: str) -> None:
    """Publish to every subscriber of ``topic``."""
    _host.broadcast(topic, message)


def subscribe(topic: str) -> Subscription:
    """Open a subscription."""
    return Subscription(_host.subscribe(topic))


def push(topic: str, message: str) -> None:
    """Push onto the queue ``topic``."""
    _host.push(topic, message)


@_blocking.awaitable("messaging.pull(topic)")
async def pull(topic: str) -> str:
    """Wait for the next queued message of ``topic`` (from synchronous code where the runner
    lets an inferlet block: block for it and return it)."""
    return await _host.pull(topic)
