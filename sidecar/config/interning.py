"""Equal frozen settings shared by the jobs that have them (issue 49).

100,000 jobs of a few kinds hold a few retry, cancel, claim and answer objects,
a calendar per distinct schedule and a header map per distinct set, not one of
each per job. Every table is bounded: a full one forgets its oldest entry.
"""

from __future__ import annotations

from typing import Any, TypeVar

_T = TypeVar("_T")
# Equal small settings (retry, cancel, claim, answer) shared by every job that has
# them: 100,000 jobs of a few kinds hold a few objects, not 100,000 (issue 49).
SHARED: dict[object, object] = {}
SHARED_MAX = 4096


# The calendars apart: thousands of distinct schedules (a minute per tenant) must not
# fill the small settings' table.
CALENDARS: dict[object, object] = {}


def interned(value: _T, table: dict[object, object] = SHARED) -> _T:
    """`value`, or an equal one made before (frozen, so sharing changes nothing)."""
    try:
        kept = table.get(value)
    except TypeError:  # not hashable
        return value
    if kept is not None:
        return kept  # type: ignore[return-value]
    keep(table, value, value)
    return value


def keep(table: dict[Any, Any], key: object, value: object) -> None:
    """Keep `value` under `key`; a full table first forgets its oldest entry.

    Not "stop keeping once full": a sidecar whose jobs changed over weeks would
    then share nothing new, and what a job shares would depend on what came
    before it. A job keeps the object it was given either way.
    """
    if len(table) >= SHARED_MAX:
        del table[next(iter(table))]
    table[key] = value
