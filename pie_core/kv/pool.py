"""The page pool: which physical KV pages are free, and who holds the rest (refcounts)."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from pie_core.errors import OutOfPages
from pie_core.kv.accounts import PageAccounts
from pie_core.kv.prefix_cache import PrefixCache

__all__ = ["PagePool"]


class PagePool:
    """Fixed set of ``num_pages`` physical pages with reference counts.

    A page is free exactly when its count is zero. ``alloc`` hands out pages with count 1;
    ``retain`` adds a holder (a fork sharing a committed page); ``release`` drops one holder
    and frees pages whose count reaches zero.

    The pool's :class:`PrefixCache` holds one reference on each committed page it can hand
    to a later context with the same prefix; pages only the cache holds are evicted on demand,
    so they count as available and the pool is *whole* when nothing else holds a page.

    ``accounts`` charges the pages contexts hold to their users (see :mod:`pie_core.kv.accounts`).
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"a page pool needs pages > 0 and page_size > 0, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._refs = np.zeros(num_pages, dtype=np.int32)
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
        self.cache = PrefixCache(self)
        self.accounts = PageAccounts()
        self.on_release: Callable[[], None] | None = None  # told when pages became free

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def available_count(self) -> int:
        """Free pages plus pages only the prefix cache holds."""
        return len(self._free) + self.cache.idle_count()

    def can_take(self, n: int) -> bool:
        """Whether ``n`` pages can be had now: free ones first, so the prefix cache's idle
        pages (a scan of the cache) are counted only when the free ones are short."""
        return n <= len(self._free) or n <= self.available_count

    def is_whole(self) -> bool:
        """True when no page is held by anyone but the prefix cache."""
        return self.available_count == self.num_pages

    def refs_of(self, pages: np.ndarray) -> np.ndarray:
        return self._refs[pages]

    def alloc(self, n: int) -> list[int]:
        """Take ``n`` free pages (count 1 each).

        Raises:
            OutOfPages: Fewer than ``n`` pages are free; nothing is taken.
        """
        if n > len(self._free) and n <= self.available_count:
            self.cache.evict(n - len(self._free))
        if n > len(self._free):
            raise OutOfPages(
                f"needs {n} KV pages but only {len(self._free)} of {self.num_pages} are free; "
                "release or truncate contexts, or start the engine with more KV memory"
            )
        pages = [self._free.pop() for _ in range(n)]
        self._refs[pages] = 1
        return pages

    def retain(self, pages: Iterable[int]) -> None:
        """Add one holder to each page (pages must be allocated)."""
        idx = np.fromiter(pages, dtype=np.int64)
        if idx.size and (self._refs[idx] <= 0).any():
            raise RuntimeError(f"retain of free pages {idx[self._refs[idx] <= 0].tolist()}")
        np.add.at(self._refs, idx, 1)

    def release(self, pages: Iterable[int]) -> None:
        """Drop one holder from each page; pages whose count reaches zero become free."""
        idx = np.fromiter(pages, dtype=np.int64)
        if not idx.size:
            return
        if (self._refs[idx] <= 0).any():
            raise RuntimeError(f"release of free pages {idx[self._refs[idx] <= 0].tolist()}")
        np.subtract.at(self._refs, idx, 1)
        freed = np.unique(idx[self._refs[idx] == 0])
        self._free.extend(freed[::-1].tolist())
        if self.on_release is not None:  # freed, or left to the prefix cache (available too)
            self.on_release()

    def refcount(self, page: int) -> int:
        return int(self._refs[page])
