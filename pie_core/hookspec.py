"""The backend contract: pluggy hook specifications plus the batch and output value objects.

A backend is a plugin object (usually a class instance) with ``@hookimpl`` methods for the
hooks below. It is found through the entry-point group ``pie.backends``: the entry point names
the backend and points at a zero-argument factory (a class) returning the plugin object. The
plugin object must carry ``PIE_CONTRACT_VERSION`` equal to :data:`CONTRACT_VERSION`'s major
number, or registration fails (see ``pie_core.plugins``).

Versioning: a minor bump only adds optional features, each named by a feature string that a
backend declares in ``Capabilities.features`` (and ``BackendInfo.features``). The core never
sends a batch that needs an undeclared feature (the inferlet gets ``Unsupported`` instead), so a
backend written for an older minor keeps working unchanged. A major bump changes what existing
hooks or fields mean, and older backends are refused. History: 1.1 added ``ProbeKind.EMBEDDING``
(feature ``"embeddings"``); 1.2 ``BackendOptions.weights_key``; 1.3 the adapter hooks
(``pie_backend_adapter_*``, feature ``"adapters"``, and ``pie_backend_adapter_zo`` with feature
``"zo"``) and ``Capabilities.max_adapters`` / ``max_adapter_rank``; 1.4
``BackendInfo.keeps_derived_weights`` (the engine then keeps no float32 copy of a GGUF).

Every array is a numpy array; integer arrays are int32 unless said otherwise. The core builds
batches; the backend never sees Python lists per token. Hooks are called from one backend worker
thread, never concurrently for the same backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterable

import numpy as np
import pluggy

from pie_core.values import ProbeKind, SamplerKind
from pie_core.models.spec import ModelSpec

__all__ = [
    "CONTRACT_VERSION",
    "hookspec",
    "hookimpl",
    "SamplerKind",
    "ProbeKind",
    "CopyKind",
    "Capabilities",
    "BackendInfo",
    "BackendOptions",
    "ForwardBatch",
    "BatchOutput",
    "BackendSpec",
]

CONTRACT_VERSION = "1.4"
"""Major.minor of this contract. A plugin whose major differs is refused at registration; any
minor of the same major is accepted (minors only add optional, feature-gated capabilities)."""

hookspec = pluggy.HookspecMarker("pie")
hookimpl = pluggy.HookimplMarker("pie")


class CopyKind(IntEnum):
    """Direction of a page copy. Host slots are the backend's own, numbered by the core."""

    DEVICE_TO_DEVICE = 0
    DEVICE_TO_HOST = 1
    HOST_TO_DEVICE = 2


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """Identity of a backend: shown by ``pie backends`` and checked at registration."""

    name: str
    version: str
    contract_version: str
    description: str = ""
    features: frozenset[str] = frozenset()
    """Features the backend can offer (same names as ``Capabilities.features``)."""
    devices: tuple[str, ...] = ("cpu",)
    keeps_derived_weights: bool = False
    """(contract 1.4) The backend stores what it derives from the weights (a packed or quantised
    layout) under ``BackendOptions.weights_key`` and reads ``weights`` only when nothing is stored
    for that key. The engine then keeps no float32 copy of a GGUF's weights on disk: it dequantises
    into unlinked temporary files that vanish once the backend lets go of them."""


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """What the engine asks of the backend when it loads a model.

    ``kv_pages`` = 0 lets the backend size the pool from ``kv_memory_bytes``.
    """

    device: str = "cpu"
    dtype: str = "float32"
    page_size: int = 16
    kv_pages: int = 0
    kv_memory_bytes: int = 1 << 30
    host_pages: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    weights_key: str = ""
    """Names the content of the weights being loaded (the same key means the same weights), so a
    backend may keep what it derives from them (packed or quantised copies) and skip the work next
    time; "" when unknown. Set by the engine (contract 1.2)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a loaded backend promises. The core refuses work beyond it with ``Unsupported``."""

    page_size: int
    num_pages: int
    num_host_pages: int
    vocab_size: int
    max_batch_tokens: int
    max_batch_requests: int
    max_sample_rows: int
    max_mask_bytes: int
    dtype: str
    device: str
    features: frozenset[str] = frozenset()
    """Subset of ``{"custom_mask", "logit_mask", "probes", "embeddings", "adapters", "zo",
    "offload", "system_speculation"}``. ``"embeddings"`` (contract 1.1): EMBEDDING probe rows.
    ``"adapters"`` (1.3): the adapter hooks and ``adapter_ids``; ``"zo"`` (1.3): ``zo_seeds`` and
    ``pie_backend_adapter_zo``."""
    max_adapters: int = 0
    """Adapters the backend holds at once (created and not destroyed); 0 without ``"adapters"``."""
    max_adapter_rank: int = 0
    """Largest LoRA rank the backend accepts; 0 without ``"adapters"``."""

    def check_limits(self, batch: ForwardBatch) -> None:
        """Refuse a batch beyond the declared limits (call it first in ``pie_backend_forward``).

        Raises:
            ValueError: Naming the first limit the batch exceeds.
        """
        for what, value, limit in (
            ("input tokens", batch.num_tokens, self.max_batch_tokens),
            ("requests", batch.num_requests, self.max_batch_requests),
            ("sample rows", len(batch.sample_rows), self.max_sample_rows),
            ("custom-mask entries", int(batch.mask_indptr[-1]), self.max_mask_bytes),
        ):
            if value > limit:
                raise ValueError(f"the batch has {value} {what}; this backend takes at most {limit}: split it")


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """One flat batch of R requests, N input tokens, S sample rows, Q probe rows.

    Tokens and KV:
        token_ids[N], positions[N] (feed RoPE only), qo_indptr[R+1]: request r owns input
        tokens ``qo_indptr[r]:qo_indptr[r+1]`` (at least one each).
        kv_page_indices[P], kv_page_indptr[R+1]: request r's physical pages in sequence order,
        including the pages this pass writes. kv_last_page_len[R]: valid slots in r's last page
        after the writes. r's KV length is ``(pages - 1) * page_size + last_page_len``.
        kv_write_slots[N]: slot (index into r's page list * page_size + offset) that each input
        token's K/V is written to before attention.

    Attention:
        By default a token attends to every slot of its request from 0 up to and including its
        own write slot. ``mask_indptr[R+1]`` (int64) indexes ``mask_data`` (bool): when
        ``mask_indptr[r+1] > mask_indptr[r]``, request r carries a custom mask of shape
        ``(n_r, kv_len_r)`` row-major, true = attend, replacing the default. Sliding-window
        layers additionally hide keys whose position is ``<= q_pos - window``.

    Sampling (S rows, each an index into the N tokens):
        sample_rows[S], sampler_kind[S] (int8, :class:`SamplerKind`), temperature[S] (f32),
        top_k[S], top_p[S] (f32), min_p[S] (f32), draws[S] (tokens drawn; 1 except multinomial),
        seeds[S] (uint64; 0 = fresh randomness, else reproducible for the same logits).
        logit_masks: None, or uint8[S, ceil(vocab/8)] (``np.packbits(..., bitorder="little")``
        of a bool vocab mask, true = allowed). Disallowed tokens get -inf before sampling and
        probes at that row.

    Probes (Q rows):
        probe_rows[Q], probe_kind[Q] (int8, :class:`ProbeKind`), probe_temperature[Q] (f32),
        probe_k[Q]; for LOGPROBS the ids are ``probe_token_ids[probe_token_indptr[q]:...[q+1]]``.
        probe_masked[Q] (int32): index of the sample row whose logit mask applies, or -1.
        EMBEDDING rows read the hidden state, not the logits: a row probed only for its
        embedding needs no logits (see ``pie_core.backend_kit.sampling.logit_rows``/``hidden_rows``).

    Adapters: adapter_ids[R] (-1 none): request r runs with that adapter's LoRA deltas on every
    projection it adapts (see :mod:`pie_core.backend_kit.lora`). zo_seeds[R] (int64, 0 none): request r runs
    its adapter's mean weights plus ``sigma * zo_noise(seed)`` (sigma as last set by
    ``pie_backend_adapter_zo``); a nonzero seed comes only with an adapter. Requests with
    different adapters, seeds and none share one batch; the backend groups rows by
    ``(adapter, seed)``.
    """

    token_ids: np.ndarray
    positions: np.ndarray
    qo_indptr: np.ndarray
    kv_page_indices: np.ndarray
    kv_page_indptr: np.ndarray
    kv_last_page_len: np.ndarray
    kv_write_slots: np.ndarray
    mask_indptr: np.ndarray
    mask_data: np.ndarray
    sample_rows: np.ndarray
    sampler_kind: np.ndarray
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    draws: np.ndarray
    seeds: np.ndarray
    logit_masks: np.ndarray | None
    probe_rows: np.ndarray
    probe_kind: np.ndarray
    probe_temperature: np.ndarray
    probe_k: np.ndarray
    probe_token_ids: np.ndarray
    probe_token_indptr: np.ndarray
    probe_masked: np.ndarray
    adapter_ids: np.ndarray
    zo_seeds: np.ndarray

    @property
    def num_requests(self) -> int:
        return len(self.qo_indptr) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class BatchOutput:
    """What ``pie_backend_forward`` returns.

    tokens: int32[sum(draws)], the sampled ids of each sample row in row order (row s owns
        ``draws[s]`` consecutive entries).
    probes: one value per probe row: float32[vocab] for LOGITS; ``(int32[k], float32[k])`` for
        DISTRIBUTION (descending probability); float32[len(ids)] for LOGPROBS; float for ENTROPY;
        float32[hidden_size] for EMBEDDING.
    """

    tokens: np.ndarray
    probes: tuple[Any, ...] = ()


