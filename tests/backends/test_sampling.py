"""Reference semantics of samplers and probes (``pie_core.backend_kit.sampling``), on hand-made logits.

Batches are assembled as the core does; the logits are chosen by the test, so every expected
support set and probability is known exactly. Expected values are written out here (``_softmax``
below), never taken from the module under test, and the distributions are checked at
temperatures 0.7 and 1.5 as well as 1. Ties follow the contract's rule: the lower id wins.
"""

from __future__ import annotations

import numpy as np
import pytest

from pie_core.hookspec import ProbeKind, SamplerKind
from pie_core.backend_kit.sampling import logit_rows, sample_and_probe
from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.request import ForwardRequest, ProbeSpec, SampleSpec

VOCAB = 12
# Probabilities 0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02 and five tiny ones (sum 1 after softmax).
PROBS = np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02] + [1e-9] * 5)
LOGITS = np.log(PROBS / PROBS.sum()).astype(np.float32)
PERM = np.random.default_rng(0).permutation(VOCAB)  # scatter the ranks over the ids
SCATTERED = np.empty(VOCAB, np.float32)
SCATTERED[PERM] = LOGITS  # id PERM[r] has rank r
RANK = lambda *ranks: set(PERM[list(ranks)].tolist())  # noqa: E731


def _softmax(z: np.ndarray, t: float = 1.0) -> np.ndarray:
    """softmax(z / t) in float64, written out rather than taken from the module under test."""
    e = np.exp((np.asarray(z, np.float64) - np.max(z)) / t)
    return e / e.sum()


def _forward(samples=(), probes=(), logits=SCATTERED, seed_rng=0):
    """Run one request (one token) with the given samples/probes on ``logits``."""
    req = ForwardRequest(
        token_ids=np.zeros(1, np.int32),
        positions=np.zeros(1, np.int32),
        page_ids=np.zeros(1, np.int32),
        last_page_len=1,
        write_slots=np.zeros(1, np.int32),
        samples=tuple(samples),
        probes=tuple(probes),
    )
    batch = assemble([req], VOCAB)
    rows = logit_rows(batch)
    return sample_and_probe(batch, rows, np.tile(logits, (len(rows), 1)), np.random.default_rng(seed_rng))


def _draw_set(spec: SampleSpec, draws: int = 4000, logits: np.ndarray = SCATTERED) -> tuple[set[int], np.ndarray]:
    spec = SampleSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__}, "draws": draws})
    tokens = _forward([spec], logits=logits).tokens
    assert len(tokens) == draws
    return set(tokens.tolist()), tokens


def _mask(allowed: set[int]) -> np.ndarray:
    bits = np.zeros(VOCAB, bool)
    bits[list(allowed)] = True
    return np.packbits(bits, bitorder="little")


def test_argmax_picks_the_highest_logit():
    out = _forward([SampleSpec(index=0, kind=SamplerKind.ARGMAX)])
    assert out.tokens.tolist() == [int(PERM[0])]


@pytest.mark.parametrize("kind", list(SamplerKind))
def test_temperature_zero_is_argmax_for_every_sampler(kind):
    spec = SampleSpec(index=0, kind=kind, temperature=0.0, top_k=3, top_p=0.5, min_p=0.1, draws=5)
    assert _forward([spec]).tokens.tolist() == [int(PERM[0])] * 5


def test_top_k_draws_only_the_k_most_probable():
    seen, _ = _draw_set(SampleSpec(index=0, kind=SamplerKind.TOP_K, top_k=3, seed=1))
    assert seen == RANK(0, 1, 2)


@pytest.mark.parametrize(
    "top_p, ranks", [(0.64, (0, 1)), (0.66, (0, 1, 2)), (0.0, (0,)), (1.0, tuple(range(7)))]
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, ranks):
    seen, _ = _draw_set(SampleSpec(index=0, kind=SamplerKind.TOP_P, top_p=top_p, seed=2), draws=20000)
    # Ranks 7+ have probability 1e-9: never drawn in practice even when kept.
    assert seen == RANK(*ranks)


@pytest.mark.parametrize("min_p, ranks", [(0.3, (0, 1, 2)), (0.2, (0, 1, 2, 3)), (1.0, (0,))])
def test_min_p_keeps_tokens_above_the_scaled_maximum(min_p, ranks):
    seen, _ = _draw_set(SampleSpec(index=0, kind=SamplerKind.MIN_P, min_p=min_p, seed=3), draws=20000)
    assert seen == RANK(*ranks)


