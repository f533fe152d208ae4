"""Exactly tied logits for the sampler and probe cases, placed at a chosen rank.

The contract's tie rule (``pie_core.hookspec``'s samplers and probes, as
``docs/backend-authors.md`` states it): among equal values the **lower token id wins** — argmax
is the lowest id of the maxima, a top-k or nucleus cut that falls inside a group of equal
probabilities keeps its lowest ids, and a DISTRIBUTION lists equal probabilities lower id first.

To check it on a backend's own logits the suite needs logits that tie exactly. A case picks a
prompt, reads the plain model's last-row logits, and reloads the model with the least likely
token not in the prompt made the *twin* of the token at rank ``r``
(:func:`conformance.models.with_twin`: the same output row, so the same logit on every row). The
twins then share ranks ``r`` and ``r + 1`` and every other token keeps its logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.batches import kv_request
from conformance.harness import Harness
from conformance.loaded import LoadedModel

__all__ = ["Tie", "tie_at_rank"]

PROMPT = 7


@dataclass(frozen=True, slots=True)
class Tie:
    """A loaded model and prompt whose last row ties ``low`` and ``high`` (``low < high``) at
    ranks ``rank`` and ``rank + 1``; ``logits`` are that row's logits as the backend computes
    them (float64 copy)."""

    model: LoadedModel
    prompt: np.ndarray
    logits: np.ndarray
    low: int
    high: int
    rank: int

    def request(self, **fields: object):  # type: ignore[no-untyped-def]
        """A fresh request of the prompt on the twin model (``samples=``, ``probes=``)."""
        m = self.model
        return kv_request(self.prompt, m.pages_for(len(self.prompt)), m.page_size, **fields)  # type: ignore[arg-type]


def _last_row(model: LoadedModel, prompt: np.ndarray) -> np.ndarray:
    run = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size)])
    return model.own_logits(run)[0][-1].astype(np.float64)


def tie_at_rank(harness: Harness, rng: np.random.Generator, rank: int) -> Tie:
    """A model and prompt whose last-row logits tie two tokens at ranks ``rank`` and ``rank + 1``.

    Skips as "not supported" when numerics are off (a weightless backend cannot tie two rows).

    Raises:
        AssertionError: The backend gives the twins different logits although their output
            rows are identical (the tie cases cannot run on such a backend).
    """
    harness.require_numerics()  # a weightless backend's logits do not come from the output rows
    plain = harness.model()
    prompt = rng.integers(0, plain.vocab, PROMPT)
    logits = _last_row(plain, prompt)
    order = np.lexsort((np.arange(plain.vocab), -logits))
    token = int(order[rank])
    twin = int(next(t for t in order[::-1] if t not in prompt))  # the least likely token not in the prompt
    model = harness.load(harness.options.archs[0], twins=(token, twin))
    tied = _last_row(model, prompt)
    assert tied[token] == tied[twin], (
        f"tokens {token} and {twin} have identical output rows but the backend gives them logits "
        f"{tied[token]!r} and {tied[twin]!r}: the tie cases need equal inputs to give equal logits"
    )
    return Tie(model, prompt, tied, min(token, twin), max(token, twin), rank)
