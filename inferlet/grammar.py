"""Grammars, matchers and grammar constraints: ``from inferlet import Grammar, GrammarConstraint, Matcher``.

A :class:`Grammar` is validated when it is built (a malformed schema, regex or grammar raises
``InvalidInput`` right there) but compiled only for a model's vocabulary, which a
:class:`Matcher` starts in the background when it is created. Compiled grammars are cached per
(grammar, model), so the same schema is compiled once however many generators use it.

EBNF: :meth:`Grammar.from_ebnf` takes Lark grammars (``start: ...`` rules, ``%import common.X``,
``%ignore``) and GBNF, llama.cpp's EBNF (``root ::= ...``). A source in which some line starts
a rule with ``::=`` is read as GBNF, anything else as Lark.
"""

from __future__ import annotations

from typing import Any

from inferlet.host import grammar as _host
from inferlet.host import types as _types
from inferlet._keywords import renamed
from inferlet.model import Model, Tokenizer

__all__ = ["Grammar", "Matcher", "GrammarConstraint"]


class Grammar:
    """A grammar, validated, not yet compiled for a vocabulary. Build one with the ``from_*``
    constructors or :meth:`json`.

    A Grammar is a Schema: pass it wherever one goes (``ctx.generate(constrain=g)``,
    ``g.constrain(grammar)``, ``collect_json(schema=grammar)``); each generator gets its own
    :class:`GrammarConstraint` over it, and the compilation is shared.
    """

    def __init__(self, source: _types.GrammarSource) -> None:
        if not isinstance(source, _types.GrammarSource):
            raise TypeError("build a Grammar with Grammar.from_json_schema/json/from_regex/from_ebnf")
        self._source = source

    @staticmethod
    @renamed(s="schema")
    def from_json_schema(schema: str | dict[str, Any], *, whitespace: bool = False) -> Grammar:
        """JSON conforming to a JSON Schema.

        Args:
            schema: The schema, as JSON text or a dict (also accepted as ``s=``).
            whitespace: Allow any whitespace between JSON tokens. By default the JSON is
                written on one line with ``", "`` and ``": "`` separators.

        Raises:
            InvalidInput: ``schema`` is not valid JSON or not a schema xgrammar can compile.
        """
        return Grammar(_host.json_schema(schema, whitespace=whitespace))

    @staticmethod
    def json(*, whitespace: bool = False) -> Grammar:
        """Any JSON value (on one line unless ``whitespace``: see :meth:`from_json_schema`)."""
        return Grammar(_host.any_json(whitespace=whitespace))

    @staticmethod
    @renamed(p="pattern")
    def from_regex(pattern: str) -> Grammar:
        """Text matching the regular expression ``pattern`` in full (also accepted as ``p=``).

        Raises:
            InvalidInput: The pattern does not parse (or uses lookbehind/backreferences).
        """
        return Grammar(_host.regex(pattern))

    @staticmethod
    @renamed(g="ebnf")
    def from_ebnf(ebnf: str) -> Grammar:
        """A Lark (``start: ...``) or GBNF (``root ::= ...``) grammar (also accepted as ``g=``).

        Raises:
            InvalidInput: A syntax error or an undefined rule; the message says where.
        """
        return Grammar(_host.ebnf(ebnf))

    @property
    def kind(self) -> str:
        """``json_schema``, ``json``, ``regex``, ``gbnf``, ``lark`` or ``structural_tag``."""
        return self._source.kind

    @property
    def text(self) -> str:
        """The schema, pattern or grammar text."""
        return self._source.text

    def build_constraint(self, model: Model) -> GrammarConstraint:
        """The Schema protocol: a fresh constraint over this grammar for ``model``."""
        return GrammarConstraint.from_grammar(self, model)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grammar) and other._source == self._source

    def __hash__(self) -> int:
        return hash(self._source)

    def __repr__(self) -> str:
        return f"Grammar({self._source.describe()})"


