"""Host interface ``grammar``: grammar sources, matchers on a model's vocabulary, packed masks.

A matcher's grammar starts compiling (in a worker thread) as soon as the matcher is created;
``await matcher_ready(m)`` waits for it without blocking the event loop, under the matcher's
time limit. The synchronous ``matcher_*`` calls wait in the calling thread if the grammar is not
compiled yet; those marked :func:`~pie_core.host.binding.ready_first` are served to an isolated
worker only after the compilation, awaited off the event loop.

Masks cross this interface in two forms: BRLE runs (``list[int]``, first run disallowed), the
SDK's public form, and packed bitmasks (``bytes`` of ``ceil(vocab/8)``, token ``t`` at bit
``t & 7`` of byte ``t >> 3``), the form the backend applies; the generator uses packed masks so a
step costs no per-token work.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pie_core import brle
from pie_core.errors import InvalidInput, PieError, Unsupported
from pie_core.grammar import compiler as _compiler
from pie_core.grammar.matcher import Matcher
from pie_core.grammar import source as _source
from pie_core.grammar.source import GrammarSource, any_json
from pie_core.host.binding import any_thread, current, off_loop, ready_first
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
    "matcher_ready",
    "matcher_is_ready",
    "matcher_accept",
    "matcher_try_accept",
    "matcher_allows",
    "matcher_packed",
    "matcher_runs",
    "matcher_reset",
    "matcher_rollback",
    "matcher_fork",
    "matcher_stop_ids",
    "matcher_is_terminated",
    "matcher_can_end",
    "matcher_model",
    "check_masks",
    "packed_mask",
    "mask_runs",
    "stop_ids",
]

DEFAULT_TIMEOUT_S = _compiler.DEFAULT_TIMEOUT_S

# Building a source parses it with xgrammar: seconds for a schema with a large maxItems, so a
# worker's call runs in a thread (binding.off_loop); size and nesting are bounded in any case.
json_schema = any_thread(off_loop(_source.json_schema))
regex = any_thread(off_loop(_source.regex))
ebnf = any_thread(off_loop(_source.ebnf))
structural_tag = any_thread(off_loop(_source.structural_tag))
any_json = any_thread(any_json)


@any_thread
def stop_ids(name: str) -> list[int]:
    """Tokens a grammar may end on for model ``name``: its chat stop tokens and EOS ids."""
    model = resolve(name)
    return sorted(set(model.chat.stop_tokens) | set(model.tokenizer.eos_ids))


def _user() -> str | None:
    """The user of the bound instance (None outside one): whose turn a compilation takes."""
    try:
        return current().username
    except PieError:
        return None


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
        self._compiler.submit(source, user=_user())
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

    def packed(self) -> bytes:
        """The next token's mask, packed."""
        return self.matcher.packed().tobytes()

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
        """Undo the last ``n`` accepted tokens.

        Raises:
            InvalidInput: ``n`` is negative.
        """
        if n < 0:
            raise InvalidInput(f"a matcher rolls back a count of tokens >= 0, got {n}")
        self.matcher.rollback(n)

    def fork(self) -> MatcherHandle:
        """An independent handle in the same state."""
        twin = MatcherHandle.__new__(MatcherHandle)
        twin.model_name, twin.source, twin.timeout = self.model_name, self.source, self.timeout
        twin.vocab_size, twin._spell, twin._compiler = self.vocab_size, self._spell, self._compiler
        twin._m = None if self._m is None else self._m.fork()
        return twin


@any_thread
def matcher(name: str, source: GrammarSource, timeout: float | None = None) -> MatcherHandle:
    """A matcher for ``source`` on model ``name`` (compilation starts now, in the background)."""
    return MatcherHandle(name, source, timeout)


async def matcher_ready(m: MatcherHandle) -> None:
    """Wait, without blocking the event loop, until ``m``'s grammar is compiled.

    Raises:
        InvalidInput: The grammar does not compile, or not within the matcher's time limit.
    """
    await m.ready()


