"""Per-worker resource limits: wall time (engine side), CPU time and address space (rlimits)."""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = ["WorkerLimits", "apply_rlimits"]


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """Limits for one inferlet worker process.

    Attributes:
        wall_s: Seconds from start until the worker is killed (0 = no limit).
        cpu_s: CPU seconds (``RLIMIT_CPU``) before the kernel kills the worker (0 = no limit).
        memory_mb: Address space the inferlet may add on top of what the worker had mapped
            after start-up (``RLIMIT_AS``; 0 = no limit).
    """

    wall_s: float = 600.0
    cpu_s: int = 300
    memory_mb: int = 4096


def _mapped_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def apply_rlimits(limits: WorkerLimits) -> None:
    """Set CPU and address-space limits on the calling process (call once imports are done)."""
    if limits.cpu_s > 0:
        used = resource.getrusage(resource.RUSAGE_SELF)
        base = int(used.ru_utime + used.ru_stime) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (base + limits.cpu_s, base + limits.cpu_s + 1))
    if limits.memory_mb > 0:
        cap = _mapped_bytes() + limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
