"""Process isolation for server inferlets: one worker process per inferlet (docs/server.md)."""

from pie_core.server.isolation.launcher import ProcessLauncher
from pie_core.server.isolation.limits import WorkerLimits

__all__ = ["ProcessLauncher", "WorkerLimits"]
