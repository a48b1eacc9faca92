"""Signing in to the fleet page: the sign-in form carries a CSRF token like every
form, and a POST without it is refused whether or not it comes with an Origin
(curl sends none). Run against the page of a real, unstarted daemon."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from sidecar.admin.server import Answer, Request
from sidecar.admin.sessions import SESSION_TTL
from sidecar.cli.daemon import Daemon
from sidecar.config.load import Secrets, parse_config

TOKEN = "s3cret-token-for-the-page-0123"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def daemon(tmp_path: Path) -> Daemon:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{TOKEN}\n")
    config = parse_config(
        {
            "nats": {"servers": "nats://127.0.0.1:1"},
            "admin": {"token_file": str(tokens)},
            "jobs": [{"name": "a", "schedule": "* * * * *"}],
        },
        {},
    )
    d = Daemon(config, Secrets())
    assert d.page is not None
    d.page.tokens.load()
    return d


async def call(d: Daemon, method: str, path: str, body: str = "", **headers: str) -> Answer:
    assert d.page is not None
    answer = await d.page(
        Request(
            method,
            path,
            headers={"host": "side:9464", "content-type": FORM, **headers},
            body=body.encode(),
        )
    )
    assert isinstance(answer, Answer)
    return answer


def csrf_of(html: bytes) -> str:
    found = re.search(
        rb'action="/login"[^>]*><input type="hidden" name="csrf" value="([^"]+)"', html
    )
    assert found, html[:2000]
    return found[1].decode()


def cookie_of(answer: Answer) -> str:
    return dict(answer.headers)["Set-Cookie"].split(";")[0]


async def test_sign_in_needs_the_forms_csrf_token_with_or_without_origin(daemon: Daemon) -> None:
    plain = f"token={TOKEN}"
    # curl: no Origin, no CSRF field: refused (was signed in).
    refused = await call(daemon, "POST", "/login", plain)
    assert refused.status == 403 and b"CSRF" in refused.body, refused
    # A browser of this host without the field, or with a forged or expired one: refused.
    assert (await call(daemon, "POST", "/login", plain, origin="http://side:9464")).status == 403
    forged = f"{int(time.time()) + 60}.{'0' * 32}"
    assert (await call(daemon, "POST", "/login", f"{plain}&csrf={forged}")).status == 403
    # The form's own token signs in, from curl or from this host's page.
    page = await call(daemon, "GET", "/jobs/a")
    token = csrf_of(page.body)
    expires = int(token.split(".")[0])
    assert time.time() < expires <= time.time() + SESSION_TTL + 1
    signed = await call(daemon, "POST", "/login", f"{plain}&csrf={token}")
    assert signed.status == 303, signed
    same = await call(daemon, "POST", "/login", f"{plain}&csrf={token}", origin="http://side:9464")
    assert same.status == 303, same
    # Another site's page with a good token: still refused by its Origin.
    other = await call(daemon, "POST", "/login", f"{plain}&csrf={token}", origin="http://evil")
    assert other.status == 403
    # A wrong token with the form's CSRF token: refused as before, with a form to retry.
    wrong = await call(daemon, "POST", "/login", f"token=not-the-token-at-all&csrf={token}")
    assert wrong.status == 401 and csrf_of(wrong.body)


async def test_sign_out_needs_the_sessions_csrf_token(daemon: Daemon) -> None:
    page = await call(daemon, "GET", "/jobs/a")
    signed = await call(daemon, "POST", "/login", f"token={TOKEN}&csrf={csrf_of(page.body)}")
    cookie = cookie_of(signed)
    assert (await call(daemon, "POST", "/logout", "", cookie=cookie)).status == 403
    mine = await call(daemon, "GET", "/jobs/a", cookie=cookie)
    found = re.search(
        rb'action="/logout"[^>]*><input type="hidden" name="csrf" value="([^"]+)"', mine.body
    )
    assert found, mine.body[:2000]
    out = await call(daemon, "POST", "/logout", f"csrf={found[1].decode()}", cookie=cookie)
    assert out.status == 303 and "Max-Age=0" in dict(out.headers)["Set-Cookie"]