@any_thread
def matcher_is_ready(m: MatcherHandle) -> bool:
    """Whether ``m``'s grammar is compiled (no matcher call will wait for it)."""
    return m.is_ready


@any_thread
@ready_first
def matcher_accept(m: MatcherHandle, tokens: list[int]) -> None:
    """Advance ``m`` over ``tokens``, all or none (InvalidInput names a token the grammar forbids)."""
    m.accept(tokens)


@any_thread
@ready_first
def matcher_try_accept(m: MatcherHandle, token: int) -> bool:
    """Advance ``m`` over ``token`` if the grammar allows it next; False (unchanged) if not."""
    return m.try_accept(token)


@any_thread
@ready_first
def matcher_allows(m: MatcherHandle, token: int) -> bool:
    """Whether the grammar allows ``token`` next."""
    return m.allows(token)


@any_thread
@ready_first
def matcher_packed(m: MatcherHandle) -> bytes:
    """The tokens allowed next as a packed mask (InvalidInput once ``m`` is terminated)."""
    return m.packed()


@any_thread
@ready_first
def matcher_runs(m: MatcherHandle) -> list[int]:
    """The tokens allowed next as BRLE runs (InvalidInput once ``m`` is terminated)."""
    return m.runs()


@any_thread
def matcher_reset(m: MatcherHandle) -> None:
    """Put ``m`` back at the grammar's start."""
    m.reset()


@any_thread
@ready_first
def matcher_rollback(m: MatcherHandle, n: int) -> None:
    """Undo the last ``n`` tokens ``m`` accepted (InvalidInput if ``n`` is negative)."""
    m.rollback(n)


@any_thread
def matcher_fork(m: MatcherHandle) -> MatcherHandle:
    """An independent matcher in ``m``'s state."""
    return m.fork()


@any_thread
def matcher_stop_ids(m: MatcherHandle) -> list[int]:
    """The tokens ``m``'s grammar ends on."""
    return list(m.stop_ids)


@any_thread
def matcher_is_terminated(m: MatcherHandle) -> bool:
    """True once ``m`` accepted a stop token."""
    return m.is_terminated


@any_thread
@ready_first
def matcher_can_end(m: MatcherHandle) -> bool:
    """True when a stop token is allowed now (the tokens so far complete the grammar)."""
    return m.can_end


@any_thread
def matcher_model(m: MatcherHandle) -> str:
    """The name of the model whose vocabulary ``m`` walks."""
    return m.model_name


@any_thread
def check_masks(name: str) -> None:
    """Make sure model ``name``'s backend applies logit masks.

    Raises:
        Unsupported: It does not (constrained generation is impossible there).
    """
    model = resolve(name)
    if "logit_mask" not in model.caps.features:
        raise Unsupported(f"backend {model.backend!r} does not support logit masks, so it cannot constrain generation")


@any_thread
def packed_mask(name: str, runs: Sequence[int]) -> bytes:
    """A BRLE vocabulary mask of model ``name``, packed.

    Raises:
        InvalidInput: Negative runs, or runs that do not cover exactly the vocabulary.
    """
    vocab = int(resolve(name).spec.vocab_size)
    return brle.pack_bits(brle.decode(runs, vocab, "logit mask")).tobytes()


@any_thread
def mask_runs(name: str, packed: bytes) -> list[int]:
    """A packed vocabulary mask of model ``name`` as BRLE runs.

    Raises:
        InvalidInput: ``packed`` is not ``bytes`` of the vocabulary's packed length.
    """
    vocab = int(resolve(name).spec.vocab_size)
    width = (vocab + 7) // 8
    if not isinstance(packed, (bytes, bytearray)) or len(packed) != width:
        got = f"{len(packed)} bytes" if isinstance(packed, (bytes, bytearray)) else f"a {type(packed).__name__}"
        raise InvalidInput(f"a packed mask for a vocabulary of {vocab} is {width} bytes, got {got}")
    mask = np.frombuffer(packed, dtype=np.uint8)
    return brle.encode(np.unpackbits(mask, bitorder="little", count=vocab).view(bool))
