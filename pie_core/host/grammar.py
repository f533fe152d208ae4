"""Host interface ``grammar``: grammar sources, matchers on a model's vocabulary, packed masks.

A matcher's grammar starts compiling (in a worker thread) as soon as the matcher is created;
``await handle.ready()`` waits for it without blocking the event loop, under the handle's time
limit. The synchronous calls wait in the calling thread if the grammar is not compiled yet.

Masks cross this interface in two forms: BRLE runs (``list[int]``, first run disallowed), the
SDK's public form, and packed bitmasks (``uint8[ceil(vocab/8)]``, little bit order), the form
the backend applies; the generator uses packed masks so a step costs no per-token work.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pie_core import brle
from pie_core.errors import InvalidInput, Unsupported
from pie_core.grammar import compiler as _compiler
from pie_core.grammar.matcher import Matcher
from pie_core.grammar import source as _source
from pie_core.grammar.source import GrammarSource, any_json
from pie_core.host.binding import off_loop
from pie_core.host.model import resolve

__all__ = [
    "GrammarSource",
    "MatcherHandle",
    "DEFAULT_TIMEOUT_S",
    "json_schema",
    "any_json",
    "regex",
    "ebnf",
    "structural_tag",
    "matcher",
    "check_masks",
    "packed_mask",
    "mask_runs",
    "stop_ids",
]

DEFAULT_TIMEOUT_S = _compiler.DEFAULT_TIMEOUT_S

# Building a source parses it with xgrammar: seconds for a schema with a large maxItems, so a
# worker's call runs in a thread (binding.off_loop); size and nesting are bounded in any case.
json_schema = off_loop(_source.json_schema)
regex = off_loop(_source.regex)
ebnf = off_loop(_source.ebnf)
structural_tag = off_loop(_source.structural_tag)


def stop_ids(name: str) -> list[int]:
    """Tokens a grammar may end on for model ``name``: its chat stop tokens and EOS ids."""
    model = resolve(name)
    return sorted(set(model.chat.stop_tokens) | set(model.tokenizer.eos_ids))


class MatcherHandle:
    """A grammar matcher on one model; its grammar may still be compiling."""

    def __init__(self, name: str, source: GrammarSource, timeout: float | None = None) -> None:
        """Start compiling ``source`` for model ``name``.

        Args:
            name: Model name.
            source: The grammar.
            timeout: Seconds any wait for the compilation may take (default
                :data:`DEFAULT_TIMEOUT_S`).

        Raises:
            NotFound: No such model.
            InvalidInput: ``timeout`` is not positive.
        """
        model = resolve(name)
        self.model_name = name
        self.source = source
        self.timeout = _compiler.check_timeout(timeout)
        self.vocab_size = int(model.spec.vocab_size)
        self._spell = model.tokenizer.decode
        self._compiler = _compiler.compiler_for(model.tokenizer, self.vocab_size, stop_ids(name))
        self._compiler.submit(source)
        self._m: Matcher | None = None

    async def ready(self) -> None:
        """Wait (without blocking the event loop) until the grammar is compiled.

        Raises:
            InvalidInput: The grammar does not compile, or not within the time limit.
        """
        if self._m is None:
            compiled = await self._compiler.compile(self.source, self.timeout)
            if self._m is None:
                self._m = Matcher(compiled, self.vocab_size, self.source.describe(), self._spell)

    @property
    def is_ready(self) -> bool:
        """Whether the grammar is compiled (the calls below will not wait)."""
        return self._m is not None or self._compiler.cached(self.source)

    @property
    def matcher(self) -> Matcher:
        """The matcher, compiling in this thread first if needed (same errors as :meth:`ready`)."""
        if self._m is None:
            compiled = self._compiler.compile_blocking(self.source, self.timeout)
            self._m = Matcher(compiled, self.vocab_size, self.source.describe(), self._spell)
        return self._m

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens the grammar ends on."""
        return self._compiler.stop_ids

    def accept(self, tokens: Sequence[int]) -> None:
        """Advance over ``tokens``, all or none (InvalidInput names a token the grammar forbids)."""
        self.matcher.accept(tokens)

    def try_accept(self, token: int) -> bool:
        """Advance over one token if allowed; False (unchanged) if not."""
        return self.matcher.try_accept(token)

    def allows(self, token: int) -> bool:
        """Whether ``token`` is allowed next."""
        return self.matcher.allows(token)

    def packed(self) -> np.ndarray:
        """The next token's mask, packed (a fresh array)."""
        return self.matcher.packed()

    def runs(self) -> list[int]:
        """The next token's mask as BRLE runs."""
        return self.matcher.brle()

    @property
    def is_terminated(self) -> bool:
        """True once a stop token was accepted."""
        return self._m is not None and self._m.is_terminated

    @property
    def can_end(self) -> bool:
        """True when a stop token is allowed now."""
        return self.matcher.can_end

    def reset(self) -> None:
        """Back to the grammar's start."""
        if self._m is not None:
            self._m.reset()

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""
        self.matcher.rollback(n)

    def fork(self) -> MatcherHandle:
        """An independent handle in the same state."""
        twin = MatcherHandle.__new__(MatcherHandle)
        twin.model_name, twin.source, twin.timeout = self.model_name, self.source, self.timeout
        twin.vocab_size, twin._spell, twin._compiler = self.vocab_size, self._spell, self._compiler
        twin._m = None if self._m is None else self._m.fork()
        return twin


def matcher(name: str, source: GrammarSource, timeout: float | None = None) -> MatcherHandle:
    """A matcher for ``source`` on model ``name`` (compilation starts now, in the background)."""
    return MatcherHandle(name, source, timeout)


def check_masks(name: str) -> None:
    """Make sure model ``name``'s backend applies logit masks.

    Raises:
        Unsupported: It does not (constrained generation is impossible there).
    """
    model = resolve(name)
    if "logit_mask" not in model.caps.features:
        raise Unsupported(f"backend {model.backend!r} does not support logit masks, so it cannot constrain generation")


def packed_mask(name: str, runs: Sequence[int]) -> np.ndarray:
    """A BRLE vocabulary mask of model ``name``, packed.

    Raises:
        InvalidInput: Negative runs, or runs that do not cover exactly the vocabulary.
    """
    vocab = int(resolve(name).spec.vocab_size)
    return brle.pack_bits(brle.decode(runs, vocab, "logit mask"))


def mask_runs(name: str, packed: np.ndarray) -> list[int]:
    """A packed vocabulary mask of model ``name`` as BRLE runs."""
    vocab = int(resolve(name).spec.vocab_size)
    mask = np.asarray(packed, dtype=np.uint8)
    if mask.shape != ((vocab + 7) // 8,):
        raise InvalidInput(f"a packed mask for a vocabulary of {vocab} has {(vocab + 7) // 8} bytes, got {mask.shape}")
    return brle.encode(np.unpackbits(mask, bitorder="little", count=vocab).view(bool))
