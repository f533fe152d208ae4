"""Class 1: an uploaded archive never writes outside its own program folder, never fills the
disk, and never stalls the server.

Every hostile archive is built here, byte by byte where tarfile would not write it. Each is
sent by mallory to a real server; it must be refused with a clear error, leave the canary
files beside and inside the data dir untouched, leave no staging folder, and alice must go on
being served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import os
import tarfile
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
from hostile import victim_is_served

from pie_core.client import ServerError, connect
from pie_core.server import archive as archive_module
from pie_core.server import store as store_module

MANIFEST = b'[package]\nname = "evil"\nversion = "1.0.0"\n'
MAIN = b"async def main(input):\n    return 'evil'\n"
CANARY = b"token_sha256 = 'alice'\n"


# archives ---------------------------------------------------------------------------------


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **attrs: Any) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def _tar(*members: tuple[tarfile.TarInfo, bytes], fmt: int = tarfile.PAX_FORMAT, gz: bool = True,
         program: bool = True) -> bytes:
    """A tar archive of a valid inferlet (unless ``program`` is false) followed by ``members``."""
    buf = io.BytesIO()
    head = [_member("Pie.toml", data=MANIFEST), _member("main.py", data=MAIN)] if program else []
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=fmt) as tar:
        for info, data in [*head, *members]:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def _header(name: bytes, size: int = 0, kind: bytes = b"0") -> bytes:
    """One ustar header written by hand: fast, and it may declare data that never follows."""
    block = bytearray(512)
    block[0 : len(name)] = name
    block[100:108] = b"0000644\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _raw_program() -> bytes:
    """The members of a valid inferlet as raw tar blocks, with no end marker: more can follow."""
    return b"".join(_header(name, len(data)) + data.ljust(-(-len(data) // 512) * 512, b"\0")
                    for name, data in ((b"Pie.toml", MANIFEST), (b"main.py", MAIN)))


def _chain_escape(sibling: str) -> bytes:
    """CVE-2025-4517: symlinks through folders with names near NAME_MAX make the resolved path
    longer than PATH_MAX, where ``os.path.realpath`` stops resolving, so tarfile's ``data``
    filter (Python 3.11) sees a link that stays inside and lets a file through it land at
    ``<staging>/../../../sibling``, beside the data dir."""
    comp, steps = "d" * 247, "abcdefghijklmnop"
    members, path = [], ""
    for step in steps:
        members.append(_member(os.path.join(path, comp), tarfile.DIRTYPE))
        members.append(_member(os.path.join(path, step), tarfile.SYMTYPE, linkname=comp))
        path = os.path.join(path, comp)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append(_member(linkpath, tarfile.SYMTYPE, linkname=os.path.join(*[".."] * len(steps))))
    members.append(_member("escape", tarfile.SYMTYPE, linkname=linkpath + "/../../.."))
    members.append(_member(f"escape/{sibling}", data=b"pwned"))
    return _tar(*members)


def _zero_bomb(files: int, file_mib: int) -> bytes:
    """A valid gzip of a tar with ``files`` files of ``file_mib`` MiB of zeros each, about
    1,000 times smaller than what it inflates to (built without inflating it)."""
    zeros = bytes(2**20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    crc, size, out = 0, 0, [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"]

    def add(raw: bytes, compressed: bytes | None = None) -> None:
        nonlocal crc, size
        out.append(compressed if compressed is not None else deflate.compress(raw) + deflate.flush(zlib.Z_FULL_FLUSH))
        crc, size = zlib.crc32(raw, crc), size + len(raw)

    add(_raw_program())
    mib = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)  # the same bytes every time after a full flush
    for i in range(files):
        add(_header(b"blob%d.bin" % i, file_mib * 2**20))
        for _ in range(file_mib):
            add(zeros, mib)
    add(bytes(1024))
    out.append(deflate.flush())
    out.append(crc.to_bytes(4, "little") + (size % 2**32).to_bytes(4, "little"))
    return b"".join(out)


def _many_files(count: int) -> bytes:
    """A gzip tar of an inferlet plus ``count`` files of 16 random bytes (it compresses about
    30:1, under the ratio bound, so only the member count can stop it)."""
    parts = [_raw_program()]
    for i in range(count):
        parts.append(_header(b"junk/%d.py" % i, 16))
        parts.append(os.urandom(16).ljust(512, b"\0"))
    parts.append(bytes(1024))
    return zlib.compress(b"".join(parts), 1, wbits=31)


# server side ------------------------------------------------------------------------------

_PLANTED: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_canaries():
    yield
    while _PLANTED:
        _PLANTED.pop().unlink(missing_ok=True)


def _plant_canaries(data_dir: Path) -> list[Path]:
    """The server config beside the data dir (as ~/.pie/config.toml is beside ~/.pie/server)
    and a file inside the data dir but outside programs/."""
    canaries = [data_dir.parent / f"{data_dir.name}-config.toml", data_dir / "auth.toml"]
    for path in canaries:
        path.write_bytes(CANARY)
    _PLANTED.extend(canaries)
    return canaries


def _assert_untouched(data_dir: Path, canaries: list[Path]) -> None:
    for path in canaries:
        assert path.read_bytes() == CANARY, f"{path} was overwritten"
    assert not list(data_dir.parent.glob(f"{data_dir.name}-config.toml?*"))
    programs = data_dir / "programs"
    assert not [p for p in programs.iterdir() if p.name.startswith(".")], "a staging folder was left behind"
    for path in programs.rglob("*"):
        assert path.is_dir() or (path.is_file() and not path.is_symlink()), f"stored {path} is not a plain file"


async def _upload(client: Any, archive: bytes) -> Any:
    begin = await client.request("upload_begin", size=len(archive), sha256=hashlib.sha256(archive).hexdigest())
    step = 2**20
    for offset in range(0, len(archive), step):
        await client.request("upload_chunk", upload=begin["upload"], data=archive[offset : offset + step])
    return await client.request("upload_end", upload=begin["upload"])


def _attack(hostile: Any, archive: bytes | str, words: str, max_unpacked_bytes: int | None = None) -> None:
    async def scenario(s):
        if max_unpacked_bytes is not None:
            s.server.store.limits = dataclasses.replace(s.server.store.limits, max_bytes=max_unpacked_bytes)
        canaries = _plant_canaries(s.data_dir)
        data = _chain_escape(canaries[0].name) if archive == "chain" else archive
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            with pytest.raises(ServerError, match=f"invalid_input: upload is not a safe tar archive.*{words}"):
                await _upload(mallory, data)
            await mallory.ping()  # the connection carries on
        _assert_untouched(s.data_dir, canaries)
        await victim_is_served(s)

    hostile(scenario)


# tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "archive, words",
    [
        ("chain", "symlink"),
        (_tar(_member("link", tarfile.SYMTYPE, linkname="/tmp"), _member("link/x", data=b"pwned")), "symlink"),
        (_tar(_member("up", tarfile.SYMTYPE, linkname="../../.."), _member("up/x", data=b"pwned")), "symlink"),
        (_tar(_member("hard", tarfile.LNKTYPE, linkname="/etc/passwd")), "hard link"),
        (_tar(_member("hard", tarfile.LNKTYPE, linkname="main.py"), _member("hard", data=b"pwned")), "hard link"),
        (_tar(_member("null", tarfile.CHRTYPE, devmajor=1, devminor=3)), "character device"),
        (_tar(_member("disk", tarfile.BLKTYPE, devmajor=8, devminor=0)), "block device"),
        (_tar(_member("pipe", tarfile.FIFOTYPE)), "fifo"),
        (_tar(_member("cont", tarfile.CONTTYPE, data=b"")), "contiguous"),
        (_tar(_member("holes", data=b"x" * 10, pax_headers={"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                                                             "GNU.sparse.name": "holes", "GNU.sparse.realsize": "10"})),
         "sparse"),
    ],
    ids=["cve-2025-4517-chain", "symlink-absolute", "symlink-relative", "hardlink-out", "hardlink-then-write",
         "char-device", "block-device", "fifo", "contiguous", "pax-sparse"],
)
def test_links_devices_and_other_member_types_are_refused(hostile, archive, words):
    _attack(hostile, archive, words)


@pytest.mark.parametrize(
    "archive, words",
    [
        (_tar(_member("/tmp/pie-abs.py", data=b"pwned")), "is absolute"),
        (_tar(_member("../../../pie-up.py", data=b"pwned")), r"contains '\.\.'"),
        (_tar(_member("lib/../../../../pie-up.py", data=b"pwned")), r"contains '\.\.'"),
        (_tar(_member("x", data=b"y", pax_headers={"path": "main.py\0/../../../../pie-nul"})), "NUL"),
        (_tar(_member("..\\..\\pie-win.py", data=b"pwned")), "backslash"),
        (_tar(_member("a/" * 40 + "deep.py", data=b"x")), "levels deep"),
        (_tar(_member("d" * 300 + "/x.py", data=b"x")), "255 bytes"),
        (_tar(_member(("d" * 250 + "/") * 16 + "x.py", data=b"x")), "at most 1024"),
    ],
    ids=["absolute", "dotdot", "dotdot-normalises-out", "nul", "backslash", "too-deep", "component-over-255",
         "near-path-max"],
)
def test_names_that_leave_the_folder_or_are_unreasonable_are_refused(hostile, archive, words):
    _attack(hostile, archive, words)


@pytest.mark.parametrize(
    "archive, words",
    [
        (_tar(_member("lib", tarfile.DIRTYPE), _member("lib/x.py", data=b"x"), _member("lib", data=b"x")),
         "appears twice"),
        (_tar(_member("lib", data=b"x"), _member("lib", tarfile.DIRTYPE)), "as a file and as a folder"),
        (_tar(_member("lib", data=b"x"), _member("lib/x.py", data=b"x")), "which is a file"),
        (_tar(_member("Pie.toml", data=b'[package]\nname = "other"\n')), "appears twice"),
        (_tar(_member("./main.py", data=b"x")), "appears twice"),
    ],
    ids=["file-replaces-folder", "folder-replaces-file", "file-under-file", "second-manifest", "dot-slash-duplicate"],
)
def test_a_member_never_replaces_another(hostile, archive, words):
    _attack(hostile, archive, words)


def test_a_gzip_bomb_is_stopped_after_a_mebibyte_without_filling_the_disk(hostile):
    bomb = _zero_bomb(files=256, file_mib=4)  # 1 GiB of zeros
    assert len(bomb) < 2 * 2**20

    async def scenario(s):
        canaries = _plant_canaries(s.data_dir)
        peak = 0
        done = asyncio.Event()

        async def watch_disk() -> None:
            nonlocal peak
            while not done.is_set():
                used = sum(p.stat().st_size for p in (s.data_dir / "programs").rglob("*") if p.is_file())
                peak = max(peak, used)
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch_disk())
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            try:
                with pytest.raises(ServerError, match="inflates more than 100:1.*decompression bomb"):
                    await _upload(mallory, bomb)
            finally:
                done.set()
                await watcher
        assert peak < 4 * 2**20, f"{peak} bytes reached the disk"
        _assert_untouched(s.data_dir, canaries)
        await victim_is_served(s)

    hostile(scenario)


@pytest.mark.parametrize(
    "archive, words",
    [
        (_raw_program() + _header(b"huge.bin", 2**30) + bytes(1024), "add up to more than 67108864 bytes"),
        (_raw_program() + _header(b"././@PaxHeader", 2**30, b"x") + bytes(1024), "extended header holds"),
        (_raw_program() + _header(b"././@LongLink", 2**26, b"L") + bytes(1024), "extended header holds"),
        # a folder's header declaring data: its bytes would be read as the next member's header
        (_raw_program() + _header(b"lib/", 512, b"5") + _header(b"evil.py", 5) + b"pwned".ljust(512, b"\0")
         + bytes(1024), "folder 'lib/' carries 512 bytes of data"),
    ],
    ids=["declared-1-gib", "pax-header-1-gib", "gnu-longname-64-mib", "folder-with-data"],
)
def test_oversized_members_are_refused_before_anything_is_written(hostile, archive, words):
    _attack(hostile, archive, words)


def test_files_adding_up_past_the_unpacked_bound_are_refused(hostile):
    third = bytes(2**19)
    archive = _tar(*[_member(f"part{i}.bin", data=third) for i in range(3)])
    _attack(hostile, archive, "add up to more than 1048576 bytes .at 'part1.bin'.", max_unpacked_bytes=2**20)


def test_fifty_thousand_files_are_unpacked_off_the_event_loop_and_refused_at_the_member_bound(hostile, monkeypatch):
    """While mallory's archive is being unpacked (held there until alice is done), alice's ping
    is answered and her own upload and launch are served: the work runs on a worker thread, not
    the event loop. The unpacking reads 2,001 members and stops, however many follow."""
    archive = _many_files(50_000)
    unpacking, release = threading.Event(), threading.Event()
    loop_thread: list[int] = []
    unpack_thread: list[int] = []
    mine = threading.local()
    members_read = [0]
    real_unpack, real_members = store_module.unpack_archive, archive_module._members

    def held_unpack(data, dest, limits):
        if data != archive:  # alice's probe unpacks as usual
            return real_unpack(data, dest, limits)
        unpack_thread.append(threading.get_ident())
        unpacking.set()
        if unpack_thread[0] != loop_thread[0]:  # on the loop itself, waiting would only hang the test
            assert release.wait(60), "the test never released the unpacking"
        mine.counting = True
        try:
            return real_unpack(data, dest, limits)
        finally:
            mine.counting = False

    def counted_members(stream):
        for member in real_members(stream):
            if getattr(mine, "counting", False):
                members_read[0] += 1
            yield member

    monkeypatch.setattr(store_module, "unpack_archive", held_unpack)
    monkeypatch.setattr(archive_module, "_members", counted_members)

    async def scenario(s):
        loop_thread.append(threading.get_ident())
        canaries = _plant_canaries(s.data_dir)
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            upload = asyncio.create_task(_upload(mallory, archive))
            try:
                assert await asyncio.to_thread(unpacking.wait, 60), "mallory's archive never reached the unpacking"
                assert unpack_thread[0] != loop_thread[0], "the archive was unpacked on the event loop's thread"
                async with await connect(s.url, s.tokens["alice"]) as alice:
                    await alice.ping()
                await victim_is_served(s)
                assert not upload.done(), "mallory's upload ended while its unpacking was held"
            finally:
                release.set()
            with pytest.raises(ServerError, match="more than 2000 files and folders; pack only the inferlet"):
                await upload
        assert len(unpack_thread) == 1
        assert members_read == [2001]  # refused at the bound, not after reading all 50,002
        _assert_untouched(s.data_dir, canaries)

    hostile(scenario)


def test_entry_outside_the_folder_is_refused_alike_whether_or_not_it_exists(hostile):
    async def scenario(s):
        canaries = _plant_canaries(s.data_dir)
        messages = []
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            for entry in [str(canaries[0]), str(canaries[0]) + ".nope", "../../auth.toml", "../../nope.toml",
                          "/etc/passwd", "/etc/nope"]:
                toml = MANIFEST + f'[runtime]\nentry = "{entry}"\n'.encode()
                with pytest.raises(ServerError) as err:
                    await _upload(mallory, _tar(_member("Pie.toml", data=toml), program=False))
                messages.append(err.value.message.replace(entry, "<entry>"))
        assert len(set(messages)) == 1, messages
        assert "[runtime] entry must be a relative path to a file inside the inferlet folder" in messages[0]
        assert str(s.data_dir) not in messages[0]
        _assert_untouched(s.data_dir, canaries)
        await victim_is_served(s)

    hostile(scenario)


@pytest.mark.parametrize(
    "toml, words",
    [
        (MANIFEST + b"# " + b"x" * 70_000 + b"\n", "over 65536 bytes"),
        (MANIFEST + b"deep = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested over 16 deep"),
        (MANIFEST + b"[" + b".".join(b"t%d" % i for i in range(40)) + b"]\n", "nested over 16 deep"),
        (MANIFEST + b"\xff\xfe\n", "not UTF-8"),
        (b"parameters = 3\n" + MANIFEST, r"\[parameters\] must be a table"),
    ],
    ids=["huge", "deep-arrays", "deep-tables", "not-utf8", "parameters-not-a-table"],
)
def test_hostile_manifests_are_refused_clearly(hostile, toml, words):
    async def scenario(s):
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            with pytest.raises(ServerError, match=f"invalid_input: the uploaded archive/Pie.toml: .*{words}"):
                await _upload(mallory, _tar(_member("Pie.toml", data=toml), _member("main.py", data=MAIN),
                                            program=False))
        await victim_is_served(s)

    hostile(scenario)


def test_honest_archives_still_unpack_with_folders_dot_slash_names_and_long_paths(hostile, tmp_path):
    deep = "pkg/" + "sub_" * 40 + "/helpers.py"
    (tmp_path / Path(deep).parent).mkdir(parents=True)
    (tmp_path / deep).write_text("VALUE = 'from a long path'\n")
    (tmp_path / "Pie.toml").write_text('[package]\nname = "honest"\nversion = "2.0.0"\n')
    (tmp_path / "main.py").write_text("async def main(input):\n    return 'ok'\n")
    dot_slash = io.BytesIO()
    with tarfile.open(fileobj=dot_slash, mode="w") as tar:  # what `tar -C folder .` writes
        tar.add(tmp_path, arcname=".")

    async def scenario(s):
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            assert await mallory.install(tmp_path) == "honest@2.0.0"
            assert (await _upload(mallory, dot_slash.getvalue()))["name"] == "honest"
            assert await (await mallory.launch("honest@2.0.0")).wait() == "ok"
        stored = [p for p in (s.data_dir / "programs").glob("*/pkg") if p.is_dir()]
        assert len(stored) == 2 and all((p.parent / deep).read_text().startswith("VALUE") for p in stored)

    hostile(scenario)
