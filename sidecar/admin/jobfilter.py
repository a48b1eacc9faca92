"""Which jobs a view shows: by name (``--job GLOB``), problems only, a page at a time.

A fleet of 100,000 jobs is not printed or sent whole (docs/CLI.md ``status``,
docs/ADMIN.md ``/?job=&problems=&after=``): ``status``, the fleet page and
``/api/v1/jobs`` pick the jobs by glob, keep only those with a problem when
asked, and send one page (in the config's order, then the bucket's) with the
name to go on after. Pure: it
reads the job objects of sidecar/admin/objects.py and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from sidecar.core.wire import FAILED_STATUSES

# A page of jobs when the caller names no --limit: what a terminal or a browser
# shows at once; MAX_LIMIT bounds what one request may ask for.
DEFAULT_LIMIT = 200
MAX_LIMIT = 10_000
# A glob is a job name's characters plus * ? [ ]: no more than a name's length bound.
MAX_GLOB = 200


@dataclass(frozen=True)
class Selection:
    """What a caller asked for: name globs (any matches; none: every job), problems
    only, at most `limit` jobs, those named after `after` (paging on)."""

    globs: tuple[str, ...] = ()
    problems: bool = False
    limit: int | None = DEFAULT_LIMIT
    after: str | None = None

    @property
    def narrowed(self) -> bool:
        """Whether some job may be left out by name or problem (not by paging)."""
        return bool(self.globs) or self.problems


def check_glob(glob: str) -> str:
    """`glob` as a name pattern, or ValueError saying why not."""
    if not glob or len(glob) > MAX_GLOB:
        raise ValueError(f"a job glob has 1 to {MAX_GLOB} characters")
    if any(not c.isprintable() or c.isspace() for c in glob):
        raise ValueError("a job glob has no spaces or control characters")
    return glob


def named(names: Iterable[str], globs: Sequence[str]) -> list[str]:
    """The names that match any of `globs` (all of them when none), in their order.

    Used before job objects are built: the cost of a view is its jobs', so a
    glob for ten tenants' jobs of 100,000 builds ten."""
    return [n for n in names if matches(n, globs)]


def matches(name: str, globs: Sequence[str]) -> bool:
    """Whether `name` matches any of `globs` (every name does when there is none)."""
    return not globs or any(fnmatchcase(name, g) for g in globs)


def problems(job: dict[str, Any], live: int = 1) -> list[str]:
    """What on-call would look at in job object `job`, in words; [] when nothing.
    `live`: how many instances are live (with none, no job is "run by none").

    A pause is operator intent, not a problem; a job that ended or has not
    started claims nothing on purpose."""
    out: list[str] = []
    fails = job.get("consecutive_failures") or 0
    last = job.get("last_run") or {}
    if fails:
        out.append(f"{fails} failed in a row")
    elif last.get("status") in FAILED_STATUSES:
        out.append(f"last run {last.get('status')}")
    if job.get("settings_differ"):
        out.append("settings differ between instances")
    if job.get("stream_problem"):
        out.append(str(job["stream_problem"]))
    if job.get("missed"):
        out.append("missed on an instance")
    quiet = job.get("ended") or job.get("not_started") or job.get("paused")
    if live and not quiet and job.get("run_by") == []:
        out.append("no live instance runs it")
    return out


def select(
    jobs: Sequence[dict[str, Any]], sel: Selection, live: int = 1
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The jobs `sel` shows, in the order given (the config file's, then the state
    bucket's), and what was left out: ``{"globs", "problems", "after", "matched",
    "shown", "next_after"}``. Each shown job gets its ``problems``.

    ``after`` goes on after that job in the same order; ValueError when no job
    of that name matches (removed since the page before).
    """
    chosen = [
        j
        for j in jobs
        if matches(str(j.get("name")), sel.globs) and (not sel.problems or problems(j, live))
    ]
    part, picked = page_of([str(j.get("name")) for j in chosen], sel)
    shown = [{**j, "problems": problems(j, live)} for j in chosen[part]]
    return shown, picked


def page_of(names: Sequence[str], sel: Selection) -> tuple[slice, dict[str, Any]]:
    """The page of `names` (those `sel` picked by glob and problem, in order) that
    `sel` shows, as a slice of them, and ``select``'s second value.

    The page (sidecar/admin/pagecache.py) picks names first and builds the
    objects of the shown ones only: at 100,000 jobs a page costs its 200.
    ValueError when ``after`` names no job among `names`.
    """
    start = 0
    if sel.after is not None:
        try:
            start = names.index(sel.after) + 1
        except ValueError:
            raise ValueError(
                f"after: no job {sel.after!r} among those picked (removed since?)"
            ) from None
    end = len(names) if sel.limit is None else min(len(names), start + sel.limit)
    more = end < len(names)
    return slice(start, end), {
        "globs": list(sel.globs),
        "problems": sel.problems,
        "after": sel.after,
        "matched": len(names),
        "shown": end - start,
        "next_after": names[end - 1] if more and end > start else None,
    }
