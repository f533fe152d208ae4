"""Host interface ``context``: KV-cache contexts owned by an inferlet instance."""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid
from typing import Sequence

from pie_core.engine.engine import LoadedModel
from pie_core.errors import InvalidInput, PieError
from pie_core.hookspec import CopyKind
from pie_core.host.ahead import Chain
from pie_core.host.binding import HostInstance, any_thread, current
from pie_core.host.model import resolve
from pie_core.host.scheduling import wallet
from pie_core.kv.context import KvContext
from pie_core.kv.snapshots import Snapshot
from pie_core.models.chat_formats.base import ChatBuilder
from pie_core.scheduler.market import DEFAULT_REMAINING, default_bid
from pie_core.speculation.ngram import NgramDrafter

__all__ = [
    "HostContext",
    "create",
    "release",
    "release_soon",
    "check_live",
    "is_released",
    "seq_len",
    "page_size",
    "truncate",
    "fork",
    "save",
    "snapshot",
    "open_snapshot",
    "take_snapshot",
    "delete_snapshot",
    "reserve_working_pages",
    "commit_working_pages",
    "release_working_pages",
    "committed_page_count",
    "working_page_count",
    "working_page_token_count",
]


class HostContext:
    """A context resource: a model, its KV pages, and a lock that keeps one pass in flight.

    Its pages are charged to the owner's user (``model.pool.accounts``), and so are the pages
    of snapshots saved from it, which stay charged after the inferlet ends. It bids for its
    pages in the model's market with the owner's wallet (``holder``).
    """

    def __init__(self, model: LoadedModel, owner: HostInstance, kv: KvContext | None = None) -> None:
        self.model = model
        self.owner = owner
        self.kv = kv if kv is not None else KvContext(model.pool, model.pool.accounts.of(owner.username))
        self.holder = model.market.join(self.kv, wallet(model, owner))
        self.lock = asyncio.Lock()
        self.drafter: NgramDrafter | None = None  # the system drafter, made on first use
        self.chain: Chain | None = None  # a decode loop run ahead (pie_core.host.ahead)
        self.thread = threading.get_ident()
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        owner.resources.add(self)

    @property
    def released(self) -> bool:
        return self.kv.released

    def check_live(self) -> None:
        if self.kv.released:
            raise PieError("this context was released; create a new Context")

    def drop_chain(self) -> None:
        """End the decode loop run ahead, if any (its passes run ahead are dropped): call before
        anything that changes the pages or the length of the context."""
        chain, self.chain = self.chain, None
        if chain is not None:
            chain.end()

    def release(self) -> None:
        self.drop_chain()
        self.kv.release()
        self.model.market.leave(self.kv)
        self.owner.resources.discard(self)


def create(model: str) -> HostContext:
    """A fresh empty context on ``model`` owned by the calling instance."""
    return HostContext(resolve(model), current())


def release(ctx: HostContext) -> None:
    """Free the context's pages now. Idempotent."""
    ctx.release()


@any_thread
def release_soon(ctx: HostContext) -> None:
    """Release from a finaliser, which may run on any thread: at once on the thread that owns
    the context, otherwise handed to its event loop (page state is not thread-safe)."""
    if threading.get_ident() == ctx.thread:
        ctx.release()
    elif ctx.loop is not None and not ctx.loop.is_closed():
        ctx.loop.call_soon_threadsafe(ctx.release)


def check_live(ctx: HostContext) -> None:
    """Raise PieError if ``ctx`` was released; nothing while it is live."""
    ctx.check_live()


def is_released(ctx: HostContext) -> bool:
    """Whether the context was released (its pages are back in the pool)."""
    return ctx.released


def seq_len(ctx: HostContext) -> int:
    """Tokens in the KV cache (committed + working)."""
    ctx.check_live()
    return ctx.kv.length


def page_size(ctx: HostContext) -> int:
    """Tokens per KV page."""
    ctx.check_live()
    return ctx.kv.page_size


def truncate(ctx: HostContext, n: int) -> None:
    """Drop the trailing ``n`` working tokens.

    Raises:
        InvalidInput: ``n`` exceeds the tokens in working pages.
        PieError: The context was released.
    """
    ctx.check_live()
    ctx.drop_chain()
    ctx.kv.truncate(n)


def _fork_kv(model: LoadedModel, source: KvContext, bid: float) -> KvContext:
    """A clone of ``source`` charged to the caller. Under contention the pages for its working
    copy are bought from holders bidding below ``bid``; failing that the clone starts suspended
    (rebuilt by replay on its first pass), and only a clone that can do neither is refused."""
    resident = model.market.take_now(source.fork_pages, bid) or not model.market.replayable(source)
    kv, src, dst = source.fork(model.pool.accounts.of(current().username), resident=resident)
    model.worker.enqueue_copy(CopyKind.DEVICE_TO_DEVICE, src, dst)
    model.market.ledger.burn(wallet(model, current()), len(dst))
    return kv


