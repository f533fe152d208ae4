"""The grouped LoRA op of the torch backend, every kernel of it (:mod:`pie_backend_torch.lora_step`:
``native`` ``csrc/lora.cpp``, ``triton`` under the interpreter, the ``torch`` fallback), against a
float64 reference: ``out[t] += (a_g[p] @ x[t]) @ b_g[p]`` part by part for each token's group.

Batches mix tokens without an adapter, groups of different ranks, groups that lack the
projection, scattered and empty groups, parts (``P`` of 1 to 3) and widths that are no multiple
of a vector; weights in float32 and bfloat16, outputs in float32 and bfloat16. With bfloat16
weights the reference takes the same rounded weights (the op's own error is then float32
accumulation and one rounding of the output), and one test measures what the rounding of the
weights costs against float32 ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pie_backend_torch import native
from pie_backend_torch.lora_step import LoraStep, stack
from pie_backend_torch.lora_weights import PROJECTIONS, LowRank

CPU = torch.device("cpu")


def _kernels() -> list:
    out = [pytest.param("native", marks=pytest.mark.skipif(native.ops() is None, reason="kernels not built here"))]
    out.append(pytest.param("triton", marks=pytest.mark.skipif(
        __import__("importlib").util.find_spec("triton") is None, reason="no triton")))
    return [*out, "torch"]


def _case(seed: int, n: int, inp: int, parts: int, width: int, ranks: list[int | None], dtype: torch.dtype):
    """Random ``x`` ``[n, inp]``, ``out`` and groups of the given ranks (None: the group lacks the
    projection) with their tokens' labels: interleaved, some -1, the last group without tokens."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inp, generator=gen)
    out = torch.randn(n, parts * width, generator=gen)
    pairs = []
    for r in ranks:
        if r is None:
            pairs.append(None)
            continue
        a = torch.randn(parts * r, inp, generator=gen) / inp**0.5
        b = torch.randn(parts, r, width, generator=gen)
        pairs.append(LowRank(a.to(dtype), b.to(dtype)))
    labels = np.array([(3 * t) % (len(ranks) - 1) for t in range(n)], dtype=np.int64)  # never the last group
    labels[::5] = -1
    return x, out, pairs, labels


def _reference(x: torch.Tensor, out: torch.Tensor, pairs, labels: np.ndarray) -> torch.Tensor:
    want = out.double().clone()
    for t, g in enumerate(labels):
        pair = pairs[g] if g >= 0 else None
        if pair is None:
            continue
        parts, k, width = pair.b.shape
        u = pair.a.double() @ x[t].double()
        for p in range(parts):
            want[t, p * width : (p + 1) * width] += u[p * k : (p + 1) * k] @ pair.b[p].double()
    return want


def _step(pairs, labels: np.ndarray, kernel: str) -> LoraStep:
    """A one-layer step whose groups hold ``pairs`` as their ``qkv``."""
    groups = tuple(((p,) + (None,) * (len(PROJECTIONS) - 1),) for p in pairs)
    stacks = stack(groups) if kernel == "triton" else None
    return LoraStep(labels, groups, kernel, CPU, stacks)


CASES = [  # (n, in, parts, width, ranks)
    (1, 32, 1, 16, [4, None]),  # one decode token
    (11, 70, 2, 37, [3, None, 5, 2, 6]),  # odd widths: vector tails; a group without the projection
    (23, 96, 3, 20, [8, 1, 8, 4]),  # three parts (gate/up-like and qkv without GQA)
    (9, 48, 1, 130, [2, 7]),  # block-diagonal form: one part over every column
]


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_the_grouped_op_adds_each_tokens_group_delta(kernel, case, weights):
    n, inp, parts, width, ranks = case
    if kernel == "torch" and weights == torch.bfloat16:
        pytest.skip("the fallback keeps float32 weights")
    x, out, pairs, labels = _case(n * 7 + width, n, inp, parts, width, ranks, weights)
    want = _reference(x, out, pairs, labels)
    got = out.clone()
    _step(pairs, labels, kernel).add(0, 0, x, got)
    torch.testing.assert_close(got.double(), want, atol=2e-5 * max(ranks, key=lambda r: r or 0), rtol=1e-5)
    assert (got - out).abs().amax(dim=1)[labels < 0].max() == 0, "a token without an adapter changed"


@pytest.mark.parametrize("kernel", _kernels())
def test_a_bfloat16_output_gets_its_delta_within_an_ulp(kernel):
    if kernel == "torch":
        pytest.skip("the fallback rounds the delta, then the sum")
    x, out, pairs, labels = _case(5, 13, 64, 2, 40, [4, 2, None], torch.bfloat16)
    out = out.bfloat16()
    want = _reference(x.bfloat16(), out, pairs, labels)
    got = out.clone()
    _step(pairs, labels, kernel).add(0, 0, x.bfloat16(), got)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want.bfloat16().double(), atol=1e-3, rtol=2**-7)  # one bf16 step


def test_bfloat16_weights_cost_a_few_thousandths_of_the_delta():
    """What the native path's bfloat16 weights lose against float32 ones: the rounding of the
    weights (2^-9 relative each), averaged over the rank and the input."""
    if native.ops() is None:
        pytest.skip("kernels not built here")
    x, out, pairs, labels = _case(9, 32, 896, 2, 256, [8, 8, 8, 8, 16], torch.float32)
    exact = _reference(x, out, pairs, labels) - out.double()
    rounded = [None if p is None else LowRank(p.a.bfloat16(), p.b.bfloat16()) for p in pairs]
    got = out.clone()
    _step(rounded, labels, "native").add(0, 0, x, got)
    rel = ((got.double() - out.double()) - exact).norm() / exact.norm()
    assert 1e-4 < rel < 5e-3, f"relative error of the delta {rel:.2e}"


def test_native_op_refuses_mismatched_shapes_and_tokens():
    if native.ops() is None:
        pytest.skip("kernels not built here")
    ops = native.ops()
    x, out = torch.zeros(3, 32), torch.zeros(3, 16)
    a, b = torch.zeros(4, 32), torch.zeros(1, 4, 16)
    tokens, indptr = torch.tensor([0, 2]), torch.tensor([0, 2])
    with pytest.raises(RuntimeError, match="has a"):
        ops.lora_add(x, out, [a], [torch.zeros(1, 4, 15)], tokens, indptr)
    with pytest.raises(RuntimeError, match="outside 0..2"):
        ops.lora_add(x, out, [a], [b], torch.tensor([0, 3]), indptr)
    with pytest.raises(RuntimeError, match="indptr"):
        ops.lora_add(x, out, [a], [b], tokens, torch.tensor([0, 1]))
