"""The torch backend on the real default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF).

fp32 mode generates exactly the cpu backend's 64 greedy tokens; bf16 logits match transformers
(fp32, same GGUF) within bf16 rounding; and the default CPU mode (q4 for batches of up to 64
tokens, w8a8 above) keeps a long prompt's logits within w8a8's bounds and a short one's within
q4's, and decodes tokens that transformers, teacher-forced on them, ranks at or near the top. Each torch engine is loaded once per module; the cpu engine and transformers are
the shared fixtures of tests/integration/conftest.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from inferlet import Context, Logits, Model, Sampler, runtime
from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.runtime.instance import run_main

pytestmark = pytest.mark.model

SYSTEM = "You are a concise assistant that answers questions about programming."
USER = "Write a Python function that checks whether a number is prime."
LONG_USER = (  # 96 tokens with the chat format: more than q4's 64, so its prefill runs w8a8
    "Write a Python function that checks whether a number is prime. It should take one integer, return a bool, "
    "handle negative numbers, zero and one, use trial division up to the square root, skip even divisors after two, "
    "and come with a docstring, type hints and three doctest examples that show a prime, a composite and an edge case."
)


@pytest.fixture(scope="module")
def auto_engine():
    """The torch backend as a user gets it by default on this CPU (dtype auto: quant fit, float32)."""
    engine = Engine("torch", options=BackendOptions(dtype="auto"))
    engine.load(None)
    yield engine
    asyncio.run(engine.close())


def _prompt(ctx: Context, user: str = USER) -> list[int]:
    ctx.system(SYSTEM).user(user).cue()
    return ctx.buffer()


async def _greedy(_) -> tuple[list[int], list[int]]:
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ids = _prompt(ctx)
        g = ctx.generate(Sampler.argmax(), max_tokens=64, stop=[], auto_flush=False)
        return ids, await g.collect_tokens()


async def _prompt_logits(user: str) -> tuple[list[int], list[list[float]]]:
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ids = _prompt(ctx, user)
        fwd = ctx.forward()
        fwd.input(ids)
        handles = [fwd.probe(i, Logits()) for i in range(len(ids))]
        out = await fwd.execute()
        return ids, [np.frombuffer(out.logits(h), dtype=np.float32).tolist() for h in handles]


def _hf_logits(hf_model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().numpy()


def _run(engine: Engine, main):
    final = asyncio.run(run_main(engine, main, {}, lambda event: None))
    assert final.kind == "return", final.value
    assert engine.pools_whole(), "a test left KV pages allocated"
    return final.value


def test_fp32_greedy_64_tokens_equal_the_cpu_backend(cpu_engine):
    engine = Engine("torch", options=BackendOptions(dtype="float32"))
    engine.load(None)
    try:
        ids, ours = _run(engine, _greedy)
    finally:
        asyncio.run(engine.close())
    ref_ids, ref = _run(cpu_engine, _greedy)
    assert ids == ref_ids and len(ours) == 64
    first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    assert ours == ref, f"greedy tokens diverge at step {first}: torch {ours[first:first + 5]}, cpu {ref[first:first + 5]}"


def _against_transformers(engine: Engine, hf_model, user: str) -> tuple[int, float, np.ndarray, float]:
    """Prompt length, worst logit error over the row's peak, per-row KL(transformers || ours), top-1 agreement."""
    ids, rows = _run(engine, lambda _: _prompt_logits(user))
    ours = np.asarray(rows, dtype=np.float32)
    ref = _hf_logits(hf_model, ids)[:, : ours.shape[1]]
    worst = float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())
    logp = lambda x: x - np.logaddexp.reduce(x, axis=1, keepdims=True)  # noqa: E731
    p = np.exp(logp(ref))
    kl = (p * (logp(ref) - logp(ours))).sum(axis=1)
    return len(ids), worst, kl, float(np.mean(ours.argmax(1) == ref.argmax(1)))


