"""Speculative decoding: ``from inferlet.spec import Speculator``.

Pass a speculator to ``ctx.generate(sampler, speculator=s)``, or ``system_speculation=True``
for the runtime's own n-gram drafter (prompt lookup over the context's tokens); the two are
mutually exclusive. Either way the drafts go into the same forward pass as the step's input,
each with a sample row, and the context keeps the longest run of drafts that equal what the
sampler drew before them, plus the token drawn after that run: the generated tokens are
exactly those generation without speculation gives (greedy and seeded sampling give the same
tokens; other sampling the same distribution), only several may come per step (``out.tokens``).

The generator calls a speculator like this, every step:

1. ``draft()`` before the pass, when the step can carry drafts. It cannot when probes are
   attached (``probe_each_step``, ``step.probe``), after ``step.clear_sampler()``, with a
   sampler that draws several tokens or reads a distribution, with a custom Constraint (its
   ``step`` cannot be undone; grammar constraints and ``logit_mask`` are fine), or when
   ``max_tokens`` leaves room for one token only.
2. ``accept(tokens)`` with the tokens the step produced (what ``out.tokens`` holds): the first
   is the prediction after the step's input, the rest follow the drafts that were kept.
3. ``rollback(n)``, when ``n > 0`` of the drafted tokens were not kept (``n`` counts from the
   end of what ``draft()`` returned), if the speculator has that method.

``reset()``, if present, is the speculator's own: the generator does not call it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Speculator"]


@runtime_checkable
class Speculator(Protocol):
    """A drafter for speculative decoding: any class with these methods (only ``draft`` and
    ``accept`` are required; the generator calls ``rollback`` when it exists)."""

    def draft(self) -> tuple[list[int], list[int]]:
        """Draft tokens and their absolute positions for the next pass; ``([], [])`` for no
        speculation this step. Positions must continue the context: the first draft sits
        right after the step's input tokens."""
        ...

    def accept(self, tokens: list[int]) -> None:
        """The tokens the step produced: the anchor's own prediction first, then those that
        followed the kept drafts."""
        ...

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` drafted tokens: the verifier did not keep them."""
        ...

    def reset(self) -> None:
        """Back to the initial state."""
        ...