class BackendSpec:
    """Hook specifications. A backend implements all of them except the optional ones."""

    @hookspec(firstresult=True)
    def pie_backend_info(self) -> BackendInfo:  # type: ignore[empty-body]
        """Identify the backend.

        Returns:
            Name, package version, and the contract version it was written against.
        """

    @hookspec(firstresult=True)
    def pie_backend_load_model(  # type: ignore[empty-body]
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        """Load one model's weights and allocate its KV page store.

        Args:
            spec: Architecture hyper-parameters.
            weights: ``(canonical name, float32 array)`` pairs (see ``pie_core.models.spec``).
                Consumed once; the backend converts to its own dtype and layout.
            options: Device, dtype, page size and memory budget.

        Returns:
            The capabilities of the loaded backend.

        Raises:
            ValueError: A weight is missing or misshapen, or an option is not supported.
        """

    @hookspec(firstresult=True)
    def pie_backend_capabilities(self) -> Capabilities:  # type: ignore[empty-body]
        """Capabilities of the loaded model (only valid after ``pie_backend_load_model``)."""

    @hookspec(firstresult=True)
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:  # type: ignore[empty-body]
        """Run one flat batch: write K/V, attend, then sample and probe the requested rows.

        Args:
            batch: A batch the core has validated against the capabilities.

        Returns:
            The sampled tokens and probe values, in row order.

        Raises:
            Exception: Any failure; the core fails every request of the batch with it.
        """

    @hookspec(firstresult=True)
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole KV pages (all layers, K and V, with their slot positions).

        Args:
            kind: Direction. Device page ids index the device pool; host ids the host pool.
            src: int32 page ids to read.
            dst: int32 page ids to write, same length as ``src``.
        """

    # Adapters (feature "adapters", contract 1.3). Tensors are named and shaped as in
    # pie_core.backend_kit.lora; the core numbers adapters in [0, max_adapters) and reuses an id only after
    # destroying the adapter that held it.

    @hookspec(firstresult=True)
    def pie_backend_adapter_create(self, adapter_id: int, rank: int, scaling: float) -> None:
        """Hold a new adapter of ``rank`` over every target of every layer, all weights zero (it
        changes nothing until loaded or moved by zo).

        Raises:
            ValueError: ``adapter_id`` is held already, ``rank`` is outside
                ``[1, max_adapter_rank]``, or ``max_adapters`` are held.
        """

    @hookspec(firstresult=True)
    def pie_backend_adapter_load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        """Replace a held adapter's weights (its targets and rank may change; targets absent from
        ``tensors`` add nothing). Its zo sigma stays; perturbed copies cached for zo seeds are
        dropped.

        Args:
            adapter_id: A held adapter.
            tensors: float32 arrays by :func:`pie_core.backend_kit.lora.tensor_name`, checked with
                :func:`pie_core.backend_kit.lora.check_tensors`.
            scaling: Multiplies every ``B @ A`` delta.

        Raises:
            ValueError: Unknown id or a tensor that fails the check; the adapter is unchanged.
        """

    @hookspec(firstresult=True)
    def pie_backend_adapter_save(self, adapter_id: int) -> dict[str, np.ndarray]:  # type: ignore[empty-body]
        """The mean weights of a held adapter: float32 copies by tensor name (zo's sigma is not
        applied).

        Raises:
            ValueError: Unknown id.
        """

    @hookspec(firstresult=True)
    def pie_backend_adapter_destroy(self, adapter_id: int) -> None:
        """Release a held adapter and everything cached for it; its id may be reused.

        Raises:
            ValueError: Unknown id.
        """

    @hookspec(firstresult=True)
    def pie_backend_adapter_zo(
        self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray
    ) -> None:
        """Move a held adapter's mean and set its perturbation scale (feature ``"zo"``).

        Every tensor ``T`` of the adapter becomes ``T + sum_i coefficients[i] *
        zo_noise(seeds[i], index(T))`` (:func:`pie_core.backend_kit.lora.moved`); afterwards a pass with zo
        seed ``s`` runs ``T + sigma * zo_noise(s, index(T))`` (:func:`pie_core.backend_kit.lora.perturbed`).
        Empty ``seeds`` only sets ``sigma``.

        Args:
            adapter_id: A held adapter.
            sigma: Perturbation scale, finite and >= 0.
            seeds: int64 zo seeds (nonzero).
            coefficients: float32, one per seed.

        Raises:
            ValueError: Unknown id, lengths differ, or a value is out of range; nothing changes.
        """
