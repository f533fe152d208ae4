"""A loaded backend behind one typed worker: its thread, its queues, and every hook call.

The engine never touches pluggy's hook object: :class:`BackendWorker` is the only caller of the
hooks, on the one thread it owns, and hands :class:`BackendCalls` (one typed method per hook) to
the operations it runs there.
"""

from pie_core.backend.calls import BackendCalls
from pie_core.backend.functions import FunctionBackend
from pie_core.backend.worker import BackendWorker, BatchOutcome, backend_thread

__all__ = ["BackendCalls", "BackendWorker", "FunctionBackend", "BatchOutcome", "backend_thread"]
