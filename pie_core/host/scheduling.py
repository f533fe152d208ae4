"""Host interface ``scheduling``: an inferlet's view of the KV-page market, and its bids.

See :mod:`pie_core.scheduler.market` for the mechanism. Every inferlet has a wallet per model
it uses, made on first use and retired when the inferlet ends.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pie_core.errors import InvalidInput
from pie_core.host.binding import HostInstance, current
from pie_core.host.model import resolve
from pie_core.scheduler.credits import PRICE, Wallet

if TYPE_CHECKING:
    from pie_core.host.context import HostContext
    from pie_core.engine.engine import LoadedModel

__all__ = [
    "balance",
    "rent",
    "dividend",
    "latency",
    "price",
    "set_bid",
    "set_idle",
    "set_horizon",
    "suspend",
    "is_suspended",
    "wallet",
]


class _Membership:
    """Retires an instance's wallet in one market when the instance releases what it holds."""

    def __init__(self, model: LoadedModel, key: str) -> None:
        self.model, self.key = model, key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Membership) and other.model is self.model and other.key == self.key

    def __hash__(self) -> int:
        return hash((id(self.model), self.key))

    def release(self) -> None:
        self.model.market.ledger.retire(self.key)


def wallet(model: LoadedModel, owner: HostInstance) -> Wallet:
    """``owner``'s wallet in ``model``'s market (joined, with its endowment, on first use)."""
    found = model.market.ledger.join(owner.id, owner.username)
    owner.resources.add(_Membership(model, owner.id))
    return found


def balance(model: str) -> float:
    """Credits this inferlet holds in ``model``'s market."""
    return wallet(resolve(model), current()).balance


def dividend(model: str) -> float:
    """Credits the last tick paid this inferlet as its share of the rent (by endowment)."""
    return wallet(resolve(model), current()).dividend


def rent(ctx: HostContext) -> float:
    """The clearing price of the most recent auction on the context's pool (0 without contention):
    what a holder pays per page per tick, at most its bid."""
    return ctx.model.market.price


def latency(ctx: HostContext) -> float:
    """Seconds per tick (batch) on the context's model, a moving average."""
    return ctx.model.market.latency


def price() -> float:
    """Credits one new KV page costs."""
    return PRICE


def set_bid(ctx: HostContext, value: float) -> None:
    """Bid ``value`` credits per page per tick for the context's next pass (then the default
    bid again). The bid counts up to what the inferlet's balance pays for one tick of the
    context's pages, so credits, not bids, bound a user's share of the pool.

    Raises:
        InvalidInput: ``value`` is not a finite number >= 0.
    """
    ctx.check_live()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidInput(f"a bid must be a finite number >= 0, got {value!r}")
    ctx.holder.override = float(value)
    ctx.model.market.poke()


def set_idle(ctx: HostContext, idle: bool) -> None:
    """Hold the context out of the auction (bid 0) until called again with False."""
    ctx.check_live()
    ctx.holder.idle = bool(idle)
    ctx.model.market.poke()


def set_horizon(ctx: HostContext, tokens: int | None) -> None:
    """The context expects ``tokens`` more tokens (None = unknown); the default bid spreads the
    inferlet's balance over them.

    Raises:
        InvalidInput: ``tokens`` is not an integer >= 0 or None.
    """
    ctx.check_live()
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise InvalidInput(f"a horizon must be an integer >= 0 or None, got {tokens!r}")
    ctx.holder.target = None if tokens is None else ctx.kv.length + tokens


def suspend(ctx: HostContext) -> None:
    """Give the context's pages back now; its next pass restores it (a host copy or a replay).

    Raises:
        PieError: It is in a pass, or can be neither copied to the host nor rebuilt by replay.
    """
    ctx.check_live()
    ctx.drop_chain()
    ctx.model.market.park(ctx.holder)


def is_suspended(ctx: HostContext) -> bool:
    """True while the context's pages are off the device."""
    ctx.check_live()
    return not ctx.kv.resident
