"""The checks behind user-named paths, driven in-process where the order of events is the
test's to choose: ``pie_core.safepath`` in both its forms, a folder swapped for a link after a
save was asked and before it ran, a load asked before the save it must see ran, users whose
names share a prefix, and the scratch-size walk (issue 36, items 1 and 7)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np
import pytest
from peft_folders import write_random_peft
from safetensors.numpy import load_file

from inferlet import Adapter, Model, runtime
from pie_core import safepath
from pie_core.engine.engine import Engine
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import run_main
from pie_core.server.quotas import _tree_bytes

WEIGHTS = "adapter_model.safetensors"


def _run_as(engine: Engine, user: str, root: Path, main: Callable[[dict], Awaitable[Any]]) -> Any:
    """Run ``main`` in-process as ``user`` with scratch folders under ``root`` (as ``pie serve``)."""
    events: list[Any] = []
    inst = HostInstance(engine=engine, emit=events.append, username=user, scratch_root=root)
    final = asyncio.run(run_main(engine, main, {}, events.append, instance=inst))
    assert final.kind == "return", final.value
    assert engine.pools_whole() and engine.adapters.bytes_held() == {}
    return final.value


async def _outcome(call: Any) -> str:
    """``"ok"`` or the error of ``await call()`` (or of ``await call``), raised at the call or the await."""
    try:
        await (call() if callable(call) else call)
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(params=[True, False], ids=["openat2", "walk"])
def opening(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Each test below runs with ``openat2`` and with the ``O_NOFOLLOW`` walk."""
    if request.param and not safepath._openat2_available():
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(safepath, "_openat2_usable", request.param)
    return request.param


def test_a_folder_swapped_for_a_link_after_the_save_was_asked_is_not_followed(security_engine, tmp_path, opening):
    write_random_peft(tmp_path / "alice" / "secret", security_engine, rank=4, seed=1)
    before = _files(tmp_path / "alice")

    async def main(_: dict) -> list[str]:
        here = Path(runtime.scratch_dir())
        a = Adapter.create(Model.load(runtime.models()[0]), "a")
        (here / "race").mkdir()
        pending = a.save("race")  # queued: it runs when this coroutine next waits
        (here / "race").rename(here / "race-moved")
        os.symlink("../alice/secret", here / "race")
        first = await _outcome(pending)
        os.unlink(here / "race")
        os.symlink("../alice", here / "race")  # a link as a folder on the way
        return [first, await _outcome(a.save("race/secret"))]

    out = _run_as(security_engine, "mallory", tmp_path, main)
    assert all(o.startswith("InvalidInput") and "not a PEFT adapter folder" in o for o in out), out
    assert _files(tmp_path / "alice") == before
    assert not any((tmp_path / "mallory" / "race-moved").iterdir())  # the save ran after the swap


def test_a_load_asked_before_the_save_of_its_folder_ran_loads_what_the_save_writes(security_engine, tmp_path, opening):
    write_random_peft(tmp_path / "mallory" / "base", security_engine, rank=4, seed=3)

    async def main(_: dict) -> list[str]:
        model = Model.load(runtime.models()[0])
        stale = Adapter.create(model, "stale")
        await stale.save("x")  # rank 8 zeros: what a load that read too early would find
        a, b = Adapter.create(model, "a"), Adapter.create(model, "b")
        await a.load("base")
        a.save("x")
        b.load("x")  # asked before the save above ran: this coroutine has not waited since
        return [await _outcome(b.save("y")), await _outcome(a.save("x"))]

    assert _run_as(security_engine, "mallory", tmp_path, main) == ["ok", "ok"]
    base, copied = load_file(tmp_path / "mallory" / "base" / WEIGHTS), load_file(tmp_path / "mallory" / "y" / WEIGHTS)
    assert base.keys() == copied.keys() and all(np.array_equal(base[k], copied[k]) for k in base)


def test_a_save_writes_the_shape_its_adapter_had_when_it_was_asked(security_engine, tmp_path):
    write_random_peft(tmp_path / "mallory" / "base", security_engine, rank=4, seed=3)

    async def main(_: dict) -> list[str]:
        model = Model.load(runtime.models()[0])
        a, b = Adapter.create(model, "a"), Adapter.create(model, "b")  # rank 8
        a.save("before")  # runs after the load below changed the adapter's shape to rank 4
        return [await _outcome(a.load("base")), await _outcome(lambda: b.load("before"))]

    assert _run_as(security_engine, "mallory", tmp_path, main) == ["ok", "ok"]
    assert '"r": 8' in (tmp_path / "mallory" / "before" / "adapter_config.json").read_text()


