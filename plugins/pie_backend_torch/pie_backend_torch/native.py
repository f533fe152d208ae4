"""The backend's own CPU kernels (``csrc/q4.cpp``; ``csrc/lora.cpp``: the grouped LoRA delta), compiled
from source on first use.

The operators are built for the CPU they run on (``-march=native``, or ``PIE_TORCH_MARCH``:
AVX512-VNNI, AVX-VNNI or plain AVX2 paths) with torch's extension builder, which needs a C++ compiler and ninja and
downloads nothing. The build is kept in ``<pie cache>/torch/ext/<key>``, the key naming the
source, torch's version and the CPU's instruction sets, so a second process loads it in
milliseconds and a home directory shared between CPUs never runs one CPU's build on another.
Building at ``pip install`` time would need torch inside pip's isolated build environment (an
unpinned torch there is a multi-GB CUDA download), hence the first-use build.

When the build fails (no compiler, a CPU without AVX2), or ``PIE_TORCH_NATIVE=0`` is set, :func:`ops`
says why once and returns None, and the callers use torch's own kernels (``quant="auto"`` then
picks int4 or w8a8 as before).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch

from pie_core.backend_kit import announce_step, weights_cache_dir

__all__ = [
    "ops",
    "require_q4",
    "unavailable_reason",
    "pack_q4",
    "unpack_q4",
    "q4_in_features",
    "holds_q4",
    "pack_q8",
    "unpack_q8",
    "q8_in_features",
    "Q4_BLOCK",
]

Q4_BLOCK = 32
Q4_GROUP = 16
"""Output rows per packed group (16 int32 lanes of a 512-bit vector)."""
Q4_BLOCK_BYTES = 320
"""Bytes per block of 32 inputs of a group: 256 of nibbles, 16 float16 scales, 16 float16 lows."""
Q8_BLOCK_BYTES = 576
"""q8 bytes per block of 32 inputs of a group: 512 of int8 weights, 32 float16 scales (one per 16 inputs)."""
Q8_SCALE_INPUTS = 16
_SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("q4.cpp", "lora.cpp"))
_MARCH = os.environ.get("PIE_TORCH_MARCH", "native")
"""``-march`` of the build: ``native`` (this CPU), or e.g. ``x86-64-v3`` for a build that runs on
any AVX2 CPU (the AVX2 path, without VNNI)."""
_FLAGS = ["-O3", f"-march={_MARCH}", "-mf16c", "-mfma", "-fno-math-errno", "-fopenmp"]
"""``-fopenmp`` makes ``at::parallel_for`` parallel; the library then needs ``libgomp.so.1``, which
resolves to the copy torch already loaded (one OpenMP runtime, one thread pool)."""
_log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict[str, Any] = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _build_dir() -> Path:
    h = hashlib.sha256()
    for source in _SOURCES:
        h.update(source.read_bytes())
    h.update(" ".join(_FLAGS).encode())
    h.update(torch.__version__.encode())
    h.update(_cpu_flags().encode())  # -march=native differs by CPU
    return weights_cache_dir() / "torch" / "ext" / h.hexdigest()[:20]


def _build() -> Any:
    if os.environ.get("PIE_TORCH_NATIVE", "1") == "0":
        raise RuntimeError("turned off by PIE_TORCH_NATIVE=0")
    if "avx2" not in _cpu_flags().split():
        raise RuntimeError("the CPU has no AVX2")
    from torch.utils.cpp_extension import load

    where = _build_dir()
    where.mkdir(parents=True, exist_ok=True)
    lib = where / "pie_cpu_q4.so"
    if not lib.exists():
        announce_step(f"torch backend: compiling its CPU kernels for this CPU (once, ~20-60 s; kept in {where})")
        load(
            name="pie_cpu_q4",
            sources=[str(s) for s in _SOURCES],
            extra_cflags=_FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(where),
            is_python_module=False,
            verbose=bool(os.environ.get("PIE_VERBOSE_BUILD")),
        )
    else:
        torch.ops.load_library(str(lib))
    return torch.ops.pie_cpu


def ops() -> Any:
    """``torch.ops.pie_cpu`` (built and loaded on the first call), or None where it cannot be built."""
    if "ops" in _state:  # the per-call path of the layers: no lock once settled
        return _state["ops"]
    with _lock:
        if "ops" not in _state:
            try:
                _state["ops"] = _build()
            except Exception as exc:  # any build failure means: use torch's kernels
                _state["ops"] = None
                _state["why"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                _log.warning("the torch backend's CPU kernels are not available (%s); using torch's", _state["why"])
        return _state["ops"]


def require_q4() -> Any:
    """:func:`ops` for ``quant="q4"``.

    Raises:
        ValueError: The kernels cannot be built here (the message says why and what to use).
    """
    found = ops()
    if found is None:
        raise ValueError(
            f"quant 'q4' needs the backend's CPU kernels, which could not be built: {unavailable_reason()}; "
            "use quant 'int4' (bfloat16) or 'w8a8'"
        )
    return found


def unavailable_reason() -> str | None:
    """Why :func:`ops` returned None (after it was called), else None."""
    return _state.get("why")


def pack_q4(weight: torch.Tensor) -> torch.Tensor:
    """``[out, in]`` float weights as the kernel's 4-bit groups: uint8 ``[ceil(out/16), in/32 * 320]``.

    Each block of 32 inputs of a row gets ``w ≈ q * scale + low`` with ``q`` in 0..15 and ``low``
    the block's minimum, both float16 (the rounding is against the stored float16 values). The
    ``scale`` is the spacing of the block's values where they sit on at most 16 evenly spaced
    levels (weights dequantised from a 4-bit GGUF block such as Q4_K's: they are then kept exactly,
    but for float16 rounding), else the block's range over 15. Rows go in groups of 16, the last
    padded with zero rows, and a group's blocks follow each other: 256 bytes of nibbles with the 16
    rows interleaved four inputs at a time, then the 16 rows' scales, then their lows
    (``csrc/q4.cpp`` has the byte layout).

    Raises:
        ValueError: ``in`` is not a multiple of 32.
    """
    out, inp = weight.shape
    if inp % Q4_BLOCK:
        raise ValueError(f"q4 needs in_features divisible by {Q4_BLOCK}, got {inp}")
    step = _PACK_ROWS // Q4_GROUP  # groups at a time: the sort of the step search is not done in place
    groups = -(-out // Q4_GROUP)
    return torch.cat([_pack_groups(weight[g * Q4_GROUP : (g + step) * Q4_GROUP], inp) for g in range(0, groups, step)])


_PACK_ROWS = 4096


def _pack_groups(weight: torch.Tensor, inp: int) -> torch.Tensor:
    rows = weight.shape[0]
    nb, groups = inp // Q4_BLOCK, -(-rows // Q4_GROUP)
    w = torch.zeros(groups * Q4_GROUP, inp)
    w[:rows] = weight.float()
    w = w.reshape(groups, Q4_GROUP, nb, Q4_BLOCK).transpose(1, 2)  # [group, block, row, input]
    lo = w.amin(dim=3)
    low = lo.to(torch.float16)
    scale = _steps(w, lo)[0].clamp(min=1e-8).to(torch.float16)
    q = torch.round((w - low.float()[..., None]) / scale.float()[..., None]).clamp(0, 15).to(torch.uint8)
    # input 4c+t of row r -> byte 4r+t of chunk c (low nibble); input 16+4c+t -> its high nibble
    q = q.reshape(groups, nb, Q4_GROUP, 2, 4, 4).permute(0, 1, 3, 4, 2, 5)  # [g, b, half, c, r, t]
    nibbles = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(groups, nb, 256)
    packed = torch.cat([nibbles, scale.view(torch.uint8), low.view(torch.uint8)], dim=2)
    return packed.reshape(groups, nb * Q4_BLOCK_BYTES).contiguous()


def _steps(w: torch.Tensor, lo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block (last dim of ``w``): the widest step ``range / k`` (``k`` in 1..15) on which every
    value is ``lo + q * step`` with an integer ``q`` (to float32 noise), else the range over 15; and
    whether the block fits (its values are then kept, but for the float16 rounding of step and low).
    A block on at most 16 evenly spaced levels always fits: its range is a whole number of steps."""
    span = w.amax(dim=-1) - lo
    step, fits = span / 15.0, span == 0
    rest = torch.arange(span.numel()).reshape(span.shape)[~fits]
    flat_w, flat_lo, flat_span = w.reshape(-1, w.shape[-1]), lo.reshape(-1), span.reshape(-1)
    flat_step, flat_fits = step.reshape(-1), fits.reshape(-1)
    for k in range(1, 16):
        if rest.numel() == 0:
            break
        s = flat_span[rest] / k
        d = flat_w[rest] - flat_lo[rest, None]
        ok = ((d - torch.round(d / s[:, None]) * s[:, None]).abs().amax(dim=-1) <= 1e-3 * s)
        flat_step[rest[ok]] = s[ok]
        flat_fits[rest[ok]] = True
        rest = rest[~ok]
    return flat_step.reshape(span.shape), flat_fits.reshape(span.shape)


