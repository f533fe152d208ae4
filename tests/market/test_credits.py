"""Credits: endowments bounded per user, make cost burned, rent returned as dividends, conserved."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pie_core.scheduler.credits import PRICE, Ledger


def _assert_conserved(ledger: Ledger) -> None:
    held, expected = ledger.conserved()
    assert held == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_endowment_then_make_cost():
    ledger = Ledger(100.0)
    w = ledger.join("a", "alice")
    assert w.balance == 100.0 and ledger.join("a", "alice") is w
    ledger.burn(w, 3)
    assert w.balance == 100.0 - 3 * PRICE
    _assert_conserved(ledger)


def test_rent_goes_back_as_dividends_by_endowment():
    ledger = Ledger(100.0, budget_of=lambda user: 150.0 if user == "bob" else None)
    a, b = ledger.join("a", "alice"), ledger.join("b", "bob")
    b2 = ledger.join("b2", "bob")  # bob's budget has 50 left
    assert (a.endowment, b.endowment, b2.endowment) == (100.0, 100.0, 50.0)
    ledger.rent([(a, 25.0)])
    assert a.dividend == pytest.approx(10.0) and b.dividend == pytest.approx(10.0) and b2.dividend == pytest.approx(5.0)
    assert a.balance == pytest.approx(85.0) and b.balance == pytest.approx(110.0)
    _assert_conserved(ledger)


def test_a_user_at_its_budget_gets_nothing_more():
    ledger = Ledger(100.0, budget_of=lambda user: 100.0)
    ledger.join("a", "alice")
    assert ledger.join("b", "alice").endowment == 0.0
    ledger.retire("a")
    assert ledger.join("c", "alice").endowment == 100.0  # the retired one's endowment came back


def test_retired_wallets_pay_and_receive_nothing():
    ledger = Ledger(10.0)
    a, b = ledger.join("a", "u"), ledger.join("b", "v")
    ledger.retire("a")
    ledger.burn(a, 5)
    ledger.rent([(a, 3.0), (b, 1.0)])
    assert a.balance == 10.0 and b.balance == pytest.approx(10.0)
    _assert_conserved(ledger)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.integers(0, 5), st.integers(0, 2)),
        st.tuples(st.just("retire"), st.integers(0, 5)),
        st.tuples(st.just("burn"), st.integers(0, 5), st.integers(0, 40)),
        st.tuples(st.just("rent"), st.lists(st.tuples(st.integers(0, 5), st.floats(0, 50, allow_nan=False)), max_size=6)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.floats(0, 1000, allow_nan=False))
def test_credit_is_conserved_whatever_happens(steps, endowment):
    ledger = Ledger(endowment, budget_of=lambda user: 1500.0 if user == "u0" else None)
    wallets = {}
    for op in steps:
        if op[0] == "join":
            wallets[op[1]] = ledger.join(f"k{op[1]}", f"u{op[2]}")
        elif op[0] == "retire":
            ledger.retire(f"k{op[1]}")
        elif op[0] == "burn" and op[1] in wallets:
            ledger.burn(wallets[op[1]], op[2])
        elif op[0] == "rent":
            ledger.rent([(wallets[k], amount) for k, amount in op[1] if k in wallets])
        _assert_conserved(ledger)
