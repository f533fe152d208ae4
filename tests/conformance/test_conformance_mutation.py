"""Mutation check: the NumPy backend with one planted defect at a time fails the suite, and the
report names a case that checks exactly that defect."""

from __future__ import annotations

import pytest

from conformance_runs import run_suite

# (mutant class in conformance_mutants, a case that must fail for it)
MUTANTS = [
    ("DropsAttentionMask", "test_attention_masks.py::test_custom_mask_matches_reference"),
    ("OffByOnePosition", "test_forward.py::test_prefill_matches_reference"),
    ("IgnoresLogitMask", "test_logit_masks.py::test_argmax_respects_the_logit_mask"),
    ("WritesWrongPage", "test_kv_paging.py::test_writes_and_reads_cross_page_boundaries"),
    ("IgnoresTemperature", "test_samplers.py::test_sampler_frequencies_match_the_definition[top_k]"),
    ("TopPKeepsOneTooMany", "test_samplers.py::test_sampler_frequencies_match_the_definition[top_p]"),
    ("CopiesBackwards", "test_copy_pages.py::test_device_to_device_copy_carries_the_kv"),
]


@pytest.mark.parametrize("mutant,case", MUTANTS, ids=[m for m, _ in MUTANTS])
def test_suite_fails_the_mutant_naming_the_case(tmp_path, mutant, case):
    run = run_suite(tmp_path, f"conformance_mutants:{mutant}", "--pie-arch", "qwen2")
    assert run.returncode == 1, f"{mutant} passed the suite:\n{run.output[-3000:]}"
    failed = run.outcomes("failed")
    assert any(case in c for c in failed), f"{mutant}: {case} did not fail; failed were {failed}"
    assert case.split("::")[1].split("[")[0] in run.output, "the printed report does not name the case"
    assert run.surface("contract")["failed"] == 0, "the defect should not break the contract surface"
