"""The q5 weight format: 5-bit weights on a symmetric grid with one float16 scale per block of 32
inputs, as GGUF's Q5_0 stores them, packed for the backend's ``q5_linear`` kernel (``csrc/q4.cpp``).

A tensor dequantised from Q5_0 holds, in every block of 32 inputs of a row, values ``q * d`` with
an integer ``q`` in -16..15 and a float16 ``d`` (negative where the block's largest magnitude is
positive: GGUF maps it to ``q = -16``). :func:`holds` finds that grid from the values alone and
:func:`pack` keeps it bit for bit in 11 bits per 16 weights (0.6875 bytes a weight, as the GGUF;
q8 spends 1.125 on the same values). The kernel's results equal q8's on the same weights bitwise.
"""

from __future__ import annotations

import numpy as np
import torch

from pie_backend_torch.native import Q4_BLOCK, Q4_GROUP

__all__ = ["BLOCK_BYTES", "holds", "pack", "pack_if_held", "in_features", "rows", "unpack"]

BLOCK_BYTES = 352
"""Bytes per block of 32 inputs of a group of 16 rows: 256 of low nibbles, 64 of fifth bits, 16 float16 scales."""
_CHUNK_ROWS = 4096
"""Rows examined or packed at a time (bounds the temporaries to a few hundred MB)."""


