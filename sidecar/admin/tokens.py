"""``admin.token_file``: who may act through the fleet page and its API.

The file holds one token, or several as ``name:token`` lines; a bare token is
named ``admin``. Blank lines and lines starting with ``#`` are ignored. The
name is what the fleet sees as the author of an action; the token itself is
never logged, shown or stored. The file is read again when it changes (a
rotated Kubernetes secret), and a file that turns unreadable keeps the tokens
read before, with one warning.
"""

from __future__ import annotations

import hmac
import logging
import os
import re

from sidecar.core.errors import ConfigError

log = logging.getLogger("sidecar.tokens")

KEY = "admin.token_file"
NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
MIN_TOKEN = 16


def parse_tokens(text: str) -> dict[str, str]:
    """name -> token; ConfigError naming ``admin.token_file`` for a bad line."""
    tokens: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = line.partition(":")
        if not sep:
            name, token = "admin", line
        name, token = name.strip(), token.strip()
        if not NAME.fullmatch(name):
            raise ConfigError(KEY, f"line {number}: a name is letters, digits, _ . @ - only")
        if len(token) < MIN_TOKEN:
            raise ConfigError(KEY, f"line {number}: a token needs at least {MIN_TOKEN} characters")
        if name in tokens:
            raise ConfigError(KEY, f"line {number}: the name {name!r} is given twice")
        tokens[name] = token
    if not tokens:
        raise ConfigError(KEY, "the file holds no token")
    return tokens


class TokenFile:
    """The tokens of ``admin.token_file``, or none at all (a read-only page)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.tokens: dict[str, str] = {}
        self._stamp: tuple[float, int] | None = None

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def load(self) -> None:
        """Read the file; ConfigError (exit 2 at start) when it cannot be used."""
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(KEY, f"cannot read {self.path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(KEY, f"file {self.path} is not UTF-8 text") from None
        self.tokens = parse_tokens(text)
        self._stamp = (st.st_mtime, st.st_size)

    def _refresh(self) -> None:
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
            if (st.st_mtime, st.st_size) != self._stamp:
                self.load()
                log.info("admin.token_file changed: %d token(s)", len(self.tokens))
        except (OSError, ConfigError) as exc:
            log.warning("admin.token_file: keeping the tokens read before: %s", exc)
            if self.path is not None:
                self._stamp = None

    def who(self, presented: str) -> str | None:
        """The name of `presented` when it is one of the tokens (constant time each)."""
        self._refresh()
        found = None
        for name, token in self.tokens.items():
            if hmac.compare_digest(token.encode(), presented.encode()):
                found = name
        return found