def test_a_user_whose_name_prefixes_another_users_reaches_nothing_of_theirs(security_engine, tmp_path, opening):
    write_random_peft(tmp_path / "alice" / "secret", security_engine, rank=4, seed=1)
    before = _files(tmp_path / "alice")

    async def main(_: dict) -> dict[str, str]:
        here = Path(runtime.scratch_dir())
        a = Adapter.create(Model.load(runtime.models()[0]), "a")
        os.symlink("../alice/secret", here / "ice")
        os.symlink("../alice", here / "icefolder")
        out = {"scratch": str(here)}
        for path in ("../alice/secret", "ice", "icefolder/secret", "./../alice/secret"):
            out[f"load {path}"] = await _outcome(lambda: a.load(path))
        for path in ("../alice/new", "ice", "icefolder/new"):
            out[f"save {path}"] = await _outcome(lambda: a.save(path))
        try:
            out["scratch_path"] = runtime.scratch_path("icefolder/new/file")
        except Exception as exc:  # noqa: BLE001
            out["scratch_path"] = f"{type(exc).__name__}: {exc}"
        return out

    out = _run_as(security_engine, "al", tmp_path, main)
    assert out.pop("scratch") == str(tmp_path.resolve() / "al")
    assert all(v.startswith("InvalidInput") for v in out.values()), out
    assert _files(tmp_path / "alice") == before and sorted(p.name for p in tmp_path.iterdir()) == ["al", "alice"]


def test_opening_beneath_a_root_refuses_links_files_and_dotdot_at_every_step(tmp_path, opening):
    (tmp_path / "root" / "a" / "b").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "secret").write_text("theirs")
    (tmp_path / "root" / "a" / "file").write_text("mine")
    os.symlink("../../other", tmp_path / "root" / "a" / "up")
    os.symlink(tmp_path / "other", tmp_path / "root" / "abs")
    os.symlink("../../other/secret", tmp_path / "root" / "a" / "secret")
    os.link(tmp_path / "other" / "secret", tmp_path / "root" / "a" / "hard")
    os.mkfifo(tmp_path / "root" / "a" / "fifo")
    os.symlink("a", tmp_path / "root" / "alias")  # a link that stays inside the root is refused too
    os.symlink("file", tmp_path / "root" / "a" / "alias")
    root = safepath.open_root(tmp_path / "root")
    try:
        for parts in (("a", "up"), ("abs",), ("a", "up", "x"), ("a", "file"), ("a", ".."), ("a", "missing"),
                      ("alias",), ("alias", "b")):
            with pytest.raises(OSError):
                os.close(safepath.open_dir(root, parts))
        for parts in (("a", "up", "new"), ("abs", "new"), ("a", "file", "new")):
            with pytest.raises(OSError):
                os.close(safepath.open_dir(root, parts, create=True))
        folder = safepath.open_dir(root, ("a",))
        try:
            assert safepath.read_file(folder, "file", 100) == b"mine"
            for name in ("secret", "alias", "hard", "fifo", "b", "missing"):
                with pytest.raises(OSError):
                    safepath.read_file(folder, name, 100)
            with pytest.raises(OSError) as big:
                safepath.read_file(folder, "file", 3)
            assert big.value.errno == errno.EFBIG
            safepath.write_file(folder, "secret", b"written")  # replaces the link, not its target
            assert (tmp_path / "other" / "secret").read_text() == "theirs"
            assert (tmp_path / "root" / "a" / "secret").read_text() == "written"
        finally:
            os.close(folder)
        made = safepath.open_dir(root, ("new", "deeper"), create=True)
        os.close(made)
        assert (tmp_path / "root" / "new" / "deeper").is_dir()
    finally:
        os.close(root)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["secret"]


def test_a_user_named_path_is_split_without_leaving_its_root():
    assert safepath.parts_of("a//./b/", "scratch directory") == ("a", "b")
    for bad in ("", "/etc/passwd", "a/../../b", "..", "a\x00b", "/".join(["d"] * 33), "x" * 256):
        with pytest.raises(Exception) as refused:
            safepath.parts_of(bad, "scratch directory")
        assert type(refused.value).__name__ == "InvalidInput"


def test_the_scratch_size_walk_counts_no_byte_behind_a_link(tmp_path, opening):
    (tmp_path / "mallory" / "sub").mkdir(parents=True)
    (tmp_path / "mallory" / "sub" / "own").write_bytes(b"x" * 4096)
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "big").write_bytes(b"y" * (1 << 20))
    os.symlink("../alice", tmp_path / "mallory" / "peek")
    os.symlink("../../alice", tmp_path / "mallory" / "sub" / "peek")
    assert _tree_bytes(tmp_path / "mallory") < 1 << 16 <= _tree_bytes(tmp_path / "alice")
