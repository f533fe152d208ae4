"""The engine: loaded models (backend, page pools, batcher, market), the message broker and the
events an instance emits. Below the host API (``pie_core.host``), which calls into it; it
imports nothing from the host, the runners or the server (``tests/core/test_layers.py``).

Import from the modules (``pie_core.engine.engine``, ``.broker``, ``.events``): this package
stays empty so that a client importing ``events`` does not load the engine.
"""
