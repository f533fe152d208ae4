"""Inferlet manifests (``Pie.toml``) and validation of an inferlet's input against them."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from pie_core.errors import InvalidInput

__all__ = ["Parameter", "Manifest", "load_manifest", "parse_cli_args"]

_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "int": int, "float": (int, float), "bool": bool}
_MAX_MANIFEST_BYTES = 64 * 2**10
_MAX_DEPTH = 16  # tables and arrays inside one another
_MAX_PARAMETERS = 256
_MAX_ENTRY = 1024  # bytes of the entry path


@dataclass(frozen=True, slots=True)
class Parameter:
    """One entry of ``[parameters]``: ``name = {type = "...", optional = ..., default = ...}``."""

    name: str
    type: str
    optional: bool = False
    default: Any = None
    description: str = ""

    def coerce(self, raw: Any) -> Any:
        """Check (or, for CLI strings, convert) a value to this parameter's type."""
        if isinstance(raw, str) and self.type != "string":
            return self._from_text(raw)
        want = _TYPES[self.type]
        if isinstance(raw, bool) and self.type in ("int", "float"):
            raise InvalidInput(f"parameter {self.name!r} must be {self.type}, got a bool")
        if not isinstance(raw, want):
            raise InvalidInput(f"parameter {self.name!r} must be {self.type}, got {type(raw).__name__} {raw!r}")
        return float(raw) if self.type == "float" and isinstance(raw, (int, float)) else raw

    def _from_text(self, text: str) -> Any:
        try:
            if self.type == "int":
                return int(text)
            if self.type == "float":
                return float(text)
        except ValueError:
            raise InvalidInput(f"parameter {self.name!r} must be {self.type}, got {text!r}") from None
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise InvalidInput(f"parameter {self.name!r} must be bool (true/false), got {text!r}")


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed ``Pie.toml``."""

    name: str
    version: str
    description: str
    entry: str
    root: Path
    parameters: dict[str, Parameter] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)

    @property
    def entry_path(self) -> Path:
        return self.root / self.entry

    def validate_input(self, given: dict[str, Any]) -> dict[str, Any]:
        """Typed input for ``main``: unknown, missing or mistyped parameters raise, by name."""
        unknown = sorted(set(given) - set(self.parameters))
        if unknown:
            known = ", ".join(sorted(self.parameters)) or "none"
            raise InvalidInput(f"unknown parameter {unknown[0]!r} for {self.name}; parameters: {known}")
        out: dict[str, Any] = {}
        for name, param in self.parameters.items():
            if name in given:
                out[name] = param.coerce(given[name])
            elif param.default is not None:
                out[name] = param.default
            elif not param.optional:
                raise InvalidInput(f"missing required parameter {name!r} ({param.type}) for {self.name}")
        return out


def load_manifest(folder: str | Path, *, shown_as: str | None = None) -> Manifest:
    """Read ``folder/Pie.toml``.

    Args:
        folder: The inferlet folder.
        shown_as: What error messages call the folder (the server does not show clients its
            own paths); default: its path.

    Raises:
        InvalidInput: The file is missing, over 64 KiB, not UTF-8 TOML, nested over 16 deep,
            its tables are malformed (the message names the key), or ``[runtime] entry`` is
            not a file inside the folder.
    """
    root = Path(folder)
    where = shown_as or str(root)
    path = root / "Pie.toml"
    if not path.is_file():
        raise InvalidInput(f"{where} has no Pie.toml; an inferlet is a folder with Pie.toml and main.py "
                           "(or package.json and index.ts/index.js)")
    shown = f"{where}/Pie.toml"
    with open(path, "rb") as fh:
        raw = fh.read(_MAX_MANIFEST_BYTES + 1)
    if len(raw) > _MAX_MANIFEST_BYTES:
        raise InvalidInput(f"{shown}: over {_MAX_MANIFEST_BYTES} bytes; a manifest holds names, versions "
                           "and parameters only")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidInput(f"{shown}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{shown}: not valid TOML: {exc}") from None
    except RecursionError:
        raise InvalidInput(f"{shown}: arrays or tables nested over {_MAX_DEPTH} deep") from None
    if _depth(data) > _MAX_DEPTH:
        raise InvalidInput(f"{shown}: arrays or tables nested over {_MAX_DEPTH} deep")
    pkg = data.get("package")
    if not isinstance(pkg, dict) or not isinstance(pkg.get("name"), str) or not pkg["name"]:
        raise InvalidInput(f"{shown}: [package] needs a non-empty string 'name'")
    version = pkg.get("version", "0.0.0")
    if not isinstance(version, str):
        raise InvalidInput(f"{shown}: [package] version must be a string")
    runtime = data.get("runtime", {})
    if not isinstance(runtime, dict):
        raise InvalidInput(f"{shown}: [runtime] must be a table")
    entry = runtime.get("entry", _default_entry(root))
    if not _inside(root, entry):
        raise InvalidInput(f"{shown}: [runtime] entry must be a relative path to a file inside the inferlet folder "
                           f"(no '..', not absolute, no link out of it), got {str(entry)[:200]!r}")
    if not (root / entry).is_file():
        raise InvalidInput(f"{shown}: entry module {entry!r} not found in {where}")
    declared = data.get("parameters", {})
    if not isinstance(declared, dict):
        raise InvalidInput(f"{shown}: [parameters] must be a table of name = {{type = \"...\"}}")
    if len(declared) > _MAX_PARAMETERS:
        raise InvalidInput(f"{shown}: {len(declared)} parameters; at most {_MAX_PARAMETERS} are allowed")
    params = {}
    for name, spec in declared.items():
        params[name] = _parse_parameter(shown, name, spec)
    return Manifest(
        name=pkg["name"],
        version=version,
        description=str(pkg.get("description", "")),
        entry=entry,
        root=root.resolve(),
        parameters=params,
        runtime=runtime,
    )


def _default_entry(root: Path) -> str:
    """``main.py``; for a JS/TS inferlet (``package.json``, no ``main.py``) ``index.ts`` or ``index.js``."""
    if not (root / "main.py").is_file() and (root / "package.json").is_file():
        for name in ("index.ts", "index.js"):
            if (root / name).is_file():
                return name
    return "main.py"


def _inside(root: Path, entry: Any) -> bool:
    """Whether ``entry`` names a path inside ``root`` once symlinks are resolved. Decided
    without looking at anything outside ``root``, so the answer never tells whether a path
    outside exists."""
    if not isinstance(entry, str) or not entry or len(entry.encode("utf-8", "replace")) > _MAX_ENTRY:
        return False
    pure = PurePosixPath(entry)
    if "\0" in entry or "\\" in entry or pure.is_absolute() or ".." in pure.parts:
        return False
    try:
        base = root.resolve()
        return (base / pure).resolve().is_relative_to(base)
    except (OSError, RuntimeError):  # a symlink loop or a name too long: not a usable entry either way
        return False


def _depth(value: Any) -> int:
    """How deeply tables and arrays nest in parsed TOML (iteratively: no recursion limit)."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _parse_parameter(path: str, name: str, spec: Any) -> Parameter:
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise InvalidInput(f"{path}: parameter {name!r} must be a table like {{type = \"string\"}}")
    kind = spec.get("type")
    if kind not in _TYPES:
        raise InvalidInput(f"{path}: parameter {name!r} has type {kind!r}; use one of {', '.join(_TYPES)}")
    param = Parameter(
        name=name,
        type=kind,
        optional=bool(spec.get("optional", False)),
        default=None,
        description=str(spec.get("description", "")),
    )
    if "default" in spec:
        param = Parameter(name, kind, True, param.coerce(spec["default"]), param.description)
    return param


def parse_cli_args(args: Sequence[str], manifest: Manifest) -> dict[str, Any]:
    """Turn ``--key value`` flags into an input dict (``--max-tokens`` = ``--max_tokens``).

    A bool parameter given as a bare ``--flag`` is true. Values stay strings here; the
    manifest types them in :meth:`Manifest.validate_input`.
    """
    out: dict[str, Any] = {}
    i = 0
    args = list(args)
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--") or len(flag) == 2:
            raise InvalidInput(f"expected --name value after '--', got {flag!r}")
        key = flag[2:].replace("-", "_")
        value: str | None = None
        if "=" in key:
            key, value = key.split("=", 1)
        param = manifest.parameters.get(key)
        if value is None:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if param is not None and param.type == "bool" and (nxt is None or nxt.startswith("--")):
                value = "true"
            elif nxt is None:
                raise InvalidInput(f"parameter {key!r} needs a value")
            else:
                value = nxt
                i += 1
        out[key] = value
        i += 1
    return out
