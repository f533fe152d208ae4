"""Pie installed from wheels into a fresh virtual environment, as `pip install pie-engine` gives it
to a user: no checkout beside it, no editable paths. The examples run by name, `--isolation wasm`
finds its WIT package, every backend package installs from its own wheel, and
docs/backend-authors.md's recipe (`pip install pie-engine ./my_backend`, `pie backends`,
`pie conformance --backend mine`) works verbatim on a copy of the example backend.

Offline by design: the wheels are built here (`pip wheel --no-deps --no-build-isolation`), and
the third-party dependencies (numpy, torch, xgrammar, ...) come from this test's own environment
through a folder of links to its site-packages that leaves out every Pie distribution and editable
hook, so the fresh environment reaches Pie only through the wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from pie_core.models.default_model import DEFAULT_MODEL, assembled_path, stamp_ok

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "pie-engine": REPO,
    "pie-backend-cpu": REPO / "plugins" / "pie_backend_cpu",
    "pie-backend-torch": REPO / "plugins" / "pie_backend_torch",
    "pie-backend-tensorrt": REPO / "plugins" / "pie_backend_tensorrt",
}
_NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", "tests",
                                      "benchmarks", ".pytest_cache", ".hypothesis", "pie-output")
_PIE_DISTRIBUTIONS = ("pie_engine", "pie_backend_", "__editable__", "_pie_")

pytestmark = pytest.mark.timeout(900)


@dataclass
class WheelEnv:
    root: Path
    python: Path
    wheels: Path
    env: dict[str, str]

    def run(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(args, cwd=cwd or self.root / "work", env=self.env, capture_output=True, text=True,
                              timeout=600)
        if check:
            assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def pie(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.python.parent / "pie"), *args, check=check)

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.python), "-m", "pip", "--disable-pip-version-check", *args)


def _build_wheel(source: Path, into: Path, scratch: Path) -> None:
    """A wheel of ``source``, built from a copy (an in-tree build would leave build/ in the checkout)."""
    copy = scratch / source.name
    shutil.copytree(source, copy, ignore=_NOT_SOURCES)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-w", str(into), str(copy)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"building a wheel of {source} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def _link_dependencies(farm: Path) -> None:
    """Links to everything in this environment's site-packages except Pie's own distributions,
    editable hooks and .pth files."""
    farm.mkdir()
    for site_dir in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(site_dir).iterdir():
            name = entry.name
            if name.startswith(_PIE_DISTRIBUTIONS) or name.endswith(".pth") or (farm / name).exists():
                continue
            if name in ("pie_core", "inferlet", "conformance") or name.startswith("pie_backend"):
                continue
            (farm / name).symlink_to(entry)


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> WheelEnv:
    root = tmp_path_factory.mktemp("wheel-install")
    wheels, scratch = root / "wheels", root / "sources"
    scratch.mkdir()
    for source in PACKAGES.values():
        _build_wheel(source, wheels, scratch)
    farm = root / "dependencies"
    _link_dependencies(farm)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "_dependencies.pth").write_text(f"{farm}\n")  # a path line: appended to sys.path
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIE_", "VIRTUAL_ENV"))}
    env.update(PIE_HOME=str(root / "pie-home"), PIE_CACHE_DIR=str(root / "cache"), HF_HUB_OFFLINE="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    (root / "work").mkdir()
    shared = assembled_path(DEFAULT_MODEL)  # this machine's assembled default model, when there is one
    if stamp_ok(shared, DEFAULT_MODEL):  # used where it lies, as a user's own cache would be
        target = assembled_path(DEFAULT_MODEL, root / "cache")
        target.parent.mkdir(parents=True)
        target.symlink_to(shared)
        stamp = shared.with_name(shared.name + ".stamp")
        shutil.copy(stamp, target.with_name(stamp.name))
    wenv = WheelEnv(root, python, wheels, env)
    wenv.pip("install", "-q", "--no-index", "--find-links", str(wheels), "--no-build-isolation", "pie-engine")
    return wenv


def test_the_installed_engine_is_the_wheel_not_a_checkout(wheel_env: WheelEnv) -> None:
    out = wheel_env.run(str(wheel_env.python), "-c", "import pie_core, inferlet; print(pie_core.__file__); "
                        "print(inferlet.__file__)").stdout.split()
    assert all(path.startswith(str(wheel_env.root / "venv")) for path in out), out


def test_examples_ship_in_the_wheel_and_run_by_name(wheel_env: WheelEnv) -> None:
    listed = json.loads(wheel_env.pie("examples", "--json").stdout)
    names = {e["name"] for e in listed}
    assert {"hello-world", "text-completion", "mcp-tools"} <= names
    assert all("/_bundled/examples/" in e["path"] for e in listed)
    run = wheel_env.pie("run", "hello-world", "--dummy")
    assert run.stdout.strip().splitlines()[-1] == "hello world"


def test_the_wasm_runner_builds_from_the_wheel(wheel_env: WheelEnv) -> None:
    out = wheel_env.run(str(wheel_env.python), "-c", "from pie_core.runtime.wasm.build import WIT_DIR, toolchain_missing; "
                        "print(WIT_DIR); print(toolchain_missing()); print(len(list(WIT_DIR.glob('*.wit'))))").stdout
    wit, missing, count = out.split("\n")[:3]
    assert "/_bundled/wit" in wit and missing == "None" and int(count) == len(list((REPO / "wit").glob("*.wit")))
    run = wheel_env.pie("run", "hello-world", "--dummy", "--isolation", "wasm")  # builds the component (~15-30 s)
    assert run.stdout.strip().splitlines()[-1] == "hello world"


def test_backend_authors_recipe_works_verbatim_outside_the_repo(wheel_env: WheelEnv) -> None:
    """docs/backend-authors.md: copy the example, `pip install pie-engine ./my_backend`,
    `pie backends`, `pie conformance --backend NAME` (here offline: --no-index --find-links)."""
    mine = wheel_env.root / "work" / "my_backend"
    shutil.copytree(REPO / "examples" / "backends" / "pie_backend_example", mine, ignore=_NOT_SOURCES)
    wheel_env.pip("install", "-q", "--no-index", "--find-links", str(wheel_env.wheels), "--no-build-isolation",
                  "pie-engine", "./my_backend")
    listed = wheel_env.pie("backends").stdout
    assert "example" in listed
    report = wheel_env.root / "example.json"
    run = wheel_env.pie("conformance", "--backend", "example", "--report", "json", str(report))
    totals = json.loads(report.read_text())["totals"]
    assert totals["failed"] == 0 and totals["passed"] > 100, run.stdout[-3000:]


def test_every_backend_installs_from_its_wheel(wheel_env: WheelEnv) -> None:
    wheel_env.pip("install", "-q", "--no-index", "--find-links", str(wheel_env.wheels), "--no-deps",
                  "pie-backend-cpu", "pie-backend-torch", "pie-backend-tensorrt")
    rows = {r["name"]: r for r in json.loads(wheel_env.pie("backends", "--json").stdout)}
    for name in ("cpu", "torch", "tensorrt", "dummy"):
        assert rows[name]["status"] == "ok", rows[name]
    torch_dir = wheel_env.run(str(wheel_env.python), "-c", "import pie_backend_torch, pathlib; "
                              "print(pathlib.Path(pie_backend_torch.__file__).parent)").stdout.strip()
    assert (Path(torch_dir) / "csrc" / "q4.cpp").is_file()  # its CPU kernels' source ships too
    report = wheel_env.root / "cpu.json"
    wheel_env.pie("conformance", "--backend", "cpu", "-k", "forward", "--report", "json", str(report))
    assert json.loads(report.read_text())["totals"]["passed"] > 0


def test_pie_serve_from_the_wheel_has_its_chat_page_and_openai_endpoints(wheel_env: WheelEnv) -> None:
    """The chat page and the built-in openai-compat inferlet are package data the wheel must carry."""
    import re
    import time
    import urllib.request

    proc = subprocess.Popen([str(wheel_env.python.parent / "pie"), "serve", "--dummy", "--no-auth", "--port", "0",
                             "--isolation", "inprocess", "--status-interval", "0"], cwd=wheel_env.root / "work",
                            env=wheel_env.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, port = time.monotonic() + 120, None
        assert proc.stderr is not None
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "pie serve exited"
            if found := re.search(r"chat in a browser: http://127\.0\.0\.1:(\d+)/", line):
                port = int(found[1])
        assert port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:
            assert b"<title>Pie chat</title>" in resp.read()
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert json.loads(resp.read())["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        proc.wait(30)
