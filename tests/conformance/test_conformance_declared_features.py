"""The adapter cases pass on the cpu backend, which implements adapters and zo, and fail a
backend with one adapter or zo defect planted in it (the case that must catch it is named)."""

from __future__ import annotations

import pytest

from conformance_runs import run_suite


def test_the_cpu_backend_passes_every_adapter_case(tmp_path):
    run = run_suite(tmp_path, "cpu", "--pie-arch", "qwen2", "-k", "test_adapters")
    assert run.returncode == 0, run.output[-3000:]
    assert run.surface("adapters") == {"passed": 11, "failed": 0, "not_supported": 0}


@pytest.mark.parametrize(
    "double,cases",
    [
        ("ZoIgnored", {"test_a_zo_pass_runs_the_contracts_noise"}),
        ("ZoLeaks", {"test_zo_requests_leave_their_neighbours_alone"}),
        ("DropsScaling", {"test_an_adapter_equals_its_weights_merged", "test_a_mixed_batch_equals_each_adapter_merged",
                          "test_an_adapter_of_some_targets_equals_its_weights_merged",
                          "test_a_zo_pass_runs_the_contracts_noise", "test_zo_requests_leave_their_neighbours_alone"}),
        ("OwnNoise", {"test_a_zo_pass_runs_the_contracts_noise"}),
    ],
)
def test_a_backend_with_an_adapter_defect_fails_the_case_that_covers_it(tmp_path, double, cases):
    run = run_suite(tmp_path, f"conformance_doubles:{double}", "--pie-arch", "qwen2", "-k", "test_adapters")
    assert run.returncode == 1
    assert {c.rsplit("::", 1)[1] for c in run.outcomes("failed")} == cases
