"""An instant an operator types: an RFC 3339 time or a duration from now.

``--until`` (``pause``), ``--from``/``--to`` (``backfill``), ``at``'s time and
the page's and API's forms read it here, so that each says the same thing
about the same mistake. Pure (the duration rules are sidecar/config/fields.py's).
"""

from __future__ import annotations

from sidecar.config.fields import parse_duration
from sidecar.core.clock import INSTANT_RANGE, in_range, parse_instant, rfc3339
from sidecar.core.errors import ConfigError


def instant_of(text: str, now: float, back: bool = False) -> float:
    """An RFC 3339 time or a duration from now (``30m``, ``2h``), epoch s: ahead of
    `now`, or back from it when `back` (``backfill --from 2h``); a signed one
    (``-5m``, ``+1h``) says its way itself. Raises ValueError saying what it expected."""
    text = text.strip()
    sign = -1.0 if back else 1.0
    body = text
    if body[:1] in "+-" and _digit(body[1:2]):
        sign, body = (-1.0 if body[0] == "-" else 1.0), body[1:]
    at: float | None = None
    if _digit(body[:1]) and "T" not in body:
        try:
            at = now + sign * parse_duration(body, "")
        except ConfigError as exc:
            if exc.message.startswith("too long"):  # a duration, past the longest one
                raise ValueError(f"{text!r} is {exc.message}") from None
    if at is None:
        try:
            at = parse_instant(text)
        except ValueError as exc:
            if "out of range" in str(exc) or "no offset" in str(exc):
                raise
            way = "back from now" if back else "from now"
            raise ValueError(
                f"{text!r} is neither an RFC 3339 time (2026-12-24T08:00:00Z) "
                f"nor a duration {way} (30m, 2h)"
            ) from None
    if not in_range(at):
        raise ValueError(f"{text!r} is out of range: the sidecar names {INSTANT_RANGE}")
    return at


def _digit(char: str) -> bool:
    """An ASCII digit: str.isdigit() also takes other scripts' digits, which int() reads."""
    return char.isascii() and char.isdigit()


def until_of(text: str, now: float) -> float:
    """``--until``: an RFC 3339 time, or a duration from now (``30m``, ``2h``); epoch s.

    Raises ValueError saying what it expected; a time in the past, or one past
    the last instant the sidecar can name (9999-12-31T23:59:59.999Z), is refused.
    """
    at = instant_of(text, now)
    if at < now:
        raise ValueError(f"{text.strip()!r} is in the past ({rfc3339(at)})")
    if at == now:
        raise ValueError(f"{text.strip()!r} is not in the future ({rfc3339(at)})")
    return at
