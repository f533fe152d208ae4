"""Accuracy of every path on the default GGUF against transformers float32 (issue 35).

For each path: perplexity of a fixed passage (``tests/data/accuracy_passage.txt``, ~240 tokens)
fed in passes of 8 tokens (as decode steps and small chunks see the model) and in one pass (as a
prefill does), relative to transformers float32 on the GGUF's dequantised weights; and greedy
agreement with transformers on the three prompts of ``tests/backends/accuracy_kit.py`` (tokens
equal before the first difference, of ``--tokens``).

    python benchmarks/accuracy.py                              # transformers, llama.cpp, cpu, torch formats
    python benchmarks/accuracy.py --only fit,q4                # some of them
    python benchmarks/accuracy.py "mine:quant=q8,quant_max_tokens=0,dtype=float32"   # NAME:KEY=VALUE,...

Paths: ``transformers`` (float32), ``llama.cpp`` (on the same GGUF with its own kernels:
``llama-cpp-python`` when importable, else node-llama-cpp's prebuilt llama.cpp through
``benchmarks/llamacpp_node.py``, which needs node and npm; the row says which), ``cpu`` (the
NumPy backend, float32) and torch backend option sets (``pie_backend_torch.options``; ``dtype``
defaults to ``auto``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backends"))

from accuracy_kit import (  # noqa: E402
    PROMPTS,
    backend_greedy,
    backend_logits,
    hf_greedy,
    logprob_perplexity,
    passage_ids,
    perplexity,
    prompt_ids,
)
from pie_core.hookspec import BackendOptions  # noqa: E402
from pie_core.models.registry import resolve_model  # noqa: E402

TORCH_FORMATS = [
    "fit (default):",
    "q4 + w8a8 (old default):quant=q4,quant_large=w8a8",
    "q8:quant=q8,quant_max_tokens=0,dtype=float32",
    "w8a8:quant=w8a8,quant_max_tokens=0,dtype=float32",
    "int4:quant=int4,quant_max_tokens=0,dtype=bfloat16",
    "int8:quant=int8,quant_max_tokens=0,dtype=bfloat16",
    "bf16:quant=none,dtype=bfloat16",
    "f32:quant=none,dtype=float32",
]


def _parse(arg: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = arg.rpartition(":") if ":" in arg else (arg, "", "")
    extra: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        extra[key] = int(value) if value.isdigit() else value
    return name, extra


class Path_:
    """Perplexity of a token list fed in passes of ``size`` tokens, and greedy continuations; ``label``
    names what ran when the path's name does not say; ``close`` frees what it holds (a child process)."""

    def __init__(
        self,
        perplexity: Callable[[np.ndarray, int], float],
        greedy: Callable[[list[int], int], list[int]],
        label: str = "",
        close: Callable[[], None] = lambda: None,
    ):
        self.perplexity, self.greedy, self.label, self.close = perplexity, greedy, label, close


def _of_logits(logits: Callable[[np.ndarray, int], np.ndarray]) -> Callable[[np.ndarray, int], float]:
    return lambda ids, size: perplexity(logits(ids, size), ids)


def _backend_path(backend: Any) -> Path_:
    return Path_(_of_logits(lambda ids, size: backend_logits(backend, ids, size)), lambda ids, n: backend_greedy(backend, ids, n))


def _torch(source: Any, extra: dict[str, Any]) -> Path_:
    from pie_backend_torch import TorchBackend

    extra = dict(extra)
    dtype = str(extra.pop("dtype", "auto"))
    backend = TorchBackend()
    options = BackendOptions(page_size=16, kv_pages=64, host_pages=4, dtype=dtype, extra=extra, weights_key=source.cache_key)
    backend.pie_backend_load_model(source.spec, source.weights(), options)
    return _backend_path(backend)


def _cpu(source: Any) -> Path_:
    from pie_backend_cpu import CpuBackend

    backend = CpuBackend()
    backend.pie_backend_load_model(source.spec, source.weights(), BackendOptions(page_size=16, kv_pages=64, host_pages=4))
    return _backend_path(backend)


