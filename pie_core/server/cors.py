"""Which web pages may call the HTTP API from a browser (CORS), and what a browser is told.

By default no origin may: a request carrying an ``Origin`` header (browsers send one on every
cross-origin call, and on every POST) is refused with a 403 from its head, before any body byte
is read, so a page a user happens to visit cannot make the user's browser spend this server's
compute (on a loopback ``--no-auth`` server there is no token to stop it). Clients that are not
browsers send no ``Origin`` and are not affected.

The one page allowed without a list is the server's own chat page (``GET /``): a request whose
``Origin`` names the very host it was sent to (``Host``) comes from a page this server served.
``Host`` is the browser's, so a page reaching the server under a name its author controls
(DNS rebinding) also looks same-origin; such a page holds no token, so a same-origin name is
trusted only when authentication is on, or when it is an IP address or ``localhost``, which DNS
rebinding cannot produce.

``[server] cors_origins`` in ``~/.pie/config.toml`` lists the origins allowed, exactly
(``"https://app.example.com"``, scheme, host and port), or ``"*"`` for every origin. Allowed
requests get ``Access-Control-Allow-Origin``; preflights (``OPTIONS`` with
``Access-Control-Request-Method``) get a 204 naming the methods and headers allowed. Credentials
(cookies) are never allowed: the API authenticates with ``Authorization: Bearer``, which a page
must hold and send itself, so allowing an origin does not let it act as a user it has no token of.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pie_core import config as cfg
from pie_core.errors import InvalidInput
from pie_core.server.http import HttpRefusal, HttpRequest, error_json

__all__ = ["CorsPolicy", "same_origin"]

_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+")
_HEADER_LIST = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")
_DEFAULT_HEADERS = "authorization, content-type"
MAX_AGE_S = 600


def _literal_host(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if name.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def same_origin(request: HttpRequest, *, trust_names: bool) -> bool:
    """Whether the request's ``Origin`` is the server itself as the browser addressed it
    (its host and port equal ``Host``); by name only when ``trust_names`` (authentication on),
    else only for an IP address or ``localhost`` (see the module docstring)."""
    origin, host = request.headers.get("origin"), request.headers.get("host")
    if not origin or not host:
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.strip().lower():
        return False
    return trust_names or _literal_host(host.strip())


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """Origins allowed to call the HTTP API from a browser.

    Attributes:
        origins: Exact origins (``scheme://host[:port]``, compared case-insensitively), or
            ``("*",)`` for any. Empty (the default): no browser page may call the API.
    """

    origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for origin in self.origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise InvalidInput(f"server.cors_origins: {origin!r:.80} is not an origin like 'https://app.example.com' "
                                   "(scheme and host, optional port, no path) or '*'")

    @classmethod
    def from_config(cls, config: Any = None) -> CorsPolicy:
        """The policy of ``[server] cors_origins`` (a list of strings; default none).

        Raises:
            InvalidInput: Not a list of origins.
        """
        value = cfg.get("server.cors_origins", config, default=[]) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidInput(f"server.cors_origins must be a list of origins like ['https://app.example.com'], got {value!r:.80}")
        return cls(tuple(v.rstrip("/").lower() if v != "*" else v for v in value))

    def allows(self, origin: str) -> bool:
        return "*" in self.origins or origin.lower().rstrip("/") in self.origins

    def headers(self, request: HttpRequest) -> list[tuple[str, str]]:
        """Response headers for a request whose origin is allowed (none otherwise)."""
        origin = request.headers.get("origin")
        if origin is None or not self.allows(origin):
            return []
        if "*" in self.origins:
            return [("access-control-allow-origin", "*")]
        return [("access-control-allow-origin", origin), ("vary", "Origin")]

    def check(self, request: HttpRequest, *, trust_names: bool = False) -> None:
        """Refuse a request from a disallowed origin (403); answer an allowed preflight (204).
        A same-origin request (see :func:`same_origin`) passes.

        Raises:
            HttpRefusal: The answer, given from the head alone.
        """
        origin = request.headers.get("origin")
        if origin is None or same_origin(request, trust_names=trust_names):
            return
        if not self.allows(origin):
            raise HttpRefusal(403, error_json(
                f"requests from web origin {origin!r:.100} are not allowed; the server's admin can list it in "
                "[server] cors_origins", "permission_error", None, "origin_not_allowed"))
        if request.method == "OPTIONS" and "access-control-request-method" in request.headers:
            asked = request.headers.get("access-control-request-headers", "").strip()
            allowed = asked if asked and len(asked) <= 1024 and _HEADER_LIST.fullmatch(asked) else _DEFAULT_HEADERS
            raise HttpRefusal(204, b"", "text/plain", [
                *self.headers(request),
                ("access-control-allow-methods", "GET, POST, OPTIONS"),
                ("access-control-allow-headers", allowed),
                ("access-control-max-age", str(MAX_AGE_S)),
            ])
