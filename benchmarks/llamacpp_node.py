"""llama.cpp on CPU through node-llama-cpp's prebuilt binaries (``benchmarks/llamacpp/run.mjs``).

``llama-cpp-python`` ships only an sdist here (a long build); node-llama-cpp's npm package ships
llama.cpp built for this platform, so the benchmarks can run llama.cpp's own kernels on the same
GGUF without a compiler. The node script runs as one child process answering JSON lines; token ids
are ours, fed to llama.cpp as raw tokens (Qwen2.5's GGUF carries the same BPE vocabulary).

    with NodeLlamaCpp(path) as llm:
        llm.logprobs(ids, 8)       # float64 log P(ids[i+1] | ids[..i]), fed 8 tokens a pass
        llm.greedy(prompt, 20)     # 20 argmax tokens
        llm.speed([prompt], 32)    # per-token timestamps of one (or several) sequences

The first use installs ``benchmarks/llamacpp/node_modules`` (``npm ci``, else ``npm install
--no-save``: the versions of its package-lock.json, node-llama-cpp exactly 3.22.1; about 700 MB, as
npm fetches every Linux binary variant, CUDA and Vulkan included, though only the CPU one is used).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["NodeLlamaCpp", "NodeLlamaCppUnavailable", "SpeedRun", "install"]

HERE = Path(__file__).resolve().parent / "llamacpp"


class NodeLlamaCppUnavailable(RuntimeError):
    """node or npm is missing, or installing node-llama-cpp failed."""


def install() -> Path:
    """Install node-llama-cpp in ``benchmarks/llamacpp/`` unless it is there; returns the node binary.

    Raises:
        NodeLlamaCppUnavailable: node or npm is not on PATH, or installing failed.
    """
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise NodeLlamaCppUnavailable(
            "node-llama-cpp needs node (>= 20) and npm on PATH: install Node.js, or install llama-cpp-python"
        )
    if not (HERE / "node_modules" / "node-llama-cpp" / "package.json").exists():
        # --ignore-scripts: node-llama-cpp's postinstall may try to build llama.cpp; run.mjs uses only
        # the prebuilt binaries. `npm ci` refuses a lock missing any optional dependency, and the lock
        # lists only the Linux binaries (the registry it was made against has no others for this
        # version); `npm install --no-save` then installs the lock's versions and leaves it unchanged.
        flags = ["--ignore-scripts", "--no-audit", "--no-fund"]
        done = subprocess.run([npm, "ci", *flags], cwd=HERE, capture_output=True, text=True)
        if done.returncode != 0:
            done = subprocess.run([npm, "install", "--no-save", *flags], cwd=HERE, capture_output=True, text=True)
        if done.returncode != 0:
            raise NodeLlamaCppUnavailable(f"npm install in {HERE} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return Path(node)


@dataclass(frozen=True, slots=True)
class SpeedRun:
    """One sequence of :meth:`NodeLlamaCpp.speed`: its tokens and when each came out (seconds from the start)."""

    ids: list[int]
    stamps: list[float]


class NodeLlamaCpp:
    """One ``node run.mjs`` child with the model loaded, on CPU (``gpu: false``), ``threads`` threads."""

    def __init__(self, model: str | os.PathLike[str], threads: int | None = None) -> None:
        node = install()
        self.threads = threads or os.cpu_count() or 1
        self.proc = subprocess.Popen(
            [str(node), str(HERE / "run.mjs"), str(model), str(self.threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        self.info: dict[str, Any] = self._ask({"op": "info"})

    @property
    def label(self) -> str:
        """``node-llama-cpp 3.22.1, llama.cpp v0.5.0, 2 threads``: which build answered."""
        return f"node-llama-cpp {self.info['node_llama_cpp']}, llama.cpp {self.info['llama_cpp']['release']}, {self.threads} threads"

    def _ask(self, request: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise NodeLlamaCppUnavailable(f"node run.mjs exited ({self.proc.wait()}) on {request['op']}: see its stderr above")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"node-llama-cpp {request['op']}: {reply['error']}")
        return reply

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own token ids for ``text`` (special-token text stays plain text)."""
        return self._ask({"op": "tokenize", "text": text})["ids"]

    def logprobs(self, ids: Sequence[int], pass_size: int) -> np.ndarray:
        """float64 ``[len(ids) - 1]``: log-probability of each next token, ``ids`` fed ``pass_size`` a pass."""
        reply = self._ask({"op": "logprobs", "ids": [int(i) for i in ids], "pass": int(pass_size)})
        return np.asarray(reply["logprobs"], dtype=np.float64)

    def greedy(self, ids: Sequence[int], n: int) -> list[int]:
        """``n`` argmax tokens after ``ids`` (no repetition penalty; an end-of-generation token does not stop it)."""
        return self._ask({"op": "greedy", "ids": [int(i) for i in ids], "tokens": int(n)})["ids"]

    def speed(self, prompts: Sequence[Sequence[int]], n: int) -> tuple[float, list[SpeedRun]]:
        """Greedy ``n`` tokens after each prompt: one prompt through node-llama-cpp's own generation
        loop; several as sequences of one context, a step of all of them per ``llama_decode``.

        Returns:
            ``(wall, runs)``: wall seconds from the first prompt token in to the last token out, and
            per prompt its tokens and the time (seconds from that start) each came out.
        """
        reply = self._ask({"op": "speed", "prompts": [[int(i) for i in p] for p in prompts], "tokens": int(n)})
        return reply["wall"], [SpeedRun(r["ids"], r["stamps"]) for r in reply["runs"]]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> NodeLlamaCpp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