def holds_q4(weight: torch.Tensor) -> bool:
    """Whether every block of 32 inputs of ``[out, in]`` ``weight`` lies on at most 16 evenly
    spaced levels (a tensor dequantised from a 4-bit GGUF type: Q4_K, Q4_0, Q4_1), so that q4
    keeps it (to float16 rounding of each block's step and low)."""
    out, inp = weight.shape
    if inp % Q4_BLOCK:
        return False
    for a in (0, *range(0, out, _PACK_ROWS)):  # the first 16 rows alone: most tensors fail there
        w = weight[a : a + (Q4_GROUP if a == 0 else _PACK_ROWS)].float().reshape(-1, Q4_BLOCK)
        if not bool(_steps(w, w.amin(dim=-1))[1].all()):
            return False
    return True


_Q8_EXACT = (-127, -16, 127, 16, 15)
"""Peaks in steps to try for a float16 step (negative: of the block of 32): Q8_0 (127), Q5_0 (16)."""
_Q8_ANY = tuple(dict.fromkeys((32, 31, 127, 16, 15, *range(1, 128))))
"""Peaks in steps to try for any step: Q6_K (32, 31) first."""


def _grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sub-block (rows of ``w``): a step on which every value is ``q * step`` with an integer
    ``q`` in -127..127, else the peak over 127; and whether it fits. Steps ``peak / k`` (``k`` in
    1..127) are tried, first a few that float16 holds exactly (Q8_0's and Q5_0's scales, with their
    values then kept bit for bit), then any (Q6_K's products of two scales: the values are kept but for the
    float16 rounding of the step). A symmetric grid of at most 255 levels always fits."""
    peak = w.abs().amax(dim=-1)
    step, fits = peak / 127.0, peak == 0
    pair = peak.reshape(-1, 2).amax(dim=-1).repeat_interleave(2)  # the block of 32's peak (Q8_0, Q5_0 share a scale)
    for exact, levels in ((True, _Q8_EXACT), (False, _Q8_ANY)):
        rest = torch.nonzero(~fits).flatten()
        for k in levels:
            if rest.numel() == 0:
                break
            s = (pair[rest] / -k) if k < 0 else (peak[rest] / k)
            if exact:
                s = s.half().float()
            v = w[rest]
            q = torch.round(v / s[:, None])
            off = (v - q * s[:, None]).abs().amax(dim=-1)
            ok = (off <= (1e-6 if exact else 1e-3) * s) & (q.abs().amax(dim=-1) <= 127)
            step[rest[ok]] = s[ok]
            fits[rest[ok]] = True
            rest = rest[~ok]
    return step, fits


def pack_q8(weight: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``[out, in]`` float weights as the kernel's int8 groups: uint8 ``[ceil(out/16), in/32 * 576]``,
    and the fraction of 16-input sub-blocks kept exactly (but for float16 rounding of their scale).

    Each 16 inputs of a row get ``w ≈ q * scale`` with ``q`` in -127..127 and a float16 ``scale``:
    the step of the sub-block's values where they lie on such a grid (tensors dequantised from
    Q8_0, Q5_0, Q6_K, ...), else the peak over 127. Rows go in groups of 16 as for q4; a block of
    32 inputs is 8 chunks of 64 bytes (byte 4r+t of chunk c: row r's input 4c+t, plus 128), then the
    16 rows' scales of inputs 0..15, then those of inputs 16..31 (``csrc/q4.cpp``).

    Raises:
        ValueError: ``in`` is not a multiple of 32.
    """
    out, inp = weight.shape
    if inp % Q4_BLOCK:
        raise ValueError(f"q8 needs in_features divisible by {Q4_BLOCK}, got {inp}")
    parts, kept, total = [], 0, 0
    step = _PACK_ROWS // Q4_GROUP
    for g in range(0, -(-out // Q4_GROUP), step):
        packed, fits = _pack_q8_groups(weight[g * Q4_GROUP : (g + step) * Q4_GROUP], inp)
        parts.append(packed)
        kept, total = kept + int(fits.sum()), total + fits.numel()
    return torch.cat(parts), kept / max(total, 1)


def _pack_q8_groups(weight: torch.Tensor, inp: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = weight.shape[0]
    nb, groups = inp // Q4_BLOCK, -(-rows // Q4_GROUP)
    w = torch.zeros(groups * Q4_GROUP, inp)
    w[:rows] = weight.float()
    step, fits = _grid(w.reshape(-1, Q8_SCALE_INPUTS))
    fits = fits.reshape(-1, inp // Q8_SCALE_INPUTS)[:rows]
    scale = step.clamp(min=1e-8).to(torch.float16).reshape(groups, Q4_GROUP, nb, 2)
    q = torch.round(w.reshape(groups, Q4_GROUP, nb, 2, Q8_SCALE_INPUTS) / scale.float()[..., None])
    q = (q.clamp(-127, 127) + 128).to(torch.uint8)  # [g, r, b, half, 16]
    q = q.reshape(groups, Q4_GROUP, nb, 8, 4).permute(0, 2, 3, 1, 4)  # [g, b, chunk, r, t]
    scales = scale.permute(0, 2, 3, 1).contiguous()  # [g, b, half, r]
    packed = torch.cat([q.reshape(groups, nb, 512), scales.view(torch.uint8).reshape(groups, nb, 64)], dim=2)
    return packed.reshape(groups, nb * Q8_BLOCK_BYTES).contiguous(), fits


def q8_in_features(row_bytes: int) -> int:
    """The input width whose packed q8 groups are ``row_bytes`` long (576 bytes per block of 32)."""
    if row_bytes % Q8_BLOCK_BYTES:
        raise ValueError(f"{row_bytes} bytes is no packed q8 group")
    return row_bytes // Q8_BLOCK_BYTES * Q4_BLOCK


def unpack_q8(packed: torch.Tensor, in_features: int, out_features: int) -> torch.Tensor:
    """The float32 ``[out, in]`` weights that :func:`pack_q8`'s groups stand for."""
    return q8_rows(packed, in_features, torch.arange(out_features))


def q8_rows(packed: torch.Tensor, in_features: int, rows: torch.Tensor) -> torch.Tensor:
    """float32 ``[len(rows), in]``: rows ``rows`` of :func:`pack_q8`'s weights (an embedding lookup)."""
    nb = in_features // Q4_BLOCK
    blocks = packed.index_select(0, rows // Q4_GROUP).reshape(-1, nb, Q8_BLOCK_BYTES)
    r = (rows % Q4_GROUP).reshape(-1, 1, 1, 1)
    q = blocks[..., :512].reshape(-1, nb, 8, Q4_GROUP, 4)
    q = q.gather(3, r[..., None].expand(-1, nb, 8, 1, 4)).reshape(-1, nb, 2, Q8_SCALE_INPUTS)
    scale = blocks[..., 512:].contiguous().view(torch.float16).reshape(-1, nb, 2, Q4_GROUP)
    s = scale.gather(3, r.expand(-1, nb, 2, 1)).float()
    return ((q.float() - 128) * s).reshape(-1, in_features)


def q4_in_features(row_bytes: int) -> int:
    """The input width whose packed groups are ``row_bytes`` long (320 bytes per block of 32)."""
    if row_bytes % Q4_BLOCK_BYTES:
        raise ValueError(f"{row_bytes} bytes is no packed q4 group")
    return row_bytes // Q4_BLOCK_BYTES * Q4_BLOCK


def unpack_q4(packed: torch.Tensor, in_features: int, out_features: int) -> torch.Tensor:
    """The float32 ``[out, in]`` weights that :func:`pack_q4`'s groups stand for."""
    groups, nb = packed.shape[0], in_features // Q4_BLOCK
    blocks = packed.reshape(groups, nb, Q4_BLOCK_BYTES)
    nibbles = blocks[..., :256].reshape(groups, nb, 4, Q4_GROUP, 4)  # [g, b, c, r, t]
    q = torch.stack([nibbles & 15, nibbles >> 4], dim=2).permute(0, 1, 4, 2, 3, 5)  # [g, b, r, half, c, t]
    q = q.reshape(groups, nb, Q4_GROUP, Q4_BLOCK).float()
    scale = blocks[..., 256:288].contiguous().view(torch.float16).float()
    low = blocks[..., 288:].contiguous().view(torch.float16).float()
    w = q * scale[..., None] + low[..., None]  # [g, b, r, input]
    return w.transpose(1, 2).reshape(groups * Q4_GROUP, in_features)[:out_features]
