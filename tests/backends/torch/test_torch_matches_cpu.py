"""The torch backend computes what the NumPy reference computes, on every architecture flavour,
through both its torch path and its Triton kernels (interpreted on CPU).

Each scenario runs the same batches on both backends (so their KV pools evolve alike) and
compares every probed logit row: prefill with pages scattered over the pool and with pages in
order (read in place), chunked prefill, decode rows of very different KV lengths in one batch,
custom masks (one row that may see nothing), sliding windows, and a batch mixing all of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from backend_testkit import kv_request, load_cpu, probe_logits, run
from torch_testkit import ARCHS, load_torch, spec_of

PAGE = 4
FP32_TOL = 2e-4
BF16_REL = 0.02  # of the largest |logit| of the row block: bf16 keeps 8 bits of mantissa


def _scenario(spec, rng):
    """Batches of requests; pages per context are fixed up front (some scattered, some in order)."""
    v = spec.vocab_size
    long_prompt = rng.integers(0, v, 70).tolist()
    short = rng.integers(0, v, 9).tolist()
    pages_a = [40 + i for i in range(20)]  # in order: read in place
    pages_b = [7, 3, 90, 11, 60, 5]  # scattered: gathered
    pages_c = [120, 121, 122, 123]
    mask = rng.random((3, 12)) < 0.6
    mask[:, 9:] = False
    mask[1] = False  # a row that may see no key
    mask[2, 11] = True
    return [
        [kv_request(long_prompt, pages_a, PAGE), kv_request(short, pages_b, PAGE)],
        [kv_request(short[:5], pages_c, PAGE), kv_request(rng.integers(0, v, 6).tolist(), pages_b, PAGE, start=9)],
        [
            kv_request([int(rng.integers(v))], pages_a, PAGE, start=70),
            kv_request([int(rng.integers(v))], pages_b, PAGE, start=15),
            kv_request([int(rng.integers(v))], pages_c, PAGE, start=5),
        ],
        [
            kv_request(rng.integers(0, v, 3).tolist(), pages_c, PAGE, start=9, mask=mask),
            kv_request([int(rng.integers(v))], pages_a, PAGE, start=71),
            kv_request(rng.integers(0, v, 4).tolist(), pages_b, PAGE, start=16),
        ],
    ]


def _compare(spec, torch_backend, rel: float = 0.0):
    cpu = load_cpu(spec, page_size=PAGE)
    for step, reqs in enumerate(_scenario(spec, np.random.default_rng(3))):
        want = probe_logits(run(cpu, reqs), reqs)
        got = probe_logits(run(torch_backend, reqs), reqs)
        for r, (a, b) in enumerate(zip(want, got)):
            assert b.dtype == np.float32 and b.shape == a.shape
            tol = FP32_TOL + rel * float(np.abs(a).max())
            np.testing.assert_allclose(b, a, atol=tol, rtol=0, err_msg=f"batch {step}, request {r}")


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_path_matches_the_reference_in_fp32(arch):
    spec = spec_of(arch)
    _compare(spec, load_torch(spec, page_size=PAGE))


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "qwen3"])  # soft-capping: see test_triton_kernels
def test_triton_kernels_match_the_reference_in_fp32(arch):
    spec = spec_of(arch)
    _compare(spec, load_torch(spec, page_size=PAGE, kernels="triton"))


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_bf16_stays_within_bf16_rounding_of_the_reference(kernels):
    spec = spec_of("qwen2")
    _compare(spec, load_torch(spec, page_size=PAGE, dtype="bfloat16", kernels=kernels), BF16_REL)
