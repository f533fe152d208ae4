"""Mutation check: the NumPy backend with one planted defect at a time fails the suite, and the
report names a case that checks exactly that defect. The ``Shared*`` defects sit in code the cpu
backend shares with the other backends (and, before the float64 oracle, with the suite's
reference and expected values), so only an independent oracle catches them."""

from __future__ import annotations

import pytest

from conformance_runs import run_suite

# (mutant class in conformance_mutants, a case that must fail for it)
MUTANTS = [
    ("DropsAttentionMask", "test_attention_masks.py::test_custom_mask_matches_reference"),
    ("OffByOnePosition", "test_forward.py::test_prefill_matches_reference"),
    ("IgnoresLogitMask", "test_logit_masks.py::test_argmax_respects_the_logit_mask"),
    ("WritesWrongPage", "test_kv_paging.py::test_writes_and_reads_cross_page_boundaries"),
    ("IgnoresTemperature", "test_samplers.py::test_sampler_frequencies_match_the_definition[top_k-cooler]"),
    ("TopPKeepsOneTooMany", "test_samplers.py::test_sampler_frequencies_match_the_definition[top_p-cooler]"),
    ("CopiesBackwards", "test_copy_pages.py::test_device_to_device_copy_carries_the_kv"),
    # Defects in code the cpu backend shares (the old cpu-as-reference suite passed all four):
    ("SharedRopeFrequencies", "test_forward.py::test_prefill_matches_reference"),
    ("SharedRmsNormCentred", "test_forward.py::test_single_token_prompt_matches_reference"),
    ("SharedTemperatureMultiplies", "test_samplers.py::test_sampler_frequencies_match_the_definition[min_p-warmer]"),
    ("SharedTemperatureMultiplies", "test_probes.py::test_probe_follows_its_definition[distribution]"),
    ("SharedTiesToHigherId", "test_samplers.py::test_a_cut_inside_tied_tokens_keeps_the_lower_id[top_k]"),
    ("SharedTiesToHigherId", "test_probes.py::test_distribution_lists_tied_tokens_lower_id_first[0.7]"),
]


@pytest.mark.parametrize("mutant,case", MUTANTS, ids=[f"{m}-{c.split('::')[1]}" for m, c in MUTANTS])
def test_suite_fails_the_mutant_naming_the_case(tmp_path, mutant, case):
    run = run_suite(tmp_path, f"conformance_mutants:{mutant}", "--pie-arch", "qwen2")
    assert run.returncode == 1, f"{mutant} passed the suite:\n{run.output[-3000:]}"
    failed = run.outcomes("failed")
    assert any(case in c for c in failed), f"{mutant}: {case} did not fail; failed were {failed}"
    assert case.split("::")[1].split("[")[0] in run.output, "the printed report does not name the case"
    assert run.surface("contract")["failed"] == 0, "the defect should not break the contract surface"
