"""The suite passes on the shipped backends: every surface on cpu, the non-numeric ones on dummy."""

from __future__ import annotations

import pytest

from conformance_runs import run_suite

NUMERIC = ("forward", "kv_paging", "batching", "chunked_prefill", "attention_masks", "speculation")
NON_NUMERIC = ("contract", "logit_masks", "samplers", "probes", "copy_pages", "limits", "adapters")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return run_suite(tmp_path_factory.mktemp("cpu"), "cpu")


@pytest.fixture(scope="module")
def dummy_run(tmp_path_factory):
    return run_suite(tmp_path_factory.mktemp("dummy"), "dummy")


def test_cpu_backend_passes_every_surface_it_declares(cpu_run):
    assert cpu_run.returncode == 0, cpu_run.output[-4000:]
    assert cpu_run.report["totals"]["failed"] == 0
    for surface in NUMERIC + NON_NUMERIC:
        assert cpu_run.surface(surface)["passed"] > 0, f"{surface}: nothing ran on cpu"
    assert cpu_run.report["numerics"] == "on"


def test_cpu_not_supported_cases_are_only_undeclared_features(cpu_run):
    reasons = {c["reason"] for c in cpu_run.report["cases"] if c["outcome"] == "not_supported"}
    for reason in reasons:
        assert "max_mask_bytes" in reason, reason


def test_cpu_numerics_run_on_every_architecture(cpu_run):
    passed = cpu_run.outcomes("passed")
    for arch in ("qwen2", "llama", "qwen3", "gemma3"):
        assert any(f"test_prefill_matches_reference[{arch}]" in c for c in passed), arch


def test_dummy_backend_passes_the_non_numeric_surfaces(dummy_run):
    assert dummy_run.returncode == 0, dummy_run.output[-4000:]
    assert dummy_run.report["numerics"] == "off"
    for surface in NUMERIC:
        counts = dummy_run.surface(surface)
        assert counts["passed"] == 0 and counts["not_supported"] > 0, f"{surface} ran on the weightless dummy"
    for surface in ("contract", "logit_masks", "samplers", "probes", "copy_pages", "limits"):
        assert dummy_run.surface(surface)["passed"] > 0, f"{surface}: nothing ran on dummy"


def test_skipped_cases_are_reported_as_not_supported_never_passed(dummy_run):
    skipped = [c for c in dummy_run.report["cases"] if c["reason"].startswith("not supported")]
    assert skipped and all(c["outcome"] == "not_supported" for c in skipped)
    totals = dummy_run.report["totals"]
    assert totals["passed"] + totals["not_supported"] == len(dummy_run.report["cases"])


def test_the_run_ends_with_the_surface_table(cpu_run):
    out = cpu_run.output
    assert "Pie conformance: cpu" in out
    for column in ("surface", "passed", "failed", "not supported"):
        assert column in out
    assert "declared features: adapters, custom_mask" in out


def test_registration_errors_name_the_hook_or_version(cpu_run, dummy_run):
    for run in (cpu_run, dummy_run):
        passed = run.outcomes("passed")
        for case in (
            "test_incompatible_contract_version_is_refused_naming_the_version",
            "test_wrong_hook_signature_is_refused_naming_the_hook",
            "test_missing_hook_is_refused_naming_the_hook",
        ):
            assert any(case in c for c in passed), f"{case} did not pass on {run.report['backend']}"


def test_torch_backend_in_float32_passes_every_surface_cpu_passes(tmp_path):
    pytest.importorskip("pie_backend_torch")
    run = run_suite(tmp_path, "torch", "--pie-dtype", "float32")
    assert run.returncode == 0, run.output[-4000:]
    assert run.report["totals"]["failed"] == 0 and run.report["numerics"] == "on"
    for surface in NUMERIC + NON_NUMERIC:
        assert run.surface(surface)["passed"] > 0, f"{surface}: nothing ran on torch"
