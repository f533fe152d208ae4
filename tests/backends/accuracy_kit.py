"""Accuracy measures shared by the real-model tests and ``benchmarks/accuracy.py``: perplexity of a
fixed passage (in one pass or in passes of a few tokens), greedy tokens, and the same from
transformers (float32, on the GGUF's dequantised weights) as the reference.

A backend is driven through its hooks directly (``backend_testkit.run``), one request per pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from backend_testkit import kv_request, probe_logits, run
from conformance.batches import KvSequence

__all__ = [
    "PASSAGE",
    "PROMPTS",
    "passage_ids",
    "perplexity",
    "logprob_perplexity",
    "backend_logits",
    "backend_greedy",
    "hf_logits",
    "hf_greedy",
    "prompt_ids",
]

PASSAGE = (Path(__file__).resolve().parents[1] / "data" / "accuracy_passage.txt").read_text()
"""A self-written passage of about 240 tokens (no chat format around it)."""

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences what a hash map is.",
    "What does the SQL statement SELECT COUNT(*) FROM users return?",
)
"""Three short user turns for greedy agreement (chat-formatted by :func:`prompt_ids`)."""

PAGE_SIZE = 16


def passage_ids(tokenizer: Any) -> np.ndarray:
    return np.asarray(tokenizer.encode(PASSAGE), dtype=np.int32)


def prompt_ids(source: Any, user: str) -> list[int]:
    """``user`` as one chat turn of ``source``'s chat format, with the assistant cue."""
    chat = source.chat
    ids: list[int] = []
    for part in (chat.system("You are a helpful assistant."), chat.user(user), chat.cue()):
        ids.extend(part)
    return ids


def perplexity(logits: np.ndarray, ids: Sequence[int]) -> float:
    """exp of the mean negative log-likelihood of ``ids[1:]`` under ``logits[:-1]`` (float64)."""
    x = np.asarray(logits, dtype=np.float64)[:-1]
    x = x - x.max(axis=1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    return logprob_perplexity(logp[np.arange(len(x)), np.asarray(ids[1:])])


def logprob_perplexity(logprobs: np.ndarray) -> float:
    """exp of the mean negative log-likelihood, from each next token's log-probability (float64), for
    paths that hand back those rather than logits rows (llama.cpp through node-llama-cpp)."""
    return float(np.exp(-np.asarray(logprobs, dtype=np.float64).mean()))


def backend_logits(backend: Any, ids: np.ndarray, pass_size: int, first_page: int = 0) -> np.ndarray:
    """float32 ``[len(ids), vocab]``: every position's logits, fed ``pass_size`` tokens a pass."""
    pages = list(range(first_page, first_page + -(-len(ids) // PAGE_SIZE)))
    seq = KvSequence(pages, PAGE_SIZE)
    rows = []
    for a in range(0, len(ids), pass_size):
        chunk = ids[a : a + pass_size]
        req = kv_request(chunk, pages, PAGE_SIZE, start=seq.length, probe_all=True)
        seq.length += len(chunk)
        rows.append(probe_logits(run(backend, [req]), [req])[0])
    return np.concatenate(rows)


def backend_greedy(backend: Any, ids: Sequence[int], steps: int) -> list[int]:
    """``steps`` greedy tokens after ``ids`` (prefill in one pass, then one token a pass)."""
    pages = list(range(-(-(len(ids) + steps) // PAGE_SIZE)))
    out: list[int] = []
    chunk, start = list(ids), 0
    for _ in range(steps):
        req = kv_request(np.asarray(chunk, dtype=np.int32), pages, PAGE_SIZE, start=start, probe_all=True)
        start += len(chunk)
        token = int(probe_logits(run(backend, [req]), [req])[0][-1].argmax())
        out.append(token)
        chunk = [token]
    return out


def hf_logits(model: Any, ids: Sequence[int]) -> np.ndarray:
    """float32 ``[len(ids), vocab]`` logits of one pass, on the model's own device."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)], device=model.device)).logits[0].float().cpu().numpy()


def hf_greedy(model: Any, ids: Sequence[int], steps: int) -> list[int]:
    """Plain argmax decoding (not ``generate``: the GGUF's generation config adds a repetition
    penalty even to greedy search)."""
    import torch

    out: list[int] = []
    past, chunk = None, list(ids)
    with torch.no_grad():
        for _ in range(steps):
            res = model(torch.tensor([chunk], device=model.device), past_key_values=past, use_cache=True)
            past = res.past_key_values
            out.append(int(res.logits[0, -1].argmax()))
            chunk = [out[-1]]
    return out
