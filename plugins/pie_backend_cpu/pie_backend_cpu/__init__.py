"""Pie's NumPy backend: float32, portable, the numerical reference of the conformance suite.

Installed as the ``cpu`` entry point of the ``pie.backends`` group.
"""

from pie_backend_cpu.backend import CpuBackend

__all__ = ["CpuBackend"]
