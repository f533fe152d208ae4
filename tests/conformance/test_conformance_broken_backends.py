"""A backend that does not import, bind or load is reported in one line naming it and the cause,
with the table and a nonzero exit, not with one traceback per case; a backend whose
``BackendInfo`` and ``Capabilities`` disagree on features, or name one the contract lacks, fails
the contract surface naming the features."""

from __future__ import annotations

import json

import pytest

from conformance_runs import run_pie_conformance, run_suite

SHORT = 60  # lines: the header, the one-line error, the table and a line of cases not run


@pytest.mark.parametrize(
    "backend,causes",
    [
        (
            "conformance_broken:WrongSignature",
            (
                "does not satisfy the hook spec: Plugin 'conformance_broken:WrongSignature' "
                "for hook 'pie_backend_forward'",
                "Argument(s) {'bach'} are declared in the hookimpl but can not be found in the hookspec",
            ),
        ),
        ("conformance_broken:import_fails", ("did not load: ImportError: No module named 'tensorrt'",)),
        ("conformance_no_such_module:Backend", ("did not load: ModuleNotFoundError: No module named",)),
    ],
    ids=["wrong-hook-signature", "factory-import-error", "module-import-error"],
)
def test_a_backend_that_does_not_load_is_one_line_and_the_table(tmp_path, backend, causes):
    report = tmp_path / "report.json"
    proc = run_pie_conformance(tmp_path, "--backend", backend, "--report", "json", str(report))
    out = proc.stdout + proc.stderr
    lines = out.splitlines()
    assert proc.returncode == 1, out[-3000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, out[-3000:]
    assert errors[0].startswith(f"error: backend {backend!r} "), errors[0]
    assert all(cause in errors[0] for cause in causes), errors[0]
    assert "Traceback" not in out and len(lines) < SHORT, out
    assert "total" in out and "not run: the backend did not load" in out
    data = json.loads(report.read_text())
    assert data["error"] == errors[0].removeprefix("error: ")
    assert data["totals"]["passed"] == 0 and data["totals"]["failed"] == len(data["cases"]) > 50
    assert all(c["reason"].startswith("not run:") for c in data["cases"])


def test_pytest_reports_a_backend_that_does_not_load_the_same_way(tmp_path):
    run = run_suite(tmp_path, "conformance_broken:WrongSignature")
    assert run.returncode == 1
    assert "does not satisfy the hook spec" in run.report["error"] and "'bach'" in run.report["error"]
    assert "Traceback" not in run.output and len(run.output.splitlines()) < SHORT, run.output
    assert run.report["totals"]["passed"] == 0 and run.outcomes("failed")


def test_a_feature_backend_info_offers_but_capabilities_lack_fails_the_contract(tmp_path):
    run = run_suite(
        tmp_path, "conformance_broken:OffersUndeclaredFeature", "--pie-arch", "qwen2", "-k", "test_contract"
    )
    assert run.returncode == 1, run.output[-3000:]
    failed = {c["case"].rsplit("::", 1)[1]: c["reason"] for c in run.report["cases"] if c["outcome"] == "failed"}
    assert set(failed) == {"test_backend_info_and_capabilities_declare_the_same_features"}, failed
    reason = next(iter(failed.values()))
    assert "BackendInfo.features offers ['system_speculation']" in reason, reason
    assert "system_speculation" in run.output


def test_a_feature_name_the_contract_lacks_fails_the_contract(tmp_path):
    run = run_suite(tmp_path, "conformance_broken:OffersMisspeltFeature", "--pie-arch", "qwen2", "-k", "test_contract")
    assert run.returncode == 1, run.output[-3000:]
    failed = {c["case"].rsplit("::", 1)[1]: c["reason"] for c in run.report["cases"] if c["outcome"] == "failed"}
    assert "test_declared_features_are_contract_feature_names" in failed, failed
    reason = failed["test_declared_features_are_contract_feature_names"]
    assert "BackendInfo.features: ['logit_masks']" in reason, reason
