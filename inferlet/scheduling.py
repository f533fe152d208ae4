"""Reading the KV-page market: credits, rent, dividends, latency and the page price.

When the device's KV pages do not fit every context, the engine auctions them: each context
bids credits per page per tick, and the losers are suspended (their pages copied to host memory
or dropped to be rebuilt later) until pages free up. Every inferlet gets an endowment of credits
per model it uses; making a new page costs :func:`price` credits, contexts holding pages under
contention pay rent, and that rent comes back to every inferlet as a dividend in proportion to
its endowment.

The SDK bids for you. Before each step a generator tells the market how many tokens its context
still expects: the ``horizon`` (``ctx.generate(..., horizon=n)`` or ``g.horizon(n)``: the output
length you expect) minus the tokens accepted so far; without a horizon, or once past it,
``max_tokens`` minus them; with neither, the market assumes 256. The context's default bid
spreads the inferlet's balance over that many ticks (plus its dividend income per tick) and
divides it by the pages the context will hold on average meanwhile, so with credits left a
short expected output bids more per page than a long one. When the generator ends it withdraws
its expectation. The horizon is only a hint for this pacing: it does not stop generation
(``max_tokens`` and stop tokens do), and bids only matter while pages are contended.

Override the bid for one pass with ``ctx.set_bid(value)``, keep a context out of the auction with
``with ctx.idle():``, or give its pages back now with ``ctx.suspend()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferlet.host import scheduling as _host

if TYPE_CHECKING:
    from inferlet.context import Context
    from inferlet.model import Model

__all__ = ["balance", "rent", "dividend", "latency", "price"]


def balance(model: Model) -> float:
    """Credits this inferlet has left in ``model``'s market.

    It starts at the endowment, drops by :func:`price` for every new KV page and by the rent
    your contexts pay, and rises by dividends. It may go negative; a context whose inferlet has
    nothing left bids 0 by default, so it is the first to be suspended.
    """
    return _host.balance(model.name)


def rent(ctx: Context) -> float:
    """What a page cost per tick at the last auction on ``ctx``'s model (0 while every context
    fits). Rising rent means contention; no holder ever pays more than its own bid."""
    return _host.rent(ctx._kv.handle_as_is())


def dividend(model: Model) -> float:
    """Credits the last tick paid this inferlet: its share of the rent collected in ``model``'s
    market, in proportion to its endowment."""
    return _host.dividend(model.name)


def latency(ctx: Context) -> float:
    """Seconds per tick (one batch) on ``ctx``'s model, a moving average; 0 before the first."""
    return _host.latency(ctx._kv.handle_as_is())


def price() -> float:
    """Credits one new KV page costs (burned when the page is made)."""
    return _host.price()
