"""Model-loading progress on stderr: a rich bar on a terminal, one line per phase elsewhere.

The loading code announces phases (``progress.phase("reading cached weights")``, see
:func:`pie_core.models.registry.announce`) and reports bytes (``progress(done, total)``). On a
terminal the bar's label follows the phase, and a phase without byte counts (the backend
converting weights) shows a pulsing bar and the time elapsed instead of sitting at 100%. When
stderr is not a terminal (logs, CI, pipes) each phase is one line, so a slow load is never
silent.

The wasm sandbox's component is built the first time it is used (tens of seconds, then cached):
:func:`wasm_build_notice` is the callback that says so in one line.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pie_core.engine.engine import Engine, LoadedModel

__all__ = ["LoadReporter", "loading_bar", "load_model", "wasm_build_notice"]


class LoadReporter:
    """What the loading code reports to: ``reporter(done, total)`` for bytes, ``reporter.phase(text)``
    for a new phase, :meth:`done` once the model is loaded."""

    def __init__(self, label: str, mode: str, stream: IO[str] | None = None) -> None:
        """
        Args:
            label: Prefix of every line (``loading qwen2.5-coder-0.5b-instruct``).
            mode: ``"bar"`` (a rich bar), ``"lines"`` (one line per phase) or ``"off"``.
            stream: Where lines go (default: ``sys.stderr``).
        """
        self.label, self.mode = label, mode
        self.phases: list[str] = []
        self._stream = stream
        self._start = time.monotonic()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, total=total or None)

    def phase(self, text: str) -> None:
        """Start a phase: a new label (and an indeterminate bar until bytes arrive), or a line."""
        if self.phases and self.phases[-1] == text:
            return
        self.phases.append(text)
        if self._bar is not None and self._task is not None:  # a fresh task: no total (pulsing) until bytes arrive
            self._bar.remove_task(self._task)
            self._task = self._bar.add_task(f"{self.label}: {text}", total=None)
        elif self.mode == "lines":
            self._line(f"{self.label}: {text}")

    def done(self, what: str) -> None:
        """The model is loaded: one closing line (after the bar is gone) with the time taken."""
        if self.mode != "off":
            self._line(f"{what} in {time.monotonic() - self._start:.1f}s")

    def _line(self, text: str) -> None:
        stream = self._stream or sys.stderr
        print(text, file=stream, flush=True)


def _mode(quiet: bool, stream: IO[str]) -> str:
    if quiet:
        return "off"
    return "bar" if stream.isatty() else "lines"


@contextmanager
def loading_bar(label: str, quiet: bool = False, stream: IO[str] | None = None) -> Iterator[LoadReporter]:
    """Yield a :class:`LoadReporter` drawing on ``stream`` (default stderr): a transient bar when
    it is a terminal, one line per phase when not, nothing when ``quiet``."""
    out = stream or sys.stderr
    reporter = LoadReporter(label, _mode(quiet, out), out)
    if reporter.mode != "bar":
        yield reporter
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=Console(file=out),
        transient=True,
    ) as bar:
        reporter._bar, reporter._task = bar, bar.add_task(label, total=None)
        try:
            yield reporter
        finally:
            reporter._bar = None


def load_model(engine: Engine, name: str | None, quiet: bool = False, stream: IO[str] | None = None) -> LoadedModel:
    """Load ``name`` (None: ``engine.default_model``) on ``engine`` with progress on ``stream``.

    The model is resolved first with the reporter (assembling a built-in model, fingerprinting a
    new GGUF, reading the tokenizer), then loaded (reading or dequantising weights, then the
    backend preparing them); the engine's own resolve finds it memoised.

    Raises:
        As :meth:`~pie_core.engine.engine.Engine.load`.
    """
    from pie_core import config
    from pie_core.backend_kit.steps import step_listener
    from pie_core.models.registry import resolve_model

    label = f"loading {name or config.get('engine.default_model', engine.config)}"
    with loading_bar(label, quiet, stream) as progress, step_listener(progress.phase):
        resolve_model(name, engine.config, progress=progress)
        model = engine.load(name, progress=progress)
    progress.done(f"loaded {model.name} on {engine.backend}")
    return model


def wasm_build_notice(quiet: bool = False, stream: IO[str] | None = None) -> Callable[[], None] | None:
    """The ``on_build`` callback of :class:`~pie_core.runtime.wasm.launcher.WasmLauncher`: one line
    on ``stream`` (default stderr) before the sandbox's first build, so the wait is not a silent
    hang; ``None`` (nothing printed) when ``quiet``. Nothing is printed when the build is cached."""
    if quiet:
        return None

    def notice() -> None:
        from pie_core.models.weights_cache import cache_dir

        folder = cache_dir() / "wasm"
        try:
            shown = f"~/{folder.relative_to(Path.home())}"
        except ValueError:
            shown = str(folder)
        print(f"building the wasm sandbox (first use, ~30 s; cached in {shown})...", file=stream or sys.stderr, flush=True)

    return notice
