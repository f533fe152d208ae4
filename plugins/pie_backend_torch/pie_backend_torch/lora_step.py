"""One forward's LoRA deltas: the batch's tokens grouped by ``(adapter, zo seed)``, and the
groups' weights stacked so that every group of a projection is served by one pair of ``bmm``.

Per layer and projection, the groups holding it are stacked (:func:`stack`): ``a``
``[G, P * k, in]``, ``b`` ``[G * P, k, out / P]`` (``P`` parts, ``k`` the widest group's rank,
narrower ones zero-padded; see :mod:`pie_backend_torch.lora_weights`). The tokens are laid out
group by group, each group padded to the largest group's ``m`` rows, so a projection's deltas are
``bmm(bmm(x[gather].view(G, m, in), a.T), b)`` added back with ``index_add_``: the same few ops
whatever the number of groups, and no token multiplied by another group's weights. When padding
would more than double the rows (one long prefill beside single decode tokens) the groups are
looped over instead, each multiplying only its own rows.

Measured at 32 decode tokens in 8 groups of rank-8 adapters over every target (a 4-layer model
with Qwen2.5-0.5B's layer sizes and a 4096 vocabulary, the default bf16 mode of a 2-core AVX512-BF16
CPU): the deltas add 3.7 ms (18%) to a 19.7 ms step this way; a loop over the groups
(``index_select``, two matmuls, ``index_add_`` per group) adds 8.0 ms; one masked matmul over
every group's columns (``U = x @ A_cat.T``, other groups' entries zeroed, ``out += U @ B_cat.T``:
3 ops whatever G) adds 5.8 ms, as it multiplies every token by all G groups' ``B`` (``gate_up``'s
is 9728 wide). The deltas read their weights in float32 (bf16 ``bmm`` is 3x slower on such a
CPU), so their bytes (40% of the int8 layer's for eight all-target rank-8 adapters) set the cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pie_backend_torch.lora_weights import PROJECTIONS, LayerLora

__all__ = ["Stacked", "stack", "LoraStep", "MAX_PADDING"]

MAX_PADDING = 2.0
"""The padded layout (groups times their largest size) may have this many times the rows the
groups hold; beyond it the groups are looped over."""


@dataclass(frozen=True, slots=True)
class Stacked:
    """The groups holding one projection of one layer, their weights stacked (``P`` parts of
    ``k`` ranks, as in :class:`~pie_backend_torch.lora_weights.LowRank`)."""

    members: tuple[int, ...]  # group indices, in stacking order
    a: torch.Tensor  # [len(members), P * k, in]
    b: torch.Tensor  # [len(members) * P, k, out / P]


def _stack_projection(groups: tuple[tuple[LayerLora, ...], ...], layer: int, projection: int) -> Stacked | None:
    members = tuple(g for g, layers in enumerate(groups) if layers[layer][projection] is not None)
    if not members:
        return None
    pairs = [p for p in (groups[g][layer][projection] for g in members) if p is not None]
    parts, inp, width = pairs[0].b.shape[0], pairs[0].a.shape[1], pairs[0].b.shape[2]
    k = max(p.b.shape[1] for p in pairs)
    a = pairs[0].a.new_zeros((len(members), parts * k, inp))
    b = pairs[0].b.new_zeros((len(members) * parts, k, width))
    for j, p in enumerate(pairs):
        rank = p.b.shape[1]
        a[j].view(parts, k, inp)[:, :rank] = p.a.view(parts, rank, inp)
        b[j * parts : (j + 1) * parts, :rank] = p.b
    return Stacked(members, a, b)


def _delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Deltas of ``x`` ``[G, n, in]`` (G groups of n rows) as ``[G * n, out]`` in ``dtype``
    (``a`` ``[G, P * k, in]``, ``b`` ``[G * P, k, out / P]``)."""
    g, n = x.shape[0], x.shape[1]
    parts = b.shape[0] // g
    u = torch.bmm(x, a.transpose(1, 2))  # A kept [k, in]: a long ``in`` is read contiguously
    if parts > 1:
        u = u.view(g, n, parts, -1).transpose(1, 2).reshape(g * parts, n, -1)
    y = torch.bmm(u, b)
    if parts == 1:
        return y.view(g * n, -1).to(dtype)
    y = y.view(g, parts, n, -1).transpose(1, 2)  # [G, n, P, out / P]
    # one pass casts and lays the parts out side by side
    return y.to(dtype, memory_format=torch.contiguous_format, copy=True).view(g * n, -1)


