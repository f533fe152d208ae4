"""The cpu backend computes what transformers computes on the real default model.

The prompt is built with the SDK's chat helpers; its ids go to both engines unchanged, so the
comparison covers the backend alone (not the chat template or the tokenizer).
"""

from __future__ import annotations

import numpy as np
import pytest

from inferlet import Context, Logits, Model, Sampler, runtime

pytestmark = pytest.mark.model

SYSTEM = "You are a concise assistant that answers questions about geography."
USER = "What is the capital of France, and what river runs through it?"


def _chat_prompt(ctx: Context) -> list[int]:
    ctx.system(SYSTEM).user(USER).cue()
    return ctx.buffer()


def _reference_logits(hf_model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().numpy()


def test_logits_at_every_prompt_position_match_transformers(pie, hf_model):
    async def main(_):
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ids = _chat_prompt(ctx)
            fwd = ctx.forward()
            fwd.input(ids)
            handles = [fwd.probe(i, Logits()) for i in range(len(ids))]
            out = await fwd.execute()
            rows = [np.frombuffer(out.logits(h), dtype=np.float32).tolist() for h in handles]
            return ids, rows, model.vocab_size

    ids, rows, vocab = pie.value(main)
    assert 30 <= len(ids) <= 50, f"the prompt should be about 40 tokens, got {len(ids)}"
    ours = np.asarray(rows, dtype=np.float32)
    ref = _reference_logits(hf_model, ids)
    assert ours.shape == (len(ids), vocab) and ref.shape[0] == len(ids)
    ref = ref[:, :vocab]
    err = np.abs(ours - ref).max(axis=1)
    scale = np.abs(ref).max(axis=1)
    worst = int(np.argmax(err / scale))
    assert np.all(err <= 1e-3 * scale), (
        f"logits differ at position {worst}: max|Δ|={err[worst]:.3g}, max|logit|={scale[worst]:.3g}"
    )
    assert np.array_equal(ours.argmax(axis=1), ref.argmax(axis=1))


def test_64_greedy_tokens_equal_transformers_generate(pie, hf_model):
    import torch

    async def main(_):
        model = Model.load(runtime.models()[0])
        with Context(model) as prompt:
            ids = _chat_prompt(prompt)
        with Context(model) as ctx:
            ctx.append(ids)
            g = ctx.generate(Sampler.argmax(), max_tokens=64, stop=[], auto_flush=False)
            return ids, await g.collect_tokens()

    ids, ours = pie.value(main)
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=64,
            eos_token_id=None,  # like stop=[]: run all 64 tokens past <|im_end|>
            pad_token_id=0,
        )
    ref = out[0, len(ids) :].tolist()
    assert len(ours) == len(ref) == 64
    first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    assert ours == ref, f"greedy tokens diverge at step {first}: ours {ours[first:first + 5]}, transformers {ref[first:first + 5]}"
