"""Pie's torch backend: fast on a CPU (bf16, weight-only int8/int4), CUDA with Triton kernels.

Installed as the ``torch`` entry point of the ``pie.backends`` group; the engine prefers it over
``cpu`` wherever it is installed. Options are described in :mod:`pie_backend_torch.options`.
"""

from pie_backend_torch.backend import TorchBackend

__all__ = ["TorchBackend"]
