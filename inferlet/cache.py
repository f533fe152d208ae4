"""What the SDK knows of a context's KV cache without asking the engine: its handle, its page
size and its length.

The length changes only by what the SDK itself does (a pass appends its tokens less the drafts
it dropped, a truncation removes some), so the SDK keeps it and a decode step costs no host call
to read it. Where the SDK cannot know (a pass that failed part-way, a context opened from a
snapshot), the next read asks the engine once.

A decode loop the engine runs ahead may hand over several passes at once
(``inference.forward_next``); the ones the program has not taken yet wait in :attr:`KvCache.ahead`.
They are in the engine's KV already but not in :attr:`KvCache.length`, so before the handle is
used for anything else they are truncated: the engine then holds exactly what the program saw.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from inferlet.host import context as _host
from inferlet.host.errors import PieError

__all__ = ["KvCache"]


class KvCache:
    """One context's KV cache as the SDK sees it.

    Args:
        handle: The engine's context (a :class:`~inferlet.host.types.Context` handle).
        page_size: Tokens per page, if known (the engine is asked on first use otherwise).
        length: Tokens in the cache, if known.
    """

    __slots__ = ("_handle", "_page_size", "_length", "released", "epoch", "ahead")

    def __init__(self, handle: Any, page_size: int | None = None, length: int | None = None) -> None:
        self._handle = handle
        self._page_size = page_size
        self._length = length
        self.released = False
        self.epoch = 0  # bumped by every pass and every change of the pages or length
        self.ahead: deque[Any] = deque()  # passes of a decode loop taken from the engine, not yet handed out

    @property
    def handle(self) -> Any:
        """The engine's context, holding exactly :attr:`length` tokens: decode-loop passes taken
        but never handed out (:attr:`ahead`) are truncated first (the loop ends)."""
        if self.ahead:
            self._drop_ahead()
        return self._handle

    def handle_as_is(self) -> Any:
        """The handle, leaving :attr:`ahead` as it is: for the decode loop's own next call and
        for calls that neither read nor change the KV (the market's)."""
        return self._handle

    def _drop_ahead(self) -> None:
        n = len(self.ahead)
        self.ahead.clear()
        self.changed()
        if self.released:
            return
        try:
            _host.truncate(self._handle, n)
        except BaseException:
            self.forget()
            raise

    @property
    def page_size(self) -> int:
        """Tokens per KV page."""
        if self._page_size is None:
            self._page_size = _host.page_size(self._handle)
        return self._page_size

    @property
    def length(self) -> int:
        """Tokens in the KV cache (committed and working)."""
        self.check_live()
        if self._length is None:
            self._length = _host.seq_len(self.handle)
        return self._length

    def grew(self, n: int) -> None:
        """A pass appended ``n`` tokens."""
        if self._length is not None:
            self._length += n

    def shrank(self, n: int) -> None:
        """A truncation dropped ``n`` tokens."""
        if self._length is not None:
            self._length -= n

    def changed(self) -> None:
        """A pass ran, or the pages or the length changed: a decode loop the engine ran ahead on
        the context (``inferlet.host.inference.forward_next``) has ended."""
        self.epoch += 1

    def forget(self) -> None:
        """The length is unknown now (a pass failed part-way): ask the engine next time."""
        self._length = None

    def check_live(self) -> None:
        """Raise when the context was released.

        Raises:
            PieError: It was.
        """
        if self.released:
            raise PieError("this context was released; create a new Context")

    def clone(self, handle: Any) -> KvCache:
        """The view of a fork: same page size and length, another handle."""
        return KvCache(handle, self._page_size, self._length)
