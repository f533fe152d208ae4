"""Saves and loads of one adapter folder apply in the order the inferlet issued them, awaited
or not (issue 36, item 7): ``a.save(p); b.load(p)`` loads what ``a`` saved."""

from __future__ import annotations

import numpy as np
from adapter_steps import isolation, run_steps, slow_backend  # noqa: F401 - fixtures
from hostile import Served
from peft_folders import write_random_peft
from safetensors.numpy import load_file


def test_a_load_issued_after_an_unawaited_save_of_the_folder_loads_what_the_save_writes(hostile, isolation, tmp_path,
                                                                                       slow_backend):
    async def scenario(s: Served) -> None:
        scratch = s.data_dir / "scratch" / "mallory"
        write_random_peft(scratch / "base", s.server.engine, rank=4, seed=7)
        out = await run_steps(s, "mallory", tmp_path / "m", [
            {"do": "save", "path": "order/x", "adapter": "stale"},  # rank 8 zeros: what a load read too early finds
            {"do": "load", "path": "base", "adapter": "a"},
            {"do": "busy"},  # the save below waits behind a pass: the load comes while it is pending
            {"do": "save", "path": "order/x", "adapter": "a", "await": False},
            {"do": "load", "path": "order/x", "adapter": "b", "await": False},
            {"do": "save", "path": "order/y", "adapter": "b", "await": False},
            {"do": "await", "adapter": "b"},
            {"do": "await", "adapter": "a"},
            {"do": "load", "path": "order/y", "adapter": "c"},  # a plain load of the chain's last save
        ])
        assert s.server.engine.adapters.bytes_held() == {}
        assert out == ["ok"] * 5, out
        base = load_file(scratch / "base" / "adapter_model.safetensors")
        copied = load_file(scratch / "order" / "y" / "adapter_model.safetensors")
        assert base.keys() == copied.keys() and all(np.array_equal(base[k], copied[k]) for k in base)
        assert '"r": 4' in (scratch / "order" / "y" / "adapter_config.json").read_text()

    hostile(scenario, launcher=isolation)


def test_a_load_chained_after_a_save_that_failed_fails_too(hostile, isolation, tmp_path):
    out = hostile(lambda s: run_steps(s, "mallory", tmp_path / "m", [
        {"do": "write", "at": "blocked", "text": "a file where the folder would go"},
        {"do": "save", "path": "blocked", "adapter": "a", "await": False},
        {"do": "load", "path": "blocked", "adapter": "b", "await": False},
        {"do": "await", "adapter": "a"},
        {"do": "await", "adapter": "b"},
        {"do": "save", "path": "fine", "adapter": "b"},  # each failure is reported once
    ]), launcher=isolation)
    # b's load fails at the call when a's save ran before it came, else at its await
    out = [o for o in out if o != "nothing pending"]
    assert [o.split(":")[0] for o in out] == ["InvalidInput", "InvalidInput", "ok"], out
    assert all("not a PEFT adapter folder" in o for o in out[:2]), out
