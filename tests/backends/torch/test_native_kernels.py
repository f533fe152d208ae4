"""The torch backend's own CPU kernels (``csrc/q4.cpp``): q4 rows times int8 activations equal the
product of their dequantised weights with the per-block int8 activations computed in float64;
the fused w8a8 steps equal the torch ops they replace; the AVX2 build agrees with the native
one; and without the kernels the backend says why and falls back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import numpy as np

from backend_testkit import kv_request, probe_logits, random_weights, run, tiny_spec
from pie_backend_torch import TorchBackend, linear, native, q5
from pie_backend_torch.options import resolve_options
from pie_core.hookspec import BackendOptions
from torch_testkit import load_torch

ops = native.ops()
pytestmark = pytest.mark.skipif(ops is None, reason=f"kernels not built here: {native.unavailable_reason()}")


def _emulated(x: torch.Tensor, packed: torch.Tensor, packed_rows: int, bias: torch.Tensor | None) -> torch.Tensor:
    """float64 ``x`` quantised to int8 per block of 32 (symmetric, round half to even) times the
    dequantised q4 rows."""
    m, k = x.shape
    blocks = x.double().reshape(m, k // 32, 32)
    step = blocks.abs().amax(dim=2, keepdim=True) / 127
    xq = (torch.round(blocks / torch.where(step > 0, step, 1.0)) * step).reshape(m, k)
    y = xq @ native.unpack_q4(packed, k, packed_rows).double().T
    return y if bias is None else y + bias.double()


# (rows, in, out): outputs below, at and past a group of 16 rows (and past the 8 of an AVX2
# half), 1..9 activation rows (tiles of 4 and remainders of 1, 2, 3)
SHAPES = [(1, 32, 5), (1, 96, 7), (2, 64, 4), (3, 160, 9), (5, 896, 68), (9, 288, 33), (1, 4864, 12), (6, 96, 32), (7, 64, 16)]


@pytest.mark.parametrize("rows, inp, out", SHAPES)
def test_q4_linear_is_the_dequantised_product_with_int8_blocks(rows, inp, out):
    torch.manual_seed(rows * 1000 + inp + out)
    w = torch.randn(out, inp) / 10
    x = torch.randn(rows, inp)
    x[:, 3] *= 40  # an outlier channel spoils only its own block
    bias = torch.randn(out)
    packed = native.pack_q4(w)
    got = ops.q4_linear(x, packed, out, bias)
    torch.testing.assert_close(got.double(), _emulated(x, packed, out, bias), atol=2e-5 * (inp / 32) ** 0.5, rtol=1e-5)
    torch.testing.assert_close(ops.q4_linear(x, packed, out, None).double(), _emulated(x, packed, out, None), atol=1e-4, rtol=1e-5)


def _ggml_like(kind: str, rows: int, inp: int) -> torch.Tensor:
    """Weights as a GGUF type dequantises them: Q8_0 / Q5_0 (one float16 scale per 32 inputs,
    int8 / 5-bit levels), Q6_K (6-bit levels, a float16 ``d`` times an int8 scale per 16), Q4_K
    (16 levels with a scale and a minimum per 32)."""
    g = torch.Generator().manual_seed(len(kind) + rows)
    if kind == "q6_k":
        d = (torch.rand(rows, inp // 256, 1, 1, generator=g) * 1e-3).half().float()
        sc = torch.randint(-128, 128, (rows, inp // 256, 16, 1), generator=g).float()
        q = torch.randint(-32, 32, (rows, inp // 256, 16, 16), generator=g).float()
        return (d * sc * q).reshape(rows, inp)
    d = (torch.rand(rows, inp // 32, 1, generator=g) * 0.02).half().float()
    if kind == "q4_k":
        low = -(torch.rand(rows, inp // 32, 1, generator=g) * 0.1).half().float()
        return (torch.randint(0, 16, (rows, inp // 32, 32), generator=g) * d + low).reshape(rows, inp)
    q = torch.randint(-127, 128, (rows, inp // 32, 32), generator=g) if kind == "q8_0" else torch.randint(-16, 16, (rows, inp // 32, 32), generator=g)
    return (q * d).reshape(rows, inp)


@pytest.mark.parametrize("kind", ["q8_0", "q5_0"])
def test_q8_keeps_8_and_5_bit_gguf_weights_bit_for_bit(kind):
    w = _ggml_like(kind, 40, 256)
    packed, exact = native.pack_q8(w)
    assert exact == 1.0 and torch.equal(native.unpack_q8(packed, 256, 40), w)
    assert not native.holds_q4(w)
    assert type(linear.fit(w, None)) is (linear.Q8 if kind == "q8_0" else linear.Q5)


def _q5_0(rows: int, inp: int, peak_q: int = -16, seed: int = 0) -> torch.Tensor:
    """Q5_0-dequantised weights: ``q * d``, ``q`` in -16..15, float16 ``d`` of either sign, each block's
    largest magnitude at ``peak_q`` (-16 as GGUF's reference quantiser; smaller where an importance
    matrix chose the scale)."""
    g = torch.Generator().manual_seed(seed)
    lim = min(16, abs(peak_q))
    q = torch.randint(-lim + 1, min(15, lim - 1) + 1, (rows, inp // 32, 32), generator=g)
    q[..., 0] = peak_q
    sign = torch.where(torch.rand(rows, inp // 32, 1, generator=g) < 0.5, -1.0, 1.0)
    d = (torch.rand(rows, inp // 32, 1, generator=g) * 0.02 + 1e-3).half().float() * sign
    return (q * d).reshape(rows, inp)


@pytest.mark.parametrize("peak_q", [-16, 15, -9])
def test_q5_keeps_q5_0_weights_bit_for_bit_in_the_gguf_s_bytes(peak_q):
    w = _q5_0(40, 256, peak_q)
    assert q5.holds(w) and not native.holds_q4(w)
    packed = q5.pack(w)
    assert packed.shape == (3, 8 * q5.BLOCK_BYTES)  # 22 bytes per 32 weights of a row, as Q5_0
    assert torch.equal(q5.unpack(packed, 256, 40), w)
    ids = torch.tensor([39, 0, 17, 17])
    assert torch.equal(q5.rows(packed, 256, ids), w[ids])


def test_q5_holds_no_8_bit_or_float_weights():
    assert not q5.holds(_ggml_like("q8_0", 40, 256))
    assert not q5.holds(torch.randn(40, 256))
    with pytest.raises(ValueError, match="5-bit"):
        q5.pack(torch.randn(16, 64))


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 32])
def test_q5_linear_equals_q8_linear_on_the_same_weights_bit_for_bit(rows):
    w, bias = _q5_0(37, 896, seed=rows), torch.randn(37)  # 3 groups, the last 5 rows wide
    x = torch.randn(rows, 896) * torch.where(torch.rand(896) < 0.02, 30.0, 1.0)  # a few outlier channels
    want = ops.q8_linear(x, native.pack_q8(w)[0], 37, bias)
    assert torch.equal(ops.q5_linear(x, q5.pack(w), 37, bias), want)
    assert torch.equal(linear.Q5(w, bias)(x), want)


def test_q5_linear_refuses_weights_of_another_layout():
    with pytest.raises(RuntimeError, match="q5_linear: weights must be contiguous uint8"):
        ops.q5_linear(torch.randn(2, 64), native.pack_q8(torch.randn(16, 64))[0], 16, None)


def test_q8_keeps_q6_k_weights_to_float16_rounding_of_their_scales():
    w = _ggml_like("q6_k", 24, 512)
    packed, exact = native.pack_q8(w)
    err = (native.unpack_q8(packed, 512, 24) - w).abs()
    assert exact == 1.0 and bool((err <= w.abs() * 2**-11 + 1e-12).all())
    assert isinstance(linear.fit(w, None), linear.Q8)


def test_fit_gives_4_bit_weights_q4_and_float_weights_float32():
    q4k = _ggml_like("q4_k", 40, 256)
    assert native.holds_q4(q4k) and isinstance(linear.fit(q4k, None), linear.Q4)
    dense = linear.fit(torch.randn(40, 256), None)
    assert isinstance(dense, linear.Dense) and dense.weight.dtype == torch.float32


@pytest.mark.parametrize("rows, inp, out", SHAPES)
def test_q8_linear_is_the_dequantised_product_with_int8_blocks(rows, inp, out):
    torch.manual_seed(rows * 1000 + inp + out)
    w, x, bias = torch.randn(out, inp) / 10, torch.randn(rows, inp), torch.randn(out)
    packed = native.pack_q8(w)[0]
    m, k = x.shape
    blocks = x.double().reshape(m, k // 16, 16)  # q8 quantises activations per 16 inputs
    step = blocks.abs().amax(dim=2, keepdim=True) / 127
    xq = (torch.round(blocks / torch.where(step > 0, step, 1.0)) * step).reshape(m, k)
    want = xq @ native.unpack_q8(packed, k, out).double().T + bias.double()
    torch.testing.assert_close(ops.q8_linear(x, packed, out, bias).double(), want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["q4", "q8", "q5"])
def test_a_row_s_result_does_not_depend_on_the_other_rows(kernel):
    """Bit for bit: alone, in tiles of 4 and their remainders, in a batch of 64."""
    torch.manual_seed(3)
    w, x = (_q5_0(40, 896) if kernel == "q5" else torch.randn(40, 896) / 10), torch.randn(64, 896)
    packed = {"q4": lambda: native.pack_q4(w), "q8": lambda: native.pack_q8(w)[0], "q5": lambda: q5.pack(w)}[kernel]()
    op = getattr(ops, f"{kernel}_linear")
    full = op(x, packed, 40, None)
    for r in (0, 5, 63):
        for size in (1, 2, 3, 7, 32):
            start = max(0, min(r - size // 2, 64 - size))
            assert torch.equal(op(x[start : start + size], packed, 40, None)[r - start], full[r])


def test_q4_packs_16_rows_four_inputs_at_a_time():
    """The byte layout that ``csrc/q4.cpp`` reads: byte 4r+t of chunk c holds row r's input 4c+t
    (low nibble) and 16+4c+t (high), then 16 float16 scales, then 16 float16 lows."""
    q = (torch.arange(16)[:, None] * 7 + torch.arange(32)[None, :] * 5) % 16
    q[:, 0], q[:, 1] = 0, 15  # every row spans 0..15: scale 1, low 0
    packed = native.pack_q4(q.float())
    assert packed.shape == (1, 320) and packed.dtype == torch.uint8
    for c in range(4):
        for r in range(16):
            for t in range(4):
                assert int(packed[0, 64 * c + 4 * r + t]) == int(q[r, 4 * c + t]) | int(q[r, 16 + 4 * c + t]) << 4
    assert packed[0, 256:288].view(torch.float16).tolist() == [1.0] * 16
    assert packed[0, 288:].view(torch.float16).tolist() == [0.0] * 16


def test_q4_weights_are_within_half_a_step_of_the_originals():
    torch.manual_seed(1)
    w = torch.randn(16, 128) * torch.linspace(0.01, 3, 16)[:, None]
    blocks = w.reshape(16, 4, 32)
    step = (blocks.amax(dim=2) - blocks.amin(dim=2)) / 15
    err = (native.unpack_q4(native.pack_q4(w), 128, 16) - w).reshape(16, 4, 32).abs()
    assert bool((err <= step[..., None] * 0.5 + 1e-2 * step[..., None] + 1e-6).all())  # float16 scale rounding


def test_q4_keeps_weights_from_a_4_bit_block_exactly():
    """Weights dequantised from a 4-bit GGUF block (``lo + q * d``, here using only the levels
    2..13) are kept up to float16 rounding of d and lo, not re-rounded to the block's range / 15."""
    torch.manual_seed(3)
    d = torch.rand(40, 4, 1) * 0.01 + 0.001  # one step per block of 32
    q = torch.randint(2, 14, (40, 4, 32)).float()
    q[..., 0], q[..., 1] = 2, 13
    w = (q * d - 0.03).reshape(40, 128)
    err = (native.unpack_q4(native.pack_q4(w), 128, 40) - w).reshape(40, 4, 32).abs()
    assert bool((err <= 0.02 * d).all()), float((err / d).max())  # min/max rounding would be up to 0.37 d
    other = torch.randn(40, 128)  # values on no lattice: the block's range over 15, as before
    other[0, :32] = torch.tensor([0.0, 1.0, 2.3, 3.0]).repeat(8)  # few values, unevenly spaced
    blocks = other.reshape(40, 4, 32)
    step = (blocks.amax(dim=2) - blocks.amin(dim=2)) / 15
    err = (native.unpack_q4(native.pack_q4(other), 128, 40) - other).reshape(40, 4, 32).abs()
    assert bool((err <= step[..., None] * 0.51 + 1e-6).all())


