"""The chat page ``pie serve`` answers ``GET /`` with: one self-contained HTML file
(``chat/index.html``: no external asset, so it works offline) that talks to this server's own
``/v1/models`` and ``/v1/chat/completions`` with the token the user pastes (kept in the
browser's ``localStorage``, never sent anywhere else).

The page is public, like ``/health``: it holds no secret, and every request it makes goes
through the API's own authentication. Its Content-Security-Policy allows exactly its inline
script and style (by hash) and connections to this origin, nothing else.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path

__all__ = ["chat_page"]

_PAGE = Path(__file__).resolve().parent / "chat" / "index.html"


def _hashes(html: str, tag: str) -> str:
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.S)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)


@functools.cache
def chat_page() -> tuple[bytes, list[tuple[str, str]]]:
    """The page and the headers it is served with (its CSP names its inline blocks by hash)."""
    html = _PAGE.read_text(encoding="utf-8")
    csp = (f"default-src 'none'; script-src {_hashes(html, 'script')}; style-src {_hashes(html, 'style')}; "
           "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    headers = [("content-security-policy", csp), ("x-content-type-options", "nosniff"),
               ("referrer-policy", "no-referrer"), ("cache-control", "no-cache")]
    return html.encode("utf-8"), headers
