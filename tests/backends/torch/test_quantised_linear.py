"""Quantised linear layers: torch's CPU kernels compute ``x @ W_q.T`` for the quantised weight
(weight-only int8 / int4, and int8 x int8 "w8a8" on both of its kernels: ``torch._int_mm`` for
CPUs with VNNI, fbgemm for others), the quantisation error stays within its step size, and the
batch-size switch routes large batches to the other layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend_testkit import kv_request, probe_logits, random_weights, run
from pie_backend_torch import linear
from pie_backend_torch.linear import INT4_GROUP, ByBatchSize, Dense, Int4, Int8, Int8Dynamic, quantise
from pie_core.models.spec import ModelSpec, RopeConfig
from torch_testkit import load_torch


@pytest.fixture(params=["int_mm", "fbgemm"])
def w8a8_kernel(request, monkeypatch) -> str:
    """Run a w8a8 test on each integer kernel, whichever this CPU would pick."""
    monkeypatch.setattr(linear, "_has_vnni", lambda: request.param == "int_mm")
    return str(request.param)


@pytest.fixture
def weight() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(48, 96) / 10


@pytest.mark.parametrize("cls", [Int8, Int4])
def test_quantised_layers_multiply_by_their_own_dequantised_weight(cls, weight):
    layer = cls(weight, torch.full((48,), 0.5, dtype=torch.bfloat16))
    x = torch.randn(5, 96).to(torch.bfloat16)
    got = layer(x).float()
    want = x.float() @ layer.dequantised().T + 0.5
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)


def test_int8_error_is_at_most_half_a_step_per_channel(weight):
    layer = Int8(weight, None)
    step = layer.scale.float()[:, None]
    err = (layer.dequantised() - weight).abs()
    assert bool((err <= step / 2 + 1e-6).all())


def test_int4_error_is_within_one_step_of_its_group(weight):
    layer = Int4(weight, None)
    groups = weight.reshape(48, -1, INT4_GROUP)
    step = ((groups.amax(-1) - groups.amin(-1)) / 15)[..., None]
    err = (layer.dequantised().reshape(48, -1, INT4_GROUP) - groups).abs()
    assert bool((err <= step * 0.75 + 1e-3).all())  # half a step, plus bf16 rounding of scale and offset


def test_int4_needs_whole_blocks_and_falls_back_to_int8():
    w = torch.randn(16, 40)
    with pytest.raises(ValueError, match="divisible by 32"):
        Int4(w, None)
    assert isinstance(quantise(w, None, "int4", torch.bfloat16, 0), Int8)
    assert isinstance(quantise(torch.randn(8, 64), None, "int4", torch.bfloat16, 0), Int8)
    assert isinstance(quantise(torch.randn(16, 64), None, "int4", torch.bfloat16, 0), Int4)
    assert isinstance(quantise(w, None, "none", torch.float32, 0), Dense)
    packed = quantise(w, None, "none", torch.bfloat16, 0)
    x = torch.randn(3, 40).bfloat16()
    torch.testing.assert_close(packed(x), torch.nn.functional.linear(x, w.bfloat16()))


def test_large_batches_use_the_dense_weights(weight):
    layer = quantise(weight, None, "int8", torch.bfloat16, 4)
    assert isinstance(layer, ByBatchSize)
    small, large = torch.randn(4, 96).bfloat16(), torch.randn(5, 96).bfloat16()
    torch.testing.assert_close(layer(small), layer.small(small))
    torch.testing.assert_close(layer(large), layer.large(large))
    assert not torch.equal(layer.small(large), layer.large(large))


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_a_quantised_model_stays_close_to_the_dense_one(quant):
    spec = ModelSpec(
        arch="qwen2", vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        intermediate_size=96, qkv_bias=True, tie_embeddings=True, rope=RopeConfig(theta=1e4),
    )
    reqs = [kv_request(np.arange(7) * 11 % 128, np.arange(2), 4)]
    dense = probe_logits(run(load_torch(spec, random_weights(spec), dtype="bfloat16"), reqs), reqs)[0]
    got = probe_logits(run(load_torch(spec, random_weights(spec), dtype="bfloat16", quant=quant, quant_max_tokens=0), reqs), reqs)[0]
    corr = np.corrcoef(dense.ravel(), got.ravel())[0, 1]
    assert corr > (0.995 if quant == "int8" else 0.95), corr
    assert not np.array_equal(dense, got)  # the quantised weights really ran


def _per_token_int8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plain dynamic int8 (per-token activations, per-channel weights), no outlier handling."""
    sw = w.abs().amax(1) / 127
    sx = x.abs().amax(1, keepdim=True) / 127
    return (torch.round(x / sx) @ torch.round(w / sw[:, None]).T) * sx * sw


