"""Per-worker resource limits: wall time (engine side), CPU time and address space (rlimits)."""

from __future__ import annotations

import resource
from dataclasses import dataclass

from pie_core.errors import InvalidInput

__all__ = ["WorkerLimits", "apply_rlimits"]


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """Limits for one inferlet worker process.

    Attributes:
        wall_s: Seconds the inferlet may run, counted once its worker has started and
            imported it, before the worker is killed (0 = no limit); never past
            ``start_s + wall_s`` after the launch.
        start_s: Seconds a worker may take to start and import the inferlet (0 = no limit).
        cpu_s: CPU seconds (``RLIMIT_CPU``) before the kernel kills the worker (0 = no limit).
        memory_mb: Address space the inferlet may add on top of what the worker had mapped
            after start-up (``RLIMIT_AS``; 0 = no limit).
    """

    wall_s: float = 600.0
    start_s: float = 60.0
    cpu_s: int = 300
    memory_mb: int = 4096

    @classmethod
    def from_config(cls) -> WorkerLimits:
        """Limits from ``~/.pie/config.toml`` (``server.worker_wall_s``, ``server.worker_start_s``,
        ``server.worker_cpu_s``, ``server.worker_memory`` such as ``"4GiB"``); unset keys keep
        the defaults above.

        Raises:
            InvalidInput: A value is not a non-negative number (or byte size).
        """
        from pie_core import config

        doc = config.load_config()
        base = cls()
        memory = config.get("server.worker_memory", doc, None)
        try:
            limits = cls(
                wall_s=float(config.get("server.worker_wall_s", doc, base.wall_s)),
                start_s=float(config.get("server.worker_start_s", doc, base.start_s)),
                cpu_s=int(config.get("server.worker_cpu_s", doc, base.cpu_s)),
                memory_mb=base.memory_mb if memory is None else config.parse_bytes(memory) // 2**20,
            )
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"bad worker limit in config: {exc}; fix it with 'pie config set server.worker_...'") from exc
        if min(limits.wall_s, limits.start_s, limits.cpu_s, limits.memory_mb) < 0:
            raise InvalidInput(f"worker limits must be >= 0 (0 = none), got {limits}")
        return limits


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
