"""Prefix cache: committed pages findable by a content hash chained over what they hold.

A full page's hash covers the previous page's hash and the page's (token, position) pairs, so
equal hashes mean equal prefixes and therefore equal KV contents. The cache holds one
reference on each page it knows; a page held by nobody else is *idle* and is evicted
(least recently used first) when the pool runs short, so cached pages never cost anyone an
allocation.

It also knows which pages passes are computing right now (:meth:`PrefixCache.announce`), so a
pass whose next pages another pass is computing waits for them to land and takes them from the
cache instead of computing them again: N contexts opening on one system prompt at once compute
it once (SGLang's in-batch prefix caching makes the same trade).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pie_core.kv.pool import PagePool

__all__ = ["PrefixCache", "ROOT", "chain_hash", "chain_keys", "salted_root"]

ROOT = b"pie-prefix-root"


def salted_root(salt: bytes) -> bytes:
    """The root of the chain of pages computed under ``salt`` (an adapter; b"": the base weights)."""
    if not salt:
        return ROOT
    # A separate hash domain (person), so no page of tokens can hash to a salted root.
    return hashlib.blake2b(ROOT + salt, digest_size=16, person=b"pie-kv-salt").digest()


def chain_hash(prev: bytes, tokens: np.ndarray, positions: np.ndarray) -> bytes:
    """The hash of a full page given the hash of the page before it."""
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(np.ascontiguousarray(tokens, dtype=np.int32).tobytes())
    h.update(np.ascontiguousarray(positions, dtype=np.int32).tobytes())
    return h.digest()


def chain_keys(prev: bytes, tokens: np.ndarray, positions: np.ndarray, page_size: int) -> list[bytes]:
    """The hashes of the full pages ``tokens``/``positions`` fill, chained on from ``prev``."""
    keys = []
    for page_tokens, page_positions in zip(tokens.reshape(-1, page_size), positions.reshape(-1, page_size)):
        prev = chain_hash(prev, page_tokens, page_positions)
        keys.append(prev)
    return keys


class PrefixCache:
    """``hash -> page`` for one page pool, in least-recently-used order."""

    def __init__(self, pool: PagePool) -> None:
        self._pool = pool
        self._pages: OrderedDict[bytes, int] = OrderedDict()
        self._computing: dict[bytes, asyncio.Event] = {}
        self.hits = 0
        self.waits = 0  # passes that waited for another pass's pages (then took what it cached)

    def __len__(self) -> int:
        return len(self._pages)

    def cached_prefix(self, keys: list[bytes]) -> int:
        """How many leading ``keys`` are cached or being computed by a pass in flight (a pass
        that needs them waits for it and adopts them), without touching them or counting hits:
        a placement probe, not a use."""
        n = 0
        for key in keys:
            if key not in self._pages and key not in self._computing:
                break
            n += 1
        return n

    def lookup_chain(self, keys: list[bytes]) -> list[int]:
        """The cached pages of the longest cached prefix of ``keys`` (a chain, root first)."""
        found: list[int] = []
        for key in keys:
            page = self._pages.get(key)
            if page is None:
                break
            found.append(page)
        self._touch(keys[: len(found)])
        self.hits += len(found)
        return found

    def insert_chain(self, keys: list[bytes], pages: list[int]) -> list[int]:
        """Cache each page under its key unless an equal page is cached already.

        Returns:
            The page to keep for each key: the given one, or the one cached before it.
        """
        kept = []
        for key, page in zip(keys, pages):
            cached = self._pages.get(key)
            if cached is None:
                self._pool.retain([page])
                self._pages[key] = cached = page
            kept.append(cached)
        self._touch(keys)
        return kept

    def computing(self, key: bytes) -> asyncio.Event | None:
        """Set when the pass computing the page of ``key`` (not cached yet) has landed or failed;
        None when no pass announced it."""
        return self._computing.get(key)

    def announce(self, keys: list[bytes]) -> list[bytes]:
        """Mark the pages of ``keys`` as being computed by the caller's pass; returns those it
        announced (not cached and not announced by another pass), for :meth:`landed`."""
        mine = [k for k in keys if k not in self._pages and k not in self._computing]
        if mine:
            done = asyncio.Event()
            self._computing.update(dict.fromkeys(mine, done))
        return mine

    def landed(self, keys: list[bytes]) -> None:
        """The pass that announced ``keys`` ended (its pages cached, or it failed): wake its waiters."""
        for key in keys:
            done = self._computing.pop(key, None)
            if done is not None:
                done.set()

    def _touch(self, keys: list[bytes]) -> None:
        # Deeper pages are only reachable through their ancestors, so they go stale first:
        # mark the chain used leaf-first so eviction takes leaves before roots.
        for key in reversed(keys):
            self._pages.move_to_end(key)

    def pages(self) -> list[int]:
        """Every page the cache holds a reference on, least recently used first."""
        return list(self._pages.values())

    def idle_count(self) -> int:
        """Pages held by the cache alone (free for the taking)."""
        if not self._pages:
            return 0
        pages = np.fromiter(self._pages.values(), dtype=np.int64, count=len(self._pages))
        return int(np.count_nonzero(self._pool.refs_of(pages) == 1))

    def evict(self, n: int) -> int:
        """Free up to ``n`` idle pages, least recently used first; returns how many."""
        freed: list[int] = []
        for key, page in list(self._pages.items()):
            if len(freed) >= n:
                break
            if self._pool.refcount(page) == 1:
                del self._pages[key]
                freed.append(page)
        self._pool.release(freed)
        return len(freed)

    def clear(self) -> None:
        """Drop every idle page (pages in use stay with their holders)."""
        self.evict(len(self._pages))
