"""Where the files that ship beside the code are: the example inferlets and the WIT package.

In a source checkout (an editable install included) they are the checkout's ``examples/`` and
``wit/``; a wheel carries copies under ``pie_core/_bundled/`` (``setup.py`` puts them there).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["examples_dir", "wit_dir", "js_sdk_dir"]

_PACKAGE = Path(__file__).resolve().parent
_BUNDLED = _PACKAGE / "_bundled"
_CHECKOUT = _PACKAGE.parent


def _find(name: str) -> Path:
    bundled = _BUNDLED / name
    if bundled.is_dir():  # an installed wheel: never guess at what else sits in site-packages
        return bundled
    return _CHECKOUT / name


def examples_dir() -> Path:
    """The folder of the bundled example inferlets (one folder with a ``Pie.toml`` each)."""
    return _find("examples")


def wit_dir() -> Path:
    """The WIT package (``pie:inferlet``) the wasm runner builds against."""
    return _find("wit")


def js_sdk_dir() -> Path:
    """The JavaScript/TypeScript SDK, the npm package ``inferlet`` (``sdk/javascript``)."""
    return _find("sdk") / "javascript"
