"""Models by Hugging Face repo id: found in the local Hugging Face cache, downloaded into it.

``--model Qwen/Qwen2.5-0.5B-Instruct`` names a repo whose snapshot is a Hugging Face folder
(``config.json``, ``*.safetensors``); ``--model Qwen/Qwen2.5-0.5B-Instruct-GGUF`` a repo with
one GGUF file, and ``REPO:SELECTOR`` one GGUF of a repo with several (a file name, or a
quantisation tag such as ``q4_k_m`` matched case-insensitively, as llama.cpp's ``-hf`` does).

The cache is huggingface_hub's own (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``), read through its cache API, so what transformers, ``hf download``
or ``pie model pull`` fetched is shared and never copied. huggingface_hub is imported only when
a repo id is used.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pie_core.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from huggingface_hub import CachedRepoInfo, CachedRevisionInfo

__all__ = ["HubModel", "split_ref", "hub_cache_dir", "offline", "find_cached", "list_cached", "pull", "remove"]

_REF = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?::([A-Za-z0-9_.+-]+))?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_HF_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
"""What ``pull`` downloads of a safetensors repo: config, weights, tokenizer, chat template."""


@dataclass(frozen=True, slots=True)
class HubModel:
    """A loadable model in the Hugging Face cache.

    Attributes:
        name: How ``--model`` names it: the repo id, plus ``:FILE`` for one GGUF of several.
        repo_id: The repo.
        path: The snapshot folder (format ``"hf"``) or the ``.gguf`` file in it.
        format: ``"hf"`` or ``"gguf"``.
        size: Bytes on disk of what loading reads.
        revision: The snapshot's commit.
        sha256: The GGUF's sha256 when the cache names its blob by it (large files), else None.
    """

    name: str
    repo_id: str
    path: Path
    format: str
    size: int
    revision: str
    sha256: str | None = None


def split_ref(name: str) -> tuple[str, str | None] | None:
    """``(repo_id, selector)`` when ``name`` has the shape of a repo id (``owner/name`` or
    ``owner/name:selector``), else None."""
    match = _REF.match(name)
    return (match.group(1), match.group(2)) if match else None


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it (read now, not at import)."""
    if env := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def offline() -> bool:
    """Whether downloads are off (``HF_HUB_OFFLINE``, read now)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _repos() -> list[CachedRepoInfo]:
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        return [r for r in scan_cache_dir(hub_cache_dir()).repos if r.repo_type == "model"]
    except CacheNotFound:
        return []


def _revision(repo: CachedRepoInfo) -> CachedRevisionInfo:
    """The snapshot ``main`` points to, else the newest one."""
    revisions = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
    return next((r for r in revisions if "main" in r.refs), revisions[0])


def _files(revision: CachedRevisionInfo) -> dict[str, Any]:
    return {f.file_path.relative_to(revision.snapshot_path).as_posix(): f for f in revision.files}


def _ggufs(files: dict[str, Any]) -> list[str]:
    """The loadable GGUFs of a snapshot (vision projectors left out)."""
    return sorted(n for n in files if n.endswith(".gguf") and not Path(n).name.startswith("mmproj"))


def _is_hf_snapshot(files: dict[str, Any]) -> bool:
    return "config.json" in files and any("/" not in n and n.endswith(".safetensors") for n in files)


def _gguf(repo: CachedRepoInfo, revision: CachedRevisionInfo, name: str, file: Any) -> HubModel:
    blob = Path(file.blob_path).name
    return HubModel(name, repo.repo_id, Path(file.file_path), "gguf", int(file.size_on_disk), revision.commit_hash,
                    blob if _SHA256.match(blob) else None)


def _pick(repo: CachedRepoInfo, selector: str | None) -> HubModel:
    revision = _revision(repo)
    files = _files(revision)
    ggufs = _ggufs(files)
    if selector is not None:
        wanted = selector.lower()
        exact = [n for n in ggufs if n.lower() == wanted or Path(n).name.lower() == wanted]
        matches = exact or [n for n in ggufs if wanted in Path(n).name.lower()]
        if len(matches) != 1:
            some = ", ".join(matches or ggufs) or "none"
            what = "several" if matches else "no"
            raise NotFound(f"{repo.repo_id} has {what} cached GGUF files matching {selector!r} ({some}); "
                           f"name one: {repo.repo_id}:FILE")
        return _gguf(repo, revision, f"{repo.repo_id}:{Path(matches[0]).name}", files[matches[0]])
    if _is_hf_snapshot(files):
        size = sum(f.size_on_disk for n, f in files.items() if "/" not in n)
        return HubModel(repo.repo_id, repo.repo_id, Path(revision.snapshot_path), "hf", int(size), revision.commit_hash)
    if len(ggufs) == 1:
        return _gguf(repo, revision, repo.repo_id, files[ggufs[0]])
    if ggufs:
        names = ", ".join(Path(n).name for n in ggufs)
        raise NotFound(f"{repo.repo_id} has {len(ggufs)} cached GGUF files ({names}); name one: "
                       f"{repo.repo_id}:FILE or a tag such as {repo.repo_id}:q4_k_m")
    raise NotFound(f"{repo.repo_id} is in the Hugging Face cache ({hub_cache_dir()}) without config.json + *.safetensors "
                   f"or a .gguf file; download them with: pie model pull {repo.repo_id}")


def _cached_repo(repo_id: str) -> CachedRepoInfo | None:
    repos = _repos()
    exact = [r for r in repos if r.repo_id == repo_id]
    folded = [r for r in repos if r.repo_id.lower() == repo_id.lower()]  # the Hub's ids ignore case
    found = exact or folded
    return found[0] if len(found) == 1 else None


def find_cached(name: str) -> HubModel:
    """The cached model ``name`` (``owner/repo`` or ``owner/repo:selector``) names.

    Raises:
        NotFound: Not a repo id, not in the cache (the message says how to download it), or
            no loadable file in its snapshot, or a selector that matches no file or several.
    """
    ref = split_ref(name)
    if ref is None:
        raise NotFound(f"{name!r} is not a Hugging Face repo id (owner/name or owner/name:FILE)")
    repo_id, selector = ref
    repo = _cached_repo(repo_id)
    if repo is None:
        pull = f"pie model pull {repo_id}" + (f" --file {selector}" if selector and selector.endswith(".gguf") else "")
        raise NotFound(f"{repo_id} is not in the Hugging Face cache ({hub_cache_dir()}); download it with: {pull}")
    return _pick(repo, selector)


def list_cached() -> list[HubModel]:
    """Every loadable model in the cache: a repo with a Hugging Face folder, and each GGUF file."""
    found: list[HubModel] = []
    for repo in sorted(_repos(), key=lambda r: r.repo_id.lower()):
        revision = _revision(repo)
        files = _files(revision)
        if _is_hf_snapshot(files):
            found.append(_pick(repo, None))
        ggufs = _ggufs(files)
        for n in ggufs:
            name = repo.repo_id if len(ggufs) == 1 and not _is_hf_snapshot(files) else f"{repo.repo_id}:{Path(n).name}"
            found.append(_gguf(repo, revision, name, files[n]))
    return found


def pull(repo_id: str, file: str | None = None) -> HubModel:
    """Download a model into the Hugging Face cache (or find it there) and return it.

    Without ``file``, a repo with ``config.json`` and ``*.safetensors`` is downloaded as a
    Hugging Face folder (config, weights, tokenizer), and a repo of GGUF files must have exactly
    one (else ``file`` names it). Offline (``HF_HUB_OFFLINE=1``) only the cache is looked at.

    Raises:
        NotFound: No such repo or file, offline and not cached, or the Hub unreachable.
        InvalidInput: ``repo_id`` is not a repo id, or the repo is gated (log in first).
    """
    if split_ref(repo_id) is None or ":" in repo_id:
        raise InvalidInput(f"{repo_id!r} is not a Hugging Face repo id (owner/name); a file goes in --file")
    if offline():
        try:
            return find_cached(f"{repo_id}:{file}" if file else repo_id)
        except NotFound:
            raise NotFound(f"{repo_id}{' ' + file if file else ''} is not in the Hugging Face cache ({hub_cache_dir()}) "
                           "and HF_HUB_OFFLINE=1 forbids downloading it; unset HF_HUB_OFFLINE where the Hub is reachable") from None
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    if (why := _unreachable()) is not None:
        raise NotFound(f"cannot reach the Hugging Face Hub ({why}) to download {repo_id}; models already in the "
                       f"cache ({hub_cache_dir()}) still work, and HF_HUB_OFFLINE=1 skips this check")
    quiet = logging.getLogger("huggingface_hub")
    level, quiet.level = quiet.level, logging.ERROR  # its retry warnings; the failure is our one line
    try:
        if file is not None:
            hf_hub_download(repo_id, file, cache_dir=hub_cache_dir())
        else:
            names = HfApi().list_repo_files(repo_id)
            if "config.json" in names and any(n.endswith(".safetensors") for n in names):
                snapshot_download(repo_id, cache_dir=hub_cache_dir(), allow_patterns=_HF_FILES)
            else:
                ggufs = [n for n in names if n.endswith(".gguf") and not Path(n).name.startswith("mmproj")]
                if len(ggufs) != 1:
                    listed = ", ".join(ggufs[:12]) + (" ..." if len(ggufs) > 12 else "")
                    raise NotFound(f"{repo_id} has {len(ggufs)} GGUF files ({listed}); pick one with --file NAME.gguf"
                                   if ggufs else f"{repo_id} has neither config.json + *.safetensors nor a .gguf file")
                file = ggufs[0]
                hf_hub_download(repo_id, file, cache_dir=hub_cache_dir())
    except (NotFound, InvalidInput):
        raise
    except Exception as exc:  # huggingface_hub's and httpx's errors: one line each
        raise _one_line(repo_id, file, exc) from None
    finally:
        quiet.setLevel(level)
    return find_cached(f"{repo_id}:{Path(file).name}" if file else repo_id)


def _unreachable() -> str | None:
    """Why the Hub's host cannot be reached (a name that does not resolve, a refused or silent
    port), or None; asked first, because huggingface_hub retries such failures for ~25 s."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlsplit(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    return None


