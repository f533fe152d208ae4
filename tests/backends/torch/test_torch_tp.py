"""Tensor parallel in the torch backend (``tp=2`` on gloo, CPU): the same logits as one rank, the
conformance suite, clean errors for a bad ``tp`` and a rank that dies or hangs, and no process
left behind."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from backend_testkit import kv_request, probe_logits, random_weights, run, tiny_spec
from pie_backend_torch import TorchBackend
from pie_core.hookspec import BackendOptions, CopyKind
from pie_core.models.spec import ModelSpec, RopeConfig
from pie_backend_torch.tp_shard import Shard, local_spec
from torch_testkit import load_torch

TP_CLOSE = dict(rtol=1e-5, atol=1e-5)
"""float32 partial sums added in another order: equal to rounding (|logits| reach ~40 here)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); only a reaped process is gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _session(backend: TorchBackend) -> list[np.ndarray]:
    """Prefill two requests, decode three steps, fork one request's pages, offload and restore
    them, and decode on the copies: every row's logits."""
    first = kv_request([1, 5, 9, 13, 2, 7], [0, 1], 4)
    second = kv_request([11, 3, 8], [3], 4)
    out = probe_logits(run(backend, [first, second]), [first, second])
    for step in range(3):
        a = kv_request([3 + step], [0, 1, 2], 4, start=6 + step)
        b = kv_request([20 + step], [3, 4], 4, start=3 + step)
        out += probe_logits(run(backend, [a, b]), [a, b])
    backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([0, 1, 2], np.int32), np.array([5, 6, 7], np.int32))
    backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_HOST, np.array([3, 4], np.int32), np.array([0, 1], np.int32))
    backend.pie_backend_copy_pages(CopyKind.HOST_TO_DEVICE, np.array([0, 1], np.int32), np.array([8, 9], np.int32))
    fork = kv_request([4, 6], [5, 6, 7], 4, start=9)
    restored = kv_request([30], [8, 9], 4, start=6)
    out += probe_logits(run(backend, [fork, restored]), [fork, restored])
    return out


@pytest.mark.parametrize("arch, tp", [("qwen2", 2), ("gemma3", 2), ("gemma3", 4), ("qwen3", 2)])
def test_the_ranks_slices_put_back_together_are_the_weights(arch, tp):
    spec = tiny_spec(arch)
    shards = [Shard(spec, r, tp) for r in range(tp)]
    kv_owner = [s.kv_heads for s in shards]
    group = spec.num_heads // spec.num_kv_heads
    for s in shards:  # every query head's KV head is on its rank
        assert all(h // group in s.kv_heads for h in s.q_heads)
    assert local_spec(spec, tp).num_kv_heads == len(kv_owner[0])
    for name, w in random_weights(spec):
        parts = [s.take(name, w) for s in shards]
        kind = name.rsplit(".", 2)[-2] if name.startswith("blk.") else ""
        if kind in ("attn_q", "ffn_gate", "ffn_up"):
            np.testing.assert_array_equal(np.concatenate(parts), w)
        elif kind in ("attn_output", "ffn_down"):
            np.testing.assert_array_equal(np.concatenate(parts, axis=1), w)
        elif kind in ("attn_k", "attn_v"):  # each KV head once, or shared by tp / kv_heads ranks
            heads = sorted({h for r in kv_owner for h in r})
            assert heads == list(range(spec.num_kv_heads))
            for s, part in zip(shards, parts):
                rows = slice(s.kv_heads.start * spec.head_dim, s.kv_heads.stop * spec.head_dim)
                np.testing.assert_array_equal(part, w[rows])
        else:
            assert all(p is w for p in parts)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_tp2_logits_equal_one_rank_through_prefill_decode_and_page_copies(arch):
    # qwen2: 6 heads, 2 KV heads (one per rank); gemma3: 1 KV head, shared by both ranks
    spec = tiny_spec(arch)
    one = load_torch(spec, random_weights(spec))
    two = load_torch(spec, random_weights(spec), tp=2)
    try:
        expected, got = _session(one), _session(two)
    finally:
        two.close()
    rows, rows_tp = np.concatenate(expected), np.concatenate(got)
    assert rows.shape == rows_tp.shape == (9 + 6 + 3, spec.vocab_size)  # every input row probed
    np.testing.assert_allclose(rows_tp, rows, **TP_CLOSE)


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_tp2_block_quantised_layers_equal_one_rank(quant):
    # each rank's attention-out and MLP-down inputs (32 and 64 wide) are whole blocks of 32
    spec = ModelSpec(arch="qwen2", vocab_size=97, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, intermediate_size=128, qkv_bias=True, tie_embeddings=True, rope=RopeConfig(theta=1e4))
    runs = []
    for extra in ({"quant": quant}, {"quant": quant, "tp": 2}):
        backend = load_torch(spec, random_weights(spec), **extra)
        try:
            prompt = kv_request([1, 5, 9, 13, 2, 7], [0, 1], 4)
            rows = probe_logits(run(backend, [prompt]), [prompt])
            for step in range(3):
                r = kv_request([3 + step], [0, 1, 2], 4, start=6 + step)
                rows += probe_logits(run(backend, [r]), [r])
        finally:
            backend.close()
        runs.append(np.concatenate(rows))
    np.testing.assert_allclose(runs[1], runs[0], **TP_CLOSE)


def test_tp2_runs_the_conformance_suite():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-m", "pie_core.cli.main", "conformance", "--backend", "torch", "--dtype", "float32",
         "--backend-option", "tp=2"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " failed" not in done.stdout.splitlines()[-1], done.stdout[-2000:]


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"tp": 4}, "tp=4 does not divide the model's 6 attention heads"),
        ({"tp": 3}, "tp=3 neither divides the model's 2 KV heads"),
        ({"tp": 0}, "extra['tp'] must be an integer >= 1, got 0"),
        ({"tp": "two"}, "extra['tp'] must be an integer >= 1, got 'two'"),
        ({"tp": 2, "cuda_graphs": True}, "tp=2 does not capture CUDA graphs"),
        ({"tp": 2, "tp_timeout": 0}, "extra['tp_timeout'] must be > 0 seconds"),
    ],
)
def test_a_tp_that_cannot_split_the_model_is_refused_before_any_process_starts(extra, message):
    spec = tiny_spec("qwen2")
    before = set(_children())
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        TorchBackend().pie_backend_load_model(spec, random_weights(spec), BackendOptions(page_size=4, kv_pages=8, extra=extra))
    assert set(_children()) == before


