"""Messaging with other inferlets: ``from inferlet import messaging``."""

from __future__ import annotations

from pie_core.host import messaging as _host

__all__ = ["broadcast", "subscribe", "push", "pull", "Subscription"]


class Subscription:
    """A subscription to a broadcast topic: ``await sub.next()``, ``async for msg in sub``,
    or ``with messaging.subscribe(topic) as sub``."""

    def __init__(self, handle: _host.Subscription) -> None:
        self._h = handle

    async def next(self) -> str | None:
        """Wait for the next broadcast; None after :meth:`unsubscribe`."""
        return await _host.next_message(self._h)

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


async def pull(topic: str) -> str:
    """Wait for the next queued message of ``topic``."""
    return await _host.pull(topic)
