"""Features no in-tree backend declares ('zo', 'adapters') are still checked: a backend that
implements them passes those cases, and one that declares zo but gets it wrong fails them."""

from __future__ import annotations

import pytest

from conformance_runs import run_suite


def test_a_backend_declaring_zo_and_adapters_passes_their_cases(tmp_path):
    run = run_suite(tmp_path, "conformance_doubles:ZoCpu", "--pie-arch", "qwen2", "-k", "test_adapters")
    assert run.returncode == 0, run.output[-3000:]
    assert run.surface("adapters") == {"passed": 5, "failed": 0, "not_supported": 0}


@pytest.mark.parametrize(
    "double,case",
    [
        ("ZoIgnored", "test_zo_seed_perturbs_the_model_reproducibly"),
        ("ZoLeaks", "test_zo_requests_leave_their_neighbours_alone"),
    ],
)
def test_a_backend_that_declares_zo_and_fails_it_fails_the_suite(tmp_path, double, case):
    run = run_suite(tmp_path, f"conformance_doubles:{double}", "--pie-arch", "qwen2", "-k", "test_adapters")
    assert run.returncode == 1
    assert [c.rsplit("::", 1)[1] for c in run.outcomes("failed")] == [case]
