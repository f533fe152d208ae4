"""Samplers: how a sampled row turns logits into a token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inferlet.host.types import ProbeKind, ProbeSpec, SampleSpec, SamplerKind

__all__ = ["Sampler"]


@dataclass(frozen=True, slots=True)
class Sampler:
    """A sampling rule. Build one with the constructors; every one takes an optional ``seed``
    (0 = fresh randomness each call; any other value makes draws reproducible).

    ``output`` says what the sampled row gives back: ``"token"`` (every sampler but two),
    ``"distribution"`` (:meth:`dist`: a token and the full distribution) or ``"embedding"``
    (:meth:`embedding`: the hidden state, no token).
    """

    kind: SamplerKind
    temperature: float = 1.0
    k: int = 0
    p: float = 1.0
    min_prob: float = 0.0
    draws: int = 1
    seed: int = 0
    output: Literal["token", "distribution", "embedding"] = "token"

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
        if self.output not in ("token", "distribution", "embedding"):
            raise ValueError(f"output must be 'token', 'distribution' or 'embedding', got {self.output!r}")

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
    def top_k(temperature: float = 0.6, k: int = 40, *, top_k: int | None = None, seed: int = 0) -> Sampler:
        """Sample among the ``k`` most likely tokens (``top_k=`` is another name for ``k``)."""
        return Sampler(SamplerKind.TOP_K, temperature, k=k if top_k is None else top_k, seed=seed)

    @staticmethod
    def min_p(temperature: float = 0.6, p: float = 0.1, *, min_p: float | None = None, seed: int = 0) -> Sampler:
        """Keep tokens whose probability is at least ``p`` times the top token's."""
        return Sampler(SamplerKind.MIN_P, temperature, min_prob=p if min_p is None else min_p, seed=seed)

    @staticmethod
    def top_k_top_p(
        temperature: float = 0.6,
        k: int = 40,
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

    @staticmethod
    def dist(temperature: float = 1.0, seed: int = 0) -> Sampler:
        """The full distribution at the row, and one token drawn from it.

        With ``h = fwd.sample([i], Sampler.dist(t, seed))``, ``out.distribution(h)`` gives
        ``(ids, probs)`` of ``softmax(logits / t)`` over the whole vocabulary (after any logit
        mask; most probable first, lower id first on ties), and ``out.token(h)`` one token
        drawn from that same distribution (``seed`` 0: fresh randomness; any other seed:
        reproducible). ``t = 0`` gives the one-hot distribution at the argmax and the argmax.
        In ``ctx.generate(Sampler.dist(...))`` the draw is the accepted token and
        ``out.distribution(out.auto_sampler)`` the distribution of each step.

        The lists are ``vocab_size`` long; when the top few entries suffice, probe with
        ``Distribution(temperature, k)`` instead.
        """
        return Sampler(SamplerKind.MULTINOMIAL, temperature, seed=seed, output="distribution")

    @staticmethod
    def embedding() -> Sampler:
        """The row's embedding instead of a token.

        With ``h = fwd.sample([i], Sampler.embedding())``, ``out.embedding(h)`` gives the
        final hidden state at row ``i`` (after the model's final norm, before the output
        layer; ``hidden_size`` floats) and ``out.token(h)`` is None: no token is drawn, so a
        generator refuses this sampler. Same as ``fwd.probe(i, Embedding())``. Needs a backend
        with the ``"embeddings"`` feature; others raise Unsupported.
        """
        return Sampler(SamplerKind.ARGMAX, temperature=0.0, output="embedding")

    @property
    def draws_tokens(self) -> bool:
        """Whether the sampled row yields tokens (all samplers but :meth:`embedding`)."""
        return self.output != "embedding"

    def probe_spec(self, index: int, masked_by: int = -1) -> ProbeSpec | None:
        """The probe this sampler reads at input row ``index`` besides its tokens, if any.

        Args:
            index: The input row.
            masked_by: Index of the pass's sample row whose logit mask the probe sees.
        """
        if self.output == "distribution":
            return ProbeSpec(index, ProbeKind.DISTRIBUTION, temperature=self.temperature, k=0, masked_by=masked_by)
        if self.output == "embedding":
            return ProbeSpec(index, ProbeKind.EMBEDDING)
        return None

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
