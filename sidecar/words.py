"""A cron expression in words, for ``check`` and ``status``: pure, English only.

``describe("0 9 * * 1#2")`` is ``"at 09:00 on the second Monday of the month"``.
It covers what ``sidecar.schedule`` accepts (5 or 6 fields, names, ranges,
steps, lists, ``L``, ``LW``, ``5L``, ``#``); what it cannot say neatly it says
field by field, never wrongly. The times are wall times in the job's timezone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.calendar import Calendar

_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_NTH = {"1": "first", "2": "second", "3": "third", "4": "fourth", "5": "fifth"}
_MONTH_NAMES = {m[:3].upper(): str(i + 1) for i, m in enumerate(_MONTHS)}
_DAY_NAMES = {d[:3].upper(): str(i) for i, d in enumerate(_DAYS[:7])}


def describe(expr: str) -> str:
    """The expression in words (wall time of the job's timezone)."""
    parts = expr.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    if len(parts) != 6:
        return expr
    sec, minute, hour, dom, month, dow = (_names(p) for p in parts)
    when = _time(sec, minute, hour)
    days = _days(dom, dow)
    if days == "every day" and not when[3:4].isdigit():
        days = ""  # "every 5 minutes", not "every 5 minutes every day"
    months = "" if month == "*" else f"in {_list(month, _month)}"
    return " ".join(p for p in (when, days, months) if p)


def _names(part: str) -> str:
    out = part.upper()
    for names in (_MONTH_NAMES, _DAY_NAMES):
        for name, number in names.items():
            out = out.replace(name, number)
    return out


def _plain(field: str) -> bool:
    return field.isdigit()


def _time(sec: str, minute: str, hour: str) -> str:
    seconds = "" if sec == "0" else sec
    if _plain(minute) and _plain(hour) and (not seconds or _plain(seconds)):
        return f"at {_clock(hour, minute, seconds)}"
    if _plain(minute) and _all_plain(hour) and not seconds:
        times = [_clock(h, minute, "") for h in hour.split(",")]
        return "at " + _and(times)
    if _plain(minute) and not seconds and hour != "*":
        return f"at minute {minute} of {_unit(hour, 'hour')}"
    pieces = []
    if seconds:
        pieces.append(_unit(seconds, "second"))
    if minute != "*" or not seconds:
        pieces.append(_unit(minute, "minute"))
    if hour != "*":
        pieces.append(_unit(hour, "hour", past=True))
    return ", ".join(pieces)


def _clock(hour: str, minute: str, sec: str) -> str:
    text = f"{int(hour):02d}:{int(minute):02d}"
    return f"{text}:{int(sec):02d}" if sec else text


def _all_plain(field: str) -> bool:
    return all(p.isdigit() for p in field.split(",")) and field.count(",") < 4


def _unit(field: str, unit: str, past: bool = False) -> str:
    """``*/5`` -> every 5 minutes; ``7`` -> at minute 7; ``9-17`` -> hours 9 through 17."""
    if field == "*":
        return f"every {unit}"
    if field.startswith("*/"):
        return f"every {field[2:]} {unit}s"
    if field.isdigit():
        return (
            f"every hour at minute {field}"
            if unit == "minute"
            else (f"at {unit} {field}" if not past else f"during hour {field}")
        )
    what = _list(field, str)
    return f"{unit}s {what}" if not past else f"during hours {what}"


def _list(field: str, name: object) -> str:
    """A field's list, ranges and steps in words, each value through ``name``."""
    namer = name if callable(name) else str
    out = []
    for item in field.split(","):
        step = ""
        if "/" in item:
            item, n = item.split("/", 1)
            step = f" (every {n})"
        if "-" in item:
            a, b = item.split("-", 1)
            out.append(f"{namer(a)} through {namer(b)}{step}")
        elif item == "*":
            out.append(f"every one{step}")
        else:
            out.append(f"{namer(item)}{step}")
    return _and(out)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _month(value: str) -> str:
    return _MONTHS[int(value) - 1] if value.isdigit() and 1 <= int(value) <= 12 else value


def _day(value: str) -> str:
    return _DAYS[int(value)] if value.isdigit() and 0 <= int(value) <= 7 else value


def _days(dom: str, dow: str) -> str:
    on_dom = _dom(dom)
    on_dow = _dow(dow)
    if dom == "*" and dow == "*":
        return "every day"
    if dom.startswith("*") or dow.startswith("*"):
        # Debian cron: the other field alone decides (AND with "*").
        return " and ".join(p for p in (on_dom if dom != "*" else "", on_dow) if p) or on_dom
    return f"{on_dom} or {on_dow}"  # both restricted: either matches


def _dom(dom: str) -> str:
    if dom == "*":
        return ""
    if dom == "L":
        return "on the last day of the month"
    if dom == "LW":
        return "on the last weekday of the month"
    if dom.startswith("*/"):
        return f"on every {_ordinal(dom[2:])} day of the month"
    return f"on day {_list(dom, str)} of the month"


def _ordinal(n: str) -> str:
    suffix = {"1": "st", "2": "nd", "3": "rd"}.get(n[-1:], "th")
    return n + ("th" if n[-2:-1] == "1" else suffix)


def _dow(dow: str) -> str:
    if dow == "*":
        return ""
    if "#" in dow and "," not in dow:
        day, nth = dow.split("#", 1)
        return f"on the {_NTH.get(nth, nth + 'th')} {_day(day)} of the month"
    if dow.endswith("L") and dow[:-1].isdigit():
        return f"on the last {_day(dow[:-1])} of the month"
    if dow == "1-5":
        return "on weekdays (Monday through Friday)"
    return f"on {_list(dow, _day)}"


def schedule_lines(calendar: Calendar) -> list[str]:
    """``check``'s and ``status``'s lines for a job's calendar: each expression in
    words, the spread offset, the exclusions, what the reference backend cannot run."""
    lines = [f"schedule {expr!r}: {describe(expr)}" for expr in calendar.exprs]
    if calendar.spread:
        lines.append(
            f"spread {calendar.spread:g}s: every slot {calendar.offset_ms // 1000}s later "
            "(from the job name)"
        )
    lines += [f"excluded: {e.text}" for e in calendar.exclusions]
    if found := calendar.unportable():
        lines.append(
            f"uses {', '.join(found)}: a scheduler of the reference backend sharing the "
            "stream cannot run this job"
        )
    return lines
