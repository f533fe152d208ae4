"""Probes: read values off one input row (its logits, or its hidden state) without sampling it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from inferlet.host.types import ProbeKind, ProbeSpec

__all__ = ["Logits", "Distribution", "Logprob", "Logprobs", "Entropy", "Embedding", "Probe"]


@dataclass(frozen=True, slots=True)
class Logits:
    """Raw logits: ``out.logits(h)`` gives native-endian f32 bytes, ``vocab_size * 4`` long."""

    def spec(self, index: int) -> ProbeSpec:
        return ProbeSpec(index, ProbeKind.LOGITS)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Top-``k`` ids and probabilities of softmax(logits / temperature); ``k = 0``: all."""

    temperature: float = 1.0
    k: int = 0

    def spec(self, index: int) -> ProbeSpec:
        if self.temperature <= 0:
            raise ValueError(f"Distribution temperature must be > 0, got {self.temperature}")
        if self.k < 0:
            raise ValueError(f"Distribution k must be >= 0, got {self.k}")
        return ProbeSpec(index, ProbeKind.DISTRIBUTION, temperature=self.temperature, k=self.k)


@dataclass(frozen=True, slots=True, init=False)
class Logprob:
    """Log-probability of one token: ``out.logprobs(h)`` is a length-1 list.

    ``Logprob(5)``, ``Logprob(token=5)`` and ``Logprob(token_id=5)`` are the same probe.
    """

    token_id: int

    def __init__(self, token: int | None = None, *, token_id: int | None = None) -> None:
        object.__setattr__(self, "token_id", _one_of("Logprob", token, token_id, "token", "token_id"))

    @property
    def token(self) -> int:
        """The token whose log-probability is read (same as ``token_id``)."""
        return self.token_id

    def spec(self, index: int) -> ProbeSpec:
        return ProbeSpec(index, ProbeKind.LOGPROBS, token_ids=(int(self.token_id),))


@dataclass(frozen=True, slots=True, init=False)
class Logprobs:
    """Log-probabilities of several tokens, in the given order.

    ``Logprobs([1, 2])``, ``Logprobs(tokens=[1, 2])`` and ``Logprobs(token_ids=[1, 2])`` are the
    same probe; any iterable of ids will do.
    """

    token_ids: tuple[int, ...]

    def __init__(self, tokens: Iterable[int] | None = None, *, token_ids: Iterable[int] | None = None) -> None:
        ids = _one_of("Logprobs", tokens, token_ids, "tokens", "token_ids")
        object.__setattr__(self, "token_ids", tuple(int(t) for t in ids))

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens whose log-probabilities are read (same as ``token_ids``)."""
        return self.token_ids

    def spec(self, index: int) -> ProbeSpec:
        return ProbeSpec(index, ProbeKind.LOGPROBS, token_ids=self.token_ids)


@dataclass(frozen=True, slots=True)
class Entropy:
    """Shannon entropy (nats) of softmax(logits)."""

    def spec(self, index: int) -> ProbeSpec:
        return ProbeSpec(index, ProbeKind.ENTROPY)


@dataclass(frozen=True, slots=True)
class Embedding:
    """The row's final hidden state (after the model's final norm, before the output layer):
    ``out.embedding(h)`` gives ``hidden_size`` floats. Needs a backend with the
    ``"embeddings"`` feature (the cpu and dummy backends have it); others raise Unsupported."""

    def spec(self, index: int) -> ProbeSpec:
        return ProbeSpec(index, ProbeKind.EMBEDDING)


def _one_of(probe: str, value: Any, alias: Any, name: str, alias_name: str) -> Any:
    """The one of two names for a probe's argument that the caller used."""
    if value is not None and alias is not None:
        raise TypeError(f"{probe}() got {name}= and {alias_name}=, two names for one argument: pass one")
    if value is None and alias is None:
        raise TypeError(f"{probe}() is missing its argument: {probe}({name}) or {probe}({alias_name}=...)")
    return value if value is not None else alias


Probe = Logits | Distribution | Logprob | Logprobs | Entropy | Embedding
