"""Reading raw config input: durations first, and every other schema-free check.

``sidecar.config.load`` knows the schema (which keys, which rules); this module
knows single values and files. Each check takes a raw YAML value and its
key's path and returns the normalised value or raises :class:`ConfigError`
naming that key. Here too: :class:`Section` (a map with its allowed keys)
and ``read_file`` (secret files, never echoed); URLs, subjects and listen
addresses are ``sidecar.config.addresses``'s, the config file's YAML
``sidecar.config.yamlfile``'s.

A duration is a string with units, largest first, each at most once
(``250ms``, ``2s``, ``5m``, ``1h``, ``1m30s``, ``1.5s``), ASCII digits only,
or a plain integer meaning milliseconds. Everything else (negatives, floats without a unit,
bare numeric strings, booleans) is refused. Durations become float seconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar
from zoneinfo import ZoneInfo

from sidecar.core.errors import ConfigError

_T = TypeVar("_T")
_V = TypeVar("_V")

#: Ten years: far beyond any sensible timeout or window, and well inside
#: what JetStream's nanosecond fields and a float can hold exactly enough.
MAX_DURATION = 10 * 365 * 24 * 3600.0

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION_RE = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?"
    r"(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?"
    r"(?:(?P<s>\d+(?:\.\d+)?)s)?"
    r"(?:(?P<ms>\d+(?:\.\d+)?)ms)?",
    # ASCII digits only: \d and float() also take other scripts' digits (U+0663 U+0660 for 30m).
    re.ASCII,
)
_PLAIN_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_EXAMPLES = "e.g. 250ms, 2s, 5m, 1h, 1m30s, or an integer in milliseconds"


def parse_duration(value: object, key: str) -> float:
    """Return ``value`` as float seconds, or raise ``ConfigError(key, ...)``."""
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration ({_EXAMPLES}), got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, f"must not be negative, got {value}")
        if value > MAX_DURATION * 1000:  # exact int/float comparison, no overflow
            raise ConfigError(key, f"too long: at most {format_duration(MAX_DURATION)}")
        return value / 1000
    if isinstance(value, float):
        raise ConfigError(key, "a number without a unit means milliseconds and must be whole")
    if not isinstance(value, str):
        raise ConfigError(key, f"expected a duration ({_EXAMPLES}), got {type_name(value)}")
    text = value.strip()
    match = _DURATION_RE.fullmatch(text)
    if not text or match is None:
        raise ConfigError(key, f"not a duration: {short(value)} ({_EXAMPLES})")
    seconds = sum(
        float(amount) * _UNITS[unit] for unit, amount in match.groupdict().items() if amount
    )
    if seconds > MAX_DURATION:
        raise ConfigError(key, f"too long: at most {format_duration(MAX_DURATION)}")
    return seconds


_WHOLE_RE = re.compile(r"\s*[+-]?[0-9]+\s*")


def whole(text: str) -> int:
    """``int(text)`` for ASCII digits only (int() also reads ``٣``); ValueError else."""
    if not _WHOLE_RE.fullmatch(text):
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)


def format_duration(seconds: float) -> str:
    """Render float seconds the way the config writes them (``1m30s``, ``250ms``)."""
    total_ms = round(seconds * 1000)
    if total_ms == 0:
        return "0s"
    parts = []
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    for amount, unit in ((hours, "h"), (minutes, "m"), (secs, "s"), (millis, "ms")):
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)


def type_name(value: object) -> str:
    """Describe a YAML value's type in the config's words ("a list", "a map", ...)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def key_text(name: object) -> str:
    """A map key as a path part: plain names as they are, anything else quoted."""
    if isinstance(name, str) and (
        (name.isidentifier() and name.isascii()) or _PLAIN_KEY_RE.fullmatch(name)
    ):
        return name  # an ASCII identifier (every key of the schema) is plain: no regex
    return short(name, 40)


def short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to one short line, for echoing a bad value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: ASCII control characters, which no name, path or header value may contain.
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
#: What hides or reorders the text around it when shown: C0 and C1 controls, bidi
#: marks, embeddings, overrides and isolates, zero-width and other invisible
#: format characters, line and paragraph separators. Output escapes them.
UNSHOWN_RE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\ufeff\ufff9-\ufffb]"
)
#: The longest reason of an operator's act (``--reason``, the page's, the API's).
MAX_REASON = 200
# Unicode categories refused in such text: controls, format characters (the bidi
# ones among them), surrogates, private use, line and paragraph separators.
_UNSHOWN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def shown_text(value: str, key: str, limit: int) -> str:
    """Text a person gives that others are shown (a reason, a job's id): at most
    `limit` characters and none that hides or reorders what is shown around it
    (a right-to-left override makes ``evil`` read ``live``); else ConfigError."""
    if len(value) > limit:
        raise ConfigError(key, f"at most {limit} characters, got {len(value)}")
    for char in value:
        if _unshown(char):
            raise ConfigError(
                key,
                f"no control, bidi or other invisible characters (U+{ord(char):04X} at "
                f"{value.index(char)})",
            )
    return value


def _unshown(char: str) -> bool:
    if char.isascii():  # of ASCII, only the controls are in those categories (Cc)
        return char < " " or char == "\x7f"
    # Its tables (about 0.1 MiB) loaded by the first such character, not at start.
    import unicodedata

    return unicodedata.category(char) in _UNSHOWN_CATEGORIES


