"""One command that verifies and measures Pie's CUDA path inside a GPU lease, or dry-runs it on a CPU.

    python -m benchmarks.gpu.check --out DIR                          # on the GPU machine (cuda)
    python -m benchmarks.gpu.check --out DIR --device cpu --tiny      # the CPU dry run (CI)

Phases, in order, each timed and each stopped at its deadline (a share of ``--budget-s``; time a
phase leaves unused goes to the next):

1. ``install``: wheels from ``--wheels`` (made here by ``python -m benchmarks.gpu.make_wheels``)
   that the machine lacks, and the tree's own packages with their entry points (:mod:`.install`);
2. ``environment``: versions, the device, its bandwidth, ONNX Runtime's providers;
3. ``models``: Qwen2.5-0.5B's architecture with random weights as a Hugging Face folder (tiny: a
   small qwen2); the conformance suite builds its own tiny models;
4. ``conformance``: ``pie conformance --device DEVICE`` for the torch backend (Triton kernels and
   CUDA graphs on, on CUDA), and the tensorrt backend under each GPU provider ONNX Runtime has;
5. ``exactness``: logits and greedy tokens against transformers on the same device and weights;
6. ``throughput``: decode tok/s at each concurrency with and without CUDA graphs against
   transformers ``generate``, and the batch-1 step against the HBM floor;
7. ``profile``: where a decode step's time goes (torch.profiler and cProfile of the backend step,
   cProfile of the engine), for the next fixes.

Each phase but the first runs in a child process (:mod:`.phase`): a crash or a poisoned CUDA
context ends that phase only, and what it recorded survives it. ``report.json`` and
``report.md`` under ``--out`` are rewritten after every phase; everything else (models, caches,
conformance logs) goes to ``--work``. Exit status 0 when every phase completed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu.install import ROOT, child_env, install_wheels, write_tree_metadata
from benchmarks.gpu.phase import PHASES
from benchmarks.gpu.report import render_markdown, write_reports
from benchmarks.gpu.settings import FULL, TINY, Settings

__all__ = ["main", "SHARES", "NEEDS"]

SHARES = {"install": 0.03, "environment": 0.05, "models": 0.07, "conformance": 0.25, "exactness": 0.15,
          "throughput": 0.33, "profile": 0.12}
"""Each phase's share of the budget; its deadline is the start plus the budget times the shares so far."""
NEEDS = {"exactness": ("models",), "throughput": ("environment", "models"), "profile": ("models",)}
"""Phases that cannot run unless these completed."""
GRACE_S = 10.0
"""How long past its deadline a phase may take to stop by itself before it is killed."""
DEFAULT_BUDGET_S = {False: 420.0, True: 90.0}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for report.json, report.md and check.log")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="device under test (default cuda)")
    ap.add_argument("--tiny", action="store_true", help="tiny models and few tokens (the CPU dry run)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"seconds for the whole check (default {DEFAULT_BUDGET_S[False]:.0f}; "
                         f"{DEFAULT_BUDGET_S[True]:.0f} with --tiny)")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="wheel folder to install from (default .whl)")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new one under the temp folder)")
    ap.add_argument("--phases", default=None, metavar="A,B",
                    help=f"run only these of {', '.join(PHASES)} (and what they need), e.g. to rerun one on a warm "
                         "machine; the budget is shared among them")
    args = ap.parse_args(argv)
    if args.phases is not None:
        chosen = set(filter(None, args.phases.split(",")))
        unknown = chosen - set(PHASES)
        if unknown:
            ap.error(f"unknown phase(s) {', '.join(sorted(unknown))}; choose from {', '.join(PHASES)}")
        for name in list(chosen):
            chosen.update(NEEDS.get(name, ()))
        args.phases = [p for p in PHASES if p in chosen]
    else:
        args.phases = list(PHASES)
    return args