def fork(ctx: HostContext) -> HostContext:
    """A copy-on-write clone owned by the caller: committed pages are shared, the partly
    filled working page is copied on the device before the next batch.

    Raises:
        OutOfPages: No free page for the working copy, or the user's page quota is reached.
    """
    ctx.check_live()
    return HostContext(ctx.model, current(), _fork_kv(ctx.model, ctx.kv, ctx.holder.bid()))


def save(ctx: HostContext, name: str, buffer: Sequence[int], chat: ChatBuilder | None) -> None:
    """Snapshot the context under ``name`` for the calling user (replacing an older one), with
    the SDK's buffer and a copy of its builder beside the pages."""
    ctx.check_live()
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"a snapshot name must be a non-empty string, got {name!r}")
    state = _sdk_state(buffer, chat)
    store = current().engine.snapshots
    store.check_room(ctx.model.name, current().username, name)
    kv = _fork_kv(ctx.model, ctx.kv, ctx.holder.bid())
    ctx.model.market.join(kv, None)  # snapshots bid 0: the first to move under pressure
    store.put(ctx.model.name, current().username, name, Snapshot(kv, *state))


def snapshot(ctx: HostContext, buffer: Sequence[int], chat: ChatBuilder | None) -> str:
    """Snapshot under a generated name and return the name."""
    name = f"snap-{uuid.uuid4().hex[:12]}"
    save(ctx, name, buffer, chat)
    return name


def _sdk_state(buffer: Sequence[int], chat: ChatBuilder | None) -> tuple[list[int], ChatBuilder | None]:
    if chat is not None and not isinstance(chat, ChatBuilder):
        raise InvalidInput(f"chat must be a chat builder or None, got {type(chat).__name__}")
    if isinstance(buffer, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in buffer):
        raise InvalidInput("buffer must be a list of token ids")
    return [int(t) for t in buffer], None if chat is None else copy.copy(chat)


def open_snapshot(model: str, name: str) -> tuple[HostContext, list[int], ChatBuilder | None] | None:
    """A new context cloned from the caller's snapshot ``name`` with a copy of its SDK state, or
    None if it is absent."""
    loaded = resolve(model)
    snap = current().engine.snapshots.get(loaded.name, current().username, name)
    if snap is None:
        return None
    loaded = current().engine.replica_of(loaded.name, snap.kv.pool)  # a snapshot stays on its replica
    own = wallet(loaded, current())
    bid = default_bid(own.balance, max(1, len(snap.kv.pages)), DEFAULT_REMAINING, loaded.pool.page_size, own.dividend)
    kv = _fork_kv(loaded, snap.kv, bid)
    return HostContext(loaded, current(), kv), list(snap.buffer), None if snap.chat is None else copy.copy(snap.chat)


def take_snapshot(model: str, name: str) -> tuple[HostContext, list[int], ChatBuilder | None] | None:
    """Remove the snapshot ``name`` and return it as a context (no copy) with its SDK state, or
    None."""
    loaded = resolve(model)
    snap = current().engine.snapshots.pop(loaded.name, current().username, name)
    if snap is None:
        return None
    loaded = current().engine.replica_of(loaded.name, snap.kv.pool)
    return HostContext(loaded, current(), snap.kv), snap.buffer, snap.chat


def delete_snapshot(model: str, name: str) -> None:
    """Drop the snapshot ``name`` (no error if it is absent)."""
    loaded = resolve(model)
    snap = current().engine.snapshots.pop(loaded.name, current().username, name)
    if snap is not None:
        loaded = current().engine.replica_of(loaded.name, snap.kv.pool)
        snap.kv.release()
        loaded.market.leave(snap.kv)


def reserve_working_pages(ctx: HostContext, n: int) -> None:
    """Pre-allocate ``n`` working pages (raises OutOfPages, taking none, if short)."""
    ctx.check_live()
    ctx.drop_chain()
    ctx.kv.reserve(n)


def commit_working_pages(ctx: HostContext, k: int) -> None:
    """Promote ``k`` full working pages to committed."""
    ctx.check_live()
    ctx.drop_chain()
    ctx.kv.commit(k)


def release_working_pages(ctx: HostContext, n: int) -> None:
    """Free ``n`` empty working pages from the end."""
    ctx.check_live()
    ctx.drop_chain()
    ctx.kv.release_working(n)


def committed_page_count(ctx: HostContext) -> int:
    """Committed (full, immutable, shareable) pages."""
    ctx.check_live()
    return ctx.kv.committed


def working_page_count(ctx: HostContext) -> int:
    """Working pages, including reserved empty ones."""
    ctx.check_live()
    return ctx.kv.working_pages


def working_page_token_count(ctx: HostContext) -> int:
    """Tokens held in working pages."""
    ctx.check_live()
    return ctx.kv.working_tokens
