"""The GPU check (benchmarks/gpu) runs its whole flow on a CPU with tiny models, so that the
command a GPU lease depends on cannot rot between leases; and its pieces that need no device."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from benchmarks.gpu.environment import datasheet_bandwidth
from benchmarks.gpu.install import ROOT, install_wheels, write_tree_metadata
from benchmarks.gpu.settings import QWEN25_05B
from benchmarks.gpu.step_loop import weight_bytes

PHASES = ["install", "environment", "models", "conformance", "exactness", "throughput", "profile"]


def test_cpu_dry_run_completes_every_phase_and_reports_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.check", "--out", str(out), "--work", str(tmp_path / "work"),
         "--device", "cpu", "--tiny", "--budget-s", "240", "--wheels", str(tmp_path / "no-wheels")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    report = json.loads((out / "report.json").read_text())
    phases = {p["name"]: p for p in report["phases"]}
    assert list(phases) == PHASES
    assert {n: p["status"] for n, p in phases.items()} == dict.fromkeys(PHASES, "ok"), proc.stdout[-3000:]
    assert proc.returncode == 0
    checks = [c for p in report["phases"] for c in p["record"].get("checks", [])]
    assert [c["name"] for c in checks if c["ok"] is False] == []
    assert any(c["name"].startswith("conformance torch-cpu") and c["ok"] for c in checks)
    assert any(c["name"].startswith("float32 greedy tokens") and c["ok"] for c in checks)
    [throughput] = phases["throughput"]["record"]["tables"]
    measured = {(row[0], row[2]) for row in throughput["rows"] if row[4] is not None}
    assert {("backend step", 1), ("backend step", 4), ("engine", 1), ("transformers", 1)} <= measured
    assert phases["throughput"]["record"]["facts"]["hbm_floor"]["floor_ms"] > 0
    assert "tensorrt_backend" in phases["conformance"]["record"]["facts"]  # skipped on a CPU, and says why
    markdown = (out / "report.md").read_text()
    assert "| throughput | ok |" in markdown and "decode throughput" in markdown
    assert all(p["seconds"] <= p["deadline_s"] + 10 for p in report["phases"])


def test_carried_wheels_install_into_the_site_folder(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "pie_check_probe-0.0.1-py3-none-any.whl", "w") as z:
        z.writestr("pie_check_probe/__init__.py", "VALUE = 1\n")
        info = "pie_check_probe-0.0.1.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: pie-check-probe\nVersion: 0.0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    site = tmp_path / "site"
    assert install_wheels(wheels, site, timeout=120) == {"installed": ["pie_check_probe==0.0.1"], "present": []}
    assert (site / "pie_check_probe" / "__init__.py").is_file()


def test_tree_packages_get_their_entry_points(tmp_path: Path) -> None:
    written = write_tree_metadata(tmp_path)
    assert {w.split("==")[0] for w in written} == {"pie-engine", "pie-backend-cpu", "pie-backend-torch", "pie-backend-tensorrt"}
    eps = {(d.metadata["Name"], ep.group, ep.name) for d in importlib.metadata.distributions(path=[str(tmp_path)])
           for ep in d.entry_points}
    assert ("pie-engine", "pytest11", "pie_conformance") in eps
    assert ("pie-backend-torch", "pie.backends", "torch") in eps


def test_hbm_floor_counts_every_weight_of_qwen25_05b_once() -> None:
    from pie_core.models.hf_config import spec_from_hf_config

    spec = spec_from_hf_config({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **QWEN25_05B})
    assert weight_bytes(spec, 2) == 2 * 494_032_768  # the checkpoint's parameter count, tied head read once
    assert datasheet_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert datasheet_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert datasheet_bandwidth("NVIDIA H200") == 4.8e12
    assert datasheet_bandwidth("Some CPU") is None


def test_failed_conformance_cases_reach_the_report(tmp_path: Path, monkeypatch) -> None:
    from benchmarks.gpu import conformance_runs
    from benchmarks.gpu.record import Record
    from benchmarks.gpu.settings import TINY, Settings

    def fake_run(settings, backend, dtype, options, report: Path) -> list[str]:
        data = {"totals": {"passed": 1, "failed": 1, "not_supported": 0},
                "cases": [{"case": "test_forward[qwen2]", "outcome": "failed", "reason": "logits differ"},
                          {"case": "test_batching[qwen2]", "outcome": "passed", "reason": ""}]}
        return [sys.executable, "-c", f"import pathlib; pathlib.Path({str(report)!r}).write_text({json.dumps(data)!r}); "
                                      "raise SystemExit(1)"]

    monkeypatch.setattr(conformance_runs, "_command", fake_run)
    settings = Settings(device="cpu", tiny=True, work=str(tmp_path), deadline=__import__("time").time() + 60, sizes=TINY)
    record = Record()
    conformance_runs.run(settings, record)
    runs, failures = record.data["tables"]
    assert failures["rows"] == [["torch-cpu-float32", "test_forward[qwen2]", "logits differ"]]
    assert runs["rows"][0][2] == "failed (exit 1)" and runs["rows"][0][4] == 1
    assert [c["ok"] for c in record.data["checks"]] == [False]
