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

from typing import Any, Mapping, Sequence

from inferlet.host._declare import host
from inferlet.host.types import Matcher, GrammarSource

__all__ = ["any_json", "check_masks", "ebnf", "json_schema", "mask_runs", "matcher", "matcher_accept", "matcher_allows",
           "matcher_can_end", "matcher_fork", "matcher_is_ready", "matcher_is_terminated", "matcher_model",
           "matcher_packed", "matcher_ready", "matcher_reset", "matcher_rollback", "matcher_runs",
           "matcher_stop_ids", "matcher_try_accept", "packed_mask", "regex", "stop_ids", "structural_tag"]


@host
def any_json(whitespace: bool = False) -> GrammarSource:
    """A source for any JSON value: on one line with ``", "`` and ``": "`` separators, or with
    ``whitespace=True`` xgrammar's built-in JSON grammar (any whitespace between tokens).
    """


@host
def check_masks(name: str) -> None:
    """Make sure model ``name``'s backend applies logit masks.

    Raises:
        Unsupported: It does not (constrained generation is impossible there).
    """


@host
def ebnf(text: str) -> GrammarSource:
    """A source for a GBNF (``root ::= ...``) or Lark (``start: ...``) grammar.

    Raises:
        InvalidInput: The grammar has a syntax error or references an undefined rule.
    """


@host
def json_schema(schema: str | Mapping[str, Any] | bool, whitespace: bool = False) -> GrammarSource:
    """A source for JSON conforming to ``schema`` (a JSON Schema as text or as a dict).

    Raises:
        InvalidInput: ``schema`` is not valid JSON, not an object (or boolean), or uses a type,
            reference or keyword combination xgrammar cannot turn into a grammar.
    """


@host
def mask_runs(name: str, packed: bytes) -> list[int]:
    """A packed vocabulary mask of model ``name`` as BRLE runs.

    Raises:
        InvalidInput: ``packed`` is not ``bytes`` of the vocabulary's packed length.
    """


@host
def matcher(name: str, source: GrammarSource, timeout: float | None = None) -> Matcher:
    """A matcher for ``source`` on model ``name`` (compilation starts now, in the background)."""


@host
def matcher_accept(m: Matcher, tokens: list[int]) -> None:
    """Advance ``m`` over ``tokens``, all or none (InvalidInput names a token the grammar forbids)."""


@host
def matcher_allows(m: Matcher, token: int) -> bool:
    """Whether the grammar allows ``token`` next."""


@host
def matcher_can_end(m: Matcher) -> bool:
    """True when a stop token is allowed now (the tokens so far complete the grammar)."""


@host
def matcher_fork(m: Matcher) -> Matcher:
    """An independent matcher in ``m``'s state."""


@host
def matcher_is_ready(m: Matcher) -> bool:
    """Whether ``m``'s grammar is compiled (no matcher call will wait for it)."""


@host
def matcher_is_terminated(m: Matcher) -> bool:
    """True once ``m`` accepted a stop token."""


@host
def matcher_model(m: Matcher) -> str:
    """The name of the model whose vocabulary ``m`` walks."""


@host
def matcher_packed(m: Matcher) -> bytes:
    """The tokens allowed next as a packed mask (InvalidInput once ``m`` is terminated)."""


@host
async def matcher_ready(m: Matcher) -> None:
    """Wait, without blocking the event loop, until ``m``'s grammar is compiled.

    Raises:
        InvalidInput: The grammar does not compile, or not within the matcher's time limit.
    """


@host
def matcher_reset(m: Matcher) -> None:
    """Put ``m`` back at the grammar's start."""


@host
def matcher_rollback(m: Matcher, n: int) -> None:
    """Undo the last ``n`` tokens ``m`` accepted."""


@host
def matcher_runs(m: Matcher) -> list[int]:
    """The tokens allowed next as BRLE runs (InvalidInput once ``m`` is terminated)."""


@host
def matcher_stop_ids(m: Matcher) -> list[int]:
    """The tokens ``m``'s grammar ends on."""


@host
def matcher_try_accept(m: Matcher, token: int) -> bool:
    """Advance ``m`` over ``token`` if the grammar allows it next; False (unchanged) if not."""


@host
def packed_mask(name: str, runs: Sequence[int]) -> bytes:
    """A BRLE vocabulary mask of model ``name``, packed.

    Raises:
        InvalidInput: Negative runs, or runs that do not cover exactly the vocabulary.
    """


@host
def regex(pattern: str) -> GrammarSource:
    """A source for strings that match ``pattern`` in full.

    Raises:
        InvalidInput: The pattern does not parse or uses a feature xgrammar lacks (lookbehind,
            backreferences).
    """


@host
def stop_ids(name: str) -> list[int]:
    """Tokens a grammar may end on for model ``name``: its chat stop tokens and EOS ids."""


@host
def structural_tag(tag_json: str) -> GrammarSource:
    """A source for an xgrammar structural tag (JSON), e.g. a model's tool-call format.

    Raises:
        InvalidInput: The tag is malformed.
    """
