"""Class 2, programs: a user reaches only the programs they uploaded (plus the built-ins and
examples everyone shares). Knowing another user's archive hash, program name or upload id gets
mallory nothing, and no answer tells him whether such a thing exists.
"""

from __future__ import annotations

import hashlib

import pytest
from hostile import PROBE, Served, victim_is_served, write_program

from pie_core.client import ServerError, connect, pack_program
from pie_core.runtime.launcher import InProcessLauncher


async def _send(client, archive: bytes) -> dict:
    begin = await client.request("upload_begin", size=len(archive), sha256=hashlib.sha256(archive).hexdigest())
    assert begin["stored"] is False
    await client.request("upload_chunk", upload=begin["upload"], data=archive)
    return await client.request("upload_end", upload=begin["upload"])


def test_another_users_hash_is_not_stored_for_mallory_and_does_not_let_him_launch(hostile):
    alices = pack_program(PROBE)
    digest = hashlib.sha256(alices).hexdigest()

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            assert await alice.install(PROBE) == "probe@1.0.0"
            again = await alice.request("upload_begin", size=len(alices), sha256=digest)
            assert again["stored"] is True  # her own bytes: nothing to send
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            begin = await mallory.request("upload_begin", size=len(alices), sha256=digest)
            assert begin["stored"] is False and begin["upload"] and "name" not in begin
            with pytest.raises(ServerError, match="not_found: no program 'probe'; upload it first"):
                await mallory.launch("probe", {"mode": "user"})
            with pytest.raises(ServerError, match="not_found: no program 'probe@1.0.0'"):
                await mallory.launch("probe@1.0.0", {"mode": "user"})
            assert not any(p.startswith("probe@") for p in await mallory.list_programs())
            with pytest.raises(ServerError, match="hash mismatch"):  # claiming the hash is not enough
                await mallory.request("upload_chunk", upload=begin["upload"], data=b"x" * len(alices))
                await mallory.request("upload_end", upload=begin["upload"])
            with pytest.raises(ServerError, match="not_found: no program 'probe'"):
                await mallory.launch("probe", {"mode": "user"})
        await victim_is_served(s)

    hostile(scenario)


def test_missing_program_errors_do_not_tell_whether_another_user_has_it(hostile):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            await alice.install(PROBE)
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            said = {}
            for name in ("probe", "probe@1.0.0", "qrobe", "qrobe@1.0.0"):
                with pytest.raises(ServerError) as err:
                    await mallory.launch(name, {"mode": "user"})
                said[name] = err.value.message.replace(name, "<name>")
            assert said["probe"] == said["qrobe"] and said["probe@1.0.0"] == said["qrobe@1.0.0"], said
            assert "probe" not in said["probe"] and "alice" not in str(said)

    hostile(scenario)


def test_the_same_bytes_sent_by_mallory_are_stored_once_and_indexed_for_him_alone(hostile):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            await alice.install(PROBE)
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            assert (await _send(mallory, pack_program(PROBE)))["name"] == "probe"  # he had the bytes: fine
            assert await (await mallory.launch("probe", {"mode": "user"})).wait() == "mallory"
        assert len(list((s.data_dir / "programs").glob("*/Pie.toml"))) == 1
        await victim_is_served(s)

    hostile(scenario)


def test_a_program_mallory_names_like_alices_never_shadows_hers(hostile, tmp_path):
    evil = write_program(tmp_path / "evil", "async def main(input):\n    return 'mallory was here'\n", name="probe",
                         parameters='mode = {type = "string"}')
    (evil / "Pie.toml").write_text((evil / "Pie.toml").read_text().replace('"1.0.0"', '"99.0.0"'))

    async def scenario(s):
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            assert await mallory.install(evil) == "probe@99.0.0"
        await victim_is_served(s)  # alice's "probe" is still her own (it returns her name)
        async with await connect(s.url, s.tokens["alice"]) as alice:
            with pytest.raises(ServerError, match="not_found: probe is uploaded at versions 1.0.0, not 99.0.0"):
                await alice.launch("probe@99.0.0", {"mode": "user"})
            assert "probe@99.0.0" not in await alice.list_programs()

    hostile(scenario)


def test_mallory_cannot_feed_or_end_alices_upload(hostile):
    archive = pack_program(PROBE)

    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            begin = await alice.request("upload_begin", size=len(archive), sha256=hashlib.sha256(archive).hexdigest())
            async with await connect(s.url, s.tokens["mallory"]) as mallory:
                for frame in ({"type": "upload_chunk", "data": b"evil"}, {"type": "upload_end"}):
                    with pytest.raises(ServerError) as err:
                        await mallory.request(frame.pop("type"), upload=begin["upload"], **frame)
                    assert err.value.message == f"no open upload {begin['upload']!r}; start one with upload_begin"
            await alice.request("upload_chunk", upload=begin["upload"], data=archive)
            assert (await alice.request("upload_end", upload=begin["upload"]))["name"] == "probe"
        await victim_is_served(s)

    hostile(scenario)


def test_open_uploads_are_bounded_in_bytes_per_user_and_in_all(hostile):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory, await connect(s.url, s.tokens["alice"]) as alice:
            store = s.server.store
            half = store.max_pending_bytes // 2
            await mallory.request("upload_begin", size=store.max_upload, sha256="ab" * 32)
            with pytest.raises(ServerError, match=f"at most {half} may be open at once"):
                for _ in range(half // store.max_upload + 1):
                    await mallory.request("upload_begin", size=store.max_upload, sha256="cd" * 32)
            await alice.request("upload_begin", size=store.max_upload, sha256="ef" * 32)  # mallory cannot take it all
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())
