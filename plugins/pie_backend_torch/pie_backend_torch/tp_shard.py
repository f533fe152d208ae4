"""How a model is cut across tensor-parallel ranks (Megatron-style).

Rank ``r`` of ``tp`` holds query heads ``[r * H / tp, (r + 1) * H / tp)`` and the KV heads they
read: ``kv_heads / tp`` of them when ``tp`` divides the KV heads, else (``tp`` a multiple of the KV
heads) the one KV head its query heads share, each rank keeping its own copy. So the Q/K/V
projection is split by output rows (column parallel), the attention-out projection by input
columns (row parallel: each rank's product is a partial sum, all-reduced), and the MLP likewise:
gate/up by rows, down by columns, one all-reduce after it. Norms, the embedding and the LM head
stay whole on every rank (the head runs on rank 0 only). A rank's slice is an ordinary model of
fewer heads and a narrower MLP (:func:`local_spec`), so the single-process layout code loads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from pie_core.backend_kit import ModelSpec

__all__ = ["Shard", "check_split", "local_spec", "shard_weights"]


def check_split(spec: ModelSpec, tp: int) -> None:
    """Refuse a ``tp`` the model's heads or MLP cannot be split by.

    Raises:
        ValueError: Naming what does not divide.
    """
    if tp == 1:
        return
    if spec.num_heads % tp:
        raise ValueError(f"tp={tp} does not divide the model's {spec.num_heads} attention heads; pick a tp that does")
    kvh = spec.num_kv_heads
    if kvh % tp and tp % kvh:
        raise ValueError(
            f"tp={tp} neither divides the model's {kvh} KV heads nor is a multiple of them; pick a tp that does"
        )
    if spec.intermediate_size % tp:
        raise ValueError(f"tp={tp} does not divide the model's MLP width {spec.intermediate_size}; pick a tp that does")


@dataclass(frozen=True, slots=True)
class Shard:
    """Rank ``rank``'s slice of a model split ``tp`` ways."""

    spec: ModelSpec
    rank: int
    tp: int

    @property
    def q_heads(self) -> range:
        per = self.spec.num_heads // self.tp
        return range(self.rank * per, (self.rank + 1) * per)

    @property
    def kv_heads(self) -> range:
        kvh = self.spec.num_kv_heads
        if kvh % self.tp == 0:
            per = kvh // self.tp
            return range(self.rank * per, (self.rank + 1) * per)
        first = self.rank // (self.tp // kvh)  # tp is a multiple of kvh: ranks share one KV head
        return range(first, first + 1)

    @property
    def mlp(self) -> slice:
        per = self.spec.intermediate_size // self.tp
        return slice(self.rank * per, (self.rank + 1) * per)

    def _rows(self, heads: range) -> slice:
        hd = self.spec.head_dim
        return slice(heads.start * hd, heads.stop * hd)

    def take(self, name: str, array: np.ndarray) -> np.ndarray:
        """This rank's part of the canonical weight ``name`` (whole when it is not split)."""
        kind = name.rsplit(".", 2)[-2] if name.startswith("blk.") else ""
        if kind == "attn_q":
            return array[self._rows(self.q_heads)]
        if kind in ("attn_k", "attn_v"):
            return array[self._rows(self.kv_heads)]
        if kind == "attn_output":
            return array[:, self._rows(self.q_heads)]
        if kind in ("ffn_gate", "ffn_up"):
            return array[self.mlp]
        if kind == "ffn_down":
            return array[:, self.mlp]
        return array

    def take_lora(self, name: str, array: np.ndarray) -> np.ndarray:
        """This rank's part of the LoRA tensor ``name`` (``blk.{i}.{target}.lora_{a|b}``): the
        ``B`` of a column-split projection by rows, the ``A`` of a row-split one by columns (its
        delta is then a partial sum, added before the all-reduce); the other half whole."""
        kind = name.rsplit(".", 2)[-2]
        split = name.endswith("lora_b") if kind in _COLUMN else name.endswith("lora_a") and kind in _ROW
        return np.ascontiguousarray(self.take(name, array)) if split else array

    def take_adapter(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """:meth:`take_lora` of every tensor of an adapter."""
        return {name: self.take_lora(name, a) for name, a in tensors.items()}


_COLUMN = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
_ROW = ("attn_output", "ffn_down")


def local_spec(spec: ModelSpec, tp: int) -> ModelSpec:
    """The model one rank runs: its heads, KV heads and MLP width; the softmax scale kept."""
    if tp == 1:
        return spec
    shard = Shard(spec, 0, tp)
    return dataclasses.replace(
        spec,
        num_heads=len(shard.q_heads),
        num_kv_heads=len(shard.kv_heads),
        intermediate_size=spec.intermediate_size // tp,
    )


def shard_weights(
    spec: ModelSpec, weights: Iterable[tuple[str, np.ndarray]], tp: int
) -> Iterator[tuple[str, list[np.ndarray]]]:
    """Every weight as its ``tp`` slices (index = rank), read once from ``weights``."""
    shards = [Shard(spec, r, tp) for r in range(tp)]
    for name, array in weights:
        array = np.asarray(array)
        yield name, [np.ascontiguousarray(s.take(name, array)) for s in shards]