def test_q4_refuses_what_it_cannot_multiply():
    packed = native.pack_q4(torch.randn(4, 64))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.q4_linear(torch.randn(1, 48), packed, 4, None)
    with pytest.raises(RuntimeError, match="uint8"):
        ops.q4_linear(torch.randn(1, 32), packed, 4, None)  # rows packed for 64 inputs
    with pytest.raises(RuntimeError, match="uint8"):
        ops.q4_linear(torch.randn(1, 64), packed, 17, None)  # 17 rows need two groups of 16
    with pytest.raises(ValueError, match="divisible by 32"):
        native.pack_q4(torch.randn(4, 40))


@pytest.mark.parametrize("rows", [1, 9, 32])
def test_fused_w8a8_steps_equal_the_torch_ops(monkeypatch, rows):
    monkeypatch.setattr(linear, "_has_vnni", lambda: True)
    torch.manual_seed(rows)
    layer = linear.Int8Dynamic(torch.randn(40, 96) / 10, torch.randn(40))
    x = torch.randn(rows, 96)
    x[:, 62] *= 50
    x[:, 7] *= 20
    fused = layer(x)
    monkeypatch.setattr(native, "ops", lambda: None)
    torch.testing.assert_close(fused, layer(x), atol=1e-5, rtol=1e-5)


