"""Both ways in (`pie conformance`, `pytest --pyargs conformance`), and a plugin that stays out of
every other pytest run."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

from conformance import plugin
from pie_core.cli.main import build_parser
from pie_core.models.spec import ARCHITECTURES


def _run(cmd: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_plugin_is_registered_under_pytest11():
    assert "conformance.plugin" in {ep.value for ep in entry_points(group="pytest11")}


def test_plugin_offers_every_supported_architecture():
    assert plugin._ARCHS == ARCHITECTURES


def test_pie_conformance_runs_the_suite_and_writes_json(tmp_path):
    report = tmp_path / "r.json"
    proc = _run([sys.executable, "-m", "pie_core.cli.main", "conformance", "--backend", "dummy",
                 "--report", "json", str(report), "-k", "test_contract or test_probe_follows"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["backend"] == "dummy" and data["totals"]["failed"] == 0
    assert set(data["surfaces"]) == {"contract", "probes"}
    assert "Pie conformance: dummy" in proc.stdout


def test_pie_conformance_names_the_installed_backends_for_an_unknown_one(tmp_path):
    proc = _run([sys.executable, "-m", "pie_core.cli.main", "conformance", "--backend", "no-such"], tmp_path)
    assert proc.returncode == 1
    assert "unknown backend 'no-such'" in proc.stderr and "cpu" in proc.stderr


def test_pie_conformance_accepts_only_json_reports():
    args = build_parser().parse_args(["conformance", "--backend", "cpu", "--report", "json", "out.json"])
    assert args.report == ["json", "out.json"]
    proc = _run([sys.executable, "-m", "pie_core.cli.main", "conformance", "--backend", "cpu",
                 "--report", "xml", "out.xml"], ".")
    assert proc.returncode == 1 and "use --report json PATH" in proc.stderr


def test_suite_without_a_backend_is_a_usage_error(tmp_path):
    proc = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "conformance"], tmp_path)
    assert proc.returncode == 4
    assert "--pie-backend NAME" in proc.stdout + proc.stderr


def test_other_pytest_runs_see_no_report_and_no_change(tmp_path):
    (tmp_path / "test_plain.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture\ndef rng():\n    return 4\n\n"
        "def test_own_fixture_wins(rng):\n    assert rng == 4\n\n"
        "def test_plain():\n    assert True\n"
    )
    proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert "2 passed" in proc.stdout and "Pie conformance" not in proc.stdout
