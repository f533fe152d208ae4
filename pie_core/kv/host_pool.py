"""The host pool: slots in host memory that suspended contexts' pages are copied to."""

from __future__ import annotations

from typing import Iterable

__all__ = ["HostPool"]


class HostPool:
    """``num_pages`` host page slots (the backend's host pool, numbered by the core).

    A slot holds one suspended page; it is free again once the page was copied back (the copy
    is queued before the slot is released, and queued copies run in order).
    """

    def __init__(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"a host pool needs pages >= 0, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def free_count(self) -> int:
        return len(self._free)

    def is_whole(self) -> bool:
        return len(self._free) == self.num_pages

    def alloc(self, n: int) -> list[int] | None:
        """``n`` free slots, or None (taking none) when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def release(self, slots: Iterable[int]) -> None:
        slots = list(slots)
        if any(not 0 <= s < self.num_pages for s in slots) or len(set(slots) | set(self._free)) != len(slots) + len(self._free):
            raise RuntimeError(f"release of host slots not held: {slots}")
        self._free.extend(reversed(slots))
