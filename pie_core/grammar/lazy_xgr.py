"""``xgr``: the ``xgrammar`` module, imported on first use.

xgrammar imports torch and transformers (about 2 s), and every inferlet imports the SDK, which
reaches this package; an inferlet that never constrains generation should not pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["xgr"]


class _OnFirstUse:
    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("xgrammar"), name)


if TYPE_CHECKING:
    import xgrammar as xgr
else:
    xgr = _OnFirstUse()
