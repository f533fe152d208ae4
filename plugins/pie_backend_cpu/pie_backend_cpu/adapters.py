"""The adapters a cpu backend holds (:class:`pie_core.backend_kit.AdapterBank`), fused for the
NumPy forward by :func:`~pie_backend_cpu.lora_deltas.fuse`, and grouped per batch."""

from __future__ import annotations

from pie_core.backend_kit import AdapterBank, ForwardBatch, ModelSpec

from pie_backend_cpu.lora_deltas import LayerDeltas, TokenGroup, fuse, token_groups

__all__ = ["AdapterStore", "MAX_ADAPTERS", "MAX_ADAPTER_RANK"]

MAX_ADAPTERS = 32
"""Adapters held at once."""
MAX_ADAPTER_RANK = 64
"""Largest LoRA rank accepted."""


class AdapterStore(AdapterBank[tuple[LayerDeltas, ...]]):
    """Adapters of one loaded model, by the core's adapter id."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec, lambda tensors, scaling: fuse(spec, tensors, scaling), MAX_ADAPTERS, MAX_ADAPTER_RANK)

    def groups(self, batch: ForwardBatch) -> tuple[TokenGroup, ...]:
        """The batch's adapter groups with the deltas each runs (empty when no request has one).

        Raises:
            ValueError: As :meth:`~pie_core.backend_kit.AdapterBank.check_batch`.
        """
        if not self.check_batch(batch):
            return ()
        return tuple(TokenGroup(tokens, self.fused(a, s)) for a, s, tokens in token_groups(batch))
