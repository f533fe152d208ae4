"""``TorchBackend``: the hook implementations of the torch backend."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Iterable

import numpy as np
import torch

from pie_core.backend_kit import (
    CONTRACT_VERSION,
    AdapterHooks,
    BackendInfo,
    BackendOptions,
    BatchOutput,
    Capabilities,
    CopyKind,
    ForwardBatch,
    ModelSpec,
    check_batch,
    device_pool_pages,
    hidden_rows,
    hookimpl,
    host_pool_pages,
    logit_rows,
)

from pie_backend_torch.adapters import MAX_ADAPTER_RANK, MAX_ADAPTERS, AdapterStore
from pie_backend_torch.kv_cache import KvCache, page_bytes
from pie_backend_torch.model import Transformer
from pie_backend_torch.options import TorchConfig, resolve_options
from pie_backend_torch.sampling import Drawer, Masker, draw, sample_and_probe
from pie_backend_torch.tp_group import TpGroup
from pie_backend_torch.tp_shard import Shard, check_split, local_spec, shard_weights
from pie_backend_torch.weights_store import load_weights

__all__ = [
    "TorchBackend",
    "FEATURES",
    "MAX_BATCH_TOKENS",
    "MAX_BATCH_REQUESTS",
    "MAX_SAMPLE_ROWS",
    "MAX_MASK_BYTES",
    "MAX_ADAPTERS",
    "MAX_ADAPTER_RANK",
    "build_transformer",
]

MAX_BATCH_TOKENS = 8192
"""Most input tokens (prefill and decode together) in one forward."""
MAX_BATCH_REQUESTS = 256
"""Most requests in one forward."""
MAX_SAMPLE_ROWS = 4096
"""Most sample rows in one forward (each may draw several tokens)."""
MAX_MASK_BYTES = 1 << 28
"""Most custom attention-mask entries (one byte each) in one forward."""
FEATURES = frozenset({"custom_mask", "logit_mask", "probes", "embeddings", "offload", "adapters", "zo"})


def build_transformer(
    spec: ModelSpec,
    weights: Iterable[tuple[str, np.ndarray]],
    config: TorchConfig,
    page_size: int,
    num_pages: int,
    host_pages: int,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Transformer:
    """Lay out ``weights`` and allocate the KV pools of ``spec`` (a rank's slice under tp)."""
    with torch.inference_mode():
        model_weights = load_weights(spec, weights, config)
    cache = KvCache(
        spec.num_layers, num_pages, host_pages, page_size, spec.num_kv_heads, spec.head_dim, config.dtype, config.device
    )
    return Transformer(spec, model_weights, cache, config, reduce)


def rank_threads(config: TorchConfig) -> int | None:
    """Intra-op threads of each rank: as asked, else under tp on a CPU the cores split between ranks."""
    if config.threads is not None or config.tp == 1 or config.device.type != "cpu":
        return config.threads
    return max(1, (os.cpu_count() or 1) // config.tp)


def _package_version() -> str:
    try:
        return version("pie-backend-torch")
    except PackageNotFoundError:
        return "0+unknown"


def _devices() -> tuple[str, ...]:
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


class TorchBackend(AdapterHooks):
    """torch backend: bf16 and weight-only int8/int4 on a CPU, Triton kernels on CUDA.

    One instance serves one model, and the LoRA adapters created for it
    (:mod:`pie_backend_torch.adapters`). Hooks are called from one worker thread at a time.
    """

    PIE_CONTRACT_VERSION = CONTRACT_VERSION

    def __init__(self) -> None:
        self._model: Transformer | None = None
        self._cache: KvCache | None = None
        self._caps: Capabilities | None = None
        self._config: TorchConfig | None = None
        self._drawer: Drawer = draw
        self._masker: Masker | None = None
        self._rng = np.random.default_rng()
        self._graphs: Any = None  # cuda_graphs.DecodeGraphs when capturing
        self._adapters: AdapterStore | None = None
        self._tp: TpGroup | None = None

    @hookimpl
    def pie_backend_info(self) -> BackendInfo:
        """Identify the backend."""
        return BackendInfo(
            name="torch",
            version=_package_version(),
            contract_version=CONTRACT_VERSION,
            description=f"torch {torch.__version__}: bf16/int8/int4 on CPU, Triton kernels and CUDA graphs on CUDA",
            features=FEATURES,
            devices=_devices(),
            keeps_derived_weights=True,  # weights_store.py: its layout under weights_key
        )

    @hookimpl
    def pie_backend_load_model(
        self, spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], options: BackendOptions
    ) -> Capabilities:
        """Load weights and allocate the KV pools.

        ``options.dtype`` ``"auto"`` picks bfloat16 where the CPU (or GPU) computes it natively,
        with weight-only int4 for small batches on a CPU; ``options.extra`` is described in
        :mod:`pie_backend_torch.options`. The pools are sized as
        :func:`~pie_core.backend_kit.device_pool_pages` and
        :func:`~pie_core.backend_kit.host_pool_pages` say.

        Raises:
            ValueError: A weight is missing or misshapen, an option is unknown or unavailable, or
                the pool options hold no page.
        """
        config = resolve_options(options)
        if options.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {options.page_size}")
        check_split(spec, config.tp)
        threads = rank_threads(config)
        if threads is not None:
            torch.set_num_threads(threads)
        local = local_spec(spec, config.tp)  # spec itself when tp == 1
        per_page = page_bytes(spec.num_layers, options.page_size, local.num_kv_heads, spec.head_dim, config.dtype)
        num_pages = device_pool_pages(options, per_page)
        host_pages = host_pool_pages(options)
        group: TpGroup | None = None
        if config.tp == 1:
            model = build_transformer(spec, weights, config, options.page_size, num_pages, host_pages)
        else:
            model, group = self._load_ranks(spec, weights, config, options.page_size, num_pages, host_pages, threads)
        if self._tp is not None:  # the model loaded before had ranks: they go once this one stands
            self._tp.close()
        self._tp = group
        cache = model.cache
        self._model = model
        self._adapters = AdapterStore(
            spec, config.kernels, config.dtype, config.device, None if config.tp == 1 else Shard(spec, 0, config.tp)
        )
        self._cache = cache
        self._config = config
        if config.kernels == "triton":
            from pie_backend_torch.triton_kernels.sampling import apply_packed_mask, triton_draw

            self._drawer = triton_draw
            self._masker = apply_packed_mask
        if config.cuda_graphs:
            from pie_backend_torch.cuda_graphs import DecodeGraphs

            self._graphs = DecodeGraphs(self._model)
        self._caps = Capabilities(
            page_size=options.page_size,
            num_pages=num_pages,
            num_host_pages=host_pages,
            vocab_size=spec.vocab_size,
            max_batch_tokens=MAX_BATCH_TOKENS,
            max_batch_requests=MAX_BATCH_REQUESTS,
            max_sample_rows=MAX_SAMPLE_ROWS,
            max_mask_bytes=MAX_MASK_BYTES,
            dtype=config.dtype_name,
            device=str(config.device),
            features=FEATURES,
            max_adapters=MAX_ADAPTERS,
            max_adapter_rank=MAX_ADAPTER_RANK,
        )
        return self._caps

    def _load_ranks(
        self,
        spec: ModelSpec,
        weights: Iterable[tuple[str, np.ndarray]],
        config: TorchConfig,
        page_size: int,
        num_pages: int,
        host_pages: int,
        threads: int | None,
    ) -> tuple[Transformer, TpGroup]:
        """Start the tp - 1 workers, send each its slice of every weight, and build rank 0's slice;
        returns once every rank holds its model (one all-reduce says so)."""
        group = TpGroup(config.tp, config.device, config.tp_timeout)
        try:
            local = local_spec(spec, config.tp)
            group.command("load", spec, config, page_size, num_pages, host_pages, threads)
            mine: list[tuple[str, np.ndarray]] = []
            for name, parts in shard_weights(spec, weights, config.tp):
                mine.append((name, parts[0]))
                for rank in range(1, config.tp):
                    group.send(rank, (name, parts[rank]))
            for rank in range(1, config.tp):
                group.send(rank, None)
            model = build_transformer(local, mine, config, page_size, num_pages, host_pages, group.all_reduce)
            group.all_reduce(torch.ones(1, device=config.device), loading=True)  # every rank built its slice
        except BaseException:
            group.close()
            raise
        return model, group

    def close(self) -> None:
        """Stop this backend's tensor-parallel workers (when ``tp`` > 1) and drop the model.

        The engine has no unload hook: workers also stop when this object is garbage-collected or
        the process exits. Idempotent.
        """
        if self._tp is not None:
            self._tp.close()
            self._tp = None
        self._model = self._cache = self._caps = None

    def _bank(self) -> Any:
        bank = super()._bank()
        return bank if self._tp is None else _MirroredBank(bank, self._tp)

    @hookimpl
    def pie_backend_capabilities(self) -> Capabilities:
        """Capabilities of the loaded model.

        Raises:
            RuntimeError: No model is loaded yet.
        """
        if self._caps is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._caps

    @hookimpl
    def pie_backend_forward(self, batch: ForwardBatch) -> BatchOutput:
        """Write K/V, attend, and sample/probe the requested rows on the device.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: The batch exceeds the declared limits or is inconsistent (lengths, ranges,
                slots, masks, probe kinds), names an adapter not held, or has a zo seed without
                an adapter. Nothing is written then.
        """
        model, caps = self._loaded()
        caps.check_limits(batch)
        check_batch(batch, caps.vocab_size, caps.num_pages, caps.page_size)
        rows = logit_rows(batch)
        hidden = hidden_rows(batch)
        with torch.inference_mode():
            assert self._adapters is not None
            lora = self._adapters.step(batch)
            if self._tp is not None:
                self._tp.command("forward", batch)  # checked above: every rank takes it
            if self._graphs is not None and self._graphs.accepts(batch, rows, hidden):
                logits, states = self._graphs.forward(batch, rows)
            else:
                logits, states = model.forward(batch, rows, hidden, lora)
            return sample_and_probe(batch, rows, logits, self._rng, states, hidden, self._drawer, self._masker)

    @hookimpl
    def pie_backend_copy_pages(self, kind: CopyKind, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy whole pages between or within the device and host pools.

        Raises:
            RuntimeError: No model is loaded yet.
            ValueError: Lengths differ, ids are out of range, or destinations repeat.
        """
        self._loaded()
        assert self._cache is not None
        with torch.inference_mode():
            self._cache.copy(kind, src, dst)  # checks the ids first: the workers only get a copy that succeeded
        if self._tp is not None:
            self._tp.command("copy", int(kind), np.asarray(src), np.asarray(dst))

    def _loaded(self) -> tuple[Transformer, Capabilities]:
        if self._model is None or self._caps is None:
            raise RuntimeError("no model loaded: call pie_backend_load_model first")
        return self._model, self._caps


class _MirroredBank:
    """Rank 0's adapter bank under tp: each change is made here first (which checks it), then
    broadcast, so every rank holds the same adapters and fuses its own slice of them."""

    def __init__(self, bank: AdapterStore, group: TpGroup) -> None:
        self._bank, self._group = bank, group

    def create(self, adapter_id: int, rank: int, scaling: float) -> None:
        self._group.check()
        self._bank.create(adapter_id, rank, scaling)
        self._group.command("adapter", "create", adapter_id, rank, scaling)

    def load(self, adapter_id: int, tensors: dict[str, np.ndarray], scaling: float) -> None:
        self._group.check()
        self._bank.load(adapter_id, tensors, scaling)
        self._group.command("adapter", "load", adapter_id, tensors, scaling)

    def save(self, adapter_id: int) -> dict[str, np.ndarray]:
        return self._bank.save(adapter_id)

    def destroy(self, adapter_id: int) -> None:
        self._group.check()
        self._bank.destroy(adapter_id)
        self._group.command("adapter", "destroy", adapter_id)

    def zo(self, adapter_id: int, sigma: float, seeds: np.ndarray, coefficients: np.ndarray) -> None:
        self._group.check()
        self._bank.zo(adapter_id, sigma, seeds, coefficients)
        self._group.command("adapter", "zo", adapter_id, sigma, seeds, coefficients)
