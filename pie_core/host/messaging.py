"""Host interface ``messaging``: pub/sub and queues across the inferlets of one engine."""

from __future__ import annotations

from pie_core.errors import InvalidInput
from pie_core.host.binding import current
from pie_core.runtime.broker import Subscription

__all__ = ["broadcast", "subscribe", "unsubscribe", "next_message", "push", "pull", "Subscription"]


def _check(topic: str, message: str | None = None) -> None:
    if not isinstance(topic, str) or not topic:
        raise InvalidInput(f"a topic must be a non-empty string, got {topic!r}")
    if message is not None and not isinstance(message, str):
        raise InvalidInput(f"messages are strings, got {type(message).__name__}")


def broadcast(topic: str, message: str) -> None:
    """Publish ``message`` to every subscriber of ``topic``."""
    _check(topic, message)
    current().engine.broker.broadcast(topic, message)


def subscribe(topic: str) -> Subscription:
    """Open a subscription owned by the caller (closed when the inferlet ends)."""
    _check(topic)
    sub = current().engine.broker.subscribe(topic)
    current().resources.add(sub)
    return sub


def unsubscribe(sub: Subscription) -> None:
    """Close a subscription; a pending ``next_message`` returns None."""
    sub.release()
    current().resources.discard(sub)


async def next_message(sub: Subscription) -> str | None:
    """Wait for the next broadcast on ``sub``; None once unsubscribed."""
    return await sub.next()


def push(topic: str, message: str) -> None:
    """Append ``message`` to the queue ``topic``."""
    _check(topic, message)
    current().engine.broker.push(topic, message)


async def pull(topic: str) -> str:
    """Wait for and remove the next message of the queue ``topic``."""
    _check(topic)
    return await current().engine.broker.pull(topic)