def _stop(proc: subprocess.Popen) -> None:
    """Ask the phase's process group to stop, then kill it."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _child(name: str, settings: Settings, work: Path, env: dict[str, str], log) -> tuple[str, dict[str, Any], str | None]:
    settings_path, result_path = work / f"{name}.settings.json", work / f"{name}.result.json"
    settings.save(settings_path)
    result_path.unlink(missing_ok=True)
    log.write(f"\n===== phase {name} =====\n")
    log.flush()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu.phase", name, str(settings_path), str(result_path)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout=max(1.0, settings.left() + GRACE_S))
        status = "ok" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        _stop(proc)
        rc, status = None, "stopped"
    record = json.loads(result_path.read_text()) if result_path.is_file() else {"facts": {}, "tables": [], "checks": []}
    error = record["facts"].get("error")
    if status == "ok" and record["facts"].get("stopped"):
        status, error = "stopped", "ran out of time before: " + "; ".join(record["facts"]["stopped"])
    if status == "failed" and error is None:
        error = f"exit status {rc} (a crash?): see check.log"
    if status == "stopped":
        error = f"stopped at its deadline (+{GRACE_S:.0f} s grace); what it recorded before is kept"
    return status, record, error


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    budget = args.budget_s or DEFAULT_BUDGET_S[args.tiny]
    start = time.time()
    work = args.work or Path(tempfile.mkdtemp(prefix="pie-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    site = work / "site"
    sizes = TINY if args.tiny else FULL
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.gpu.check", *(argv if argv is not None else sys.argv[1:])]),
        "device": args.device, "device_name": args.device, "tiny": args.tiny, "budget_s": budget,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "work": str(work), "total_s": 0.0, "phases": [],
    }
    extra: dict[str, Any] = {}
    done: set[str] = set()
    names = ["install", *args.phases]
    total_share = sum(SHARES[n] for n in names)
    share = 0.0
    with (args.out / "check.log").open("w") as log:
        for name in names:
            share += SHARES[name] / total_share
            deadline = start + budget * share
            entry: dict[str, Any] = {"name": name, "status": "running", "seconds": 0.0,
                                     "deadline_s": budget * share, "record": {}, "error": None}
            report["phases"].append(entry)
            write_reports(report, args.out)
            print(f"[{time.time() - start:6.1f} s] {name} (until {budget * share:.0f} s)", flush=True)
            t0 = time.time()
            missing = [n for n in NEEDS.get(name, ()) if n not in done]
            if missing:
                entry.update(status="skipped", error=f"needs {', '.join(missing)}, which did not complete")
            elif name == "install":
                try:
                    wheels = install_wheels(args.wheels, site, timeout=max(5.0, deadline - time.time()))
                    tree = write_tree_metadata(site)
                    entry.update(status="ok", record={"facts": {"wheel_folder": str(args.wheels), **wheels,
                                                                "tree_packages": tree, "site": str(site)},
                                                      "tables": [], "checks": []})
                except Exception as exc:  # noqa: BLE001 - recorded; later phases say what they miss
                    detail = getattr(exc, "stderr", "") or ""
                    entry.update(status="failed", error=f"{type(exc).__name__}: {exc} {detail}"[:2000])
            else:
                env = child_env(site, work)
                if args.tiny and args.device == "cpu":
                    env["OMP_NUM_THREADS"] = "1"  # tiny models gain nothing from threads, and lose to wake-ups under load
                settings = Settings(device=args.device, tiny=args.tiny, work=str(work), deadline=deadline,
                                    sizes=sizes, extra=extra)
                status, record, error = _child(name, settings, work, env, log)
                entry.update(status=status, record=record, error=error)
            entry["seconds"] = time.time() - t0
            if entry["status"] == "ok":
                done.add(name)
            if name == "environment":
                facts = entry["record"].get("facts", {})
                extra["hbm_bandwidth"] = facts.get("hbm_bandwidth", {})
                report["device_name"] = facts.get("device", {}).get("name", args.device)
            report["total_s"] = time.time() - start
            write_reports(report, args.out)
            print(f"[{time.time() - start:6.1f} s] {name}: {entry['status']} in {entry['seconds']:.1f} s"
                  + (f" — {entry['error']}" if entry["error"] else ""), flush=True)
    print(render_markdown(report))
    return 0 if all(p["status"] == "ok" for p in report["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
