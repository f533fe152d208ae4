"""A minimal out-of-tree Pie backend (entry point ``example`` in ``pie.backends``)."""

from pie_backend_example.backend import ExampleBackend

__all__ = ["ExampleBackend"]
