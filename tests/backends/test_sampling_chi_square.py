"""Every sampler's empirical frequencies over 2,000 seeded draws pass a chi-square test against
the distribution its definition gives, and seeded draws repeat exactly."""

from __future__ import annotations

import numpy as np
import pytest

from pie_core.hookspec import SamplerKind
from pie_core.scheduler.request import SampleSpec
from test_sampling import PERM, PROBS, VOCAB, _draw_set

DRAWS = 2000
P = PROBS / PROBS.sum()  # by rank


def _restricted(ranks: list[int]) -> np.ndarray:
    q = np.zeros(VOCAB)
    q[ranks] = P[ranks] / P[ranks].sum()
    return q


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square (Wilson-Hilferty), so a correct sampler fails ~1 in 1000."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


CASES = {
    "top_k": (SampleSpec(0, SamplerKind.TOP_K, 1.0, top_k=3), _restricted([0, 1, 2])),
    "top_p": (SampleSpec(0, SamplerKind.TOP_P, 1.0, top_p=0.7), _restricted([0, 1, 2])),
    "min_p": (SampleSpec(0, SamplerKind.MIN_P, 1.0, min_p=0.2), _restricted([0, 1, 2, 3])),
    "top_k_top_p": (SampleSpec(0, SamplerKind.TOP_K_TOP_P, 1.0, top_k=4, top_p=0.7), _restricted([0, 1])),
    "multinomial": (SampleSpec(0, SamplerKind.MULTINOMIAL, 1.0), P),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampler_frequencies_pass_chi_square(name):
    spec, expected_by_rank = CASES[name]
    spec = SampleSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__}, "seed": 1234})
    _, tokens = _draw_set(spec, DRAWS)
    counts_by_rank = np.bincount(np.argsort(PERM)[tokens], minlength=VOCAB)
    expected = expected_by_rank * DRAWS
    assert counts_by_rank[expected == 0].sum() == 0, "drew a token outside the sampler's support"
    big = expected >= 5  # pool small expected counts into one bin, as the test requires
    obs = np.append(counts_by_rank[big], counts_by_rank[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    assert stat < _chi2_critical(df), f"{name}: chi2 {stat:.1f} with {df} df"


@pytest.mark.parametrize("name", sorted(CASES))
def test_seeded_draws_repeat_exactly(name):
    spec = SampleSpec(**{**{f: getattr(CASES[name][0], f) for f in SampleSpec.__dataclass_fields__}, "seed": 99})
    assert np.array_equal(_draw_set(spec, 200)[1], _draw_set(spec, 200)[1])
