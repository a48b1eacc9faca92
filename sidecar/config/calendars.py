"""``calendars:``: shared calendars named at the top of the config, and their use.

Each is ``{file: holidays.ics}`` (an iCalendar file, read here with a size cap,
a path relative to the config file's directory; sidecar/when/ics.py parses
it) or ``{dates: [...]}`` (what a job's ``exclude`` takes). A job names one in
its ``exclude`` as ``calendar:<name>`` (``resolve``), beside plain entries.
Errors name the key (``calendars.holidays-de.file: holidays.ics, line 12:
...``, ``jobs[1].exclude[0]: unknown calendar 'x'``). docs/SCHEDULES.md,
"Shared calendars".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import date, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from sidecar.config.fields import key_text, read_capped, short, string, type_name
from sidecar.config.keys import JOB_NAME, ConfigSection
from sidecar.core.errors import ConfigError, IcsError

if TYPE_CHECKING:  # loaded by the first ``calendars:`` entry (_shared), not by every start
    from sidecar.when.shared import Resolved, SharedCalendar

#: An ``exclude`` entry naming a shared calendar starts with it (sidecar/when/shared.py PREFIX).
PREFIX = "calendar:"
#: The largest calendar file: thirty years of a country's holidays take about 100 KiB.
MAX_CALENDAR_FILE = 1 << 20
#: At most this many entries in ``dates:``.
MAX_DATES = 10_000
_UTC = ZoneInfo("UTC")


def parse_calendars(data: object, base_dir: str | None) -> Mapping[str, SharedCalendar]:
    """The ``calendars:`` map; `base_dir`: the config file's directory (None: the cwd)."""
    if data is None:
        return MappingProxyType({})
    if not isinstance(data, dict):
        raise ConfigError(
            "calendars",
            f"expected a map of names to {{file: ...}} or {{dates: [...]}}, got {type_name(data)}",
        )
    out: dict[str, SharedCalendar] = {}
    shared = _shared()
    for name, raw in data.items():
        key = f"calendars.{key_text(name)}"
        if not isinstance(name, str) or not JOB_NAME.fullmatch(name):
            raise ConfigError(key, "a calendar name is letters, digits, _ and - only")
        sec = ConfigSection(raw, key, ("file", "dates"))
        if sec.has("file") == sec.has("dates"):
            raise ConfigError(key, "give either file (an iCalendar file) or dates (a list)")
        calendar = (
            _from_file(shared, name, sec.text("file", ""), sec.key("file"), base_dir)
            if sec.has("file")
            else _from_dates(shared, name, sec.data["dates"], sec.key("dates"))
        )
        out[name] = calendar
    return MappingProxyType(out)


def _shared() -> type[SharedCalendar]:
    """The shared calendar's class, its module loaded now: a config without
    ``calendars:`` never needs it (tests/cli/test_start_imports.py)."""
    from sidecar.when.shared import SharedCalendar

    return SharedCalendar


def _from_file(
    shared: type[SharedCalendar], name: str, file: str, key: str, base_dir: str | None
) -> SharedCalendar:
    if not file:
        raise ConfigError(key, "must not be empty")
    path = os.path.join(base_dir, file) if base_dir and not os.path.isabs(file) else file
    try:
        text = read_capped(path, MAX_CALENDAR_FILE, key).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(key, f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(key, f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(key, f"{path}: cannot read: {exc.strerror or exc}") from None
    # The iCalendar parser is loaded by the first calendar file, not by every start.
    from sidecar.when.ics import parse_ics

    try:
        events = parse_ics(text)
    except IcsError as exc:
        raise ConfigError(key, f"{path}, {exc}") from None
    calendar = shared(name, tuple(events), f"file {file}")
    try:
        calendar.resolve(_UTC)  # what no zone can make right (out of range)
    except (ValueError, OverflowError) as exc:
        raise ConfigError(key, f"{path}: {exc}") from None
    return calendar


def _from_dates(shared: type[SharedCalendar], name: str, raw: object, key: str) -> SharedCalendar:
    if not isinstance(raw, list):
        raise ConfigError(key, "expected a list of dates and ISO 8601 intervals, as exclude takes")
    if len(raw) > MAX_DATES:
        raise ConfigError(key, f"more than {MAX_DATES} entries")
    texts: list[str] = []
    for i, value in enumerate(raw):
        item = f"{key}[{i}]"
        # An unquoted 2026-12-24 is a YAML date: the same day as the string.
        if isinstance(value, date) and not isinstance(value, datetime):
            value = value.isoformat()
        text = string(value, item).strip()
        try:
            shared(name, (text,), "dates").resolve(_UTC)
        except ValueError as exc:
            raise ConfigError(item, str(exc)) from None
        texts.append(text)
    return shared(name, tuple(texts), "dates")


def is_reference(text: str) -> bool:
    """Whether an ``exclude`` entry names a shared calendar (``calendar:<name>``)."""
    return text.strip().startswith(PREFIX)


def resolve(text: str, key: str, calendars: Mapping[str, SharedCalendar], tz: ZoneInfo) -> Resolved:
    """The calendar an ``exclude`` entry names, in the job's zone `tz`."""
    name = text.strip().removeprefix(PREFIX).strip()
    calendar = calendars.get(name)
    if calendar is None:
        known = ", ".join(sorted(calendars)) or "none"
        raise ConfigError(key, f"unknown calendar {short(name)} (calendars: {known})")
    try:
        return calendar.resolve(tz)
    except (ValueError, OverflowError) as exc:
        raise ConfigError(key, f"calendar {name} in the job's timezone {tz.key}: {exc}") from None
