"""Host interface ``messaging``: pub/sub and queues between the inferlets of one user.

Topic and queue names resolve inside the calling user's namespace: the same name used by two
users names two different topics (or queues). Messages, queues and subscriptions are bounded by
the user's quotas (``server.quotas.*`` under ``pie serve``; defaults under ``pie run``).
"""

from __future__ import annotations


from inferlet.host._declare import host
from inferlet.host.types import Subscription

__all__ = ["broadcast", "next_message", "pull", "push", "subscribe", "subscription_closed", "subscription_topic",
           "unsubscribe"]


@host
def broadcast(topic: str, message: str) -> None:
    """Publish ``message`` to every subscriber of the caller's ``topic``.

    Raises:
        InvalidInput: The message is too large, or a subscriber's inbox is full.
    """


@host
async def next_message(sub: Subscription) -> str | None:
    """Wait for the next broadcast on ``sub``; None once unsubscribed."""


@host
async def pull(topic: str) -> str:
    """Wait for and remove the next message of the caller's queue ``topic``."""


@host
def push(topic: str, message: str) -> None:
    """Append ``message`` to the caller's queue ``topic``.

    Raises:
        InvalidInput: The message is too large, the queue is full, or a new queue would pass
            the user's quota of subscriptions and queues.
    """


@host
def subscribe(topic: str) -> Subscription:
    """Open a subscription owned by the caller (closed when the inferlet ends).

    Raises:
        InvalidInput: The user has as many subscriptions and queues in use as its quota allows.
    """


@host
def subscription_closed(sub: Subscription) -> bool:
    """Whether ``sub`` was closed (by :func:`unsubscribe` or when its inferlet ended)."""


@host
def subscription_topic(sub: Subscription) -> str:
    """The topic ``sub`` listens to."""


@host
def unsubscribe(sub: Subscription) -> None:
    """Close a subscription; a pending ``next_message`` returns None."""
