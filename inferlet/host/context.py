"""Host interface ``context``: KV-cache contexts owned by an inferlet instance."""

from __future__ import annotations

from typing import Sequence

from inferlet.host._declare import host
from inferlet.host.types import ChatBuilder, Context

__all__ = ["check_live", "commit_working_pages", "committed_page_count", "create", "delete_snapshot", "fork",
           "is_released", "open_snapshot", "page_size", "release", "release_soon", "release_working_pages",
           "reserve_working_pages", "save", "seq_len", "snapshot", "take_snapshot", "truncate",
           "working_page_count", "working_page_token_count"]


@host
def check_live(ctx: Context) -> None:
    """Raise PieError if ``ctx`` was released; nothing while it is live."""


@host
def commit_working_pages(ctx: Context, k: int) -> None:
    """Promote ``k`` full working pages to committed."""


@host
def committed_page_count(ctx: Context) -> int:
    """Committed (full, immutable, shareable) pages."""


@host
def create(model: str) -> Context:
    """A fresh empty context on ``model`` owned by the calling instance."""


@host
def delete_snapshot(model: str, name: str) -> None:
    """Drop the snapshot ``name`` (no error if it is absent)."""


@host
def fork(ctx: Context) -> Context:
    """A copy-on-write clone owned by the caller: committed pages are shared, the partly
    filled working page is copied on the device before the next batch.

    Raises:
        OutOfPages: No free page for the working copy, or the user's page quota is reached.
    """


@host
def is_released(ctx: Context) -> bool:
    """Whether the context was released (its pages are back in the pool)."""


@host
def open_snapshot(model: str, name: str) -> tuple[Context, list[int], ChatBuilder | None] | None:
    """A new context cloned from the caller's snapshot ``name``, with the buffer and a copy of
    the builder saved with it; None if there is no such snapshot."""


@host
def page_size(ctx: Context) -> int:
    """Tokens per KV page."""


@host
def release(ctx: Context) -> None:
    """Free the context's pages now. Idempotent."""


@host(oneway=True)
def release_soon(ctx: Context) -> None:
    """Release from a finaliser, which may run on any thread: at once on the thread that owns
    the context, otherwise handed to its event loop (page state is not thread-safe).
    """


@host
def release_working_pages(ctx: Context, n: int) -> None:
    """Free ``n`` empty working pages from the end."""


@host
def reserve_working_pages(ctx: Context, n: int) -> None:
    """Pre-allocate ``n`` working pages (raises OutOfPages, taking none, if short)."""


@host
def save(ctx: Context, name: str, buffer: Sequence[int], chat: ChatBuilder | None) -> None:
    """Snapshot the context under ``name`` for the calling user, replacing an older one.

    The SDK's state goes beside the KV pages: its ``buffer`` of tokens not yet run and a copy
    of its conversation builder ``chat``; :func:`open_snapshot` hands them back. The snapshot's
    pages stay charged to the user after the inferlet ends.

    Raises:
        InvalidInput: ``name`` is empty, or the user keeps as many snapshots as its quota allows.
        OutOfPages: The pool is short, or the user's page quota is reached.
    """


@host
def seq_len(ctx: Context) -> int:
    """Tokens in the KV cache (committed + working)."""


@host
def snapshot(ctx: Context, buffer: Sequence[int], chat: ChatBuilder | None) -> str:
    """Snapshot under a generated name (as :func:`save`) and return the name."""


@host
def take_snapshot(model: str, name: str) -> tuple[Context, list[int], ChatBuilder | None] | None:
    """Remove the snapshot ``name`` and return it as a context (no copy), with its buffer and
    builder; None if there is no such snapshot."""


@host
def truncate(ctx: Context, n: int) -> None:
    """Drop the trailing ``n`` working tokens.

    Raises:
        InvalidInput: ``n`` exceeds the tokens in working pages.
        PieError: The context was released.
    """


@host
def working_page_count(ctx: Context) -> int:
    """Working pages, including reserved empty ones."""


@host
def working_page_token_count(ctx: Context) -> int:
    """Tokens held in working pages."""