def test_top_k_top_p_renormalises_inside_the_top_k():
    # Top 3 renormalised: 0.4/0.8, 0.25/0.8, 0.15/0.8 = 0.5, 0.3125, 0.1875 (cumulative 0.5,
    # 0.8125, 1). p=0.85 needs all three, whereas nucleus 0.85 over the full distribution
    # would need four; p=0.8 needs two, p=0.45 one.
    for top_p, ranks in ((0.85, (0, 1, 2)), (0.8, (0, 1)), (0.45, (0,))):
        spec = SampleSpec(index=0, kind=SamplerKind.TOP_K_TOP_P, top_k=3, top_p=top_p, seed=4)
        assert _draw_set(spec)[0] == RANK(*ranks)
    full = SampleSpec(index=0, kind=SamplerKind.TOP_P, top_p=0.85, seed=4)
    assert _draw_set(full, draws=20000)[0] == RANK(0, 1, 2, 3)


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_multinomial_frequencies_follow_the_tempered_distribution(temperature):
    draws = 40000
    _, tokens = _draw_set(SampleSpec(index=0, kind=SamplerKind.MULTINOMIAL, temperature=temperature, seed=5), draws)
    p = _softmax(SCATTERED, temperature)
    freq = np.bincount(tokens, minlength=VOCAB) / draws
    sigma = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-6), (freq, p)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_filtered_samplers_draw_in_proportion_inside_the_support(temperature):
    draws = 40000
    spec = SampleSpec(index=0, kind=SamplerKind.TOP_K, top_k=2, temperature=temperature, seed=6)
    _, tokens = _draw_set(spec, draws)
    share = np.mean(tokens == PERM[0])
    expected = 0.4 ** (1 / temperature) / (0.4 ** (1 / temperature) + 0.25 ** (1 / temperature))
    assert abs(share - expected) <= 5 * np.sqrt(expected * (1 - expected) / draws)


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    spec = SampleSpec(index=0, kind=SamplerKind.MULTINOMIAL, draws=64, seed=99)
    first = _forward([spec], seed_rng=1).tokens
    again = _forward([spec], seed_rng=2).tokens
    other = _forward([SampleSpec(index=0, kind=SamplerKind.MULTINOMIAL, draws=64, seed=100)]).tokens
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_seed_zero_takes_fresh_randomness():
    spec = SampleSpec(index=0, kind=SamplerKind.MULTINOMIAL, draws=64, seed=0)
    assert not np.array_equal(_forward([spec], seed_rng=1).tokens, _forward([spec], seed_rng=2).tokens)


@pytest.mark.parametrize("kind", list(SamplerKind))
def test_logit_mask_is_honoured_by_every_sampler(kind):
    allowed = RANK(3, 5, 9)  # excludes the argmax
    spec = SampleSpec(
        index=0, kind=kind, top_k=2, top_p=0.9, min_p=0.05, draws=500, seed=7, logit_mask=_mask(allowed)
    )
    tokens = set(_forward([spec]).tokens.tolist())
    assert tokens <= allowed
    if kind == SamplerKind.ARGMAX:
        assert tokens == RANK(3)


def test_mask_allowing_nothing_is_an_error():
    with pytest.raises(ValueError, match="allows no token"):
        _forward([SampleSpec(index=0, logit_mask=_mask(set()))])


def test_rows_draw_their_own_counts_in_row_order():
    out = _forward(
        [
            SampleSpec(index=0, kind=SamplerKind.ARGMAX, draws=2),
            SampleSpec(index=0, kind=SamplerKind.MULTINOMIAL, draws=3, seed=1, logit_mask=_mask({4})),
        ]
    )
    assert out.tokens.tolist() == [int(PERM[0])] * 2 + [4] * 3


def test_distribution_probe_is_the_tempered_softmax_top_k():
    out = _forward(
        probes=[
            ProbeSpec(index=0, kind=ProbeKind.DISTRIBUTION, temperature=0.5, k=4),
            ProbeSpec(index=0, kind=ProbeKind.DISTRIBUTION, temperature=1.0, k=0),
        ]
    )
    p = _softmax(SCATTERED, 0.5)
    ids, probs = out.probes[0]
    assert ids.tolist() == PERM[:4].tolist()
    np.testing.assert_allclose(probs, p[PERM[:4]], rtol=1e-6)
    ids, probs = out.probes[1]
    assert sorted(ids.tolist()) == list(range(VOCAB)) and np.all(np.diff(probs) <= 0)
    assert abs(float(probs.sum()) - 1.0) < 1e-6
    np.testing.assert_allclose(probs, _softmax(SCATTERED)[ids], rtol=1e-6)


def test_logprobs_probe_is_log_softmax_at_the_ids_in_order():
    ids = (5, 0, 11, 5)
    out = _forward(probes=[ProbeSpec(index=0, kind=ProbeKind.LOGPROBS, token_ids=ids)])
    ref = np.log(_softmax(SCATTERED))[list(ids)]
    np.testing.assert_allclose(out.probes[0], ref, rtol=1e-6)


