"""Filesystem confinement of workers with Landlock (skipped only where the kernel lacks it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_isolation import _launcher, served  # noqa: F401  # ``served`` is a fixture

from pie_core.client import connect
from pie_core.runtime.process import landlock

FS = Path(__file__).parent / "inferlets" / "iso_fs"
ABI = landlock.abi_version()

pytestmark = pytest.mark.skipif(ABI == 0, reason="this kernel has no Landlock (or it is disabled)")


def test_a_worker_writes_only_its_scratch_and_reads_only_code(served, tmp_path):
    outside = tmp_path / "server-secret.txt"
    outside.write_text("secret")

    async def run(s):
        async with await connect(s.url, s.tokens["alice"]) as alice:
            other = s.server.options.data_dir / "scratch" / "bob" / "notes.txt"
            other.parent.mkdir(parents=True)
            other.write_text("bob's")
            args = {"outside": str(outside), "other_scratch": str(other), "data_dir": str(s.server.options.data_dir),
                    "server_pid": os.getpid()}
            result = await (await alice.launch(await alice.install(FS), args)).wait()
            scratch = s.server.options.data_dir / "scratch" / "alice"
            assert (scratch / "w.txt").read_text() == "x" and (scratch / "rel.txt").read_text() == "y"
            return result

    result = served(run, launcher=_launcher())
    assert result == {
        "cwd_is_scratch": True, "write_scratch": "ok", "write_relative": "ok", "read_program": "ok", "import_stdlib": "ok",
        "read_outside": "denied", "write_outside": "denied", "read_other_scratch": "denied", "list_data_dir": "denied",
        "signal_server": "denied" if ABI >= 6 else "ok",
    }
    assert not (tmp_path / "server-secret.txt.new").exists()


def test_confinement_is_inherited_by_what_the_worker_starts(tmp_path):
    """A confined process cannot lift the restriction, and its children stay confined."""
    import subprocess
    import sys

    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    code = ("import subprocess, sys\n"
            "from pie_core.runtime.process import landlock, sandbox\n"
            "from pathlib import Path\n"
            f"assert landlock.confine(sandbox.readable_roots(Path({str(tmp_path / 'prog')!r})), []) == {ABI}\n"
            f"r = subprocess.run(['cat', {str(secret)!r}], capture_output=True)\n"
            "print(r.returncode, r.stdout.decode().strip() or 'nothing')\n")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "nothing"]


def test_a_confined_worker_makes_files_and_folders_but_no_fifo_or_socket(tmp_path):
    """A FIFO in a user's scratch would block whoever opens it (a wasm guest's WASI read cannot be
    interrupted), so the write rights stop at regular files, folders and links."""
    import subprocess
    import sys

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    code = ("import os, socket\n"
            "from pie_core.runtime.process import landlock\n"
            f"landlock.confine([], [{str(scratch)!r}])\n"
            f"os.chdir({str(scratch)!r})\n"
            "open('file', 'w').write('x'); os.mkdir('folder')\n"
            "for name, make in (('fifo', lambda: os.mkfifo('fifo')),\n"
            "                   ('socket', lambda: socket.socket(socket.AF_UNIX).bind('sock'))):\n"
            "    try:\n"
            "        make()\n"
            "        print(name, 'made')\n"
            "    except PermissionError:\n"
            "        print(name, 'denied')\n")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fifo", "denied", "socket", "denied"]
    assert sorted(p.name for p in scratch.iterdir()) == ["file", "folder"]
