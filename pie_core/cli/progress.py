"""A rich progress bar for model loading, drawn on stderr."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["loading_bar"]


@contextmanager
def loading_bar(label: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``progress(done, total)`` callback that drives a transient bar."""
    if not enabled:
        yield lambda done, total: None
        return
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
