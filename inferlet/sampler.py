"""Samplers: how a sampled row turns logits into a token."""

from __future__ import annotations

from dataclasses import dataclass

from pie_core.host.inference import SampleSpec, SamplerKind

__all__ = ["Sampler"]


@dataclass(frozen=True, slots=True)
class Sampler:
    """A sampling rule. Build one with the constructors; every one takes an optional ``seed``
    (0 = fresh randomness each call; any other value makes draws reproducible)."""

    kind: SamplerKind
    temperature: float = 1.0
    k: int = 0
    p: float = 1.0
    min_prob: float = 0.0
    draws: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.kind in (SamplerKind.TOP_K, SamplerKind.TOP_K_TOP_P) and self.k < 1:
            raise ValueError(f"top-k needs k >= 1, got {self.k}")
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"top-p needs 0 < p <= 1, got {self.p}")
        if not 0.0 <= self.min_prob <= 1.0:
            raise ValueError(f"min-p needs 0 <= p <= 1, got {self.min_prob}")
        if self.draws < 1:
            raise ValueError(f"multinomial needs draws >= 1, got {self.draws}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")

    @staticmethod
    def argmax() -> Sampler:
        """Greedy: the highest-scoring token."""
        return Sampler(SamplerKind.ARGMAX, temperature=0.0)

    @staticmethod
    def greedy() -> Sampler:
        """Alias of :meth:`argmax`."""
        return Sampler.argmax()

    @staticmethod
    def top_p(temperature: float = 0.6, p: float = 0.95, *, top_p: float | None = None, seed: int = 0) -> Sampler:
        """Nucleus sampling: the smallest set of tokens whose probability reaches ``p``."""
        return Sampler(SamplerKind.TOP_P, temperature, p=p if top_p is None else top_p, seed=seed)

    @staticmethod
    def top_k(temperature: float = 0.6, k: int = 50, *, top_k: int | None = None, seed: int = 0) -> Sampler:
        """Sample among the ``k`` most likely tokens."""
        return Sampler(SamplerKind.TOP_K, temperature, k=k if top_k is None else top_k, seed=seed)

    @staticmethod
    def min_p(temperature: float = 0.6, p: float = 0.1, *, min_p: float | None = None, seed: int = 0) -> Sampler:
        """Keep tokens whose probability is at least ``p`` times the top token's."""
        return Sampler(SamplerKind.MIN_P, temperature, min_prob=p if min_p is None else min_p, seed=seed)

    @staticmethod
    def top_k_top_p(
        temperature: float = 0.6,
        k: int = 50,
        p: float = 0.95,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
    ) -> Sampler:
        """Top-k filter, then nucleus over what remains."""
        return Sampler(
            SamplerKind.TOP_K_TOP_P,
            temperature,
            k=k if top_k is None else top_k,
            p=p if top_p is None else top_p,
            seed=seed,
        )

    @staticmethod
    def multinomial(temperature: float = 1.0, draws: int = 1, *, seed: int = 0) -> Sampler:
        """``draws`` independent draws from the full tempered distribution."""
        return Sampler(SamplerKind.MULTINOMIAL, temperature, draws=draws, seed=seed)

    def spec(self, index: int) -> SampleSpec:
        """The host-level sample request for input row ``index``."""
        return SampleSpec(
            index=index,
            kind=self.kind,
            temperature=self.temperature,
            top_k=self.k,
            top_p=self.p,
            min_p=self.min_prob,
            draws=self.draws,
            seed=self.seed,
        )
