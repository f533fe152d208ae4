"""Host interface ``context``: KV-cache contexts owned by an inferlet instance."""

from __future__ import annotations

import asyncio

from pie_core.errors import PieError
from pie_core.host.binding import HostInstance, current
from pie_core.host.model import resolve
from pie_core.kv.context import KvContext
from pie_core.runtime.engine import LoadedModel

__all__ = ["HostContext", "create", "release", "seq_len", "page_size", "truncate"]


class HostContext:
    """A context resource: a model, its KV pages, and a lock that keeps one pass in flight."""

    def __init__(self, model: LoadedModel, owner: HostInstance) -> None:
        self.model = model
        self.owner = owner
        self.kv = KvContext(model.pool)
        self.lock = asyncio.Lock()
        owner.resources.add(self)

    @property
    def released(self) -> bool:
        return self.kv.released

    def check_live(self) -> None:
        if self.kv.released:
            raise PieError("this context was released; create a new Context")

    def release(self) -> None:
        self.kv.release()
        self.owner.resources.discard(self)


def create(model: str) -> HostContext:
    """A fresh empty context on ``model`` owned by the calling instance."""
    return HostContext(resolve(model), current())


def release(ctx: HostContext) -> None:
    """Free the context's pages now. Idempotent."""
    ctx.release()


def seq_len(ctx: HostContext) -> int:
    """Tokens in the KV cache (committed + working)."""
    return ctx.kv.length


def page_size(ctx: HostContext) -> int:
    """Tokens per KV page."""
    return ctx.kv.page_size


def truncate(ctx: HostContext, n: int) -> None:
    """Drop the trailing ``n`` working tokens.

    Raises:
        InvalidInput: ``n`` exceeds the tokens in working pages.
        PieError: The context was released.
    """
    ctx.check_live()
    ctx.kv.truncate(n)
