"""Process isolation for server inferlets: one worker process per inferlet (docs/server.md)."""

from pie_core.runtime.process.launcher import ProcessLauncher
from pie_core.runtime.process.limits import WorkerLimits

__all__ = ["ProcessLauncher", "WorkerLimits"]
