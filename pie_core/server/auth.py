"""Users and their tokens, kept in the config file as SHA-256 hashes (never the tokens).

``[auth.users.<name>]`` holds ``token_sha256`` and ``created``. Tokens are random
(``secrets.token_urlsafe``), shown once by ``pie auth add`` and then only their hash exists.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tomlkit.toml_document import TOMLDocument

from pie_core import config as cfg
from pie_core.errors import InvalidInput, NotFound, PieError

__all__ = ["User", "Authenticator", "AuthError", "add_user", "remove_user", "list_users", "hash_token", "LOCAL_USER"]

LOCAL_USER = "local"
_USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class AuthError(PieError):
    """A missing or wrong token."""

    kind = "unauthorized"


@dataclass(frozen=True, slots=True)
class User:
    name: str
    token_sha256: str
    created: str = ""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def list_users(config: TOMLDocument | None = None) -> list[User]:
    """Every configured user, by name."""
    users = cfg.get("auth.users", config, default={}) or {}
    out = []
    for name, entry in users.items():
        if isinstance(entry, dict) and isinstance(entry.get("token_sha256"), str):
            out.append(User(name, entry["token_sha256"], str(entry.get("created", ""))))
    return sorted(out, key=lambda u: u.name)


def add_user(name: str, path: str | Path | None = None) -> str:
    """Create ``name`` (or give it a new token) and return the token; only its hash is saved.

    Raises:
        InvalidInput: A name with characters other than letters, digits, ``_ . -``.
    """
    if not _USER.fullmatch(name):
        raise InvalidInput(f"user names use letters, digits, '_', '.', '-' (up to 64), got {name!r}")
    token = f"pie_{secrets.token_urlsafe(32)}"
    doc = cfg.load_config(path)
    cfg.set(f'auth.users."{name}".token_sha256', hash_token(token), config=doc)
    cfg.set(f'auth.users."{name}".created', time.strftime("%Y-%m-%dT%H:%M:%S%z"), config=doc)
    cfg.save_config(doc, path)
    return token


def remove_user(name: str, path: str | Path | None = None) -> None:
    """Delete ``name`` and its token.

    Raises:
        NotFound: No such user (the message lists them).
    """
    doc = cfg.load_config(path)
    users: Any = doc.get("auth", {}).get("users", {})
    if name not in users:
        known = ", ".join(u.name for u in list_users(doc)) or "none"
        raise NotFound(f"no user {name!r}; users: {known}")
    del users[name]
    cfg.save_config(doc, path)


class Authenticator:
    """Checks tokens against the configured users (or lets everyone in as ``local``)."""

    def __init__(self, users: list[User], *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._users = list(users)

    @property
    def user_count(self) -> int:
        return len(self._users)

    @classmethod
    def from_config(cls, config: TOMLDocument | None = None, *, enabled: bool = True) -> Authenticator:
        return cls(list_users(config), enabled=enabled)

    def check(self, token: str | None) -> str:
        """The user ``token`` belongs to.

        Raises:
            AuthError: No token, or one that matches no user.
        """
        if not self.enabled:
            return LOCAL_USER
        if not token:
            raise AuthError("authentication required: send an 'auth' request with your token (see 'pie auth add')")
        digest = hash_token(token)
        for user in self._users:
            if hmac.compare_digest(user.token_sha256, digest):
                return user.name
        raise AuthError("the token matches no user; ask the server's admin for one ('pie auth add NAME')")

    def bearer(self, header: str | None) -> str:
        """The user of an HTTP ``Authorization: Bearer <token>`` header (see :meth:`check`)."""
        if not self.enabled:
            return LOCAL_USER
        if not header or not header.lower().startswith("bearer "):
            raise AuthError("authentication required: send 'Authorization: Bearer <token>'")
        return self.check(header[7:].strip())
