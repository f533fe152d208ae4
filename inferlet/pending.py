"""The tokens a context holds in the SDK and has not run yet: one owner, take and restore."""

from __future__ import annotations

from typing import Iterable

__all__ = ["Pending"]


class Pending:
    """A context's buffered tokens (the chat helpers and ``append`` add to it).

    A pass that runs buffered tokens takes them with :meth:`take` and, if the pass fails,
    gives them back with :meth:`restore`, so a failed pass loses nothing.
    """

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self._tokens = [int(t) for t in tokens]

    def __len__(self) -> int:
        return len(self._tokens)

    def tokens(self) -> list[int]:
        """A copy of the buffered tokens, oldest first."""
        return list(self._tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Buffer ``tokens`` after those already held."""
        self._tokens.extend(int(t) for t in tokens)

    def take(self, expected: list[int]) -> None:
        """Remove the leading tokens ``expected`` (those a pass is about to run).

        Raises:
            ValueError: The buffer no longer starts with ``expected`` (it was run or changed
                since the pass read it).
        """
        n = len(expected)
        if self._tokens[:n] != expected:
            raise ValueError("the buffer no longer starts with the tokens the pass read")
        del self._tokens[:n]

    def restore(self, tokens: list[int]) -> None:
        """Put back ``tokens`` that a failed pass took, ahead of anything buffered since."""
        self._tokens[:0] = tokens
