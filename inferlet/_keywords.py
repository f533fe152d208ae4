"""Keyword aliases: one SDK call answers to the reference's parameter names and to older ones."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

__all__ = ["renamed"]

F = TypeVar("F", bound=Callable[..., Any])


def renamed(**aliases: str) -> Callable[[F], F]:
    """Let a function take its parameters under other keyword names as well.

    ``@renamed(msg="message")`` makes ``f(model, msg=x)`` the same call as
    ``f(model, message=x)``; the signature (and what ``help()`` shows) keeps the new names.

    Raises (from the wrapped function):
        TypeError: A call that names one parameter twice, under both names.
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in aliases.items():
                if old in kwargs:
                    if new in kwargs:
                        name = fn.__qualname__
                        raise TypeError(f"{name}() got {new}= and {old}=, two names for one argument: pass one")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