@pytest.mark.parametrize("rows", [1, 12])
def test_w8a8_multiplies_like_the_float_weights(w8a8_kernel, rows):
    torch.manual_seed(1)
    w, b = torch.randn(64, 96) / 10, torch.randn(64)
    layer = Int8Dynamic(w, b)
    assert (layer.packed is None) == (w8a8_kernel == "int_mm")
    x = torch.randn(rows, 96)
    want = x @ w.T + b
    got = layer(x.bfloat16()).float()
    assert got.dtype == torch.float32 and layer(x.bfloat16()).dtype == torch.bfloat16
    assert layer(x).dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)
    torch.testing.assert_close(layer(x), want, atol=0.05, rtol=0.02)


def test_w8a8_scales_each_token_on_its_own(w8a8_kernel):
    """A token 1000x smaller than its batch neighbour keeps its precision (per-token steps, on
    fbgemm too, whose own activation range is per tensor)."""
    torch.manual_seed(4)
    w = torch.randn(64, 96) / 10
    layer = Int8Dynamic(w, None)
    small = torch.randn(1, 96) / 1000
    want = small @ w.T
    for got in (layer(torch.cat([torch.randn(1, 96), small]))[1:], layer(small)):
        assert ((got - want).norm() / want.norm()).item() < 0.02


def test_w8a8_keeps_outlier_channels_out_of_the_int8_step(w8a8_kernel):
    torch.manual_seed(2)
    w = torch.randn(64, 96) / 10
    x = torch.randn(8, 96)
    x[:, 7] *= 60.0  # one channel 60x the others, as in Qwen's residual stream
    before = x.clone()
    layer = Int8Dynamic(w, None)
    got = layer(x)
    assert torch.equal(x, before)  # the input is not changed
    want = x @ (layer.weight.float() * layer.scale[:, None]).T  # the weights' own error left out
    err = (got - want).abs().max().item()
    naive_err = (_per_token_int8(x, w) - want).abs().max().item()
    assert err < naive_err / 10, (err, naive_err)


def test_w8a8_handles_a_different_outlier_channel_each_call(w8a8_kernel):
    torch.manual_seed(3)
    layer = Int8Dynamic(torch.randn(32, 64) / 10, None)
    deq = layer.weight.float() * layer.scale[:, None]
    for channels in ([3], [9, 20], [20], []):
        x = torch.randn(4, 64)
        x[:, channels] *= 80.0
        torch.testing.assert_close(layer(x), x @ deq.T, atol=0.05, rtol=0.02)


def test_w8a8_keeps_outlier_weights_and_starts_afresh_when_full(w8a8_kernel):
    torch.manual_seed(5)
    layer = Int8Dynamic(torch.randn(32, 96) / 10, None)
    deq = layer.weight.float() * layer.scale[:, None]
    for start in [*range(0, 96, 6), 0, 0]:  # 8 channels a call, 16 sets: the kept ones overflow
        x = torch.randn(2, 96)
        x[:, start : start + 6] *= 80.0
        torch.testing.assert_close(layer(x), x @ deq.T, atol=0.05, rtol=0.02)
        assert 0 < layer.kept.used <= linear._KEPT_COLUMNS


def test_w8a8_for_every_batch_size_is_one_layer():
    layer = quantise(torch.randn(48, 96), None, "w8a8", torch.float32, 8, "w8a8")
    assert isinstance(layer, Int8Dynamic)


def test_large_batches_can_use_w8a8():
    w = torch.randn(48, 96) / 10
    layer = quantise(w, None, "int4", torch.bfloat16, 4, "w8a8")
    assert isinstance(layer, ByBatchSize) and isinstance(layer.small, Int4) and isinstance(layer.large, Int8Dynamic)
    x = torch.randn(9, 96).bfloat16()
    torch.testing.assert_close(layer(x), layer.large(x))