def _steps(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block (rows of ``w``, 32 values): the signed float16 step ``d`` on which every value is
    ``q * d`` with an integer ``q`` in -16..15, and whether the block has one. GGUF's reference
    quantiser puts the block's largest magnitude at ``q = -16`` (so ``|d|`` is the peak over 16);
    an importance-weighted one searches the scale, so smaller peaks (over 15 .. 8) are tried next."""
    peak = w.abs().amax(dim=-1)
    step = torch.zeros_like(peak)
    found = peak == 0
    for k in range(16, 7, -1):
        for sign in (-1.0, 1.0):
            rest = torch.nonzero(~found).flatten()
            if rest.numel() == 0:
                return step, found
            s = sign * (peak[rest] / k).half().float()
            v = w[rest]
            q = torch.round(v / s[:, None])
            ok = ((q * s[:, None]) == v).all(dim=-1) & (q.amin(dim=-1) >= -16) & (q.amax(dim=-1) <= 15)
            step[rest[ok]] = s[ok]
            found[rest[ok]] = True
    return step, found


def holds(weight: torch.Tensor) -> bool:
    """Whether every block of 32 inputs of ``[out, in]`` ``weight`` is ``q * d`` with ``q`` in
    -16..15 and a float16 ``d``: a tensor dequantised from Q5_0, which q5 keeps exactly."""
    out, inp = weight.shape
    if inp % Q4_BLOCK:
        return False
    for a in (0, *range(0, out, _CHUNK_ROWS)):  # the first 16 rows alone: most other tensors fail there
        w = weight[a : a + (Q4_GROUP if a == 0 else _CHUNK_ROWS)].float().reshape(-1, Q4_BLOCK)
        if not bool(_steps(w)[1].all()):
            return False
    return True


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``[out, in]`` weights that :func:`holds` accepts, as the kernel's groups: uint8
    ``[ceil(out/16), in/32 * 352]`` (rows in groups of 16, the last padded with zero rows).

    Raises:
        ValueError: A block of ``weight`` is on no such grid.
    """
    packed = pack_if_held(weight)
    if packed is None:
        raise ValueError("q5 holds only weights on a 5-bit symmetric grid per block of 32 (GGUF Q5_0)")
    return packed


def pack_if_held(weight: torch.Tensor) -> torch.Tensor | None:
    """:func:`pack` where :func:`holds`, else None, in one pass over the weights."""
    out, inp = weight.shape
    if inp % Q4_BLOCK or not holds(weight[:Q4_GROUP]):  # the first 16 rows alone: most other tensors fail there
        return None
    step = _CHUNK_ROWS // Q4_GROUP
    parts = []
    for g in range(0, -(-out // Q4_GROUP), step):
        part = _pack_groups(weight[g * Q4_GROUP : (g + step) * Q4_GROUP], inp)
        if part is None:
            return None
        parts.append(part)
    return torch.cat(parts)


def _pack_groups(weight: torch.Tensor, inp: int) -> torch.Tensor | None:
    rows = weight.shape[0]
    nb, groups = inp // Q4_BLOCK, -(-rows // Q4_GROUP)
    w = torch.zeros(groups * Q4_GROUP, inp)
    w[:rows] = weight.float()
    blocks = w.reshape(-1, Q4_BLOCK)
    d, ok = _steps(blocks)
    if not bool(ok.all()):
        return None
    safe = torch.where(d == 0, torch.ones_like(d), d)
    u = (torch.round(blocks / safe[:, None]) + 16).to(torch.uint8).reshape(groups, Q4_GROUP, nb, 8, 4)
    u = u.permute(0, 2, 3, 1, 4)  # [g, b, c, r, t]: input 4c+t of row r, byte 4r+t of chunk c
    low = u & 15
    nibbles = (low[:, :, :4] | (low[:, :, 4:] << 4)).reshape(groups, nb, 256)
    fifth = np.packbits((u >> 4).numpy().reshape(groups, nb, 8, 64), axis=-1, bitorder="little")
    scale = d.to(torch.float16).reshape(groups, Q4_GROUP, nb).transpose(1, 2).contiguous()  # [g, b, r]
    packed = torch.cat(
        [nibbles, torch.from_numpy(fifth).reshape(groups, nb, 64), scale.view(torch.uint8).reshape(groups, nb, 32)], dim=2
    )
    return packed.reshape(groups, nb * BLOCK_BYTES).contiguous()


def in_features(row_bytes: int) -> int:
    """The input width whose packed q5 groups are ``row_bytes`` long (352 bytes per block of 32)."""
    if row_bytes % BLOCK_BYTES:
        raise ValueError(f"{row_bytes} bytes is no packed q5 group")
    return row_bytes // BLOCK_BYTES * Q4_BLOCK


def rows(packed: torch.Tensor, in_feats: int, ids: torch.Tensor) -> torch.Tensor:
    """float32 ``[len(ids), in]``: rows ``ids`` of :func:`pack`'s weights (an embedding lookup)."""
    nb = in_feats // Q4_BLOCK
    blocks = packed.index_select(0, ids // Q4_GROUP).reshape(-1, nb, BLOCK_BYTES)
    r = (ids % Q4_GROUP).reshape(-1, 1, 1, 1)
    nib = blocks[..., :256].reshape(-1, nb, 4, Q4_GROUP, 4)
    nib = nib.gather(3, r[..., None].expand(-1, nb, 4, 1, 4)).reshape(-1, nb, 4, 4)  # [n, b, c, t]
    low = torch.cat([nib & 15, nib >> 4], dim=2)  # [n, b, c in 0..7, t]
    bits = torch.from_numpy(np.unpackbits(blocks[..., 256:320].numpy(), axis=-1, bitorder="little"))
    fifth = bits.reshape(-1, nb, 8, Q4_GROUP, 4).gather(3, r[..., None].expand(-1, nb, 8, 1, 4)).reshape(-1, nb, 8, 4)
    q = (low | (fifth << 4)).float() - 16
    scale = blocks[..., 320:].contiguous().view(torch.float16).reshape(-1, nb, Q4_GROUP)
    s = scale.gather(2, r.reshape(-1, 1, 1).expand(-1, nb, 1)).float()  # [n, b, 1]
    return (q.reshape(-1, nb, Q4_BLOCK) * s).reshape(-1, in_feats)


def unpack(packed: torch.Tensor, in_feats: int, out_features: int) -> torch.Tensor:
    """The float32 ``[out, in]`` weights that :func:`pack`'s groups stand for."""
    return rows(packed, in_feats, torch.arange(out_features))
