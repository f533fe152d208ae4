"""Shared helpers for the backend tests: tiny models, loaded backends, and request builders.

The tiny models and request builders live in the installable conformance suite
(``conformance.models``, ``conformance.batches``); this module re-exports them for the tests.
"""

from __future__ import annotations

from typing import Sequence

from conformance.batches import kv_request as _kv_request
from conformance.batches import probe_logits
from conformance.models import random_weights, tiny_spec
from pie_core.hookspec import BackendOptions
from pie_core.models.spec import ModelSpec
from pie_core.scheduler.assemble import assemble
from pie_core.scheduler.request import ForwardRequest
from pie_backend_cpu import CpuBackend

__all__ = [
    "tiny_spec",
    "random_weights",
    "load_cpu",
    "kv_request",
    "run",
    "probe_logits",
]


def load_cpu(spec: ModelSpec, weights=None, page_size: int = 4, kv_pages: int = 256, host_pages: int = 16):
    """A CpuBackend with ``spec`` loaded (random weights unless given)."""
    backend = CpuBackend()
    backend.pie_backend_load_model(
        spec,
        random_weights(spec) if weights is None else weights,
        BackendOptions(page_size=page_size, kv_pages=kv_pages, host_pages=host_pages),
    )
    return backend


def kv_request(*args, probe_all: bool = True, **kwargs) -> ForwardRequest:
    """:func:`conformance.batches.kv_request`, probing every row by default."""
    return _kv_request(*args, probe_all=probe_all, **kwargs)


def run(backend, requests: Sequence[ForwardRequest]):
    """Assemble ``requests`` into one batch and run it; returns the BatchOutput."""
    caps = backend.pie_backend_capabilities()
    return backend.pie_backend_forward(assemble(list(requests), caps.vocab_size))
