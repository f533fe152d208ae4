"""``--isolation`` end to end: ``pie run --isolation wasm`` runs the example in the sandbox, and
both commands refuse ``wasm`` in one line when its toolchain is missing; ``pie serve``'s ``auto``
picks wasm only where it can run."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pie_core.cli import serve as serve_cli
from pie_core.cli.main import main
from pie_core.errors import Unsupported
from pie_core.runtime.wasm import build

MISSING = "the wasm runner needs wasmtime, which is not installed: pip install 'pie-engine[wasm]'"


@pytest.fixture
def quiet_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("PIE_HOME", str(tmp_path / "pie-home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    return tmp_path


def test_pie_run_isolation_wasm_runs_the_example_in_the_sandbox(quiet_home, capsys, monkeypatch) -> None:
    seen: list[str] = []
    real = build.component_path
    monkeypatch.setattr("pie_core.runtime.wasm.launcher.component_path",
                        lambda cache, on_build=None: seen.append("built") or real(cache, on_build))
    code = main(["run", "hello-world", "--dummy", "--quiet", "--isolation", "wasm", "--", "--name", "sandbox"])
    assert (code, capsys.readouterr().out.strip(), seen) == (0, "hello sandbox", ["built"])


def test_wasm_without_its_toolchain_is_one_clear_error(quiet_home, capsys, monkeypatch) -> None:
    monkeypatch.setattr(build, "toolchain_missing", lambda: MISSING)
    code = main(["run", "hello-world", "--dummy", "--quiet", "--isolation", "wasm", "--", "--name", "x"])
    err = capsys.readouterr().err
    assert code != 0 and MISSING in err and "Traceback" not in err
    with pytest.raises(Unsupported, match="pie-engine\\[wasm\\]"):
        serve_cli._isolation("wasm")


def test_serve_auto_is_wasm_where_the_toolchain_runs_and_process_elsewhere(monkeypatch) -> None:
    assert serve_cli._isolation("auto") == "wasm"  # the test extra installs componentize-py and wasmtime
    monkeypatch.setattr(build, "toolchain_missing", lambda: MISSING)
    assert serve_cli._isolation("auto") == "process"
    assert serve_cli._isolation("inprocess") == "inprocess"
