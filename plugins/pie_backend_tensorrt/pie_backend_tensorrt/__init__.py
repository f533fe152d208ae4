"""Pie's TensorRT backend: the model as one ONNX graph, run by ONNX Runtime on the TensorRT, CUDA
or CPU execution provider (the same graph and code on each).

Installed as the ``tensorrt`` entry point of the ``pie.backends`` group.
"""

from pie_backend_tensorrt.backend import TensorrtBackend

__all__ = ["TensorrtBackend"]
