"""Core-side state of one context: its pages, how many are committed, and its token lineage."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from pie_core.errors import InvalidInput, PieError
from pie_core.kv.accounts import PageAccount
from pie_core.kv.host_pool import HostPool
from pie_core.kv.lineage import Lineage
from pie_core.kv.plan import ReplayStep, WritePlan
from pie_core.kv.pool import PagePool
from pie_core.kv.prefix_cache import chain_keys, salted_root

__all__ = ["KvContext", "ReplayStep", "WritePlan"]


class KvContext:
    """Pages of one context: ``committed`` full immutable pages, then working pages.

    ``length`` tokens are in the KV cache; ``tokens``/``positions`` record what was written to
    each slot (the lineage, used to rebuild a suspended context and to hash committed pages).
    Working pages beyond ``length`` may be reserved ahead of use.

    Committed pages go into the pool's prefix cache under a hash chained over their tokens and
    positions; a page equal to one cached already is swapped for it, and :meth:`adopt_prefix`
    takes cached pages instead of computing them. Tokens written under a custom attention mask
    make the rest of the context unshareable (their KV no longer follows from the prefix).
    Passes run under an adapter carry a ``salt`` (the adapter's weights and zo seed) that roots
    the hash chain; a context whose passes change salt is unshareable from there on.

    With an ``account``, every page in the page list is charged to it (shared pages too) and an
    allocation past the account's quota raises OutOfPages; without one nothing is counted.

    A context is *resident* (its pages are on the device) or *suspended*: :meth:`offload` copies
    its pages to host slots, :meth:`drop` lets them go and keeps only the lineage (see
    :mod:`pie_core.kv.lineage`); :meth:`restore` brings it back. A suspended context stays
    charged for the pages it will need again.

    The scheduler and the market ask it how many pages a pass needs (:meth:`pages_needed`),
    holds (:attr:`held_pages`), keeps spare, a fork copies or a restore takes, and never work
    that out from ``pages``, ``committed`` and ``length`` themselves.
    """

    def __init__(self, pool: PagePool, account: PageAccount | None = None) -> None:
        self.pool = pool
        self._account = account
        self.page_size = pool.page_size
        self.pages: list[int] = []
        self.committed = 0
        self.length = 0
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self._hashes: list[bytes] = []  # chain hash per committed page while shareable
        self.shareable = True
        self._salt = b""  # what the context's KV was computed under, besides the base weights
        self.lineage = Lineage()
        self.resident = True
        self.host_pages: list[int] = []  # while offloaded: the host slot of each page
        self._host_pool: HostPool | None = None
        self._suspended_pages = 0  # pages charged while suspended (restore takes this many)
        self.released = False

    @property
    def working_pages(self) -> int:
        return len(self.pages) - self.committed

    @property
    def working_tokens(self) -> int:
        """Tokens held in working pages (the part ``truncate`` may drop)."""
        return self.length - self.committed * self.page_size

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # What callers ask instead of doing page arithmetic on the fields.

    @property
    def held_pages(self) -> int:
        """Pages the context holds, or, suspended, takes back when restored."""
        return len(self.pages) if self.resident else self._suspended_pages

    @property
    def spare_pages(self) -> int:
        """Empty working pages reserved ahead of use (0 while suspended)."""
        if not self.resident:
            return 0
        return len(self.pages) - max(self._pages_for(self.length), self.committed)

    @property
    def fork_pages(self) -> int:
        """Fresh pages :meth:`fork` takes for its working copy (0 when suspended: the clone is too)."""
        return max(0, self._pages_for(self.length) - self.committed) if self.resident else 0

    def pages_needed(self, n: int, at: int | None = None) -> int:
        """Pages a pass of ``n`` tokens written from slot ``at`` (default: the length) needs
        beyond those the context holds (or, suspended, takes back)."""
        start = self.length if at is None else at
        return max(0, self._pages_for(start + n) - self.held_pages)

    @property
    def restore_pages(self) -> int:
        """Pages :meth:`restore` takes from the pool at most (0 while resident)."""
        return 0 if self.resident else self._suspended_pages

    def release_spare(self, keep: int = 0) -> None:
        """Free the empty working pages beyond the first ``keep`` (a suspended or released
        context has none)."""
        extra = self.spare_pages - keep
        if extra > 0:
            self.release_working(extra)

    def reserve(self, n_pages: int) -> None:
        """Add ``n_pages`` working pages (raises OutOfPages, taking none, if the pool is short)."""
        self._check_resident()
        if n_pages < 0:
            raise InvalidInput(f"cannot reserve a negative number of pages ({n_pages})")
        self.pages.extend(_alloc_charged(self.pool, self._account, n_pages, n_pages))

    def plan_write(self, n: int, at: int | None = None) -> WritePlan:
        """Reserve what ``n`` more tokens need and say where they go: slots ``at..at+n-1``
        (``at`` defaults to the length; a pass run ahead of its predecessor's record writes
        beyond it, see :mod:`pie_core.host.ahead`)."""
        self._check_resident()
        start = self.length if at is None else at
        need = self.pages_needed(n, start)
        if need:
            self.reserve(need)
        return self._plan(start, start + n)

    def _plan(self, start: int, stop: int) -> WritePlan:
        used = self._pages_for(stop)
        return WritePlan(
            page_ids=np.asarray(self.pages[:used], dtype=np.int32),
            write_slots=np.arange(start, stop, dtype=np.int32),
            last_page_len=stop - (used - 1) * self.page_size,
        )

    def replay(self, start: int, max_tokens: int) -> Iterator[ReplayStep]:
        """The passes that recompute slots ``[start, length)`` of a restored context from its
        lineage, at most ``max_tokens`` each (a masked pass whole); call :meth:`replayed` after
        the last one landed."""
        tokens = np.asarray(self.tokens, dtype=np.int32)
        positions = np.asarray(self.positions, dtype=np.int32)
        for run in self.lineage.chunks(start, max_tokens):
            yield ReplayStep(run, tokens[run.start : run.stop], positions[run.start : run.stop],
                             self._plan(run.start, run.stop))

    def advance(
        self,
        tokens: list[int],
        positions: list[int],
        masks: np.ndarray | None = None,
        hold: int = 0,
        salt: bytes = b"",
        tag: Any = None,
    ) -> None:
        """Record a completed pass and commit every page it filled.

        ``masks`` are the pass's attention mask rows (None = causal). The last ``hold`` tokens
        are speculative drafts: pages holding them stay working (truncatable) until
        :meth:`settle`. ``salt`` names the adapter weights the pass ran under (b"" none), and
        ``tag`` is what a replay needs to run under them again (kept in the lineage).
        """
        self._take_salt(salt)
        self.lineage.extend(len(tokens), tag, masks)
        self.tokens.extend(tokens)
        self.positions.extend(positions)
        self.length += len(tokens)
        if masks is not None:
            self.shareable = False
        self._commit_to((self.length - hold) // self.page_size)

    def settle(self, drop: int) -> None:
        """After a pass with held drafts: drop the last ``drop`` tokens (the rejected drafts),
        then commit every page the kept tokens filled."""
        self.truncate(drop)
        self._commit_to(self.length // self.page_size)

    def commit(self, k: int) -> None:
        """Promote ``k`` full working pages to committed."""
        self._check_resident()
        full = self.length // self.page_size - self.committed
        if not 0 <= k <= full:
            raise InvalidInput(f"can commit at most {full} full working pages, asked for {k}")
        self._commit_to(self.committed + k)

    def prefix_keys(self, tokens: np.ndarray, positions: np.ndarray, salt: bytes = b"") -> list[bytes]:
        """The prefix-cache keys of the full pages ``tokens`` would fill from the context's end
        (what :meth:`adopt_prefix` looks up, and what computing them would commit); [] where
        nothing could be shared: the context does not end on a page boundary, is not shareable,
        or ran under another salt."""
        ps = self.page_size
        whole = len(tokens) // ps
        if not whole or not self.shareable or self.length != self.committed * ps:
            return []
        if self.length and salt != self._salt:
            return []
        prev = self._hashes[-1] if self._hashes else salted_root(salt)
        return chain_keys(prev, tokens[: whole * ps], positions[: whole * ps], ps)

    def adopt_prefix(
        self, tokens: np.ndarray, positions: np.ndarray, limit: int, salt: bytes = b"", tag: Any = None,
        keys: list[bytes] | None = None,
    ) -> int:
        """Take cached pages for the leading full pages of ``tokens`` instead of computing them.

        Only pages that end at or before input row ``limit`` are taken (rows that are sampled
        or probed must run). Applies when the context ends on a page boundary. ``keys``: what
        :meth:`prefix_keys` gave for these tokens, when the caller has them.

        Returns:
            How many leading tokens are now in the cache (a multiple of the page size).
        """
        ps = self.page_size
        whole = min(len(tokens), limit) // ps
        keys = (self.prefix_keys(tokens, positions, salt) if keys is None else keys)[:whole]
        found = self.pool.cache.lookup_chain(keys) if keys else []
        if not found:
            return 0
        try:
            self._charge(len(found))
        except PieError:  # over quota: compute instead, which asks for (and is refused) pages itself
            return 0
        self._salt = salt
        self.pool.retain(found)
        self.pages[self.committed : self.committed] = found
        n = len(found) * ps
        self.lineage.extend(n, tag)
        self.tokens.extend(tokens[:n].tolist())
        self.positions.extend(positions[:n].tolist())
        self._hashes.extend(keys[: len(found)])
        self.length += n
        self.committed += len(found)
        return n

    def _take_salt(self, salt: bytes) -> None:
        if not self.length:
            self._salt = salt
        elif salt != self._salt:
            self.shareable = False

    def _chain_end(self) -> bytes:
        # The hash the next committed page chains on from.
        return self._hashes[-1] if self._hashes else salted_root(self._salt)

    def _commit_to(self, committed: int) -> None:
        if committed <= self.committed:
            return
        if self.shareable:
            self._share(self.committed, committed)
        self.committed = committed

    def _share(self, first: int, stop: int) -> None:
        # Hash pages first..stop-1 and swap any page for an equal one the cache holds already.
        ps = self.page_size
        span = slice(first * ps, stop * ps)
        keys = chain_keys(self._chain_end(), np.asarray(self.tokens[span]), np.asarray(self.positions[span]), ps)
        mine = self.pages[first:stop]
        kept = self.pool.cache.insert_chain(keys, mine)
        dupes = [p for p, k in zip(mine, kept) if p != k]
        if dupes:
            self.pool.retain([k for p, k in zip(mine, kept) if p != k])
            self.pool.release(dupes)
            self.pages[first:stop] = kept
        self._hashes.extend(keys)

    def truncate(self, n: int) -> None:
        """Drop the last ``n`` working tokens and free working pages left empty."""
        self._check_live()
        if not self.resident:
            return self._truncate_suspended(n)
        if not 0 <= n <= self.working_tokens:
            raise InvalidInput(
                f"truncate({n}) exceeds the {self.working_tokens} tokens in working pages; "
                "committed pages cannot be truncated"
            )
        self.length -= n
        del self.tokens[self.length :], self.positions[self.length :]
        self.lineage.truncate(self.length)
        self.release_spare()

    def _truncate_suspended(self, n: int) -> None:
        if not 0 <= n <= self.working_tokens:
            raise InvalidInput(f"truncate({n}) exceeds the {self.working_tokens} tokens in working pages")
        self.length -= n
        del self.tokens[self.length :], self.positions[self.length :]
        self.lineage.truncate(self.length)
        keep = max(self._pages_for(self.length), self.committed)
        if self.host_pages and self._host_pool is not None:
            self._host_pool.release(self.host_pages[keep:])
            del self.host_pages[keep:]
        self._refund(self._suspended_pages - keep)
        self._suspended_pages = keep

    def release_working(self, n: int) -> None:
        """Free the last ``n`` working pages that hold no tokens."""
        self._check_resident()
        empty = self.spare_pages
        if not 0 <= n <= empty:
            raise InvalidInput(f"only {empty} working pages are empty; cannot release {n}")
        if n:
            self.pool.release(self.pages[-n:])
            del self.pages[-n:]
            self._refund(n)

    def fork(self, account: PageAccount | None = None, resident: bool = True) -> tuple[KvContext, list[int], list[int]]:
        """A copy-on-write clone: committed pages are shared (refcount), working pages holding
        tokens get fresh pages.

        Args:
            account: Who the clone's pages are charged to (default: this context's account).
            resident: False: the clone starts suspended with no pages (rebuilt by replay), as
                does any clone of a suspended context.

        Returns:
            The clone, and the (source, destination) working pages whose contents the caller
            must copy on the device.

        Raises:
            OutOfPages: Not enough free pages for the working copy, or the account's quota is
                reached; nothing changes.
        """
        self._check_live()
        account = account if account is not None else self._account
        if not (self.resident and resident):
            return self._fork_suspended(account), [], []
        used = self._pages_for(self.length)
        src = self.pages[self.committed : used]
        shared = self.pages[: self.committed]
        dst = _alloc_charged(self.pool, account, len(src), len(shared) + len(src))
        self.pool.retain(shared)
        child = self._clone(account)
        child.pages = shared + dst
        return child, src, dst

    def _clone(self, account: PageAccount | None) -> KvContext:
        # A context with this one's contents and no pages (the caller gives it pages or suspends it).
        child = KvContext(self.pool, account)
        child.length, child.committed = self.length, self.committed
        child.tokens, child.positions = list(self.tokens), list(self.positions)
        child._hashes, child.shareable, child._salt = list(self._hashes), self.shareable, self._salt
        child.lineage = self.lineage.copy()
        return child

    def _fork_suspended(self, account: PageAccount | None) -> KvContext:
        # A clone of a suspended context is suspended too, with no pages: it is rebuilt by replay.
        if not self.lineage.replayable:
            raise PieError("this context is suspended and cannot be rebuilt by replay; run a pass on it first")
        need = self._pages_for(self.length)
        if account is not None:
            account.charge(need)
        child = self._clone(account)
        child.resident, child._suspended_pages = False, need
        return child

    # Suspension. The caller (the market) queues the page copies these return, in order, before
    # the next batch, and keeps replay for the scheduler.

    @property
    def offloaded(self) -> bool:
        return not self.resident and bool(self.host_pages)

    def offload(self, host: HostPool) -> tuple[list[int], list[int]] | None:
        """Suspend to host slots: returns (device pages, host slots) to copy device->host, or None
        (nothing changes) when the host pool is short. The device pages go back to the pool."""
        self._check_resident()
        self.release_spare()  # empty reserved pages are not kept over a suspension
        slots = host.alloc(len(self.pages))
        if slots is None:
            return None
        src = self.pages
        self.host_pages, self._host_pool = slots, host
        self._suspend()
        return src, slots

    def drop(self) -> None:
        """Suspend without a copy: the pages go back to the pool; :meth:`restore` needs a replay."""
        self._check_resident()
        if not self.lineage.replayable:
            raise PieError("this context's lineage cannot be replayed (a truncation cut a masked pass)")
        self.release_spare()
        self._suspend()

    def _suspend(self) -> None:
        self.pool.release(self.pages)
        self._suspended_pages, self.pages, self.resident = len(self.pages), [], False

    def restore(self) -> tuple[list[int], list[int], int | None]:
        """Take device pages again (raises OutOfPages, changing nothing, when short).

        Returns:
            (host slots, device pages) to copy host->device when the context was offloaded, and
            the first slot a replay must recompute (None when nothing is to replay; before it,
            pages found in the prefix cache were taken instead of recomputed).
        """
        self._check_live()
        if self.resident:
            raise PieError("restore of a resident context")
        found = self.pool.cache.lookup_chain(self._hashes)  # pages nobody needs to compute or copy
        self.pool.retain(found)  # before alloc, which may evict idle cached pages
        try:
            fresh = self.pool.alloc(self._suspended_pages - len(found))
        except BaseException:
            self.pool.release(found)
            raise
        self.pages = found + fresh
        self.resident, self._suspended_pages = True, 0
        if self.host_pages:
            slots, self.host_pages = self.host_pages, []
            self._host_pool.release(slots)  # the copy out of them is queued ahead of any reuse
            self._reshare()
            return slots[len(found) :], fresh, None
        start = len(found) * self.page_size
        return [], [], start if start < self.length else None

    def replayed(self) -> None:
        """The replay of a restored context landed: its committed pages are shareable again."""
        self._reshare()

    def _reshare(self) -> None:
        shared = len(self._hashes)
        self._hashes = []
        if shared:
            self._share(0, shared)

    def _check_resident(self) -> None:
        self._check_live()
        if not self.resident:
            raise PieError("this context is suspended (it is restored by its next forward pass)")

    def release(self) -> None:
        """Return every page to the pool (and host slots to the host pool). Idempotent."""
        if not self.released:
            self.pool.release(self.pages)
            self._refund(len(self.pages) + self._suspended_pages)
            if self._host_pool is not None and self.host_pages:
                self._host_pool.release(self.host_pages)
            self.pages, self.host_pages, self._suspended_pages = [], [], 0
            self.released = True

    def _charge(self, n: int) -> None:
        if self._account is not None:
            self._account.charge(n)

    def _refund(self, n: int) -> None:
        if self._account is not None:
            self._account.refund(n)

    def _check_live(self) -> None:
        if self.released:
            raise PieError("this context was released; create a new one")


def _alloc_charged(pool: PagePool, account: PageAccount | None, n: int, charge: int) -> list[int]:
    """``n`` pages from ``pool`` with ``charge`` pages charged to ``account`` first (refunded
    if the pool cannot give them)."""
    if account is not None:
        account.charge(charge)
    try:
        return pool.alloc(n)
    except BaseException:
        if account is not None:
            account.refund(charge)
        raise
