"""``pie run --kv-pages N --host-pages M`` end to end, in-process on the dummy backend: the loaded
model's pools have the sizes asked for, and the engine is told how much host pool to use."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from pie_core.cli import run as run_cli
from pie_core.cli.main import main
from pie_core.engine.engine import Engine


@pytest.fixture
def pie_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Run ``pie run hello-world --backend dummy FLAGS...``; returns (exit code, the engine, its keywords)."""
    monkeypatch.setenv("PIE_HOME", str(tmp_path / "pie-home"))  # the default config, whatever ~/.pie says
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    made: list[tuple[Engine, dict[str, Any]]] = []

    class RecordingEngine(Engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append((self, kwargs))

    monkeypatch.setattr(run_cli, "Engine", RecordingEngine)

    def run(*flags: str) -> tuple[int, Engine, dict[str, Any]]:
        code = main(["run", "hello-world", "--backend", "dummy", "--quiet", *flags, "--", "--name", "pool"])
        assert capsys.readouterr().out.strip() == "hello pool"
        (engine, kwargs), = made
        return code, engine, kwargs

    return run


def test_kv_pages_sizes_the_device_pool_of_the_loaded_model(pie_run):
    code, engine, kwargs = pie_run("--kv-pages", "64")
    (model,) = engine.models.values()
    assert code == 0
    assert model.caps.num_pages == 64 and model.pool.num_pages == 64
    assert "host_pages" not in kwargs  # no flag, default config: the backend's host pool


def test_kv_pages_and_host_pages_size_both_pools(pie_run):
    code, engine, kwargs = pie_run("--kv-pages", "64", "--host-pages", "8")
    (model,) = engine.models.values()
    assert code == 0
    assert (model.caps.num_pages, model.pool.num_pages, model.caps.num_host_pages) == (64, 64, 8)
    assert kwargs["host_pages"] == 8
