"""Constraints on generation: ``from inferlet import AnyJson, JsonSchema, Regex, Ebnf``.

Two protocols:

- a **Schema** describes output and builds a constraint for a model
  (``build_constraint(model)``); :class:`AnyJson`, :class:`JsonSchema`, :class:`Regex`,
  :class:`Ebnf` and a :class:`~inferlet.grammar.Grammar` (e.g. ``tools.native_grammar(...)``)
  are the built-in ones. Schemas hold no state, so one schema serves any number of generators.
- a **Constraint** is stateful: before each sampled token the generator calls
  ``step(accepted)`` with the tokens accepted since the previous call (``[]`` the first time)
  and applies the BRLE mask it returns (``[]`` = no restriction this step).
  :class:`~inferlet.grammar.GrammarConstraint` is the built-in one.

``ctx.generate(..., constrain=c)`` takes one schema or constraint or a list of them, and
``g.constrain(c)`` adds more: the masks are ANDed, together with a static ``logit_mask``. A step
whose combined mask allows no token raises ``InvalidInput`` instead of sampling. A stop token
can end generation only when every grammar constraint can end, and generation ends when a
grammar constraint has accepted its stop token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Collection, Protocol, Sequence, runtime_checkable

from inferlet.host import grammar as _host
from inferlet.host.errors import InvalidInput
from inferlet.grammar import Grammar, GrammarConstraint
from inferlet.model import Model

__all__ = ["Schema", "Constraint", "AnyJson", "JsonSchema", "Regex", "Ebnf", "ConstraintSet", "as_schema", "parse_json"]


@runtime_checkable
class Constraint(Protocol):
    """Anything with ``step(accepted) -> BRLE mask`` (``[]`` for no restriction)."""

    def step(self, accepted: list[int]) -> list[int]: ...


@runtime_checkable
class Schema(Protocol):
    """Anything with ``build_constraint(model) -> Constraint``."""

    def build_constraint(self, model: Model) -> Any: ...


@dataclass(frozen=True, slots=True)
class AnyJson:
    """Any valid JSON (on one line unless ``whitespace``)."""

    whitespace: bool = False

    def build_constraint(self, model: Model) -> GrammarConstraint:
        """A fresh constraint for ``model``."""
        return GrammarConstraint.from_grammar(Grammar.json(whitespace=self.whitespace), model)


@dataclass(frozen=True, slots=True)
class JsonSchema:
    """JSON conforming to a JSON Schema (text or dict); validated when built.

    Attributes:
        schema: The JSON Schema.
        whitespace: Allow any whitespace between JSON tokens (default: one line, ``", "`` and
            ``": "`` separators).
    """

    schema: str | dict[str, Any]
    whitespace: bool = False

    def __post_init__(self) -> None:
        _host.json_schema(self.schema, whitespace=self.whitespace)

    def build_constraint(self, model: Model) -> GrammarConstraint:
        """A fresh constraint for ``model``."""
        grammar = Grammar.from_json_schema(self.schema, whitespace=self.whitespace)
        return GrammarConstraint.from_grammar(grammar, model)


@dataclass(frozen=True, slots=True)
class Regex:
    """Text matching a regular expression in full; validated when built."""

    pattern: str

    def __post_init__(self) -> None:
        _host.regex(self.pattern)

    def build_constraint(self, model: Model) -> GrammarConstraint:
        """A fresh constraint for ``model``."""
        return GrammarConstraint.from_regex(self.pattern, model)


@dataclass(frozen=True, slots=True)
class Ebnf:
    """A custom grammar in Lark format (``start: ...``); GBNF (``root ::= ...``) works too."""

    source: str

    def __post_init__(self) -> None:
        _host.ebnf(self.source)

    def build_constraint(self, model: Model) -> GrammarConstraint:
        """A fresh constraint for ``model``."""
        return GrammarConstraint.from_ebnf(self.source, model)


_UNSET = b""  # "not computed yet" (None means "no restriction"); a real mask is never empty


class ConstraintSet:
    """The constraints of one generator, ANDed. Internal: the generator's bookkeeping.

    Masks are packed (``ceil(vocab/8)`` bytes, token ``t`` at bit ``t & 7`` of byte ``t >> 3``).
    Grammar constraints advance eagerly as tokens are accepted and fill their masks once per
    step; other constraints are stepped lazily, when the next mask is needed, with the tokens
    accepted since.
    """

    def __init__(self, model: Model, static_mask: Sequence[int] | None = None) -> None:
        """Start with no constraint but ``static_mask`` (BRLE), if given.

        Raises:
            Unsupported: The model's backend does not apply logit masks.
        """
        _host.check_masks(model.name)
        self._model = model
        self._grammars: list[GrammarConstraint] = []
        self._others: list[Any] = []
        self._pending: list[int] = []
        self._static = None if static_mask is None else _host.packed_mask(model.name, static_mask)
        self._mask: bytes | None = _UNSET
        self._accepted = 0

    def add(self, item: Any) -> None:
        """Add a schema, a constraint, or a list of them.

        Raises:
            TypeError: Something that is neither.
            InvalidInput: A grammar constraint compiled for another model.
        """
        if isinstance(item, (list, tuple)):
            for each in item:
                self.add(each)
            return
        if isinstance(item, GrammarConstraint):
            if item.model_name != self._model.name:
                raise InvalidInput(
                    f"this constraint was built for model {item.model_name!r}, the generator runs on {self._model.name!r}"
                )
            self._grammars.append(item)
        elif callable(getattr(item, "build_constraint", None)):
            built = item.build_constraint(self._model)
            if not callable(getattr(built, "step", None)):
                raise TypeError(f"{type(item).__name__}.build_constraint() must return a Constraint, got {type(built).__name__}")
            self.add(built)
            return
        elif callable(getattr(item, "step", None)):
            self._others.append(item)
        else:
            raise TypeError(
                "constrain= takes a Schema (AnyJson, JsonSchema, Regex, Ebnf, a Grammar or any object with "
                f"build_constraint(model)) or a Constraint (an object with step(accepted)), got {type(item).__name__}"
            )
        self._mask = _UNSET

    @property
    def static(self) -> bool:
        """True when the only rule is the static mask: every step's mask is the same."""
        return not self._grammars and not self._others

    @property
    def ended(self) -> bool:
        """True when a grammar constraint accepted its stop token."""
        return any(g.matcher.is_terminated for g in self._grammars)

    @property
    def can_speculate(self) -> bool:
        """Whether masks can be computed ahead over draft tokens: grammar constraints roll
        back, while a custom Constraint's ``step`` cannot be undone."""
        return not self._others

    async def ready(self) -> None:
        """Wait for every grammar to compile (off the event loop, under its time limit)."""
        for g in self._grammars:
            await g.matcher.ready()

    def mask(self) -> bytes | None:
        """The packed mask for the next token (None: no restriction).

        Raises:
            InvalidInput: The constraints together allow no token.
        """
        if self._mask == _UNSET:
            masks = [g.matcher.packed_mask() for g in self._grammars]
            pending, self._pending = self._pending, []
            for c in self._others:
                runs = c.step(list(pending))
                if runs:
                    masks.append(_host.packed_mask(self._model.name, runs))
            if self._static is not None:
                masks.append(self._static)
            mask = None if not masks else masks[0] if len(masks) == 1 else _and(masks)
            if mask is not None and mask.count(0) == len(mask):
                raise InvalidInput(
                    f"the generator's constraints allow no token after {self._accepted} accepted tokens: a grammar "
                    "that can neither continue nor end here, or ANDed constraints (and logit_mask) with no token "
                    "in common: loosen one of them"
                )
            self._mask = mask
        return self._mask

    def admits(self, token: int) -> bool:
        """Whether ``token`` is allowed next."""
        mask = self.mask()
        return mask is None or (0 <= token < len(mask) * 8 and bool((mask[token >> 3] >> (token & 7)) & 1))

    def accept(self, token: int) -> None:
        """Advance every constraint over ``token`` (which :meth:`admits` allowed)."""
        for i, g in enumerate(self._grammars):
            if not g.matcher.try_accept(token):
                for done in self._grammars[:i]:
                    done.matcher.rollback(1)
                raise InvalidInput(f"token {token} is not allowed by {g!r}; check admits() before accept()")
        self._pending.append(token)
        self._accepted += 1
        self._mask = _UNSET

    def masks_along(self, drafts: Sequence[int], stop: Collection[int]) -> list[bytes | None]:
        """The masks for the next token and after each draft in turn (for verifying drafts in
        one pass), as far as the drafts can go; the constraints end where they started.

        Drafts stop before the first one the constraints forbid, one in ``stop``, or one that
        ends a grammar: such a token can only be the last of a step, never a draft it keeps.
        Only when :attr:`can_speculate`.

        Returns:
            ``1 + usable`` masks: ``[0]`` for the next token, ``[i]`` after ``drafts[i - 1]``.
        """
        masks = [self.mask()]
        walked = 0
        try:
            for tok in drafts:
                if tok in stop or not self.admits(tok):
                    break
                for g in self._grammars:
                    g.matcher.try_accept(tok)
                walked += 1
                self._mask = _UNSET
                if self.ended:
                    break
                try:
                    masks.append(self.mask())
                except InvalidInput:  # a dead end after this draft: the step stops before it
                    break
        finally:
            for g in self._grammars:
                g.matcher.rollback(walked)
            self._mask = masks[0]
        return masks


def _and(masks: list[bytes]) -> bytes:
    """The bitwise AND of equally long packed masks (as integers: no loop over the bytes)."""
    acc = int.from_bytes(masks[0], "little")
    for m in masks[1:]:
        acc &= int.from_bytes(m, "little")
    return acc.to_bytes(len(masks[0]), "little")


def as_schema(schema: Any) -> Any:
    """``collect_json``'s ``schema``: None (any JSON), a JSON Schema (text or dict), or a Schema
    (a Grammar among them) or Constraint as is."""
    if schema is None:
        return AnyJson()
    if isinstance(schema, (str, dict, bool)):
        return JsonSchema(schema)  # type: ignore[arg-type]
    return schema


def parse_json(text: str, generated: int) -> Any:
    """The value of a constrained reply.

    Raises:
        InvalidInput: ``text`` is not complete JSON (generation stopped before the grammar ended).
    """
    try:
        return json.loads(text)
    except ValueError as e:
        raise InvalidInput(
            f"the reply is not complete JSON ({e}); generation stopped after {generated} tokens "
            "before the JSON ended: raise max_tokens"
        ) from None
