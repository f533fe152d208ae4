"""Links an inferlet plants in its scratch folder lead nowhere: ``Adapter.save``/``load`` open
their folder beneath the user's scratch folder without following any link (issue 36, item 1).

Mallory's inferlet runs in a worker process and in the wasm sandbox (both make relative links
such as ``../alice/x``); alice keeps an adapter in her scratch folder. Each attack of the red
team is replayed: reading alice's adapter through a link, writing through one into alice's
folder or out of every root, swapping the folder for a link while a save is pending, and telling
whether a path exists from the refusal. Afterwards nothing outside mallory's folder changed and
alice is still served within 0.5 s.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from adapter_steps import isolation, run_steps  # noqa: F401 - isolation is a fixture
from hostile import Served
from peft_folders import write_random_peft
from victim import Victim


def _tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (links not followed): a file's hash, a link's target."""
    found = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(dirpath, name)
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                found[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[rel] = "dir"
    return found


def _attack(hostile: Any, isolation: Any, tmp_path: Path, steps: list[dict[str, Any]]) -> list[str]:
    """Run mallory's ``steps`` with alice's adapter at ``alice/secret`` and a folder ``outside``
    beside the scratch folders; returns mallory's outcomes after checking that neither changed
    and that alice is still served."""

    async def scenario(s: Served) -> list[str]:
        alice = s.data_dir / "scratch" / "alice"
        write_random_peft(alice / "secret", s.server.engine, rank=4, seed=1)
        (s.data_dir / "outside").mkdir()
        before = _tree(s.data_dir / "scratch" / "alice"), _tree(s.data_dir / "outside")
        async with Victim(s, tmp_path / "a") as victim:
            out = await run_steps(s, "mallory", tmp_path / "m", steps)
            assert await victim.served_s() < 0.5
        assert (_tree(s.data_dir / "scratch" / "alice"), _tree(s.data_dir / "outside")) == before
        assert s.server.engine.adapters.bytes_held() == {}
        return out

    return hostile(scenario, launcher=isolation)


def test_a_load_through_a_planted_link_reads_nothing_of_alices(hostile, isolation, tmp_path):
    out = _attack(hostile, isolation, tmp_path, [
        {"do": "link", "target": "../alice/secret", "at": "steal"},
        {"do": "load", "path": "steal"},
        {"do": "mkdir", "at": "deep"},
        {"do": "link", "target": "../../alice", "at": "deep/hop"},
        {"do": "load", "path": "deep/hop/secret"},
        {"do": "mkdir", "at": "files"},  # a real folder whose two files are links to alice's
        {"do": "link", "target": "../../alice/secret/adapter_config.json", "at": "files/adapter_config.json"},
        {"do": "link", "target": "../../alice/secret/adapter_model.safetensors", "at": "files/adapter_model.safetensors"},
        {"do": "load", "path": "files"},
    ])
    assert all(o.startswith("InvalidInput") and "not a PEFT adapter folder" in o for o in out), out


def test_a_save_through_a_planted_link_writes_nothing_outside_the_users_folder(hostile, isolation, tmp_path):
    out = _attack(hostile, isolation, tmp_path, [
        {"do": "link", "target": "../alice/secret", "at": "plant"},
        {"do": "save", "path": "plant"},
        {"do": "link", "target": "../alice", "at": "hop"},
        {"do": "save", "path": "hop/new"},
        {"do": "link", "target": "../../../../../../../../../../outside", "at": "far"},
        {"do": "save", "path": "far"},
        {"do": "link", "target": "../../outside", "at": "near"},  # <data dir>/outside, beside scratch/
        {"do": "save", "path": "near/peft"},
        {"do": "save", "path": "mine/ok"},  # an honest save still works
        {"do": "load", "path": "mine/ok"},
    ])
    assert out[-2:] == ["ok", "ok"], out
    assert all(o.startswith("InvalidInput") and "not a PEFT adapter folder" in o for o in out[:-2]), out


def test_a_folder_swapped_for_a_link_while_its_save_is_pending_is_not_followed(hostile, isolation, tmp_path):
    # The save runs on the backend thread some time after the call: before the swap (it writes
    # into the folder, now renamed) or after it (it meets the link and is refused). Either way
    # alice's folder is untouched (checked by _attack).
    out = _attack(hostile, isolation, tmp_path, [
        {"do": "mkdir", "at": "race"},
        {"do": "save", "path": "race", "await": False},
        {"do": "rename", "from": "race", "to": "race-moved"},
        {"do": "link", "target": "../alice", "at": "race"},
        {"do": "await"},
    ])
    assert out == ["ok"] or (out[0].startswith("InvalidInput") and "not a PEFT adapter folder" in out[0]), out


def test_a_refused_load_does_not_tell_whether_anything_exists(hostile, isolation, tmp_path):
    states: list[list[dict[str, Any]]] = [
        [],  # nothing there
        [{"do": "link", "target": "../alice/secret", "at": "probe"}],  # a link to a folder that exists
        [{"do": "link", "target": "../alice/no-such", "at": "probe"}],  # a link to nothing
        [{"do": "write", "at": "probe", "text": "x"}],  # a file
        [{"do": "mkdir", "at": "probe"}],  # an empty folder
        [{"do": "mkdir", "at": "probe"}, {"do": "write", "at": "probe/adapter_config.json", "text": "not json"},
         {"do": "write", "at": "probe/adapter_model.safetensors", "text": "x"}],
        [{"do": "mkdir", "at": "probe"}, {"do": "write", "at": "probe/adapter_config.json", "text": '{"r": 4}'}],
    ]
    steps: list[dict[str, Any]] = []
    for setup in states:
        steps += [*setup, {"do": "load", "path": "probe"}, {"do": "remove", "at": "probe"}]
    steps += [{"do": "link", "target": "../alice/secret", "at": "probe"}, {"do": "save", "path": "probe"},
              {"do": "remove", "at": "probe"}, {"do": "link", "target": "../alice/no-such", "at": "probe"},
              {"do": "save", "path": "probe"}]
    out = _attack(hostile, isolation, tmp_path, steps)
    loads, saves = out[: len(states)], out[len(states):]
    assert len(set(loads)) == 1 and loads[0].startswith("InvalidInput"), loads
    assert len(set(saves)) == 1 and saves[0].startswith("InvalidInput"), saves
