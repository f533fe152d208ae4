"""Pie for Python: the engine core. Backend-agnostic; imports no backend."""

__version__ = "0.1.0"
__all__ = ["__version__"]
