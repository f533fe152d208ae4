"""Credits of the KV-page market: endowments, balances, rent and dividends, conserved.

Every inferlet joining a model's market gets an endowment of credits (bounded per user, so
one user's share of the pool is bounded however many inferlets it runs). Making a new KV
page costs :data:`PRICE` credits, which are burned. Rent moves credits from the contexts that
hold pages under contention to every live inferlet, in proportion to its endowment. So, at
every moment::

    sum(live balances) + retired = sum(endowments ever given) - burned

(:meth:`Ledger.conserved`; a property test checks it over random operations). Balances may go
negative; a negative balance bids nothing by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

__all__ = ["PRICE", "DEFAULT_ENDOWMENT", "Wallet", "Ledger"]

PRICE = 1.0
"""Credits burned per new KV page (``scheduling.price()``)."""

DEFAULT_ENDOWMENT = 1000.0
"""Credits an inferlet starts with, per model it uses."""


@dataclass(eq=False)
class Wallet:
    """One inferlet's credits in one market."""

    key: str
    user: str
    endowment: float
    balance: float
    dividend: float = 0.0  # what the last tick paid it
    live: bool = True


class Ledger:
    """The wallets of one market and the totals that prove conservation.

    ``budget_of(user)`` (None = unbounded) caps the endowments a user's live inferlets hold
    together: an inferlet joining when its user's budget is spent starts with what is left.
    """

    def __init__(self, endowment: float = DEFAULT_ENDOWMENT, budget_of: Callable[[str], float | None] | None = None) -> None:
        if not endowment >= 0 or math.isinf(endowment):
            raise ValueError(f"an endowment must be a finite number >= 0, got {endowment}")
        self.endowment = endowment
        self.budget_of = budget_of
        self.wallets: dict[str, Wallet] = {}
        self.endowed = 0.0  # every endowment ever given
        self.burned = 0.0
        self.retired = 0.0  # balances of wallets that left

    def join(self, key: str, user: str) -> Wallet:
        """The live wallet under ``key``, created with an endowment on first use."""
        wallet = self.wallets.get(key)
        if wallet is None:
            amount = self.endowment
            budget = None if self.budget_of is None else self.budget_of(user)
            if budget is not None:
                held = sum(w.endowment for w in self.wallets.values() if w.user == user)
                amount = max(0.0, min(amount, budget - held))
            wallet = self.wallets[key] = Wallet(key, user, amount, amount)
            self.endowed += amount
        return wallet

    def retire(self, key: str) -> None:
        """The inferlet ended: its balance leaves the market (its endowment returns to its user's budget)."""
        wallet = self.wallets.pop(key, None)
        if wallet is not None:
            wallet.live = False
            self.retired += wallet.balance

    def burn(self, wallet: Wallet, pages: int) -> None:
        """Charge the make cost of ``pages`` new pages."""
        if wallet.live and pages > 0:
            cost = PRICE * pages
            wallet.balance -= cost
            self.burned += cost

    def rent(self, payments: list[tuple[Wallet, float]]) -> None:
        """Collect ``(wallet, credits)`` rent and pay it out as dividends by endowment."""
        revenue = 0.0
        for wallet, amount in payments:
            if wallet.live and amount > 0:
                wallet.balance -= amount
                revenue += amount
        live = list(self.wallets.values())
        for wallet in live:
            wallet.dividend = 0.0
        if revenue <= 0 or not live:
            return
        total = sum(w.endowment for w in live)
        shares = [w.endowment / total for w in live] if total > 0 else [1.0 / len(live)] * len(live)
        for wallet, share in zip(live, shares):
            wallet.dividend = revenue * share
            wallet.balance += wallet.dividend

    def conserved(self) -> tuple[float, float]:
        """(what the wallets hold, what they should hold): equal up to float rounding."""
        held = math.fsum([w.balance for w in self.wallets.values()] + [self.retired])
        return held, self.endowed - self.burned