def test_w8a8_quantise_takes_the_largest_channels_out():
    x = torch.tensor([[1.0, -50.0, 2.0, 0.5], [-3.0, 1.0, 0.25, 9.0]])
    xq, step, outliers, wide = ops.w8a8_quantise(x, 2)
    assert outliers.tolist() == [1, 3]  # peaks 50 and 9
    torch.testing.assert_close(wide, x[:, [1, 3]])
    torch.testing.assert_close(step[:, 0], torch.tensor([2.0, 3.0]) / 127)
    assert xq.tolist() == [[64, 0, 127, 0], [-127, 0, 11, 0]]  # outlier channels are 0 in every row


_CHILD = """
import json, sys, torch
from pie_backend_torch import native, q5
ops = native.ops()
torch.manual_seed(7)
w = torch.randn(37, 96) / 10
x = torch.randn(5, 96)
w5 = (torch.randint(-16, 16, (37, 3, 32)) * (torch.rand(37, 3, 1) / 50).half().float()).reshape(37, 96)
print(json.dumps({"why": native.unavailable_reason(), "isa": ops.isa(), "y": ops.q4_linear(x, native.pack_q4(w), 37, None).tolist(),
                  "y8": ops.q8_linear(x, native.pack_q8(w)[0], 37, None).tolist(),
                  "y5": ops.q5_linear(x, q5.pack(w5), 37, None).tolist(), "w5": w5.tolist(),
                  "y4f": ops.q4_linear(x, native.pack_q4(w), 37, None, True).tolist(),
                  "y8f": ops.q8_linear(x, native.pack_q8(w)[0], 37, None, True).tolist()}))
"""


