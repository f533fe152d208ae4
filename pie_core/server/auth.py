"""Users and their tokens, kept in the config file as SHA-256 hashes (never the tokens).

``[auth.users.<name>]`` holds ``token_sha256`` and ``created``. Tokens are random
(``secrets.token_urlsafe``), shown once by ``pie auth add`` and then only their hash exists.
An :class:`Authenticator` built from the config file re-reads the user table when the file
changes, so ``pie auth add``/``remove`` take effect on a running server's next connection.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tomlkit.toml_document import TOMLDocument

from pie_core import config as cfg
from pie_core.errors import InvalidInput, NotFound, PieError

__all__ = ["User", "Authenticator", "AuthError", "add_user", "remove_user", "list_users", "hash_token", "metrics_id",
           "LOCAL_USER"]

log = logging.getLogger("pie.server")

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


def metrics_id(user: User) -> str:
    """The label ``/metrics`` gives ``user``: derived from its token's hash, so a scrape names no
    one (any user's token may read ``/metrics``); ``pie auth list`` shows whose it is."""
    return "u-" + hashlib.sha256(b"pie-metrics\0" + user.token_sha256.encode()).hexdigest()[:10]


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


def _file_stamp(path: Path | None) -> tuple[int, int, int] | None:
    """What changes when the file is rewritten (``save_config`` renames a new file over it)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class Authenticator:
    """Checks tokens against the configured users (or lets everyone in as ``local``).

    Built with ``source`` (as :meth:`from_config` does), it stats that file on each check and
    reloads the users when its modification time, size or inode changed; a file that no
    longer parses keeps the last good table (and logs a warning).
    """

    def __init__(self, users: list[User], *, enabled: bool = True, source: str | Path | None = None) -> None:
        self.enabled = enabled
        self._users = list(users)
        self._source = Path(source) if source is not None else None
        self._stamp = _file_stamp(self._source)
        self._salt = secrets.token_bytes(16)  # pseudonyms of users no longer configured

    @property
    def user_count(self) -> int:
        self._refresh()
        return len(self._users)

    @classmethod
    def from_config(cls, config: TOMLDocument | None = None, *, enabled: bool = True,
                    path: str | Path | None = None) -> Authenticator:
        """Users from ``config`` (a fixed table), or else from the config file, followed as it changes.

        Args:
            config: A loaded document; its users never change.
            enabled: False lets everyone in as :data:`LOCAL_USER`.
            path: The file to follow when ``config`` is None (default: the config file).

        Raises:
            InvalidInput: The config file is not valid TOML (at construction only).
        """
        if config is not None:
            return cls(list_users(config), enabled=enabled)
        source = Path(path) if path is not None else cfg.config_path()
        stamp = _file_stamp(source)  # before reading, so a write in between is seen on the next check
        auth = cls(list_users(cfg.load_config(source)), enabled=enabled, source=source)
        auth._stamp = stamp
        return auth

    def _refresh(self) -> None:
        """Reload the users when the source file changed since the last look."""
        if self._source is None or not self.enabled:
            return
        stamp = _file_stamp(self._source)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            users = list_users(cfg.load_config(self._source))
        except (InvalidInput, OSError) as exc:
            log.warning("auth: keeping the previous %d users; could not reload %s: %s", len(self._users), self._source, exc)
            return
        if [u.name for u in users] != [u.name for u in self._users]:
            log.info("auth: users reloaded from %s: %s", self._source, ", ".join(u.name for u in users) or "none")
        self._users = users

    def pseudonym(self, name: str) -> str:
        """How ``/metrics`` labels the user ``name`` (:func:`metrics_id`; with authentication off,
        the one user's own name)."""
        if not self.enabled:
            return name
        self._refresh()
        for user in self._users:
            if user.name == name:
                return metrics_id(user)
        return "u-" + hashlib.sha256(self._salt + name.encode()).hexdigest()[:10]

    def check(self, token: str | None) -> str:
        """The user ``token`` belongs to.

        Raises:
            AuthError: No token, or one that matches no user.
        """
        if not self.enabled:
            return LOCAL_USER
        if not token:
            raise AuthError("authentication required: send an 'auth' request with your token (see 'pie auth add')")
        self._refresh()
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
