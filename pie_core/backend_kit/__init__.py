"""Everything a backend imports from ``pie_core``: the contract and the pieces backends share.

A backend (``plugins/*``, ``examples/backends/*``) imports ``pie_core.backend_kit`` and nothing
else of ``pie_core``, not even the kit's submodules (``tests/core/test_backend_seams.py`` enforces
it), so the engine core can change behind this face without breaking a backend. What it holds:

- the contract (:mod:`pie_core.hookspec`): ``CONTRACT_VERSION``, ``hookimpl`` and the value
  objects of the hooks; ``ModelSpec`` and ``RopeConfig`` (:mod:`pie_core.models.spec`);
  ``Unsupported`` (:mod:`pie_core.errors`), raised for an architecture the backend does not run;
- :func:`check_batch`, the consistency checks every forward runs before it writes, and
  :func:`kv_lengths` / :func:`write_slots`, each request's KV length and each token's flat write slot;
- :func:`inverse_frequencies` and :func:`layer_frequencies`, RoPE's float64 tables;
- :func:`device_pool_pages` and :func:`host_pool_pages`, the pool sizes from ``BackendOptions``;
- the reference samplers and probes (:mod:`.sampling`): :func:`sample_and_probe`,
  :func:`logit_rows`, :func:`hidden_rows`;
- the adapter hooks over a bank of adapters (:class:`AdapterHooks`, :class:`AdapterBank`) and
  the contract's LoRA tensor names and zo noise (:mod:`.lora`);
- :func:`weights_cache_dir`, where derived weights may be kept, and :func:`announce_step`, which
  says on screen what a one-time step of loading (a kernel build, weight packing) is doing;
- :class:`DummyBackend`, the weightless backend (entry point ``dummy``).

The kit sits at the bottom of ``pie_core``: it may import only the contract (``hookspec``,
``values``, ``models.spec``, ``errors``) and ``models.weights_cache``, never the engine, host,
runtime, server, kv or scheduler (``tests/core/test_layers.py``).
"""

from pie_core.backend_kit import lora
from pie_core.backend_kit.adapter_bank import AdapterBank, AdapterHooks
from pie_core.backend_kit.batch import check_batch, kv_lengths, write_slots
from pie_core.backend_kit.dummy import DummyBackend
from pie_core.backend_kit.pools import DEFAULT_HOST_PAGES, MAX_BUDGET_PAGES, device_pool_pages, host_pool_pages
from pie_core.backend_kit.rope import inverse_frequencies, layer_frequencies
from pie_core.backend_kit.sampling import hidden_rows, logit_rows, sample_and_probe
from pie_core.backend_kit.steps import announce_step, step_listener
from pie_core.backend_kit.weights_cache import weights_cache_dir
from pie_core.errors import Unsupported
from pie_core.hookspec import (
    CONTRACT_VERSION,
    BackendInfo,
    BackendOptions,
    BatchOutput,
    Capabilities,
    CopyKind,
    ForwardBatch,
    ProbeKind,
    SamplerKind,
    hookimpl,
)
from pie_core.models.spec import ModelSpec, RopeConfig

__all__ = [
    # the contract
    "CONTRACT_VERSION",
    "hookimpl",
    "BackendInfo",
    "BackendOptions",
    "BatchOutput",
    "Capabilities",
    "CopyKind",
    "ForwardBatch",
    "ProbeKind",
    "SamplerKind",
    "ModelSpec",
    "RopeConfig",
    "Unsupported",
    # shared by backends
    "check_batch",
    "kv_lengths",
    "write_slots",
    "inverse_frequencies",
    "layer_frequencies",
    "sample_and_probe",
    "logit_rows",
    "hidden_rows",
    "device_pool_pages",
    "host_pool_pages",
    "MAX_BUDGET_PAGES",
    "DEFAULT_HOST_PAGES",
    "weights_cache_dir",
    "announce_step",
    "step_listener",
    "AdapterHooks",
    "AdapterBank",
    "lora",
    "DummyBackend",
]
