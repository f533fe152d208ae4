"""The batcher's fit of step time against batch tokens, the system drafter's budget."""

import pytest

from pie_core.scheduler.step_cost import MIN_BATCHES, StepCost


def test_a_linear_cost_is_recovered_and_gives_the_slowdown_of_extra_rows():
    cost = StepCost()
    for i in range(60):
        tokens = 8 + (i * 7) % 40
        cost.observe(tokens, 0.010 + 0.002 * tokens)
    fixed, per = cost.line()
    assert fixed == pytest.approx(0.010, rel=1e-6) and per == pytest.approx(0.002, rel=1e-6)
    assert cost.ratio(16, 8) == pytest.approx((0.010 + 0.002 * 24) / (0.010 + 0.002 * 16))


def test_no_answer_before_enough_batches_or_when_every_batch_is_the_same_size():
    cost = StepCost()
    for _ in range(MIN_BATCHES - 1):
        cost.observe(16, 0.05)
    assert cost.ratio(16, 4) is None
    for _ in range(20):
        cost.observe(16, 0.05)
    assert cost.line() is None and cost.ratio(16, 4) is None  # no slope can be seen


def test_it_follows_a_changing_backend():
    cost = StepCost()
    for i in range(100):
        cost.observe(4 + i % 20, 0.01)  # flat: rows free
    assert cost.ratio(16, 8) == pytest.approx(1.0, abs=0.01)
    for i in range(200):
        cost.observe(4 + i % 20, 0.001 * (4 + i % 20))  # now every row costs
    assert cost.ratio(16, 8) > 1.4


def test_a_step_in_the_cost_is_seen_where_the_line_would_smooth_it():
    cost = StepCost()
    for i in range(80):
        tokens = 16 + i % 6  # 16 rows: 50 ms; any more: a slower kernel, 80 ms and up
        cost.observe(tokens, 0.050 if tokens == 16 else 0.080 + 0.001 * (tokens - 17))
    assert cost.ratio(16, 1) == pytest.approx(1.6, rel=1e-3)  # the first extra row pays the switch
    assert cost.ratio(17, 1) == pytest.approx(0.081 / 0.080, rel=1e-3)
    assert cost.ratio(16, 40) is not None  # a size never seen: the line answers
