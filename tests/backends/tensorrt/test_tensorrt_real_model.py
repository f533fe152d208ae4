"""The tensorrt backend's graph on the real default model, run by ONNX Runtime's CPU provider:
greedy tokens equal transformers' on the same weights, and asking for TensorRT on a machine
without it is a one-line error naming what to install."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from inferlet import Context, Model, Sampler, runtime
from pie_core.engine.engine import Engine
from pie_core.hookspec import BackendOptions
from pie_core.runtime.instance import run_main

pytestmark = pytest.mark.model

SYSTEM = "You are a concise assistant that answers questions about programming."
USER = "Write a Python function that checks whether a number is prime."


@pytest.fixture(scope="module")
def ort_engine():
    engine = Engine("tensorrt", options=BackendOptions(dtype="float32", extra={"provider": "cpu"}))
    engine.load(None)
    yield engine
    asyncio.run(engine.close())


async def _greedy(_) -> tuple[list[int], list[int]]:
    model = Model.load(runtime.models()[0])
    with Context(model) as prompt:
        prompt.system(SYSTEM).user(USER).cue()
        ids = prompt.buffer()
    with Context(model) as ctx:
        ctx.append(ids)
        g = ctx.generate(Sampler.argmax(), max_tokens=48, stop=[], auto_flush=False)
        return ids, await g.collect_tokens()


def test_greedy_48_tokens_equal_transformers_generate(ort_engine, hf_model):
    import torch

    final = asyncio.run(run_main(ort_engine, _greedy, {}, lambda event: None))
    assert final.kind == "return", final.value
    assert ort_engine.pools_whole(), "a test left KV pages allocated"
    ids, ours = final.value
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                do_sample=False, max_new_tokens=48, eos_token_id=None, pad_token_id=0)
    ref = out[0, len(ids):].tolist()
    assert len(ours) == len(ref) == 48
    first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    assert ours == ref, f"greedy tokens diverge at step {first}: ours {ours[first:first + 5]}, transformers {ref[first:first + 5]}"


def _pie(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pie_core.cli.main", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=900)


def test_tensorrt_without_tensorrt_is_a_one_line_error():
    import onnxruntime

    if "TensorrtExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has TensorRT")
    proc = _pie("run", "text-completion", "--backend", "tensorrt", "--", "--max-tokens", "4")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], lines  # after the loading phases, one line
    err = errors[0]
    assert "pip install 'pie-backend-tensorrt[gpu]'" in err and "--backend-option provider=cpu" in err, err


def test_pie_run_on_the_cpu_provider_completes_text():
    proc = _pie("run", "text-completion", "--backend", "tensorrt", "--backend-option", "provider=cpu",
                "--", "--prompt", "Say hello.", "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith('{"tokens": 4}'), proc.stdout
