"""The KV-page market of one model: who holds device pages when not everyone fits.

Every context is a *holder* bidding credits per page per tick (see :func:`default_bid`;
``set_bid`` overrides it for one pass, ``idle`` bids 0; snapshots bid 0; so does a context that
asked for no pass in :data:`QUIET_TICKS` ticks: one waiting on a tool or its client is the first
to give its pages up). A pass asks
:meth:`Market.admit` for the pages it will write. When it needs none, or the pool has them
and nobody bidding more waits, they are granted at once. Otherwise the pass waits and an auction (:mod:`.auction`) runs over
every holder that could move: idle resident contexts, the waiting passes, and snapshots. The
losers that hold pages are *suspended*: their pages are copied to the host pool
(``copy_pages`` device->host), or, when the host pool is full, dropped and rebuilt later by
replaying their lineage. Winners are granted highest bid first as pages allow; a suspended
holder is restored as part of its grant. Auctions rerun at every tick (batch) while someone
waits, and the clearing price of the last one is the rent that holders pay per page per tick
(never above their bid). Holders in a pass are never moved.

A suspended context's inferlet notices nothing: its next pass waits in :meth:`admit` and the
context comes back (copy or replay) before the pass runs. Only a context that needs more
pages than the whole pool gets OutOfPages. Offloaded contexts are also restored, highest bid
first, whenever pages are free and nobody waits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pie_core.errors import OutOfPages, PieError
from pie_core.hookspec import CopyKind
from pie_core.kv.context import KvContext
from pie_core.kv.host_pool import HostPool
from pie_core.kv.pool import PagePool
from pie_core.scheduler.auction import clear
from pie_core.scheduler.credits import PRICE, Ledger, Wallet

__all__ = ["DEFAULT_REMAINING", "QUIET_TICKS", "Grant", "Holder", "Market", "default_bid"]

DEFAULT_REMAINING = 256
"""Tokens a context is expected to still produce when no generator said (horizon/max_tokens)."""

QUIET_TICKS = 4
"""Ticks without a pass after which a context bids 0, as an idle one does."""

LATENCY_WEIGHT = 0.2
"""Weight of the newest tick in the latency average."""


def default_bid(balance: float, pages: float, remaining: float, page_size: int, dividend: float, cv2: float = 1.0) -> float:
    """The bid per page per tick that spends the balance over the expected rest of the generation.

    With ``remaining`` tokens to go the context lives about ``remaining`` more ticks, in which it
    may spend ``balance / remaining`` plus its dividend income per tick. It holds ``pages`` now
    and grows one page per ``page_size`` tokens; over an output length with squared coefficient
    of variation ``cv2`` the pages held on average over the remaining ticks are
    ``pages + remaining * (1 + cv2) / (2 * page_size)``. The bid is the per-tick budget spread
    over those pages (the budget-exhausting bid of the Pie paper, SOSP '25). Never negative.
    """
    mu = max(float(remaining), 1.0)
    budget = balance / mu + dividend
    held = pages + mu * (1.0 + cv2) / (2.0 * page_size)
    return max(0.0, budget / held if held > 0 else budget)


@dataclass(frozen=True, slots=True)
class Grant:
    """What :meth:`Market.admit` granted a pass: ``pages`` working pages reserved, and, when the
    context was restored without its pages, the first slot its caller must replay
    (``replay_from``; None: nothing to replay)."""

    pages: int
    replay_from: int | None = None


class Holder:
    """A context (or snapshot) in the market and what it bids."""

    def __init__(self, kv: KvContext, wallet: Wallet | None) -> None:
        self.kv = kv
        self.wallet = wallet  # None: a snapshot (bids 0, pays nothing)
        self.override: float | None = None  # set_bid, for the next pass
        self.idle = False
        self.target: int | None = None  # the length a generator expects to reach
        self.busy = False  # in a pass: never moved
        self.preempt: Callable[[], None] | None = None  # drops passes run ahead: call before moving it
        self.wanted = -1  # new pages a waiting pass asks for (-1: not waiting)
        self.granted: asyncio.Future[Grant] | None = None
        self.parked = False  # suspended by its inferlet: restored by its next pass only
        self.rent = 0.0  # the price per page due at the last tick (it paid at most its bid)
        self.order = 0  # arrival order among waiters (earlier wins ties)
        self.quiet = 0  # ticks since it last asked for a pass

    @property
    def pages(self) -> int:
        """Pages it holds, or would take back when restored."""
        return self.kv.held_pages

    def bid(self) -> float:
        if self.wallet is None or self.idle or self.quiet >= QUIET_TICKS:
            return 0.0
        if self.override is not None:  # at most what the balance pays for one tick: credit bounds a share
            return min(self.override, max(self.wallet.balance, 0.0) / max(self.pages, 1))
        remaining = DEFAULT_REMAINING if self.target is None else self.target - self.kv.length
        return default_bid(self.wallet.balance, max(self.pages, 1), remaining, self.kv.page_size, self.wallet.dividend)


class Market:
    """Holders, waiters and auctions of one page pool.

    Args:
        pool: The device pool.
        host: The host pool that suspended pages are copied to.
        copy: Queues a page copy before the next batch (``BackendWorker.enqueue_copy``).
        ledger: The credits.
        replayable: Whether a context's lineage can be replayed now (its adapters unchanged).
    """

    def __init__(
        self,
        pool: PagePool,
        host: HostPool,
        copy: Callable[[CopyKind, list[int], list[int]], None],
        ledger: Ledger | None = None,
        replayable: Callable[[KvContext], bool] = lambda kv: kv.lineage.replayable,
    ) -> None:
        self.pool = pool
        self.host = host
        self.copy = copy
        self.ledger = ledger or Ledger()
        self.replayable = replayable
        self.holders: dict[int, Holder] = {}
        self.waiters: list[Holder] = []
        self.price = 0.0  # the clearing price of the last auction
        self._contended = False  # an auction ran since the last tick
        self.latency = 0.0
        self.ticks = 0
        self.suspensions = 0
        self.replays = 0
        self._arrivals = 0
        self._poked = False
        pool.on_release = self.poke

    # Holders.

    def join(self, kv: KvContext, wallet: Wallet | None) -> Holder:
        """Register ``kv`` (or re-register it, e.g. a snapshot taken back as a context)."""
        holder = self.holders.get(id(kv))
        if holder is None or holder.kv is not kv:
            holder = self.holders[id(kv)] = Holder(kv, wallet)
        holder.wallet = wallet
        return holder

    def holder(self, kv: KvContext) -> Holder:
        holder = self.holders.get(id(kv))
        if holder is None or holder.kv is not kv:
            raise PieError("this context is not in the market")
        return holder

    def leave(self, kv: KvContext) -> None:
        holder = self.holders.pop(id(kv), None)
        if holder is not None and holder in self.waiters:
            self.waiters.remove(holder)

    # Passes.

    async def admit(self, holder: Holder, new: int) -> Grant:
        """Wait until ``holder`` is resident with ``new`` more working pages reserved, and mark it
        busy (call :meth:`done` after the pass).

        Returns:
            The grant: whether the caller must replay the lineage first, and from which slot.

        Raises:
            OutOfPages: The context needs more pages than the pool has, or its user's quota.
        """
        holder.quiet = 0
        if holder.pages + new > self.pool.num_pages:
            raise OutOfPages(
                f"this context needs {holder.pages + new} KV pages but the pool has {self.pool.num_pages}; "
                "shorten it, or start the engine with more pages (--kv-pages)"
            )
        grant = self.admit_now(holder, new)
        if grant is not None:
            return grant
        holder.wanted = new
        holder.order, self._arrivals = self._arrivals, self._arrivals + 1
        holder.granted = asyncio.get_running_loop().create_future()
        self.waiters.append(holder)
        self.poke()  # one auction once this round of passes has queued, not one per arrival
        try:
            grant = await holder.granted
        except BaseException:
            if holder in self.waiters:
                self.waiters.remove(holder)
            elif holder.granted.done() and not holder.granted.cancelled() and holder.granted.exception() is None:
                self.done(holder)  # granted, but the pass will not run
            holder.wanted, holder.granted = -1, None
            raise
        holder.wanted, holder.granted = -1, None
        return grant

    def admit_now(self, holder: Holder, new: int) -> Grant | None:
        """:meth:`admit` when it needs no wait (the context is resident and the pages are free
        for it): the grant, and the holder is busy; None, and nothing changed, otherwise."""
        if holder.kv.resident and (new == 0 or self._fits_now(holder, new)):
            return self._grant(holder, new)
        return None

    def reserve_now(self, holder: Holder, new: int) -> bool:
        """Reserve ``new`` pages for a pass run ahead (paid like any page) if the context is
        resident and they are free now; the holder is not pinned (it sets ``preempt``). False,
        and nothing changed, otherwise."""
        holder.quiet = 0
        if not holder.kv.resident or (new and not self._fits_now(holder, new)):
            return False
        if new:
            holder.kv.reserve(new)
            if holder.wallet is not None:
                self.ledger.burn(holder.wallet, new)
        return True

    def _fits_now(self, holder: Holder, new: int) -> bool:
        # Free pages go to a newcomer unless someone bidding more is already waiting for them.
        if not self.pool.can_take(new):
            return False
        return not self.waiters or holder.bid() >= max(h.bid() for h in self.waiters)

    def done(self, holder: Holder) -> None:
        """The holder's pass ended: it may be moved again, and its set_bid override is spent."""
        holder.busy = False
        holder.override = None
        if self.waiters:
            self.poke()

    def _grant(self, holder: Holder, new: int) -> Grant:
        kv = holder.kv
        holder.parked = False
        replay_from = None
        if not kv.resident:
            slots, pages, replay_from = kv.restore()
            if slots:
                self.copy(CopyKind.HOST_TO_DEVICE, slots, pages)
            elif replay_from is not None:
                self.replays += 1
        if new:
            kv.reserve(new)
            if holder.wallet is not None:
                self.ledger.burn(holder.wallet, new)
        holder.busy = True
        return Grant(new, replay_from)

    def _try_grant(self, holder: Holder) -> bool:
        if not self.pool.can_take(holder.wanted + holder.kv.restore_pages):
            return False
        self.waiters.remove(holder)
        assert holder.granted is not None  # a waiter has one (admit gave it)
        try:
            grant = self._grant(holder, holder.wanted)
        except PieError as exc:  # e.g. the user's page quota
            holder.granted.set_exception(exc)
            return True
        holder.granted.set_result(grant)
        return True

    # Suspension.

    def park(self, holder: Holder) -> None:
        """Suspend at the inferlet's request (``ctx.suspend()``): restored by its next pass.

        Raises:
            PieError: It is in a pass, or can be neither copied to the host nor replayed.
        """
        if holder.kv.resident and not self.suspend(holder):
            why = "it is in a pass" if holder.busy else "the host pool is full and its lineage cannot be replayed"
            raise PieError(f"cannot suspend this context: {why}")
        holder.parked = True

    def suspend(self, holder: Holder) -> bool:
        """Move a resident holder's pages off the device (host copy first, else drop for replay).

        Returns:
            False when it can do neither (nothing changes).
        """
        kv = holder.kv
        if kv.released or not kv.resident or holder.busy:
            return False
        if holder.preempt is not None:  # passes run ahead go first: their slots are not recorded
            holder.preempt()
        moved = kv.offload(self.host)
        if moved is not None:
            self.copy(CopyKind.DEVICE_TO_HOST, *moved)
        elif self.replayable(kv):
            kv.drop()
        else:
            return False
        self.suspensions += 1
        return True

    def _movable(self, holder: Holder) -> bool:
        kv = holder.kv
        if holder.busy or not kv.resident or not kv.held_pages:
            return False
        return self.host.free_count >= kv.held_pages or self.replayable(kv)

    def take_now(self, n: int, bid: float) -> bool:
        """Make ``n`` pages available without waiting (for forks and snapshots, which cannot
        wait): suspend idle holders bidding below ``bid``, lowest first. False if not enough."""
        if self.pool.can_take(n):
            return True
        for holder in sorted(self._live(), key=lambda h: h.bid()):
            if holder.bid() >= bid:
                break
            if self._movable(holder):
                self.suspend(holder)
                if self.pool.can_take(n):
                    return True
        return self.pool.can_take(n)

    # Auctions.

    def poke(self) -> None:
        """Pages were freed: settle soon (once), on the event loop."""
        if self._poked or not (self.waiters or not self.host.is_whole()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._poked = True
        loop.call_soon(self._poked_settle)

    def _poked_settle(self) -> None:
        self._poked = False
        self.settle()

    def settle(self) -> None:
        """Grant what fits; if someone still waits, auction the pool; restore when all is quiet."""
        self.waiters = [h for h in self.waiters if not h.kv.released and h.granted is not None and not h.granted.done()]
        for holder in sorted(self.waiters, key=lambda h: (-h.bid(), h.order)):
            self._try_grant(holder)
        if not self.waiters:
            self._restore_quietly()
            return
        self._auction()

    def _auction(self) -> None:
        self._contended = True
        live = self._live()
        bidders = [h for h in live if h in self.waiters or self._movable(h)]
        fixed = {p for h in live if h not in bidders for p in h.kv.pages}
        capacity = self.pool.num_pages - len(fixed)
        weights = np.array([h.pages + max(h.wanted, 0) for h in bidders], dtype=np.int64)
        bids = np.array([h.bid() for h in bidders])
        incumbent = np.array([2.0 if h.kv.resident and h.wanted < 0 else 1.0 / (1 + h.order) for h in bidders])
        keep = weights > 0
        winners = np.zeros(len(bidders), dtype=bool)
        if keep.any():
            won, self.price = clear(bids[keep], weights[keep], capacity, incumbent[keep])
            winners[keep] = won
        granted = sorted((h for h, w in zip(bidders, winners) if w and h in self.waiters), key=lambda h: (-h.bid(), h.order))
        short = sum(h.wanted + h.kv.restore_pages for h in granted) - self.pool.available_count
        # Losers give up their pages, lowest bid first, only as far as the winners need them.
        for holder in sorted((h for h, w in zip(bidders, winners) if not w), key=lambda h: (h.bid(), -h.order)):
            if short <= 0:
                break
            if holder.kv.resident and holder.kv.held_pages:
                before = self.pool.available_count
                if self.suspend(holder):
                    short -= self.pool.available_count - before
        for holder in granted:
            self._try_grant(holder)

    def _restorable(self) -> list[Holder]:
        return [h for h in self._live() if h.kv.offloaded and h.wallet is not None and not h.parked]

    def _restore_quietly(self) -> None:
        for holder in sorted(self._restorable(), key=lambda h: -h.bid()):
            if not self.pool.can_take(holder.kv.restore_pages):
                break
            slots, pages, _ = holder.kv.restore()
            self.copy(CopyKind.HOST_TO_DEVICE, slots, pages)

    def _live(self) -> list[Holder]:
        dead = [key for key, h in self.holders.items() if h.kv.released]
        for key in dead:
            del self.holders[key]
        return list(self.holders.values())

    # Ticks.

    def tick(self, seconds: float) -> None:
        """A batch ran: rerun the auction if someone waits, then collect rent and pay dividends."""
        self.ticks += 1
        self.latency = seconds if self.ticks == 1 else (1 - LATENCY_WEIGHT) * self.latency + LATENCY_WEIGHT * seconds
        if self.waiters:
            self.settle()
        price = self.price if self._contended else 0.0  # rent is due only under contention
        self._contended = False
        payments = []
        for holder in self._live():
            holder.quiet = 0 if holder.busy or holder.wanted >= 0 else holder.quiet + 1
            holder.rent = price
            if price > 0 and holder.wallet is not None and holder.kv.resident and holder.kv.held_pages:
                payments.append((holder.wallet, min(holder.bid(), price) * holder.kv.held_pages))
        self.ledger.rent(payments)

    def is_whole(self) -> bool:
        """No waiter and every host slot free (with ``pool.is_whole()``: nothing is held)."""
        return not self.waiters and self.host.is_whole()

