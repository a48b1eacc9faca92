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

from sidecar.config.fields import MAX_SECRET_FILE, read_capped
from sidecar.core.errors import ConfigError

log = logging.getLogger(__name__)

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
        # What the file was when last read (or found unusable): read again when it changes.
        self._stamp: tuple[object, ...] | None = None

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _stamp_now(self) -> tuple[object, ...]:
        """The file's identity and version: a rotated secret (a new inode behind the
        same name), an edit (time, size); or the error that stat gives."""
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return ("error", exc.errno)
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self) -> None:
        """Read the file; ConfigError (exit 2 at start) when it cannot be used."""
        if self.path is None:
            return
        stamp = self._stamp_now()
        try:
            text = read_capped(self.path, MAX_SECRET_FILE, KEY).decode("utf-8")
        except OSError as exc:
            raise ConfigError(KEY, f"cannot read {self.path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(KEY, f"file {self.path} is not UTF-8 text") from None
        self.tokens = parse_tokens(text)
        self._stamp = stamp

    def _refresh(self) -> None:
        """Read the file again when it changed. A file that cannot be used keeps the
        tokens read before, said once per change of the file, not once per request:
        anyone who reaches the port can send requests."""
        if self.path is None:
            return
        stamp = self._stamp_now()
        if stamp == self._stamp:
            return
        try:
            self.load()
            log.info("admin.token_file changed: %d token(s)", len(self.tokens))
        except ConfigError as exc:
            self._stamp = stamp  # not again until the file changes
            log.warning("admin.token_file: keeping the tokens read before: %s", exc)

    def who(self, presented: str) -> str | None:
        """The name of `presented` when it is one of the tokens (constant time each)."""
        self._refresh()
        found = None
        for name, token in self.tokens.items():
            if hmac.compare_digest(token.encode(), presented.encode()):
                found = name
        return found
