"""Who is signed in to the fleet page: session cookies and CSRF tokens.

``/login`` takes a token of ``admin.token_file`` and gives a cookie that names
the token (never holds it), expires after ``SESSION_TTL`` and is signed with
a key made at start, so a restart signs everyone out; a name removed from the
file signs its sessions out at their next request. A form's CSRF token is
the session cookie signed again; the sign-in form's, made before there is a
session, an expiry signed; a browser's ``Origin`` must be this host.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

from sidecar.admin.server import Request
from sidecar.admin.tokens import TokenFile

SESSION_TTL = 12 * 3600
COOKIE = "anarchon_session"


class Sessions:
    """Signed session cookies naming a token of ``tokens``."""

    def __init__(self, tokens: TokenFile) -> None:
        self.tokens = tokens
        self._key = secrets.token_bytes(32)

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()[:32]

    def _cookie(self, req: Request) -> str | None:
        for part in req.headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    def who(self, req: Request) -> str | None:
        """The token name of a valid session cookie, else None."""
        cookie = self._cookie(req)
        if not cookie or not self.tokens.enabled:
            return None
        try:
            raw_name, expires, sig = cookie.split("|")
            name = base64.urlsafe_b64decode(raw_name.encode()).decode()
            alive = int(expires) > time.time()
        except ValueError:
            return None
        ok = hmac.compare_digest(sig, self._sign(f"{raw_name}|{expires}"))
        if not (ok and alive):
            return None
        self.tokens.who("")  # re-reads a changed file: a removed name signs out
        return name if name in self.tokens.tokens else None

    def csrf(self, req: Request) -> str:
        """The CSRF token of the request's session: its cookie, signed again."""
        return self._sign("csrf|" + (self._cookie(req) or ""))

    def login_csrf(self) -> str:
        """The sign-in form's CSRF token (no session yet): signed, good for SESSION_TTL."""
        expires = str(int(time.time()) + SESSION_TTL)
        return f"{expires}.{self._sign('login|' + expires)}"

    def login_csrf_ok(self, given: str) -> bool:
        """Whether `given` is a sign-in CSRF token of this process, not expired."""
        expires, _, sig = given.partition(".")
        if not expires.isdigit() or int(expires) <= time.time():
            return False
        return hmac.compare_digest(sig, self._sign("login|" + expires))

    @staticmethod
    def same_origin(req: Request) -> bool:
        """Whether a browser's ``Origin`` is this host (no ``Origin``: not a browser)."""
        origin = req.headers.get("origin")
        if origin is None:  # not a browser (curl): the CSRF token still has to match
            return True
        host = req.headers.get("host", "")
        return origin.split("://", 1)[-1] == host

    def set_cookie(self, name: str) -> str:
        """The ``Set-Cookie`` value of a new session for the token called ``name``."""
        raw = base64.urlsafe_b64encode(name.encode()).decode()
        expires = str(int(time.time()) + SESSION_TTL)
        value = f"{raw}|{expires}|{self._sign(f'{raw}|{expires}')}"
        return f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_TTL}"

    @staticmethod
    def clear_cookie() -> str:
        """The ``Set-Cookie`` value that ends the session."""
        return f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