class Matcher:
    """A stateful walk through a grammar over a model's vocabulary.

    ``Matcher(grammar, tokenizer)`` starts compiling the grammar in the background. The first
    synchronous call waits for it (in the calling thread); ``await m.ready()`` waits without
    blocking the event loop. Either wait is limited by ``compile_timeout`` seconds (default 20)
    and raises ``InvalidInput`` when the grammar is too complex to compile in time.
    """

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer | Model, *, compile_timeout: float | None = None) -> None:
        """Bind ``grammar`` to a model's vocabulary.

        Args:
            grammar: The grammar.
            tokenizer: The model's tokenizer (``model.tokenizer()``), or the model.
            compile_timeout: Seconds a wait for the compilation may take.

        Raises:
            TypeError: ``grammar`` or ``tokenizer`` has the wrong type.
            InvalidInput: ``compile_timeout`` is not positive.
        """
        if not isinstance(grammar, Grammar):
            raise TypeError(f"Matcher needs a Grammar, got {type(grammar).__name__}")
        if isinstance(tokenizer, Model):
            tokenizer = tokenizer.tokenizer()
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"Matcher needs a model's Tokenizer (model.tokenizer()), got {type(tokenizer).__name__}")
        self._grammar = grammar
        self._model = tokenizer._name
        self._h = _host.matcher(tokenizer._name, grammar._source, compile_timeout)

    @classmethod
    def _of(cls, handle: _types.Matcher, grammar: Grammar) -> Matcher:
        self = cls.__new__(cls)
        self._grammar, self._model, self._h = grammar, _host.matcher_model(handle), handle
        return self

    @property
    def grammar(self) -> Grammar:
        """The grammar this matcher walks."""
        return self._grammar

    async def ready(self) -> None:
        """Wait until the grammar is compiled, without blocking the event loop.

        Raises:
            InvalidInput: It does not compile, or not within ``compile_timeout``.
        """
        await _host.matcher_ready(self._h)

    @renamed(ids="token_ids")
    def accept_tokens(self, token_ids: list[int]) -> None:
        """Advance over ``token_ids`` (also accepted as ``ids=``), all or none.

        Raises:
            InvalidInput: A token the grammar does not allow at its position (named in the
                message); the matcher stays as it was.
        """
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        _host.matcher_accept(self._h, [int(t) for t in token_ids])

    def next_token_logit_mask(self) -> list[int]:
        """The tokens allowed next, as a BRLE mask over the vocabulary (first run disallowed).

        Raises:
            InvalidInput: The matcher is terminated (reset it to start over).
        """
        return _host.matcher_runs(self._h)

    def try_accept(self, token: int) -> bool:
        """Advance over ``token`` if the grammar allows it next; False (state unchanged) if not."""
        return _host.matcher_try_accept(self._h, int(token))

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (e.g. drafts a verifier rejected)."""
        _host.matcher_rollback(self._h, int(n))

    def packed_mask(self) -> bytes:
        """The tokens allowed next as a packed bitmask (``ceil(vocab / 8)`` bytes, token ``t`` at
        bit ``t & 7`` of byte ``t >> 3``): the form ``fwd.sample(..., mask=...)`` applies with no
        per-token work.

        Raises:
            InvalidInput: The matcher is terminated (reset it to start over).
        """
        return _host.matcher_packed(self._h)

    @property
    def is_terminated(self) -> bool:
        """True once a stop token was accepted: the grammar is complete and closed."""
        return _host.matcher_is_terminated(self._h)

    @property
    def is_completed(self) -> bool:
        """True when the tokens so far form a complete sentence (a stop token may come next)."""
        return _host.matcher_can_end(self._h)

    def reset(self) -> None:
        """Back to the initial state."""
        _host.matcher_reset(self._h)

    def fork(self) -> Matcher:
        """An independent matcher in the same state."""
        return Matcher._of(_host.matcher_fork(self._h), self._grammar)

    def __repr__(self) -> str:
        return f"Matcher({self._grammar!r}, model={self._model!r})"


class GrammarConstraint:
    """A constraint that keeps generation inside a grammar: pass it to ``constrain=`` or
    ``g.constrain(...)``. It holds a :class:`Matcher`'s state, so use one per generator."""

    def __init__(self, matcher: Matcher) -> None:
        """Constrain by ``matcher`` (e.g. ``tools.native_matcher(...)``).

        Raises:
            TypeError: ``matcher`` is not a Matcher.
        """
        if not isinstance(matcher, Matcher):
            raise TypeError(f"GrammarConstraint wraps a Matcher, got {type(matcher).__name__}")
        self._m = matcher

    @staticmethod
    @renamed(g="grammar")
    def from_grammar(grammar: Grammar, model: Model, *, compile_timeout: float | None = None) -> GrammarConstraint:
        """A constraint from a grammar built earlier (compiled once per model, then cached)."""
        return GrammarConstraint(Matcher(grammar, _model(model), compile_timeout=compile_timeout))

    @staticmethod
    @renamed(s="schema")
    def from_json_schema(
        schema: str | dict[str, Any], model: Model, *, compile_timeout: float | None = None
    ) -> GrammarConstraint:
        """JSON conforming to a JSON Schema (see :meth:`Grammar.from_json_schema`)."""
        return GrammarConstraint.from_grammar(Grammar.from_json_schema(schema), model, compile_timeout=compile_timeout)

    @staticmethod
    def json(model: Model, *, compile_timeout: float | None = None) -> GrammarConstraint:
        """Any JSON value."""
        return GrammarConstraint.from_grammar(Grammar.json(), model, compile_timeout=compile_timeout)

    @staticmethod
    @renamed(p="pattern")
    def from_regex(pattern: str, model: Model, *, compile_timeout: float | None = None) -> GrammarConstraint:
        """Text matching a regular expression in full."""
        return GrammarConstraint.from_grammar(Grammar.from_regex(pattern), model, compile_timeout=compile_timeout)

    @staticmethod
    @renamed(g="ebnf")
    def from_ebnf(ebnf: str, model: Model, *, compile_timeout: float | None = None) -> GrammarConstraint:
        """A Lark or GBNF grammar (see :meth:`Grammar.from_ebnf`)."""
        return GrammarConstraint.from_grammar(Grammar.from_ebnf(ebnf), model, compile_timeout=compile_timeout)

    @property
    def matcher(self) -> Matcher:
        """The matcher whose state this constraint advances."""
        return self._m

    @property
    def model_name(self) -> str:
        """Name of the model whose vocabulary the constraint is compiled for."""
        return self._m._model

    def step(self, accepted: list[int]) -> list[int]:
        """The Constraint protocol: advance over ``accepted``, return the next BRLE mask.

        Raises:
            InvalidInput: ``accepted`` violates the grammar, or the grammar has ended.
        """
        self._m.accept_tokens(list(accepted))
        return self._m.next_token_logit_mask()

    def __repr__(self) -> str:
        return f"GrammarConstraint({self._m!r})"


def _model(model: Model) -> Model:
    if not isinstance(model, Model):
        raise TypeError(f"a grammar constraint needs the Model it generates on, got {type(model).__name__}")
    return model