def _one_line(repo_id: str, file: str | None, exc: Exception) -> Exception:
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    if isinstance(exc, GatedRepoError):
        return InvalidInput(f"{repo_id} is gated: accept its terms on huggingface.co and log in (hf auth login)")
    if isinstance(exc, RepositoryNotFoundError):
        return NotFound(f"no repo {repo_id} on the Hugging Face Hub (or it is private: log in with hf auth login)")
    if isinstance(exc, LocalEntryNotFoundError) or "connect" in type(exc).__name__.lower():  # before its base class
        return NotFound(f"cannot reach the Hugging Face Hub to download {repo_id} and it is not in the cache "
                        f"({hub_cache_dir()})")
    if isinstance(exc, (EntryNotFoundError, RevisionNotFoundError)):
        return NotFound(f"{repo_id} has no file {file}")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return NotFound(f"downloading {repo_id} failed: {first}")


def remove(repo_id: str) -> tuple[list[Path], int]:
    """Delete every cached revision of ``repo_id``.

    Returns:
        The files that belonged to it (snapshot paths, for callers that clean what was derived
        from them) and the bytes freed.

    Raises:
        NotFound: The repo is not in the cache.
    """
    ref = split_ref(repo_id)
    repo = _cached_repo(ref[0]) if ref else None
    if repo is None:
        raise NotFound(f"{repo_id} is not in the Hugging Face cache ({hub_cache_dir()})")
    files = [Path(f.file_path) for rev in repo.revisions for f in rev.files]
    shutil.rmtree(repo.repo_path)  # the repo's folder holds its blobs, snapshots and refs, nothing shared
    return files, int(repo.size_on_disk)
