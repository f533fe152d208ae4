"""LoRA adapters and zo on the real default model, through the SDK, against transformers + PEFT.

The PEFT adapter is made here with the ``peft`` package on transformers' model of the same
GGUF, saved in PEFT's layout, and loaded by an inferlet with ``Adapter.load``; the other way, an
adapter saved by Pie loads into ``PeftModel.from_pretrained``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from inferlet import Adapter, Context, Logits, Model, runtime, zo

pytestmark = pytest.mark.model

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")

PROMPT = "def fibonacci(n):\n    "
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def peft_folder(hf_model, tmp_path_factory):
    """A random rank-4 PEFT adapter over every projection, and transformers+PEFT logits on a prompt."""
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False)
    torch.manual_seed(0)  # PEFT draws A from the global generator: the same adapter in every test order
    wrapped = peft.get_peft_model(hf_model, config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero or tiny; make the delta visible
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    folder = tmp_path_factory.mktemp("peft") / "adapter"
    wrapped.save_pretrained(folder)
    wrapped.eval()
    yield folder, wrapped
    wrapped.unload()  # gives the session's transformers model its plain layers back


async def _logits(ctx: Context, ids: list[int], adapter: Adapter | None = None, zo_seed: int = 0) -> np.ndarray:
    fwd = ctx.forward()
    fwd.input(ids)
    if adapter is not None:
        fwd.adapter(adapter)
    if zo_seed:
        fwd.zo_seed(zo_seed)
    handles = [fwd.probe(i, Logits()) for i in range(len(ids))]
    out = await fwd.execute()
    return np.stack([np.frombuffer(out.logits(h), dtype=np.float32) for h in handles])


def _close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    ref = ref[:, : ours.shape[1]]
    err = np.abs(ours - ref).max(axis=1)
    scale = np.abs(ref).max(axis=1)
    assert np.all(err <= 1e-3 * scale), f"{what}: max|Δ|={err.max():.3g} against max|logit|={scale.max():.3g}"


def test_a_peft_adapter_equals_transformers_with_peft(pie, peft_folder):
    folder, wrapped = peft_folder

    async def main(_):
        model = Model.load(runtime.models()[0])
        ids = model.tokenizer().encode(PROMPT)
        with Adapter.create(model, "from-peft") as adapter:
            await adapter.load(str(folder))
            with Context(model) as a, Context(model) as b:
                return ids, (await _logits(a, ids, adapter)).tolist(), (await _logits(b, ids)).tolist()

    ids, adapted, plain = pie.value(main)
    with_peft = _hf_logits(wrapped, ids)
    _close(np.asarray(adapted, np.float32), with_peft, "Pie with the PEFT adapter vs transformers+PEFT")
    with wrapped.disable_adapter():
        without = _hf_logits(wrapped, ids)
    _close(np.asarray(plain, np.float32), without, "Pie without the adapter vs transformers")
    assert np.abs(with_peft - without).max() > 0.05, "the PEFT adapter barely changes the logits: a weak test"


def test_an_adapter_saved_by_pie_loads_into_peft(pie, peft_folder, tmp_path):
    folder, wrapped = peft_folder
    out = tmp_path / "trained"

    async def main(_):
        model = Model.load(runtime.models()[0])
        ids = model.tokenizer().encode(PROMPT)
        adapter = Adapter.create(model, "trained")
        zo.initialize(adapter, rank=2, alpha=4.0, population_size=2, mu_fraction=0.5, initial_sigma=0.05)
        zo.update(adapter, [1.0, 0.0], [7, 8], max_sigma=0.1)  # the mean moves: B is no longer 0
        await adapter.save(str(out))
        with Context(model) as ctx:
            return ids, (await _logits(ctx, ids, adapter)).tolist()

    ids, ours = pie.value(main)
    wrapped.load_adapter(str(out), adapter_name="pie")
    try:
        wrapped.set_adapter("pie")
        theirs = _hf_logits(wrapped, ids)
    finally:
        wrapped.set_adapter("default")
        wrapped.delete_adapter("pie")
    _close(np.asarray(ours, np.float32), theirs, "PEFT with Pie's saved adapter vs Pie")


def test_zo_seeds_perturb_reproducibly_and_a_fresh_zo_adapter_changes_nothing(pie):
    async def main(_):
        model = Model.load(runtime.models()[0])
        ids = model.tokenizer().encode(PROMPT)
        adapter = Adapter.create(model, "es")
        zo.initialize(adapter, rank=4, alpha=8.0, population_size=4, mu_fraction=0.5, initial_sigma=0.02)
        out = []
        for seed, use in ((0, False), (0, True), (5, True), (5, True), (6, True)):
            with Context(model) as ctx:
                out.append((await _logits(ctx, ids, adapter if use else None, seed)).tolist())
        return out

    plain, mean, s5, s5_again, s6 = (np.asarray(x, np.float32) for x in pie.value(main))
    np.testing.assert_allclose(mean, plain, rtol=0, atol=1e-5 * np.abs(plain).max())
    np.testing.assert_array_equal(s5, s5_again)
    assert np.abs(s5 - plain).max() > 1e-3, "zo seed 5 left the logits as they were"
    assert np.abs(s5 - s6).max() > 1e-3, "zo seeds 5 and 6 gave the same logits"


def test_save_load_round_trips_and_a_fork_is_independent(pie, peft_folder, tmp_path):
    folder, _ = peft_folder
    saved = tmp_path / "copy"

    async def main(_):
        model = Model.load(runtime.models()[0])
        ids = model.tokenizer().encode(PROMPT)
        original = Adapter.create(model, "orig")
        await original.load(str(folder))
        fork = original.fork("fork")
        await original.save(str(saved))
        copy = Adapter.create(model, "copy")
        await copy.load(str(saved))
        zo.initialize(fork, rank=2, alpha=2.0, population_size=2, mu_fraction=0.5, initial_sigma=0.1)
        zo.update(fork, [0.0, 1.0], [3, 4], max_sigma=0.2)
        results = []
        for adapter in (original, copy, fork):
            with Context(model) as ctx:
                results.append((await _logits(ctx, ids, adapter)).tolist())
        return results

    original, copy, fork = (np.asarray(x, np.float32) for x in pie.value(main))
    np.testing.assert_array_equal(copy, original)
    assert np.abs(fork - original).max() > 1e-2, "changing the fork changed nothing, or changed the original too"


def test_a_batch_of_four_adapters_and_plain_requests_equals_each_alone(pie, cpu_engine):
    seeds = [None, 1, 2, None, 3, 4]

    def make(seed: int | None, barrier: asyncio.Barrier | None):
        async def main(_):
            model = Model.load(runtime.models()[0])
            ids = model.tokenizer().encode(PROMPT)
            adapter = None
            if seed is not None:
                adapter = Adapter.create(model, f"mix-{seed}-{barrier is not None}")
                zo.initialize(adapter, rank=2 + seed, alpha=4.0, population_size=2, mu_fraction=0.5, initial_sigma=0.1)
                zo.update(adapter, [0.0, 1.0], [seed * 10, seed * 10 + 1], max_sigma=0.2)
            with Context(model) as ctx:
                if barrier is not None:
                    await barrier.wait()  # everyone's pass goes into one batch
                return (await _logits(ctx, ids, adapter)).tolist()

        return main

    alone = [pie.value(make(s, None)) for s in seeds]
    sizes = cpu_engine.models[pie.model].batcher.stats.sizes
    before = sizes[len(seeds)]

    async def together():
        barrier = asyncio.Barrier(len(seeds))
        return await asyncio.gather(*(pie.run_async(make(s, barrier)) for s in seeds))

    results = asyncio.run(together())
    assert sizes[len(seeds)] > before, "the six passes did not run as one batch"
    for seed, one, (final, _) in zip(seeds, alone, results):
        assert final.kind == "return", final.value
        np.testing.assert_allclose(np.asarray(final.value, np.float32), np.asarray(one, np.float32),
                                   rtol=0, atol=1e-4 * np.abs(np.asarray(one)).max(), err_msg=f"adapter seed {seed}")