def _transformers(source: Any) -> Path_:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        source.path.parent, gguf_file=source.path.name, dtype=torch.float32
    ).eval()

    def logits(ids: np.ndarray, size: int) -> np.ndarray:
        rows, past = [], None
        with torch.no_grad():
            for a in range(0, len(ids), size):
                out = model(torch.tensor([ids[a : a + size].tolist()]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                rows.append(out.logits[0].float().numpy())
        return np.concatenate(rows)

    return Path_(_of_logits(logits), lambda ids, n: hf_greedy(model, ids, n))


def _llama_cpp(source: Any) -> Path_ | None:
    try:
        import llama_cpp
    except ImportError:
        return _node_llama_cpp(source)
    models: dict[int, Any] = {}

    def model(batch: int) -> Any:
        if batch not in models:
            models[batch] = llama_cpp.Llama(
                str(source.path), n_ctx=512, n_batch=batch, n_ubatch=batch, logits_all=True, verbose=False, n_threads=2
            )
        return models[batch]

    def logits(ids: np.ndarray, size: int) -> np.ndarray:
        m = model(min(size, 512))
        m.reset()
        m.eval(ids.tolist())
        return np.array(m.scores[: len(ids)], dtype=np.float32)

    def greedy(ids: list[int], n: int) -> list[int]:
        m = model(512)
        m.reset()
        out: list[int] = []
        for token in m.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(int(token))
            if len(out) == n:
                break
        return out

    return Path_(_of_logits(logits), greedy, "llama-cpp-python, 2 threads")


def _node_llama_cpp(source: Any) -> Path_ | None:
    from llamacpp_node import NodeLlamaCpp, NodeLlamaCppUnavailable

    try:
        llm = NodeLlamaCpp(source.path)
    except NodeLlamaCppUnavailable as exc:
        print(f"llama.cpp: {exc}", file=sys.stderr)
        return None
    return Path_(lambda ids, size: logprob_perplexity(llm.logprobs(ids, size)), llm.greedy, llm.label, llm.close)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("formats", nargs="*", help="torch option sets NAME:KEY=VALUE,... (default: all of TORCH_FORMATS)")
    parser.add_argument("--only", default="", help="comma-separated names to run (transformers is always run)")
    parser.add_argument("--tokens", type=int, default=20, help="greedy tokens per prompt")
    parser.add_argument("--pass-size", type=int, default=8)
    args = parser.parse_args(argv)
    only = set(filter(None, args.only.split(",")))

    source = resolve_model(None)
    ids = passage_ids(source.tokenizer)
    prompts = [prompt_ids(source, p) for p in PROMPTS]
    paths: list[tuple[str, Callable[[], Path_ | None]]] = [
        ("llama.cpp", lambda: _llama_cpp(source)),
        ("cpu", lambda: _cpu(source)),
    ]
    paths += [(name, (lambda e=extra: _torch(source, e))) for name, extra in map(_parse, args.formats or TORCH_FORMATS)]

    ref_path = _transformers(source)
    ref = {size: ref_path.perplexity(ids, size) for size in (args.pass_size, len(ids))}
    ref_greedy = [ref_path.greedy(p, args.tokens) for p in prompts]
    print(f"{len(ids)} passage tokens; transformers float32 perplexity {ref[args.pass_size]:.4f} "
          f"(passes of {args.pass_size}), {ref[len(ids)]:.4f} (one pass)\n")
    print(f"| path | perplexity, passes of {args.pass_size} | vs float32 | one pass | vs float32 | "
          f"greedy tokens equal to transformers (of {args.tokens}, 3 prompts) | time (s) |")
    print("|---|---:|---:|---:|---:|---|---:|")
    print(f"| transformers float32 | {ref[args.pass_size]:.3f} | ref | {ref[len(ids)]:.3f} | ref | "
          f"{', '.join([str(args.tokens)] * 3)} | |")
    for name, make in paths:
        if only and name.split(" ")[0] not in only:
            continue
        t0 = time.perf_counter()
        path = make()
        if path is None:
            print(f"| {name} | not installed | | | | | |")
            continue
        small = path.perplexity(ids, args.pass_size)
        whole = path.perplexity(ids, len(ids))
        agree = []
        for p, want in zip(prompts, ref_greedy):
            got = path.greedy(p, args.tokens)
            agree.append(next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), args.tokens))
        label = f"{name} ({path.label})" if path.label else name
        print(f"| {label} | {small:.3f} | {small / ref[args.pass_size] - 1:+.2%} | {whole:.3f} | "
              f"{whole / ref[len(ids)] - 1:+.2%} | {', '.join(map(str, agree))} | {time.perf_counter() - t0:.0f} |",
              flush=True)
        path.close()
        del path
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
