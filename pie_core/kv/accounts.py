"""Who holds a pool's pages: one account per user, charged for every page its contexts hold.

A context charges its account for each page in its page list, whatever else holds that page:
a committed page shared by forks, snapshots or a cached prefix counts once for every context
holding it. That is what the user could keep alive on its own, so a quota bounds the pool
share one user can pin no matter how the pages are shared. Pages only the prefix cache holds
belong to nobody (they are evicted on demand).

The pools of one model's data-parallel replicas are linked (:meth:`PageAccounts.link`): a user's
pages are then bounded in each pool by ``limit_of`` and across all of them by ``total_limit_of``,
so a quota of N pages is N pages however many replicas serve the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pie_core.errors import OutOfPages

__all__ = ["PageAccount", "PageAccounts"]


class PageAccount:
    """The pages one user holds in one pool, checked against ``limit`` (None = no quota)."""

    __slots__ = ("user", "held", "_accounts")

    def __init__(self, accounts: PageAccounts, user: str) -> None:
        self.user = user
        self.held = 0
        self._accounts = accounts

    @property
    def limit(self) -> int | None:
        return self._accounts.limit(self.user)

    def charge(self, n: int) -> None:
        """Count ``n`` more pages as held.

        Raises:
            OutOfPages: The user would hold more than its quota; nothing is charged.
        """
        if n > 0:
            limit = self.limit
            if limit is not None and self.held + n > limit:
                raise OutOfPages(
                    f"user {self.user} holds {self.held} of its {limit} KV pages and needs {n} more "
                    "(quota server.quotas.pages); release contexts or snapshots"
                )
            self._accounts.check_total(self.user, n)
        self.held += n

    def refund(self, n: int) -> None:
        """Count ``n`` fewer pages as held."""
        if n > self.held:
            raise RuntimeError(f"refund of {n} pages to {self.user}, who holds {self.held}")
        self.held -= n


class PageAccounts:
    """The accounts of one pool. ``limit_of(user)`` gives a user's quota (None = unlimited);
    the server sets it, ``pie run`` leaves it unset."""

    def __init__(self) -> None:
        self.limit_of: Callable[[str], int | None] | None = None
        self.total_limit_of: Callable[[str], int | None] | None = None
        self._accounts: dict[str, PageAccount] = {}
        self._group: tuple[PageAccounts, ...] = (self,)

    @staticmethod
    def link(group: Sequence[PageAccounts]) -> None:
        """Make ``group`` (the pools of one model's replicas) count a user's pages together."""
        for accounts in group:
            accounts._group = tuple(group)

    def held_by(self, user: str) -> int:
        """Pages ``user`` holds in this pool and the pools linked to it."""
        return sum(a._accounts[user].held for a in self._group if user in a._accounts)

    def check_total(self, user: str, n: int) -> None:
        """Refuse ``n`` more pages that would take ``user`` past ``total_limit_of`` across
        the linked pools.

        Raises:
            OutOfPages: Past the total; says how many the user holds on how many replicas.
        """
        limit = None if self.total_limit_of is None else self.total_limit_of(user)
        if limit is None:
            return
        held = self.held_by(user)
        if held + n > limit:
            raise OutOfPages(
                f"user {user} holds {held} of its {limit} KV pages across the model's {len(self._group)} "
                f"replicas and needs {n} more (quota server.quotas.pages); release contexts or snapshots"
            )

    def of(self, user: str) -> PageAccount:
        """The account of ``user`` (created on first use)."""
        account = self._accounts.get(user)
        if account is None:
            account = self._accounts[user] = PageAccount(self, user)
        return account

    def limit(self, user: str) -> int | None:
        return None if self.limit_of is None else self.limit_of(user)

    def held(self) -> dict[str, int]:
        """Pages held per user, for every user who holds any."""
        return {user: a.held for user, a in self._accounts.items() if a.held}
