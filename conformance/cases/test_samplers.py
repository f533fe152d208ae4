"""Every sampler against its definition, on the backend's own logits.

The definitions (``pie_core.hookspec.SamplerKind``) are written out here, not imported from a
backend: ``p = softmax(logits / T)``; TOP_K keeps the ``k`` most probable, TOP_P the smallest
most-probable-first set reaching ``p``, MIN_P every token with ``p >= min_p * max(p)``,
TOP_K_TOP_P the nucleus inside the renormalised top ``k``, MULTINOMIAL everything; a cut inside
a group of equal probabilities keeps the lower ids, and argmax is the lowest id of the maxima.

Argmax is checked exactly; stochastic samplers by their support (a drawn token outside it
fails at once) and a chi-square test over 2,000 seeded rows, at two temperatures (0.7 and 1.5
times one that spreads the tiny model's distribution, so never 1 by construction), with
parameters placed halfway between the distribution's own steps so that a sampler keeping one
token too many or too few cannot pass by luck. Exact ties come from twin tokens
(:mod:`conformance.ties`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pie_core.hookspec import SamplerKind
from pie_core.scheduler.request import SampleSpec

from conformance.batches import kv_request
from conformance.harness import Harness
from conformance.loaded import LoadedModel, not_supported
from conformance.ties import tie_at_rank

SURFACE = "samplers"

DRAWS = 2000
_Z = 3.72  # upper 1e-4 point of the normal: a correct sampler fails about once in 10,000 runs
_STOCHASTIC = [k for k in SamplerKind if k != SamplerKind.ARGMAX]


def _softmax(z: np.ndarray, t: float) -> np.ndarray:
    e = np.exp(z / t - np.max(z / t))
    return e / e.sum()


def _chi2_critical(df: int) -> float:
    """Upper 1e-4 point of chi-square with ``df`` degrees of freedom (Wilson-Hilferty)."""
    return float(df * (1 - 2 / (9 * df) + _Z * np.sqrt(2 / (9 * df))) ** 3)


def _prompt_logits(model: LoadedModel, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A prompt and the backend's own float64 logits at its last row."""
    prompt = rng.integers(0, model.vocab, 7)
    run = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size)])
    return prompt, model.own_logits(run)[0][-1].astype(np.float64)


def _draw(model: LoadedModel, prompt: np.ndarray, spec: dict[str, Any], seeds: range) -> np.ndarray:
    """One token per seed from the last prompt row, in batches within ``max_sample_rows``."""
    out: list[int] = []
    seeds_list = list(seeds)
    step = max(1, min(len(seeds_list), model.caps.max_sample_rows))
    for i in range(0, len(seeds_list), step):
        samples = tuple(SampleSpec(index=len(prompt) - 1, seed=s, **spec) for s in seeds_list[i : i + step])
        run = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size, samples=samples)], observe=False)
        out.extend(row[0] for row in run.samples[0])
    return np.asarray(out)


def _spread_temperature(logits: np.ndarray) -> float:
    """A temperature at which the top few tokens all have sizeable probability."""
    top = np.sort(logits)[::-1][:8]
    return float(max(0.5, (top[0] - top[7]) / 3.0))