def test_entropy_probe():
    out = _forward(probes=[ProbeSpec(index=0, kind=ProbeKind.ENTROPY)])
    p = _softmax(SCATTERED)
    assert out.probes[0] == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-9)
    flat = _forward(probes=[ProbeSpec(index=0, kind=ProbeKind.ENTROPY)], logits=np.zeros(VOCAB, np.float32))
    assert flat.probes[0] == pytest.approx(np.log(VOCAB))


def test_probes_see_the_logit_mask_of_their_sample_row():
    allowed = RANK(1, 2)
    samples = [SampleSpec(index=0, logit_mask=_mask(allowed))]
    probes = [
        ProbeSpec(index=0, kind=ProbeKind.LOGITS, masked_by=0),
        ProbeSpec(index=0, kind=ProbeKind.LOGITS),
        ProbeSpec(index=0, kind=ProbeKind.DISTRIBUTION, k=3, masked_by=0),
        ProbeSpec(index=0, kind=ProbeKind.ENTROPY, masked_by=0),
    ]
    out = _forward(samples, probes)
    masked, raw, (ids, probs), entropy = out.probes
    assert set(np.flatnonzero(np.isfinite(masked)).tolist()) == allowed
    np.testing.assert_array_equal(raw, SCATTERED)
    assert ids[:2].tolist() == PERM[1:3].tolist() and probs[2] == 0.0
    np.testing.assert_allclose(probs[:2], [0.25 / 0.4, 0.15 / 0.4], rtol=1e-6)
    q = np.array([0.625, 0.375])
    assert entropy == pytest.approx(float(-(q * np.log(q)).sum()), rel=1e-6)


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_top_p_support_follows_the_tempered_distribution(temperature):
    p = _softmax(SCATTERED, temperature)
    ranked = np.cumsum(np.sort(p)[::-1])  # rank r's cumulative probability
    top_p = float((ranked[2] + ranked[3]) / 2)  # halfway between 3 and 4 tokens: exactly 4 kept
    seen, _ = _draw_set(SampleSpec(index=0, kind=SamplerKind.TOP_P, temperature=temperature, top_p=top_p, seed=8), 20000)
    assert seen == RANK(0, 1, 2, 3)


# Ids 1, 3 and 4 tie for the highest logit, ids 2 and 5 for the next.
TIED = np.array([0.0, 3.0, 2.0, 3.0, 3.0, 2.0, -1.0, -1.0, -2.0, -2.0, -3.0, -3.0], np.float32)


def test_argmax_of_tied_maxima_is_the_lowest_id():
    samples = [SampleSpec(index=0, kind=SamplerKind.ARGMAX), SampleSpec(index=0, kind=SamplerKind.TOP_K, temperature=0.0)]
    assert _forward(samples, logits=TIED).tokens.tolist() == [1, 1]


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_cuts_inside_tied_tokens_keep_the_lower_ids(temperature):
    p = _softmax(TIED, temperature)
    cut_in_ties = {
        "top_k=2": {"kind": SamplerKind.TOP_K, "top_k": 2},  # two of the three maxima: 1 and 3
        "top_p": {"kind": SamplerKind.TOP_P, "top_p": float(p[1] * 1.5)},  # reached by the second maximum
        "top_k=4 then top_p": {"kind": SamplerKind.TOP_K_TOP_P, "top_k": 4, "top_p": 1.0},  # 1, 3, 4 and 2 (not 5)
    }
    want = {"top_k=2": {1, 3}, "top_p": {1, 3}, "top_k=4 then top_p": {1, 2, 3, 4}}
    for name, params in cut_in_ties.items():
        seen, tokens = _draw_set(SampleSpec(index=0, temperature=temperature, seed=9, **params), 20000, TIED)
        assert seen == want[name], f"{name} at temperature {temperature} drew {sorted(seen)}"
        if name == "top_k=2":  # the two kept maxima are equally likely
            share = np.mean(tokens == 1)
            assert abs(share - 0.5) <= 5 * np.sqrt(0.25 / len(tokens))


def test_distribution_lists_tied_probabilities_lower_id_first():
    out = _forward(
        probes=[
            ProbeSpec(index=0, kind=ProbeKind.DISTRIBUTION, temperature=0.7, k=2),
            ProbeSpec(index=0, kind=ProbeKind.DISTRIBUTION, temperature=1.5, k=5),
            ProbeSpec(index=0, kind=ProbeKind.DISTRIBUTION, temperature=0.0, k=3),
        ],
        logits=TIED,
    )
    (ids_a, probs_a), (ids_b, probs_b), (ids_c, probs_c) = out.probes
    assert ids_a.tolist() == [1, 3]
    assert ids_b.tolist() == [1, 3, 4, 2, 5]
    np.testing.assert_allclose(probs_b, _softmax(TIED, 1.5)[[1, 3, 4, 2, 5]], rtol=1e-6)
    assert ids_c.tolist() == [1, 0, 2] and probs_c.tolist() == [1.0, 0.0, 0.0]  # one-hot, then zeros by id
