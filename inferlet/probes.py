"""Probes: read values off one input row (its logits, or its hidden state) without sampling it."""

from __future__ import annotations

from dataclasses import dataclass

from pie_core.host.inference import ProbeKind, ProbeSpec

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


@dataclass(frozen=True, slots=True)
class Logprob:
    """Log-probability of one token: ``out.logprobs(h)`` is a length-1 list."""

    token_id: int

    def spec(self, index: int) -> ProbeSpec:
        return ProbeSpec(index, ProbeKind.LOGPROBS, token_ids=(int(self.token_id),))


@dataclass(frozen=True, slots=True)
class Logprobs:
    """Log-probabilities of several tokens, in the given order."""

    token_ids: tuple[int, ...]

    def __init__(self, token_ids: list[int] | tuple[int, ...]) -> None:
        object.__setattr__(self, "token_ids", tuple(int(t) for t in token_ids))

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


Probe = Logits | Distribution | Logprob | Logprobs | Entropy | Embedding
