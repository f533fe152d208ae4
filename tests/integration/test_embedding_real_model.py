"""Embeddings on the default model equal transformers' final hidden state (after the final norm).

One prefill pass probes every prompt row with ``Embedding()``; a second pass (reading the first
pass's KV pages) takes two more rows through ``Sampler.embedding()``. transformers runs the whole
sequence at once with ``output_hidden_states=True``; its last entry is the normed final state.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferlet import Context, Embedding, Logits, Model, Sampler, runtime

pytestmark = pytest.mark.model


def test_embeddings_equal_transformers_last_hidden_state(pie, hf_model):
    import torch

    async def main(_):
        model = Model.load(runtime.models()[0])
        with Context(model) as ctx:
            ctx.user("Summarise the water cycle in one sentence.").cue()
            prompt = ctx.buffer()
            fwd = ctx.forward(flush=True)
            probes = [fwd.probe(i, Embedding()) for i in range(len(prompt))]
            h_logits = fwd.probe(len(prompt) - 1, Logits())
            out = await fwd.execute()
            rows = [out.embedding(h) for h in probes]
            logits = np.frombuffer(out.logits(h_logits), dtype=np.float32).tolist()

            more = model.tokenizer().encode(" Water evaporates")
            fwd = ctx.forward().input(more)
            h_more = fwd.sample(list(range(len(more))), Sampler.embedding())
            rows += (await fwd.execute()).embeddings_at(h_more)
            return prompt + more, len(prompt), rows, logits

    ids, n_prompt, rows, logits = pie.value(main)
    ours = np.asarray(rows, dtype=np.float64)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].double().numpy()
    assert ours.shape == ref.shape == (len(ids), hf_model.config.hidden_size)
    rel = np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)
    worst = int(np.argmax(rel))
    assert rel.max() <= 1e-4, f"row {worst} of {len(ids)}: relative error {rel[worst]:.2e}"

    # the embedding is what the output layer reads: projecting it gives the logits
    head = hf_model.get_output_embeddings().weight.detach().double().numpy()
    projected = head @ ours[n_prompt - 1]
    assert np.abs(projected - np.asarray(logits)).max() <= 1e-3 * np.abs(logits).max()
