"""Phase ``conformance``: ``pie conformance`` on the device, torch backend first, then the tensorrt
backend under each GPU provider ONNX Runtime offers.

The torch backend runs with its device defaults, which on CUDA are the Triton kernels and CUDA
graphs; float32 first (the tightest tolerances), then bfloat16 (the serving dtype) while time
lasts. The tensorrt backend runs once per provider among ``cuda`` and ``tensorrt`` that
``onnxruntime.get_available_providers()`` lists; none listed (the CPU build of ONNX Runtime) is
recorded as a skip with the providers it has. Each run is ``python -m pie_core.cli.main
conformance`` in a process of its own, stopped at the phase's deadline; a stopped run's cases are
counted from its verbose output.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu.record import Record
from benchmarks.gpu.settings import Settings

__all__ = ["run", "PROVIDERS"]

PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
"""The tensorrt backend's ``provider`` option -> the ONNX Runtime provider it needs."""

_CASE = re.compile(r"::(\S+) (PASSED|FAILED|SKIPPED|ERROR)")
_FAILED_SHOWN = 20


def _command(settings: Settings, backend: str, dtype: str, options: list[str], report: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pie_core.cli.main", "conformance", "--backend", backend,
           "--device", settings.device, "--dtype", dtype, "--report", "json", str(report), "-v"]
    for arch in settings.sizes.conformance_archs:
        cmd += ["--arch", arch]
    if settings.sizes.conformance_select:
        cmd += ["-k", settings.sizes.conformance_select]
    for option in options:
        cmd += ["--backend-option", option]
    return cmd


def _counted_from_log(log: str) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "not_supported": 0}
    for _, outcome in _CASE.findall(log):
        key = {"PASSED": "passed", "SKIPPED": "not_supported"}.get(outcome, "failed")
        counts[key] += 1
    return counts


def _one(settings: Settings, record: Record, runs, failures, name: str, backend: str, dtype: str,
         options: list[str]) -> None:
    work = Path(settings.work) / "conformance"
    work.mkdir(parents=True, exist_ok=True)
    report, log_path = work / f"{name}.json", work / f"{name}.log"
    report.unlink(missing_ok=True)
    cmd = _command(settings, backend, dtype, options, report)
    start = time.perf_counter()
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=max(1.0, settings.left()))
            status = "passed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            status = "stopped at the phase's deadline"
            record.stopped(f"conformance {name} cut short")
    seconds = time.perf_counter() - start
    text = log_path.read_text(errors="replace")
    if report.is_file():
        data = json.loads(report.read_text())
        totals = data["totals"]
        for case in data["cases"]:
            if case["outcome"] == "failed" and len(failures.rows) < _FAILED_SHOWN:
                failures.add(name, case["case"], case["reason"][:300])
        if data.get("error"):
            status += f": {data['error'][:300]}"
    else:
        totals = _counted_from_log(text)
    runs.add(name, " ".join(cmd[3:]), status, totals["passed"], totals["failed"], totals["not_supported"], seconds)
    record.check(f"conformance {name}", status == "passed",
                 f"{totals['passed']} passed, {totals['failed']} failed, {totals['not_supported']} not supported; {status}")
    if status != "passed":
        record.put(f"log_tail_{name}", text[-3000:])


def run(settings: Settings, record: Record) -> None:
    runs = record.table("conformance runs", ["run", "command", "status", "passed", "failed", "not supported", "seconds"])
    failures = record.table(f"failed cases (first {_FAILED_SHOWN})", ["run", "case", "reason"])
    for dtype in settings.sizes.conformance_dtypes:
        if settings.left() < 5:
            record.stopped(f"conformance torch {dtype} not run")
            continue
        _one(settings, record, runs, failures, f"torch-{settings.device}-{dtype}", "torch", dtype, [])
    try:
        import onnxruntime

        available = onnxruntime.get_available_providers()
    except ImportError as exc:
        record.put("tensorrt_backend", f"skipped: onnxruntime not importable ({exc})")
        return
    usable = [p for p, ep in PROVIDERS.items() if ep in available] if settings.device == "cuda" else []
    if not usable:
        record.put("tensorrt_backend", f"skipped: ONNX Runtime offers none of {list(PROVIDERS.values())} "
                                       f"on this {settings.device} run (available: {available})")
    for provider in usable:
        if settings.left() < 5:
            record.stopped(f"conformance tensorrt {provider} not run")
            continue
        # the GPU graph is float16 (the backend offers no bfloat16)
        _one(settings, record, runs, failures, f"tensorrt-{provider}", "tensorrt", "float16", [f"provider={provider}"])
