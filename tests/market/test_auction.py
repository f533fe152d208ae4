"""The knapsack auction: an exact optimum on small cases, the clearing price, never over capacity."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pie_core.scheduler.auction import clear, knapsack


def _brute(weights, values, capacity):
    best, choice = 0.0, ()
    for r in range(len(weights) + 1):
        for combo in itertools.combinations(range(len(weights)), r):
            w = sum(weights[i] for i in combo)
            v = sum(values[i] for i in combo)
            if w <= capacity and v > best + 1e-12:
                best, choice = v, combo
    return best, choice


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 12), st.floats(0, 10, allow_nan=False)), min_size=0, max_size=7),
    st.integers(0, 30),
)
def test_knapsack_matches_brute_force(items, capacity):
    weights = [w for w, _ in items]
    values = [v for _, v in items]
    chosen = knapsack(np.array(weights, dtype=np.int64), np.array(values), capacity)
    total_w = sum(w for w, c in zip(weights, chosen) if c)
    total_v = sum(v for v, c in zip(values, chosen) if c)
    best, _ = _brute(weights, values, capacity)
    assert total_w <= capacity
    assert abs(total_v - best) <= 1e-9 * max(1.0, best)
    assert not any(c and v <= 0 for v, c in zip(values, chosen))


def test_knapsack_prefers_value_over_greed():
    # Greedy by bid would take the 0.9 item (weight 6) and fit nothing else; the optimum takes two.
    chosen = knapsack(np.array([6, 5, 5]), np.array([0.9 * 6, 0.8 * 5, 0.8 * 5]), 10)
    assert chosen.tolist() == [False, True, True]


def test_large_capacity_counts_in_groups_and_never_overfills():
    rng = np.random.default_rng(0)
    weights = rng.integers(1, 3000, 40)
    values = rng.random(40) * weights
    capacity = 50_000
    chosen = knapsack(weights, values, capacity)
    assert weights[chosen].sum() <= capacity
    greedy, room = 0.0, capacity  # by value per page, while items fit
    for i in np.argsort(-values / weights):
        if weights[i] <= room:
            greedy, room = greedy + values[i], room - weights[i]
    assert values[chosen].sum() >= 0.95 * greedy


def test_clearing_price_is_the_highest_excluded_bid():
    winners, price = clear(np.array([3.0, 2.0, 1.0]), np.array([4, 4, 4]), 8)
    assert winners.tolist() == [True, True, False] and price == 1.0
    winners, price = clear(np.array([3.0, 2.0, 1.0]), np.array([4, 4, 4]), 12)
    assert winners.all() and price == 0.0


def test_zero_bids_never_win_and_set_no_price():
    winners, price = clear(np.array([0.0, 1.0]), np.array([2, 2]), 4)
    assert winners.tolist() == [False, True] and price == 0.0


def test_tiebreak_decides_equal_offers_only():
    winners, _ = clear(np.array([1.0, 1.0]), np.array([4, 4]), 4, tiebreak=np.array([0.0, 2.0]))
    assert winners.tolist() == [False, True]
    winners, _ = clear(np.array([1.0, 1.1]), np.array([4, 4]), 4, tiebreak=np.array([2.0, 0.0]))
    assert winners.tolist() == [False, True]


def test_clearing_price_with_several_excluded_is_the_highest_of_them():
    winners, price = clear(np.array([5.0, 3.0, 2.0, 1.0]), np.array([4, 4, 4, 4]), 4)
    assert winners.tolist() == [True, False, False, False] and price == 3.0
