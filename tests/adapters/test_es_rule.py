"""The zo update rule (pie_core.adapters.es), computed by hand for small generations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pie_core.adapters.es import ZoState, step
from pie_core.errors import InvalidInput


def _state(**kw) -> ZoState:
    return ZoState(**{"population_size": 4, "mu_fraction": 0.5, "sigma": 0.1, **kw})


def test_the_mean_moves_toward_the_best_mu_with_log_rank_weights():
    move = step(_state(), [0.2, 0.9, 0.1, 0.5], [11, 22, 33, 44], max_sigma=1.0)
    # mu = 2: seeds 22 (best) then 44; weights ln(2.5) - ln(1), ln(2.5) - ln(2), normalised
    w = np.array([math.log(2.5), math.log(2.5) - math.log(2)])
    w /= w.sum()
    assert move.seeds.tolist() == [22, 44]
    np.testing.assert_allclose(move.coefficients, 0.1 * w, rtol=1e-6)
    assert move.sigma == 0.1  # the first generation keeps sigma
    assert move.median == pytest.approx(0.35)


def test_sigma_grows_when_candidates_beat_the_last_median_and_shrinks_otherwise():
    up = step(_state(last_median=0.0), [1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], max_sigma=1.0)
    assert up.sigma == pytest.approx(0.1 * math.exp(0.5 * 2 / 3))
    down = step(_state(last_median=10.0), [1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], max_sigma=1.0)
    assert down.sigma == pytest.approx(0.1 * math.exp(-0.5 * 2 / 3))
    half = step(_state(last_median=2.5), [1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], max_sigma=1.0)
    assert half.sigma == pytest.approx(0.1)
    capped = step(_state(sigma=0.9, last_median=0.0), [1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], max_sigma=1.0)
    assert capped.sigma == 1.0


def test_equal_scores_leave_the_mean_and_widen_sigma_up_to_the_cap():
    flat = step(_state(last_median=3.0), [3.0] * 4, [1, 2, 3, 4], max_sigma=1.0)
    assert flat.seeds.size == 0 and flat.coefficients.size == 0
    assert flat.sigma == pytest.approx(0.1 * math.exp(1 / 3))
    assert step(_state(sigma=0.5), [3.0] * 4, [1, 2, 3, 4], max_sigma=0.6).sigma == 0.6


def test_mu_is_at_least_one_and_ties_keep_candidate_order():
    move = step(_state(mu_fraction=0.1), [1.0, 5.0, 5.0, 0.0], [7, 8, 9, 10], max_sigma=1.0)
    assert move.seeds.tolist() == [8]
    np.testing.assert_allclose(move.coefficients, [0.1])


@pytest.mark.parametrize(
    "scores,seeds,max_sigma",
    [
        ([1.0, 2.0], [1], 1.0),
        ([], [], 1.0),
        ([1.0, float("nan")], [1, 2], 1.0),
        ([1.0, 2.0], [0, 2], 1.0),
        ([1.0, 2.0], [3, 3], 1.0),
        ([1.0, 2.0], [1, 1 << 63], 1.0),
        ([1.0, 2.0], [1, 2], 0.0),
        ([1.0, 2.0], [1, 2], float("inf")),
        (["a", 2.0], [1, 2], 1.0),
    ],
)
def test_bad_updates_are_refused(scores, seeds, max_sigma):
    with pytest.raises(InvalidInput):
        step(_state(), scores, seeds, max_sigma)
