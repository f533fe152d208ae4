"""LoRA adapters in the forward's layout, and the batch's tokens grouped by the adapter they run.

The forward fuses Q/K/V into ``qkv`` and gate/up into ``gate_up`` (see ``weights``), so an
adapter is fused the same way: for ``qkv`` the ``A`` of the parts it holds stacked
``[parts * r, hidden]`` and a block-diagonal ``B`` ``[q_out + 2 * kv_out, parts * r]`` (zero
rows for the parts it lacks), likewise ``gate_up``; ``attn_output`` and ``ffn_down`` plain. A
fused projection none of whose parts are held is None. ``scaling`` is folded into ``B``, so a
group's delta on a projection ``y = W @ x`` is ``y[:, tokens] += B @ (A @ x[:, tokens])``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pie_core.backend_kit import ForwardBatch, ModelSpec, lora

__all__ = ["LowRank", "LayerDeltas", "TokenGroup", "fuse", "token_groups", "add_deltas"]

_FUSED = (
    ("qkv", ("attn_q", "attn_k", "attn_v")),
    ("attn_output", ("attn_output",)),
    ("gate_up", ("ffn_gate", "ffn_up")),
    ("ffn_down", ("ffn_down",)),
)
"""Each projection of :class:`~pie_backend_cpu.weights.LayerWeights` and the targets it fuses,
in row order."""


@dataclass(frozen=True, slots=True)
class LowRank:
    """``B @ A`` of one (fused) projection: ``a`` ``[k, in]``, ``b`` ``[out, k]`` with the
    adapter's scaling folded in."""

    a: np.ndarray
    b: np.ndarray


@dataclass(frozen=True, slots=True)
class LayerDeltas:
    """One layer's deltas, named as the projections of ``LayerWeights`` (None: adds nothing)."""

    qkv: LowRank | None
    attn_output: LowRank | None
    gate_up: LowRank | None
    ffn_down: LowRank | None


@dataclass(frozen=True, slots=True)
class TokenGroup:
    """Batch tokens (a slice when contiguous) that run one adapter's (possibly perturbed) deltas."""

    tokens: slice | np.ndarray
    layers: tuple[LayerDeltas, ...]


def _fuse_projection(
    spec: ModelSpec, tensors: dict[str, np.ndarray], layer: int, targets: tuple[str, ...], scaling: np.float32
) -> LowRank | None:
    held = [t for t in targets if lora.tensor_name(layer, t, "a") in tensors]
    if not held:
        return None
    a_parts = [tensors[lora.tensor_name(layer, t, "a")] for t in held]
    rank = a_parts[0].shape[0]
    outs = [lora.target_shape(spec, t)[0] for t in targets]
    b = np.zeros((sum(outs), rank * len(held)), dtype=np.float32)
    starts = np.cumsum([0, *outs])
    for j, t in enumerate(held):
        row = int(starts[targets.index(t)])
        block = tensors[lora.tensor_name(layer, t, "b")]
        b[row : row + block.shape[0], j * rank : (j + 1) * rank] = block * scaling
    return LowRank(np.ascontiguousarray(np.concatenate(a_parts)), b)


def fuse(spec: ModelSpec, tensors: dict[str, np.ndarray], scaling: float) -> tuple[LayerDeltas, ...]:
    """Lay an adapter's tensors (checked with :func:`pie_core.backend_kit.lora.check_tensors`) out per layer.

    Returns:
        One :class:`LayerDeltas` per layer of ``spec``.
    """
    s = np.float32(scaling)
    return tuple(
        LayerDeltas(*(_fuse_projection(spec, tensors, i, targets, s) for _, targets in _FUSED))
        for i in range(spec.num_layers)
    )


def token_groups(batch: ForwardBatch) -> list[tuple[int, int, slice | np.ndarray]]:
    """The batch's tokens grouped by ``(adapter_id, zo_seed)``, requests without an adapter left out.

    Returns:
        ``(adapter_id, zo_seed, tokens)`` per group, ``tokens`` ascending token indices (a slice
        when they are contiguous, so the forward reads them without a gather).
    """
    ids = batch.adapter_ids.astype(np.int64)
    held = np.flatnonzero(ids >= 0)
    if held.size == 0:
        return []
    keys = np.stack([ids[held], batch.zo_seeds[held].astype(np.int64)], axis=1)
    unique, label = np.unique(keys, axis=0, return_inverse=True)
    request_label = np.full(batch.num_requests, len(unique), dtype=np.int64)
    request_label[held] = label.reshape(-1)
    token_label = np.repeat(request_label, np.diff(batch.qo_indptr))
    order = np.argsort(token_label, kind="stable")
    bounds = np.searchsorted(token_label[order], np.arange(len(unique) + 1))
    groups: list[tuple[int, int, slice | np.ndarray]] = []
    for g, (adapter_id, seed) in enumerate(unique.tolist()):
        idx = order[bounds[g] : bounds[g + 1]]
        first, last = int(idx[0]), int(idx[-1])
        tokens: slice | np.ndarray = slice(first, last + 1) if last - first + 1 == len(idx) else idx
        groups.append((adapter_id, seed, tokens))
    return groups


def add_deltas(y: np.ndarray, x: np.ndarray, groups: tuple[TokenGroup, ...], layer: int, projection: str) -> None:
    """``y[:, g.tokens] += B @ (A @ x[:, g.tokens])`` for every group holding ``projection`` of
    ``layer`` (``y = W @ x`` is the projection's base output, feature-major)."""
    for group in groups:
        delta: LowRank | None = getattr(group.layers[layer], projection)
        if delta is not None:
            y[:, group.tokens] += delta.b @ (delta.a @ x[:, group.tokens])