def test_the_avx2_build_gives_the_native_build_s_results(tmp_path):
    """``PIE_TORCH_MARCH=x86-64-v3`` builds the AVX2 path (no AVX512, no VNNI) on any x86 CPU."""
    env = {**os.environ, "PIE_TORCH_MARCH": "x86-64-v3"}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    avx2 = json.loads(out.stdout.strip().splitlines()[-1])
    assert avx2["why"] is None and avx2["isa"] == "avx2"
    torch.manual_seed(7)
    w, x = torch.randn(37, 96) / 10, torch.randn(5, 96)  # 2 groups and 5 rows: both AVX2 halves, a 4-row tile and 1
    torch.testing.assert_close(torch.tensor(avx2["y"]), ops.q4_linear(x, native.pack_q4(w), 37, None), atol=1e-5, rtol=1e-6)
    # q8's sums are exact integers and its float steps the same on both paths: bit for bit
    assert torch.equal(torch.tensor(avx2["y8"]), ops.q8_linear(x, native.pack_q8(w)[0], 37, None))
    w5 = torch.tensor(avx2["w5"])  # q5 likewise, its fifth bits expanded another way on AVX2
    assert torch.equal(torch.tensor(avx2["y5"]), ops.q5_linear(x, q5.pack(w5), 37, None))
    assert torch.equal(torch.tensor(avx2["y8f"]), ops.q8_linear(x, native.pack_q8(w)[0], 37, None, True))  # two steps too
    torch.testing.assert_close(torch.tensor(avx2["y4f"]), ops.q4_linear(x, native.pack_q4(w), 37, None, True), atol=1e-5, rtol=1e-6)