def stack(groups: tuple[tuple[LayerLora, ...], ...]) -> tuple[tuple[Stacked | None, ...], ...]:
    """Stack the weights of ``groups`` (each a per-layer :data:`LayerLora` tuple), per layer and
    projection."""
    num_layers = len(groups[0])
    return tuple(
        tuple(_stack_projection(groups, i, p) for p in range(len(PROJECTIONS))) for i in range(num_layers)
    )


@dataclass(frozen=True, slots=True)
class _Padded:
    """Tokens of the member groups laid out ``[G, m]`` (short groups repeat a token of theirs)."""

    rows: int  # m
    gather: torch.Tensor | None  # [G * m] token of each padded row; None: all tokens, in order
    scatter: torch.Tensor | None  # [n] padded row of each member token; None: every row is one
    tokens: torch.Tensor | None  # [n] the member tokens, group by group (with ``scatter``)


@dataclass(frozen=True, slots=True)
class _Looped:
    """Each member group's tokens: a slice when contiguous, else an index tensor."""

    tokens: tuple[slice | torch.Tensor, ...]


def _layout(labels: np.ndarray, members: tuple[int, ...], device: torch.device) -> _Padded | _Looped:
    """Where each member group's tokens sit (``labels``: each token's group, -1 for none)."""
    slot_of = np.full(int(labels.max()) + 2, -1, dtype=np.int64)  # index -1 is "no group"
    slot_of[list(members)] = np.arange(len(members))
    slot = slot_of[labels]
    tok = np.flatnonzero(slot >= 0)
    order = np.argsort(slot[tok], kind="stable")
    tok, slot = tok[order], slot[tok][order]
    counts = np.bincount(slot, minlength=len(members))
    starts = np.cumsum(counts) - counts
    m, g, n = int(counts.max()), len(members), len(tok)

    def index(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.int64)).to(device)

    if g * m > MAX_PADDING * n:
        parts = np.split(tok, starts[1:])
        return _Looped(
            tuple(slice(int(p[0]), int(p[-1]) + 1) if p[-1] - p[0] + 1 == len(p) else index(p) for p in parts)
        )
    pos = slot * m + (np.arange(n) - starts[slot])
    gather = np.repeat(tok[starts], m)
    gather[pos] = tok
    if g * m == n:
        identity = n == len(labels) and bool((gather == np.arange(n)).all())
        return _Padded(m, None if identity else index(gather), None, None)
    return _Padded(m, index(gather), index(pos), index(tok))


class LoraStep:
    """The LoRA deltas of one forward: :meth:`add` them to each adapted projection's output."""

    def __init__(
        self,
        labels: np.ndarray,
        stacks: tuple[tuple[Stacked | None, ...], ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """
        Args:
            labels: int64 ``[N]``: each token's group (an index into the stacked groups), -1 for
                tokens without an adapter.
            stacks: :func:`stack` of the groups.
            dtype: The adapters' compute dtype.
            device: Where the weights and activations are.
        """
        self.stacks = stacks
        self.dtype = dtype
        layouts: dict[tuple[int, ...], _Padded | _Looped] = {}
        for layer in stacks:
            for s in layer:
                if s is not None and s.members not in layouts:
                    layouts[s.members] = _layout(labels, s.members, device)
        self.layouts = layouts

    def add(self, layer: int, projection: int, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out[t] += B_g A_g x[t]`` for every token ``t`` of a group ``g`` holding
        ``projection`` of ``layer``.

        Args:
            layer: Decoder layer index.
            projection: Index into :data:`~pie_backend_torch.lora_weights.PROJECTIONS`.
            x: ``[N, in]``, the projection's input (any float dtype).
            out: ``[N, out]``, the projection's output, or a tensor it is added to; updated in place.
        """
        s = self.stacks[layer][projection]
        if s is None:
            return
        x = x.to(self.dtype)
        layout = self.layouts[s.members]
        g = len(s.members)
        if isinstance(layout, _Looped):
            parts = s.b.shape[0] // g
            for j, tokens in enumerate(layout.tokens):
                a, b = s.a[j : j + 1], s.b[j * parts : (j + 1) * parts]
                if isinstance(tokens, slice):
                    out[tokens].add_(_delta(x[tokens].unsqueeze(0), a, b, out.dtype))
                else:
                    out.index_add_(0, tokens, _delta(x.index_select(0, tokens).unsqueeze(0), a, b, out.dtype))
            return
        rows = x if layout.gather is None else x.index_select(0, layout.gather)
        y = _delta(rows.reshape(g, layout.rows, -1), s.a, s.b, out.dtype)
        if layout.gather is None:
            out.add_(y)
        elif layout.scatter is None:
            out.index_add_(0, layout.gather, y)
        else:
            assert layout.tokens is not None
            out.index_add_(0, layout.tokens, y.index_select(0, layout.scatter))
