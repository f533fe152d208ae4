"""``--backend-option KEY=VALUE`` reaches the backend under test's ``BackendOptions.extra``
(converted like ``pie run``'s); the numeric reference is the suite's own oracle, not a second
backend; a malformed or refused option is one line, not a traceback per case."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conformance.harness import Harness, SuiteOptions
from conformance_broken import OPTIONS_LOG
from conformance_runs import run_pie_conformance

RECORDS = "conformance_broken:RecordsOptions"
SHORT = 60  # lines: the header, the one-line error, the table and a line of cases not run


def _logged(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_backend_options_reach_the_backend_converted(tmp_path, monkeypatch):
    log = tmp_path / "options.jsonl"
    monkeypatch.setenv(OPTIONS_LOG, str(log))
    proc = run_pie_conformance(
        tmp_path, "--backend", RECORDS, "--arch", "qwen2", "-k", "test_load_honours_the_requested_pool",
        "--backend-option", "provider=cpu", "--backend-option", "workers=2", "--backend-option", "fp8=False",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    loads = _logged(log)
    assert len(loads) >= 2  # the check before the cases, and the case's own load
    assert all(extra == {"provider": "cpu", "workers": 2, "fp8": False} for extra in loads), loads
    assert "options provider=cpu workers=2 fp8=False" in proc.stdout


def test_the_suite_loads_no_second_backend_as_its_reference(tmp_path, monkeypatch):
    log = tmp_path / "options.jsonl"
    monkeypatch.setenv(OPTIONS_LOG, str(log))
    harness = Harness(SuiteOptions(backend=RECORDS, archs=("qwen2",), numerics="on", extra={"provider": "cpu"}))
    assert harness.check() is None
    assert _logged(log) == [{"provider": "cpu"}]  # the backend under test only: the oracle is no backend
    assert harness.model().reference is not None


def test_an_option_the_backend_refuses_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(OPTIONS_LOG, str(tmp_path / "options.jsonl"))
    proc = run_pie_conformance(tmp_path, "--backend", RECORDS, "--backend-option", "bogus=1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    error = (
        f"error: backend {RECORDS!r} failed to load the tiny qwen2 model: "
        "ValueError: unknown backend options ['bogus']"
    )
    assert any(line.startswith(error) for line in out.splitlines()), out
    assert "Traceback" not in out and len(out.splitlines()) < SHORT, out


@pytest.mark.parametrize(
    "cmd,flag,code",
    [
        ([sys.executable, "-m", "pie_core.cli.main", "conformance", "--backend", "dummy"], "--backend-option", 1),
        (
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "conformance",
             "--pie-backend", "dummy"],
            "--pie-backend-option",
            4,
        ),
    ],
    ids=["pie-conformance", "pytest"],
)
def test_an_option_without_an_equals_sign_is_one_line(tmp_path, cmd, flag, code):
    proc = subprocess.run([*cmd, flag, "provider"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out
    assert f"{flag} 'provider': expected KEY=VALUE" in out
    assert "Traceback" not in out and len(out.strip().splitlines()) <= 2, out
