"""Host interface ``messaging``: pub/sub and queues between the inferlets of one user.

Topic and queue names resolve inside the calling user's namespace: the same name used by two
users names two different topics (or queues). Messages, queues and subscriptions are bounded by
the user's quotas (``server.quotas.*`` under ``pie serve``; defaults under ``pie run``)."""

from __future__ import annotations

from pie_core.engine.broker import Subscription
from pie_core.errors import InvalidInput
from pie_core.host.binding import current

__all__ = ["broadcast", "subscribe", "unsubscribe", "next_message", "push", "pull", "subscription_topic",
           "subscription_closed", "Subscription"]


def _check(topic: str, message: str | None = None) -> None:
    if not isinstance(topic, str) or not topic:
        raise InvalidInput(f"a topic must be a non-empty string, got {topic!r}")
    if message is not None and not isinstance(message, str):
        raise InvalidInput(f"messages are strings, got {type(message).__name__}")


def broadcast(topic: str, message: str) -> None:
    """Publish ``message`` to every subscriber of the caller's ``topic``.

    Raises:
        InvalidInput: The message is too large, or a subscriber's inbox is full.
    """
    _check(topic, message)
    inst = current()
    inst.engine.broker.broadcast(inst.username, topic, message)


def subscribe(topic: str) -> Subscription:
    """Open a subscription owned by the caller (closed when the inferlet ends).

    Raises:
        InvalidInput: The user has as many subscriptions and queues in use as its quota allows.
    """
    _check(topic)
    inst = current()
    sub = inst.engine.broker.subscribe(inst.username, topic)
    inst.resources.add(sub)
    return sub


def unsubscribe(sub: Subscription) -> None:
    """Close a subscription; a pending ``next_message`` returns None."""
    sub.release()
    current().resources.discard(sub)


async def next_message(sub: Subscription) -> str | None:
    """Wait for the next broadcast on ``sub``; None once unsubscribed."""
    return await sub.next()


def subscription_topic(sub: Subscription) -> str:
    """The topic ``sub`` listens to."""
    return sub.topic


def subscription_closed(sub: Subscription) -> bool:
    """Whether ``sub`` was closed (by :func:`unsubscribe` or when its inferlet ended)."""
    return sub.closed


def push(topic: str, message: str) -> None:
    """Append ``message`` to the caller's queue ``topic``.

    Raises:
        InvalidInput: The message is too large, the queue is full, or a new queue would pass
            the user's quota of subscriptions and queues.
    """
    _check(topic, message)
    inst = current()
    inst.engine.broker.push(inst.username, topic, message)


async def pull(topic: str) -> str:
    """Wait for and remove the next message of the caller's queue ``topic``."""
    _check(topic)
    inst = current()
    return await inst.engine.broker.pull(inst.username, topic)