_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def string(value: object, key: str) -> str:
    """A string; numbers and booleans are refused with a hint to quote them."""
    if not isinstance(value, str):
        hint = " (quote it)" if isinstance(value, int | float) else ""
        raise ConfigError(key, f"expected a string, got {type_name(value)}{hint}")
    return value


def boolean(value: object, key: str) -> bool:
    """``true`` or ``false``, nothing that merely looks like one."""
    if not isinstance(value, bool):
        raise ConfigError(key, f"expected true or false, got {type_name(value)}")
    return value


def headers(value: object, key: str) -> dict[str, str]:
    """A map of HTTP header names to string values; ``X-Anarchon-*`` is reserved."""
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected a map of header names to strings, got {type_name(value)}")
    result: dict[str, str] = {}
    for name, text in value.items():
        name_key = f"{key}.{key_text(name)}"
        if not isinstance(name, str) or not _HEADER_NAME_RE.fullmatch(name):
            raise ConfigError(name_key, "not a valid header name")
        if name.lower().startswith("x-anarchon-"):
            raise ConfigError(name_key, "X-Anarchon-* headers are reserved for the sidecar")
        if CONTROL_RE.search(string(text, name_key).replace("\t", "")):
            raise ConfigError(name_key, "header values must not contain control characters")
        result[name] = text
    return result


def zone(value: object, key: str) -> ZoneInfo:
    """An IANA timezone name as ``ZoneInfo``."""
    name = string(value, key)
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError):
        raise ConfigError(key, f"unknown timezone {short(name)} (use an IANA name)") from None


class Section:
    """A map of the config at ``path``, with its allowed keys checked.

    Keys in ``refused`` are errors with their own message, before the
    unknown-key check; a YAML null counts as a key not given.
    """

    refused: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, data: object, path: str, allowed: tuple[str, ...]) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(path or "config", f"expected a map, got {type_name(data)}")
        for key in data:
            if key in self.refused:
                raise ConfigError(self._join(path, key), self.refused[key])
            if key not in allowed:
                allowed_keys = ", ".join(allowed)
                raise ConfigError(self._join(path, key), f"unknown key; allowed: {allowed_keys}")
        self.data: dict[Any, Any] = data
        self.path = path

    @staticmethod
    def _join(path: str, name: object) -> str:
        name = key_text(name)
        return f"{path}.{name}" if path else name

    def key(self, name: str) -> str:
        """The full path of ``name`` in this section."""
        return self._join(self.path, name)

    def has(self, name: str) -> bool:
        """Whether ``name`` is given (a YAML null counts as not given)."""
        return self.data.get(name) is not None

    def get(self, name: str, default: _T, convert: Callable[[object, str], _V]) -> _V | _T:
        """``convert(value, key)`` of the value, or ``default`` when not given."""
        value = self.data.get(name)
        return default if value is None else convert(value, self.key(name))

    def text(self, name: str, default: _T) -> str | _T:
        """A string value, or ``default``."""
        return self.get(name, default, string)

    def duration(self, name: str, default: float, minimum_ms: int = 0) -> float:
        """A duration in float seconds, at least ``minimum_ms`` milliseconds."""
        seconds = self.get(name, default, parse_duration)
        if round(seconds * 1000) < minimum_ms:
            raise ConfigError(
                self.key(name), f"must be at least {format_duration(minimum_ms / 1000)}"
            )
        return seconds

    def integer(self, name: str, default: _T, low: int, high: int) -> int | _T:
        """An integer in ``low..high``, or ``default``."""

        def convert(value: object, key: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(key, f"expected a whole number, got {type_name(value)}")
            if not low <= value <= high:
                raise ConfigError(key, f"must be between {low} and {high}, got {value}")
            return value

        return self.get(name, default, convert)


#: The largest secret file (a password, a token list, a creds file): far more
#: than any needs; a path such as /dev/zero is refused, not read for ever.
MAX_SECRET_FILE = 1 << 20


def size_text(limit: int) -> str:
    """A byte limit in words: ``64 KiB``, ``16 MiB``."""
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def read_capped(path: str, limit: int, key: str, stdin: bool = False) -> bytes:
    """The bytes of the file `path` (``-`` with `stdin`: standard input), reading at
    most ``limit + 1`` of them: a larger file (or /dev/zero, a pipe that never ends)
    is ``ConfigError(key, ...)`` naming the limit. OSError as ``open`` raises it."""
    import sys

    stdin = stdin and path == "-"
    if stdin:
        data = sys.stdin.buffer.read(limit + 1)
    else:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    if len(data) > limit:
        where = "standard input" if stdin else path
        raise ConfigError(key, f"{where}: larger than {size_text(limit)}, the most it may be")
    return data


def read_file(path: str, key: str) -> bytes:
    """A (secret) file named by ``key``, without one trailing newline; never echoes content."""
    try:
        raw = read_capped(path, MAX_SECRET_FILE, key)
    except FileNotFoundError:
        raise ConfigError(key, f"file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(key, f"cannot read file {path}: {exc.strerror or exc}") from None
    raw = raw[:-2] if raw.endswith(b"\r\n") else raw.removesuffix(b"\n")
    if not raw:
        raise ConfigError(key, f"file {path} is empty")
    return raw


def read_text_file(path: str, key: str) -> str:
    """``read_file`` decoded as UTF-8."""
    try:
        return read_file(path, key).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(key, f"file {path} is not UTF-8 text") from None
