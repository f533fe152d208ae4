"""Fetch, here, the wheels the GPU machine lacks, into the git-ignored ``.whl/`` folder that a
device ``run`` carries (``carry: [".whl"]``):

    python -m benchmarks.gpu.make_wheels            # writes .whl/, prints the list and the total size

:data:`WHEELS` is the exact list: the packages Pie imports on the check's paths (found by logging
every module each phase imported) that are not among the device image's preinstalled packages
(``/work/.library/device/KINDS.md``). Everything else the check imports is there: torch, triton,
transformers, numpy, tokenizers, safetensors, huggingface-hub, pluggy, rich, jinja2, msgpack, h11,
pytest, pytest-timeout, hypothesis, onnx, onnx-ir, onnxruntime, pyyaml, tqdm. Pie's own packages
are not wheels: the check imports them from the tree (:mod:`benchmarks.gpu.install`).

The wheels are fetched for the device's Python (CPython 3.12, manylinux x86-64, the device
README's recipe), ``--no-deps``: each one's requirements are printed and must be on the image.
Wheels in the folder that are not on the list are removed, so the folder holds one version of
each (two stop the whole install). The total must stay under :data:`LIMIT_BYTES`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

from benchmarks.gpu.install import ROOT

__all__ = ["WHEELS", "LIMIT_BYTES", "main"]

WHEELS = {
    "gguf": "0.19.0",  # pie_core.models (GGUF reading), imported by the model registry
    "tomlkit": "0.15.2",  # pie_core.config, imported by the model registry
}
LIMIT_BYTES = 60 << 20
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.make_wheels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=ROOT / ".whl", help="wheel folder (default .whl, git-ignored)")
    args = ap.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(args.dest),
           *(f"{name}=={version}" for name, version in WHEELS.items())]
    subprocess.run(cmd, check=True)
    wanted = {f"{name}-{version}".lower() for name, version in WHEELS.items()}
    total = 0
    for wheel in sorted(args.dest.glob("*.whl")):
        name_version = "-".join(wheel.name.split("-")[:2]).lower()
        if name_version not in wanted:
            print(f"removing {wheel.name} (not on the list)")
            wheel.unlink()
            continue
        size = wheel.stat().st_size
        total += size
        print(f"{wheel.name}  {size / 1024:.0f} KiB  requires: {', '.join(_requires(wheel)) or 'nothing'}")
    print(f"{len(wanted)} wheels, {total / (1 << 20):.2f} MiB in {args.dest} (limit {LIMIT_BYTES >> 20} MiB)")
    if total > LIMIT_BYTES:
        print("too large for the device's working tree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
