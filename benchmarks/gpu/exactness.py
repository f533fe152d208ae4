"""Phase ``exactness``: the torch backend against transformers on the same device and weights.

* Logits of a passage (``tests/data/accuracy_passage.txt``, its first ``logits_tokens`` tokens):
  the first half in one prefill pass, the rest one token a pass (decode steps: on CUDA these run
  in the captured graphs). float32 against transformers float32 within the conformance suite's
  float32 tolerance; bfloat16 against transformers bfloat16, and against float32 judged by
  transformers' own bf16 error: the backend's mean |Δ| to float32 must stay within twice
  transformers bf16's (a yardstick that does not depend on the random model's logit scale).
* Greedy tokens (``greedy_tokens`` on each of the accuracy kit's three chat prompts): the
  backend's float32 must give transformers float32's tokens, parting from them only where
  transformers' own logits of the two tokens tie within the float32 tolerance (random weights make
  near-ties likely over 144 steps); its bfloat16 prefix is reported beside transformers bf16's
  own, as information.

The backend is driven through its hooks (``tests/backends/accuracy_kit.py``), one request a pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks.gpu.record import Record
from benchmarks.gpu.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "backends"))

from accuracy_kit import PAGE_SIZE, PASSAGE, PROMPTS, backend_greedy, hf_greedy, hf_logits, prompt_ids  # noqa: E402
from backend_testkit import kv_request, probe_logits, run as run_batch  # noqa: E402

__all__ = ["run", "stepped_logits", "common_prefix"]

FLOAT32_ATOL = FLOAT32_RTOL = 1e-3  # conformance.tolerances.TOLERANCES["float32"]
BF16_TOLERANCE = (1.5e-1, 5e-2)  # conformance.tolerances.TOLERANCES["bfloat16"] (atol, rtol): reported, not judged
BF16_YARDSTICK = 2.0


def stepped_logits(backend, ids: np.ndarray, prefill: int) -> np.ndarray:
    """float32 ``[len(ids), vocab]``: ``ids[:prefill]`` in one pass, then one token a pass."""
    pages = list(range(-(-len(ids) // PAGE_SIZE)))
    bounds = [0, prefill, *range(prefill + 1, len(ids) + 1)]
    rows = []
    for a, b in zip(bounds, bounds[1:]):
        req = kv_request(ids[a:b], pages, PAGE_SIZE, start=a, probe_all=True)
        rows.append(probe_logits(run_batch(backend, [req]), [req])[0])
    return np.concatenate(rows)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _load_backend(source, device: str, dtype: str):
    from pie_backend_torch import TorchBackend
    from pie_core.hookspec import BackendOptions

    backend = TorchBackend()
    backend.pie_backend_load_model(source.spec, source.weights(),
                                   BackendOptions(device=device, dtype=dtype, page_size=PAGE_SIZE, kv_pages=64, host_pages=4))
    return backend


def _hf(folder: Path, device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    attn = "eager" if dtype == "float32" else "sdpa"  # the float32 reference as plain as it gets
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype), attn_implementation=attn)
    return model.to(device).eval()


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run(settings: Settings, record: Record) -> None:
    import torch

    from pie_core.models.registry import resolve_model

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on both sides
    dev, n = settings.device, settings.sizes.greedy_tokens
    source = resolve_model(str(settings.model_dir))
    ids = np.asarray(source.tokenizer.encode(PASSAGE)[: settings.sizes.logits_tokens], dtype=np.int32)
    prefill = len(ids) // 2
    prompts = [prompt_ids(source, p) for p in PROMPTS]
    record.put("passage_tokens", len(ids))
    record.put("prompt_tokens", [len(p) for p in prompts])

    ref: dict[str, np.ndarray] = {}
    ref_greedy: dict[str, list[list[int]]] = {}
    hf32 = None  # kept: it judges where greedy tokens part (a tie within tolerance, or an error)
    for dtype in ("float32", "bfloat16"):
        hf = _hf(settings.model_dir, dev, dtype)
        ref[dtype] = hf_logits(hf, ids.tolist())
        ref_greedy[dtype] = [hf_greedy(hf, p, n) for p in prompts]
        if dtype == "float32":
            hf32 = hf
        del hf
        _free(dev)
    record.put("logit_scale", {"std": float(ref["float32"].std()), "max_abs": float(np.abs(ref["float32"]).max())})
    logits_table = record.table("logits against transformers (same device, same weights)",
                                ["torch backend", "transformers", "max abs Δ", "mean abs Δ", "top-1 agreement",
                                 "outside tolerance"])
    greedy_table = record.table(f"greedy tokens against transformers float32 ({n} tokens a prompt)",
                                ["side", "common prefix per prompt", "all equal"])
    hf_bf16_err = np.abs(ref["bfloat16"] - ref["float32"])
    logits_table.add("(transformers bfloat16)", "float32", hf_bf16_err.max(), hf_bf16_err.mean(),
                     _top1(ref["bfloat16"], ref["float32"]), "—")
    bf16_prefix = [common_prefix(a, b) for a, b in zip(ref_greedy["bfloat16"], ref_greedy["float32"])]
    greedy_table.add("(transformers bfloat16)", bf16_prefix, bf16_prefix == [n] * len(prompts))

    for dtype in ("float32", "bfloat16"):
        if settings.left() < 5:
            record.stopped(f"torch backend {dtype} not compared")
            continue
        backend = _load_backend(source, dev, dtype)
        record.put(f"capabilities_{dtype}", {"dtype": backend.pie_backend_capabilities().dtype,
                                             "device": backend.pie_backend_capabilities().device,
                                             "kernels": backend._config.kernels, "cuda_graphs": backend._config.cuda_graphs})
        ours = stepped_logits(backend, ids, prefill)
        for against in ("float32", "bfloat16") if dtype == "bfloat16" else ("float32",):
            err = np.abs(ours - ref[against])
            atol, rtol, name = (FLOAT32_ATOL, FLOAT32_RTOL, "float32") if dtype == "float32" else (*BF16_TOLERANCE, "bf16")
            outside = f"{(err > atol + rtol * np.abs(ref[against])).mean():.2%} ({name} tolerance)"
            logits_table.add(dtype, against, err.max(), err.mean(), _top1(ours, ref[against]), outside)
        err32 = np.abs(ours - ref["float32"])
        if dtype == "float32":
            bad = err32 > FLOAT32_ATOL + FLOAT32_RTOL * np.abs(ref["float32"])
            record.check("float32 logits within the float32 tolerance of transformers float32", not bad.any(),
                         f"max |Δ| {err32.max():.3g}; {int(bad.sum())} of {bad.size} outside atol=rtol={FLOAT32_ATOL}")
        else:
            bound = BF16_YARDSTICK * hf_bf16_err.mean()
            record.check("bfloat16 logits: mean |Δ| to float32 within 2x transformers bf16's own", err32.mean() <= bound,
                         f"torch bf16 {err32.mean():.3g} vs transformers bf16 {hf_bf16_err.mean():.3g} (bound {bound:.3g})")
        greedy = [backend_greedy(backend, p, n) for p in prompts]
        prefix = [common_prefix(a, b) for a, b in zip(greedy, ref_greedy["float32"])]
        greedy_table.add(f"torch {dtype}", prefix, prefix == [n] * len(prompts))
        if dtype == "float32":
            margins = [_tie_margin(hf32, p, r, g, k) for p, r, g, k in zip(prompts, ref_greedy["float32"], greedy, prefix)
                       if k < n]
            ties = all(m <= tol for m, tol in margins)
            record.check(f"float32 greedy tokens equal transformers float32 ({n} x {len(prompts)}), or part at a tie",
                         prefix == [n] * len(prompts) or ties,
                         f"common prefixes {prefix}" + "".join(
                             f"; parted where transformers' top logit leads ours by {m:.3g} (tolerance {t:.3g})"
                             for m, t in margins))
        del backend
        _free(dev)


def _tie_margin(hf32, prompt: list[int], theirs: list[int], ours: list[int], k: int) -> tuple[float, float]:
    """Where the greedy tokens first part (step ``k``): how far transformers float32's logit of its
    token leads its logit of ours, and the float32 tolerance there (a lead within it is a tie)."""
    row = hf_logits(hf32, list(prompt) + theirs[:k])[-1]
    lead = float(row[theirs[k]] - row[ours[k]])
    return lead, FLOAT32_ATOL + FLOAT32_RTOL * abs(float(row[theirs[k]]))


def _top1(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())
