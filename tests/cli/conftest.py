"""``pie`` run in-process as a user types it, with a private PIE_HOME and weights cache, on a
tiny GGUF (see ``tiny_gguf``) so that nothing loads the real model."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pie_core.cli import run as run_cli
from pie_core.cli.main import main
from pie_core.engine.engine import Engine
from tiny_gguf import write_tiny_qwen2


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf")


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh PIE_HOME and PIE_CACHE_DIR; the working directory is ``tmp_path``."""
    monkeypatch.setenv("PIE_HOME", str(tmp_path / "pie-home"))
    monkeypatch.setenv("PIE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    return tmp_path / "pie-home"


@dataclass
class Result:
    code: int
    out: str
    err: str
    engines: list[Engine] = field(default_factory=list)

    @property
    def engine(self) -> Engine:
        (engine,) = self.engines
        return engine


@pytest.fixture
def pie(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``pie(*argv)`` → :class:`Result`; the engines ``pie run`` built are recorded."""
    made: list[Engine] = []

    class RecordingEngine(Engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(run_cli, "Engine", RecordingEngine)

    def run(*argv: str) -> Result:
        made.clear()
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err, list(made))

    return run
