"""Host interface ``scheduling``: an inferlet's view of the KV-page market, and its bids.

See :mod:`pie_core.scheduler.market` for the mechanism. Every inferlet has a wallet per model
it uses, made on first use and retired when the inferlet ends.
"""

from __future__ import annotations


from inferlet.host._declare import host
from inferlet.host.types import Context

__all__ = ["balance", "dividend", "is_suspended", "latency", "price", "rent", "set_bid", "set_horizon", "set_idle",
           "suspend"]


@host
def balance(model: str) -> float:
    """Credits this inferlet holds in ``model``'s market."""


@host
def dividend(model: str) -> float:
    """Credits the last tick paid this inferlet as its share of the rent (by endowment)."""


@host
def is_suspended(ctx: Context) -> bool:
    """True while the context's pages are off the device."""


@host
def latency(ctx: Context) -> float:
    """Seconds per tick (batch) on the context's model, a moving average."""


@host
def price() -> float:
    """Credits one new KV page costs."""


@host
def rent(ctx: Context) -> float:
    """The clearing price of the most recent auction on the context's pool (0 without contention):
    what a holder pays per page per tick, at most its bid.
    """


@host
def set_bid(ctx: Context, value: float) -> None:
    """Bid ``value`` credits per page per tick for the context's next pass (then the default
    bid again). The bid counts up to what the inferlet's balance pays for one tick of the
    context's pages, so credits, not bids, bound a user's share of the pool.

    Raises:
        InvalidInput: ``value`` is not a finite number >= 0.
    """


@host
def set_horizon(ctx: Context, tokens: int | None) -> None:
    """The context expects ``tokens`` more tokens (None = unknown); the default bid spreads the
    inferlet's balance over them.

    Raises:
        InvalidInput: ``tokens`` is not an integer >= 0 or None.
    """


@host
def set_idle(ctx: Context, idle: bool) -> None:
    """Hold the context out of the auction (bid 0) until called again with False."""


@host
def suspend(ctx: Context) -> None:
    """Give the context's pages back now; its next pass restores it (a host copy or a replay).

    Raises:
        PieError: It is in a pass, or can be neither copied to the host nor rebuilt by replay.
    """