def _support_and_params(kind: SamplerKind, p: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Parameters for ``kind`` whose support is unambiguous on ``p``, and that support (ids)."""
    order = np.lexsort((np.arange(len(p)), -p))
    ps = p[order]
    if kind == SamplerKind.TOP_K:
        return order[:4], {"top_k": 4}
    if kind == SamplerKind.TOP_P:
        cum = np.cumsum(ps)
        return order[:4], {"top_p": float((cum[2] + cum[3]) / 2)}
    if kind == SamplerKind.MIN_P:
        ratio = ps / ps[0]
        return order[:4], {"min_p": float((ratio[3] + ratio[4]) / 2)}
    if kind == SamplerKind.TOP_K_TOP_P:
        cum = np.cumsum(ps[:6] / ps[:6].sum())
        return order[:3], {"top_k": 6, "top_p": float((cum[1] + cum[2]) / 2)}
    if kind == SamplerKind.MULTINOMIAL:
        return np.flatnonzero(p > 0), {}
    raise KeyError(kind)


def test_argmax_picks_the_highest_logit(model: LoadedModel, rng: np.random.Generator) -> None:
    prompt = rng.integers(0, model.vocab, 9)
    samples = tuple(SampleSpec(index=i, kind=SamplerKind.ARGMAX) for i in range(len(prompt)))
    run = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size, samples=samples)])
    logits = model.own_logits(run)[0]
    got = np.array([row[0] for row in run.samples[0]])
    want = np.argmax(logits, axis=1)
    assert np.array_equal(got, want), f"argmax drew {got.tolist()}; the highest logits are at {want.tolist()}"


@pytest.mark.parametrize("kind", list(SamplerKind), ids=lambda k: k.name.lower())
def test_zero_temperature_is_greedy(model: LoadedModel, rng: np.random.Generator, kind: SamplerKind) -> None:
    prompt, logits = _prompt_logits(model, rng)
    spec = {"kind": kind, "temperature": 0.0, "top_k": 5, "top_p": 0.5, "min_p": 0.1}
    drawn = _draw(model, prompt, spec, range(1, 17))
    best = int(np.argmax(logits))
    assert (drawn == best).all(), f"{kind.name} at temperature 0 drew {sorted(set(drawn.tolist()))}, not argmax {best}"


@pytest.mark.parametrize("kind", _STOCHASTIC, ids=lambda k: k.name.lower())
def test_seeded_rows_repeat(model: LoadedModel, rng: np.random.Generator, kind: SamplerKind) -> None:
    prompt, logits = _prompt_logits(model, rng)
    spec = {"kind": kind, "temperature": _spread_temperature(logits), "top_k": 8, "top_p": 0.95, "min_p": 0.01}
    first = _draw(model, prompt, spec, range(500, 564))
    again = _draw(model, prompt, spec, range(500, 564))
    assert np.array_equal(first, again), f"{kind.name}: the same seeds drew different tokens in a second pass"
    assert len(set(first.tolist())) > 1, f"{kind.name}: 64 different seeds all drew token {first[0]}"


def _assert_frequencies(drawn: np.ndarray, p: np.ndarray, support: np.ndarray, what: str) -> None:
    """``drawn`` stays inside ``support`` and follows ``p`` renormalised on it (chi-square)."""
    outside = sorted(set(drawn.tolist()) - set(support.tolist()))
    assert not outside, f"{what} drew {outside}, outside its support {sorted(support.tolist())[:10]}"
    q = np.zeros_like(p)
    q[support] = p[support] / p[support].sum()
    counts = np.bincount(drawn, minlength=len(p))
    expected = q * len(drawn)
    big = expected >= 5  # pool small expected counts into one bin, as the test requires
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    if df < 1:
        not_supported("the distribution is too peaked for a frequency test")
    assert stat < _chi2_critical(df), (
        f"{what}: frequencies of {len(drawn)} draws fail chi-square ({stat:.1f} >= {_chi2_critical(df):.1f} with {df} df)"
    )


@pytest.mark.parametrize("scale", [0.7, 1.5], ids=["cooler", "warmer"])
@pytest.mark.parametrize("kind", _STOCHASTIC, ids=lambda k: k.name.lower())
def test_sampler_frequencies_match_the_definition(
    model: LoadedModel, rng: np.random.Generator, kind: SamplerKind, scale: float
) -> None:
    prompt, logits = _prompt_logits(model, rng)
    temperature = scale * _spread_temperature(logits)
    p = _softmax(logits, temperature)
    support, params = _support_and_params(kind, p)
    drawn = _draw(model, prompt, {"kind": kind, "temperature": temperature, **params}, range(1, DRAWS + 1))
    _assert_frequencies(drawn, p, support, f"{kind.name} {params} at temperature {temperature:.3g}")


def test_argmax_of_tied_maxima_is_the_lower_id(pie_conformance: Harness, rng: np.random.Generator) -> None:
    tie = tie_at_rank(pie_conformance, rng, rank=0)
    row = len(tie.prompt) - 1
    samples = (SampleSpec(index=row, kind=SamplerKind.ARGMAX),) + tuple(
        SampleSpec(index=row, kind=kind, temperature=0.0, top_k=3, top_p=0.5) for kind in _STOCHASTIC
    )
    run = tie.model.run([tie.request(samples=samples)], observe=False)
    got = [r[0] for r in run.samples[0]]
    assert got == [tie.low] * len(samples), (
        f"tokens {tie.low} and {tie.high} tie for the highest logit; argmax and temperature 0 drew {got}, "
        f"the lower id {tie.low} each time expected"
    )


@pytest.mark.parametrize("kind", [SamplerKind.TOP_K, SamplerKind.TOP_P], ids=["top_k", "top_p"])
def test_a_cut_inside_tied_tokens_keeps_the_lower_id(
    pie_conformance: Harness, rng: np.random.Generator, kind: SamplerKind
) -> None:
    tie = tie_at_rank(pie_conformance, rng, rank=3)  # the twins are the 4th and 5th most probable
    temperature = 1.5 * _spread_temperature(tie.logits)
    p = _softmax(tie.logits, temperature)
    order = np.lexsort((np.arange(len(p)), -p))
    assert order[3] == tie.low and order[4] == tie.high and p[tie.low] == p[tie.high]
    cum = np.cumsum(p[order])
    params = {"top_k": 4} if kind == SamplerKind.TOP_K else {"top_p": float((cum[2] + cum[3]) / 2)}
    model = tie.model
    drawn = _draw(model, tie.prompt, {"kind": kind, "temperature": temperature, **params}, range(1, DRAWS + 1))
    what = f"{kind.name} {params} at temperature {temperature:.3g} with {tie.low} and {tie.high} tied 4th"
    assert tie.high not in drawn, f"{what}: drew {tie.high}; the cut keeps the lower id {tie.low}"
    _assert_frequencies(drawn, p, order[:4], what)


def test_one_token_supports_are_greedy(model: LoadedModel, rng: np.random.Generator) -> None:
    prompt, logits = _prompt_logits(model, rng)
    best = int(np.argmax(logits))
    t = _spread_temperature(logits)
    supports: dict[str, dict[str, Any]] = {
        "top_k=1": {"kind": SamplerKind.TOP_K, "top_k": 1},
        "top_p=1e-6": {"kind": SamplerKind.TOP_P, "top_p": 1e-6},
        "min_p=1": {"kind": SamplerKind.MIN_P, "min_p": 1.0},
    }
    for name, spec in supports.items():
        drawn = _draw(model, prompt, {"temperature": t, **spec}, range(1, 33))
        assert (drawn == best).all(), f"{name} drew {sorted(set(drawn.tolist()))}; its only token is {best}"


def test_multinomial_draws_fill_their_rows_in_order(model: LoadedModel, rng: np.random.Generator) -> None:
    prompt, logits = _prompt_logits(model, rng)
    t = _spread_temperature(logits)
    samples = (
        SampleSpec(index=6, kind=SamplerKind.MULTINOMIAL, temperature=t, draws=5, seed=11),
        SampleSpec(index=6, kind=SamplerKind.ARGMAX),
        SampleSpec(index=6, kind=SamplerKind.MULTINOMIAL, temperature=t, draws=3, seed=11),
    )
    run = model.run([kv_request(prompt, model.pages_for(len(prompt)), model.page_size, samples=samples)], observe=False)
    five, one, three = run.samples[0]
    assert len(five) == 5 and len(three) == 3, "each multinomial row owns `draws` consecutive tokens"
    assert one == (int(np.argmax(logits)),), f"the argmax row between two multinomial rows drew {one}"
    assert all(0 <= t < model.vocab for t in five + three), f"multinomial drew ids outside the vocabulary: {five}"
