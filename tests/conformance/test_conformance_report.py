"""The report folds pytest phases into one outcome per case and never counts a skip as a pass."""

from __future__ import annotations

import json

from conformance.report import SURFACES, SuiteReport


def _report() -> SuiteReport:
    r = SuiteReport(backend="x", header={"version": "1", "features": ["probes"]})
    r.record("a", "forward", "setup", "passed", "", 0.1)
    r.record("a", "forward", "call", "passed", "", 0.2)
    r.record("b", "forward", "setup", "skipped", "not supported: no 'custom_mask'", 0.0)
    r.record("c", "samplers", "setup", "passed", "", 0.0)
    r.record("c", "samplers", "call", "failed", "AssertionError: drew 7", 0.0)
    r.record("c", "samplers", "teardown", "passed", "", 0.0)
    r.record("d", "probes", "setup", "failed", "RuntimeError: load failed", 0.0)
    r.record("e", "probes", "call", "passed", "", 0.0)
    r.record("e", "probes", "teardown", "failed", "teardown broke", 0.0)
    return r


def test_skips_count_as_not_supported_and_setup_or_teardown_errors_as_failed():
    r = _report()
    outcomes = {c.case: c.outcome for c in r.cases.values()}
    assert outcomes == {"a": "passed", "b": "not_supported", "c": "failed", "d": "failed", "e": "failed"}
    assert r.cases["c"].reason == "AssertionError: drew 7"
    assert abs(r.cases["a"].duration - 0.3) < 1e-9


def test_counts_follow_the_surface_order():
    counts = _report().counts()
    assert list(counts) == [s for s in SURFACES if s in ("forward", "samplers", "probes")]
    assert counts["forward"] == {"passed": 1, "failed": 0, "not_supported": 1}
    assert counts["probes"] == {"passed": 0, "failed": 2, "not_supported": 0}


def test_json_report_round_trips(tmp_path):
    path = tmp_path / "r.json"
    _report().write_json(path)
    data = json.loads(path.read_text())
    assert data["backend"] == "x" and data["version"] == "1"
    assert data["totals"] == {"passed": 1, "failed": 3, "not_supported": 1}
    assert {c["case"] for c in data["cases"]} == set("abcde")


def test_rendered_table_lists_failures_and_reasons():
    text = _report().render(width=120)
    assert "Pie conformance: x" in text and "declared features: probes" in text
    assert "c: AssertionError: drew 7" in text
    assert "1 x not supported: no 'custom_mask' (forward)" in text
