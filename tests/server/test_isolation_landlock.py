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