def _children() -> list[int]:
    """Live child processes of this one (from /proc: no procps needed)."""
    me, kids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                kids.append(int(entry))
    return kids


def test_a_rank_that_dies_fails_the_next_forward_in_one_line_and_every_call_after():
    spec = tiny_spec("qwen2")
    backend = load_torch(spec, random_weights(spec), tp=2)
    (pid,) = backend._tp.pids
    request = kv_request([1, 2, 3], [0], 4)
    run(backend, [request])
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        run(backend, [kv_request([4], [0], 4, start=3)])
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "\n" not in message and f"rank 1 (pid {pid}) exited with code -9" in message and "load the model again" in message
    with pytest.raises(RuntimeError, match="rank 1"):
        backend.pie_backend_copy_pages(CopyKind.DEVICE_TO_DEVICE, np.array([0], np.int32), np.array([1], np.int32))
    backend.close()
    assert not _alive(pid)


def test_a_rank_that_hangs_times_out_instead_of_hanging():
    spec = tiny_spec("qwen2")
    backend = load_torch(spec, random_weights(spec), tp=2, tp_timeout=2)
    (pid,) = backend._tp.pids
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError) as err:
            run(backend, [kv_request([1, 2, 3], [0], 4)])
        assert time.monotonic() - start < 10
        assert "\n" not in str(err.value) and "did not answer in time (tp_timeout 2 s a step" in str(err.value)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    backend.close()


def test_close_stops_the_workers_and_a_second_load_replaces_them():
    spec = tiny_spec("qwen2")
    backend = load_torch(spec, random_weights(spec), tp=2)
    first = backend._tp.pids
    backend.pie_backend_load_model(spec, random_weights(spec), BackendOptions(page_size=4, kv_pages=8, extra={"tp": 2}))
    assert not any(_alive(p) for p in first)
    second = backend._tp.pids
    backend.close()
    assert not any(_alive(p) for p in second)
    with pytest.raises(RuntimeError, match="no model loaded"):
        run(backend, [kv_request([1], [0], 4)])


def test_workers_stop_when_the_backend_is_garbage_collected():
    spec = tiny_spec("qwen2")
    backend = load_torch(spec, random_weights(spec), tp=2)
    pids = backend._tp.pids
    del backend
    gc.collect()
    assert not any(_alive(p) for p in pids)


def test_workers_stop_when_rank_zero_exits_without_closing():
    code = (
        "import sys; sys.path[:0] = %r\n"
        "from torch_testkit import load_torch\n"
        "from backend_testkit import random_weights, tiny_spec\n"
        "spec = tiny_spec('qwen2')\n"
        "backend = load_torch(spec, random_weights(spec), tp=2)\n"
        "print(*backend._tp.pids, flush=True)\n" % (sys.path,)
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 1
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_a_rank_that_dies_inside_a_forward_fails_that_forward_naming_it():
    spec = tiny_spec("qwen2")
    backend = load_torch(spec, random_weights(spec), tp=2)
    group = backend._tp
    (pid,) = group.pids
    broadcast = group.command

    def then_die(*message):  # the batch reaches the worker, which is killed before the all-reduces
        broadcast(*message)
        os.kill(pid, signal.SIGKILL)

    group.command = then_die
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        run(backend, [kv_request([1, 2, 3], [0], 4)])
    assert time.monotonic() - start < 10
    assert "\n" not in str(err.value) and f"rank 1 (pid {pid}) exited with code -9" in str(err.value)
    backend.close()


def test_the_tp_step_benchmark_times_decode_steps_and_stops_its_ranks():
    from benchmarks.tp_step import bench_spec, step_times

    before = set(_children())
    times = step_times(bench_spec(layers=1, hidden=64, heads=4, kv_heads=2, inter=64), 2, batch=2, prompt=8, steps=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert set(_children()) == before