def test_default_cpu_mode_long_prompt_logits_match_transformers(auto_engine, hf_model):
    """A prompt of more than 64 tokens (before issue 35 it prefilled on w8a8; now every batch size
    runs the same fit layers, float32 activations and cache)."""
    want = "float32"
    assert next(iter(auto_engine.models.values())).caps.dtype == want
    n, worst, kl, top1 = _against_transformers(auto_engine, hf_model, LONG_USER)
    assert n > 64
    # bf16 keeps 8 mantissa bits (~0.4% per rounding); fbgemm's 7-bit activation steps (the
    # float32 mode) move single logits more, so there the distribution bounds below are the gate.
    # w8a8 takes a fixed 8 outlier channels out and runs on float32 activations: on an
    # AVX512-BF16 Xeon this prompt's worst single logit is 0.066 of the row's peak, mean KL
    # 0.0035, top-1 0.97 (2026-11-25).
    assert worst <= (0.075 if want == "bfloat16" else 0.15), f"max |Δ|/max|logit| = {worst:.3f}"
    kl_bound = 5e-3 if want == "bfloat16" else 2e-2  # float32 + w8a8 measured 0.0125 on a shorter prompt
    assert kl.mean() < kl_bound, f"mean KL(transformers || torch auto) = {kl.mean():.4f}"
    assert top1 >= 0.9


def test_default_cpu_mode_short_prompt_stays_within_q4_accuracy(auto_engine, hf_model):
    """A prompt of up to 64 tokens prefills on q4, as decode steps run: its logits carry q4's
    rounding of this GGUF's 5- and 8-bit tensors to 4 bits (docs/performance.md, issue 21)."""
    n, _, kl, top1 = _against_transformers(auto_engine, hf_model, USER)
    assert n <= 64
    # measured on an AVX512-BF16 Xeon (2026-11-25): mean KL 0.057, max 0.24, top-1 0.89; with
    # w8a8 weights in the body instead (a diagnostic run) the mean is 0.019, with them in the head 0.044
    assert kl.mean() < 0.08, f"mean KL(transformers || torch q4) = {kl.mean():.4f}"
    assert kl.max() < 0.4 and top1 >= 0.8, (kl.max(), top1)


def test_default_cpu_mode_decodes_tokens_transformers_ranks_at_the_top(auto_engine, hf_model):
    ids, ours = _run(auto_engine, _greedy)
    assert len(ours) == 64
    ref = _hf_logits(hf_model, ids + ours[:-1])[len(ids) - 1 :]
    chosen = ref[np.arange(64), ours]
    gap = ref.max(axis=1) - chosen  # 0 where transformers would have picked the same token
    assert np.mean(gap == 0) >= 0.85, f"only {np.mean(gap == 0):.2f} of the tokens are transformers' own argmax"
    assert gap.max() < 1.0, f"a decoded token is {gap.max():.2f} logits below transformers' best"


CODE = '''def is_prime(n):
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True
'''


async def _greedy_rewrite(payload) -> tuple[list[int], int]:
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user("Rename is_prime to check_prime in this code. Reply with the code only.\n\n" + CODE)
        options = {"system_speculation": True} if payload.get("speculate") else {}
        g = ctx.generate(Sampler.argmax(), max_tokens=40, **options)
        steps = 0
        async for step in g:
            await step.execute()
            steps += 1
        return await g.collect_tokens(), steps


def test_system_speculation_gives_the_default_modes_greedy_tokens(auto_engine):
    def run(speculate: bool):
        final = asyncio.run(run_main(auto_engine, _greedy_rewrite, {"speculate": speculate}, lambda e: None))
        assert final.kind == "return", final.value
        return final.value

    (plain, plain_steps), (sped, sped_steps) = run(False), run(True)
    assert sped == plain and sped_steps < plain_steps / 2
    assert auto_engine.pools_whole()