def test_without_the_kernels_auto_falls_back_and_q4_says_why(monkeypatch):
    monkeypatch.setenv("PIE_TORCH_NATIVE", "0")
    monkeypatch.setattr(native, "_state", {})
    assert native.ops() is None and "PIE_TORCH_NATIVE=0" in (native.unavailable_reason() or "")
    assert resolve_options(BackendOptions(dtype="auto")).quant in ("int4", "w8a8")
    spec = tiny_spec("qwen2")
    with pytest.raises(ValueError, match="q4.*could not be built.*PIE_TORCH_NATIVE=0"):
        TorchBackend().pie_backend_load_model(spec, random_weights(spec), BackendOptions(dtype="float32", extra={"quant": "q4"}))


def test_q4_with_dense_bf16_layers_for_large_batches_runs_a_long_prefill():
    """quant=q4 alone in bfloat16 gives batches over quant_max_tokens dense bf16 layers, which
    get q4's float32 activations: a 100-token prefill crashed in oneDNN before they cast."""
    spec = tiny_spec("qwen2")
    reqs = [kv_request(np.arange(100) * 11 % 97, list(range(30)), 4)]
    ref = probe_logits(run(load_torch(spec, random_weights(spec), quant="q4", dtype="float32"), reqs), reqs)[0]
    bf16 = probe_logits(run(load_torch(spec, random_weights(spec), quant="q4", dtype="bfloat16"), reqs), reqs)[0]
    assert bf16.shape == ref.shape == (100, spec.vocab_size)
    assert float(np.corrcoef(ref.ravel(), bf16.ravel())[0, 1]) > 0.95


def test_a_q4_model_stays_close_to_float32():
    spec = tiny_spec("qwen2")
    reqs = [kv_request(np.arange(7) * 11 % 128, np.arange(2), 4)]
    ref = probe_logits(run(load_torch(spec, random_weights(spec)), reqs), reqs)[0]
    q4 = probe_logits(run(load_torch(spec, random_weights(spec), quant="q4", quant_max_tokens=0), reqs), reqs)[0]
    assert q4.shape == ref.shape
    corr = float(np.corrcoef(ref.ravel(), q4.ravel())[0, 1])
    assert corr > 0.95, corr
    assert (q4.argmax(axis=-1) == ref.argmax(axis=-1)).mean() >= 0.8


@pytest.mark.parametrize("kind", ["q4", "q8", "q5"])
def test_two_step_activations_come_within_a_hundredth_of_the_one_step_error(kind):
    """``refine``: a layer's activations in two int8 steps (the blocks, then what they missed) give
    nearly the float product of its weights; a row's result still depends on that row alone."""
    w = _q5_0(40, 896) if kind == "q5" else torch.randn(40, 896) / 10
    make = {"q4": linear.Q4, "q8": linear.Q8, "q5": linear.Q5}[kind]
    plain, fine = make(w, torch.randn(40)), linear.refine(make(w, torch.randn(40)))
    fine.bias = plain.bias
    x = torch.randn(33, 896) * torch.where(torch.rand(896) < 0.02, 30.0, 1.0)
    exact = x.double() @ plain.dequantised().double().T + plain.bias.double()
    one, two = (plain(x).double() - exact).abs().max(), (fine(x).double() - exact).abs().max()
    assert two < one / 100, (float(one), float(two))
    y = fine(x)
    for r, size in ((0, 1), (7, 4), (32, 5)):
        start = max(0, min(r - size // 2, 33 - size))
        assert torch.equal(fine(x[start : start + size])[r - start], y[r])


def test_two_step_activations_are_kept_through_the_weights_store():
    for w in (_q5_0(40, 256), _ggml_like("q8_0", 40, 256), _ggml_like("q4_k", 40, 256)):
        layer = linear.refine(linear.quantise(w, None, "fit", torch.float32, 0))
        again = linear.rebuild_layer(linear.layer_tensors(layer, w, torch.float32), torch.float32, 0)
        assert layer.fine and again.fine and type(again) is type(layer)
        x = torch.randn(3, 256)
        assert torch.equal(again(x), layer(x))


def test_refine_leaves_layers_without_int8_activations_alone():
    dense = linear.fit(torch.randn(16, 64), None)
    assert linear.refine(dense) is dense and not getattr(dense, "fine", False)
