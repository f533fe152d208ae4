"""The GPU readiness kit (issue 39): one prepared command that verifies and measures Pie's CUDA
path inside a short GPU lease, and dry-runs the same flow on a CPU with tiny models.

Entry points: ``python -m benchmarks.gpu.check`` (see :mod:`benchmarks.gpu.check`) and, here
before a lease, ``python -m benchmarks.gpu.make_wheels``. See ``benchmarks/gpu/README.md``.
"""
