"""A stateful walk through one compiled grammar, giving the next token's vocabulary mask.

Masks come out packed the way the backend takes them (``uint8[ceil(vocab / 8)]``, bit ``i % 8``
of byte ``i // 8`` set when token ``i`` is allowed, i.e. ``np.packbits(..., bitorder="little")``).
xgrammar fills an int32 bitmask whose little-endian bytes are exactly that layout, so packing is
a view and a slice: no per-token work. A mask is filled once per state and reused until the
next token is accepted.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable

import numpy as np
from pie_core.grammar.lazy_xgr import xgr

from pie_core import brle
from pie_core.errors import InvalidInput

__all__ = ["Matcher"]

_LITTLE = sys.byteorder == "little"


class Matcher:
    """Accepts tokens against a grammar and reports which tokens may come next.

    End-of-sequence: the grammar's stop tokens are allowed exactly when the text so far is a
    complete sentence of the grammar; accepting one terminates the matcher.
    """

    def __init__(
        self,
        compiled: xgr.CompiledGrammar,
        vocab_size: int,
        what: str = "grammar",
        spell: Callable[[list[int]], str] | None = None,
    ) -> None:
        """Start at the grammar's beginning.

        Args:
            compiled: The compiled grammar (see :mod:`pie_core.grammar.compiler`).
            vocab_size: The model's vocabulary size (mask width).
            what: Name of the grammar for error messages.
            spell: Token ids to text, for error messages.
        """
        self._compiled = compiled
        self._m = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.what = what
        self._spell = spell
        self._words = np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)
        self._nbytes = (vocab_size + 7) // 8
        self._mask: np.ndarray | None = None
        self.stop_ids = tuple(int(t) for t in self._m.stop_token_ids)

    # -- state ---------------------------------------------------------------------------------
    @property
    def is_terminated(self) -> bool:
        """True once a stop token was accepted: the grammar is finished."""
        return bool(self._m.is_terminated())

    @property
    def can_end(self) -> bool:
        """True when the tokens so far form a complete sentence (a stop token is allowed now)."""
        return bool(self._m.is_completed())

    def reset(self) -> None:
        """Back to the start of the grammar."""
        self._m.reset()
        self._mask = None

    def fork(self) -> Matcher:
        """An independent copy in the same state."""
        twin = Matcher.__new__(Matcher)
        twin._compiled, twin._m = self._compiled, self._m.fork()
        twin.vocab_size, twin.what, twin._spell = self.vocab_size, self.what, self._spell
        twin._words, twin._nbytes = np.zeros_like(self._words), self._nbytes
        twin._mask = None if self._mask is None else self._mask.copy()
        twin.stop_ids = self.stop_ids
        return twin

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""
        if n:
            self._m.rollback(n)
            self._mask = None

    # -- stepping ------------------------------------------------------------------------------
    def try_accept(self, token: int) -> bool:
        """Accept one token if the grammar allows it here; False (state unchanged) if not."""
        if self._m.is_terminated() or not 0 <= token < self.vocab_size:
            return False
        ok = bool(self._m.accept_token(int(token)))
        if ok:
            self._mask = None
        return ok

    def accept(self, tokens: Iterable[int]) -> None:
        """Accept tokens in order, all or none.

        Raises:
            InvalidInput: A token the grammar does not allow at its position (the message names
                it and what the grammar allows there); the matcher is left as it was.
        """
        done = 0
        ids = [int(t) for t in tokens]
        for i, tok in enumerate(ids):
            if self.try_accept(tok):
                done += 1
                continue
            message = self._violation(tok, i, ids)
            self.rollback(done)
            raise InvalidInput(message)

    def packed(self) -> np.ndarray:
        """The next token's mask, packed (``uint8[ceil(vocab/8)]``, little bit order), a copy.

        Raises:
            InvalidInput: The matcher is terminated (a stop token was accepted).
        """
        return self._packed().copy()

    def allows(self, token: int) -> bool:
        """Whether ``token`` is allowed next."""
        if not 0 <= token < self.vocab_size or self._m.is_terminated():
            return False
        mask = self._packed()
        return bool((mask[token >> 3] >> (token & 7)) & 1)

    def brle(self) -> list[int]:
        """The next token's mask as BRLE runs (first run False = disallowed)."""
        bits = np.unpackbits(self._packed(), bitorder="little", count=self.vocab_size)
        return brle.encode(bits.view(bool))

    def allowed_count(self) -> int:
        """How many tokens the mask allows."""
        return int(np.unpackbits(self._packed(), bitorder="little", count=self.vocab_size).sum())

    # -- internals -----------------------------------------------------------------------------
    def _packed(self) -> np.ndarray:
        if self._mask is None:
            if self._m.is_terminated():
                raise InvalidInput(
                    f"the {self.what} has ended (its stop token was accepted); reset() it to start over"
                )
            self._m.fill_next_token_bitmask(self._words)
            words = self._words if _LITTLE else self._words.byteswap()
            mask = words.reshape(-1).view(np.uint8)[: self._nbytes].copy()
            tail = self.vocab_size % 8
            if tail:
                mask[-1] &= (1 << tail) - 1
            self._mask = mask
        return self._mask

    def _violation(self, token: int, index: int, ids: list[int]) -> str:
        shown = f"{token}"
        if self._spell is not None and 0 <= token < self.vocab_size:
            shown += f" ({self._spell([token])!r})"
        if self._m.is_terminated():
            return f"token {shown} at index {index} comes after the {self.what} has ended"
        if not 0 <= token < self.vocab_size:
            return f"token {token} at index {index} is outside the vocabulary of {self.vocab_size}"
        allowed = np.flatnonzero(np.unpackbits(self._packed(), bitorder="little", count=self.vocab_size))
        sample = ""
        if self._spell is not None and allowed.size:
            sample = ", e.g. " + ", ".join(repr(self._spell([int(t)])) for t in allowed[:5])
        return (
            f"token {shown} at index {index} is not allowed by the {self.what} here "
            f"({allowed.size} tokens are{sample}); accept only tokens from next_token_logit_mask()"
        )
