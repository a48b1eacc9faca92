"""The app's answer under each run, as ``history --output`` shows it.

The answer was written by the app and read back from the stream: hostile
twice over. Every line goes through `printable` (controls, bidi overrides and
invisible characters shown escaped), and a binary answer is shown as the
base64 the record holds, never as raw bytes.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from sidecar.cli.output import printable, runs_table
from sidecar.core.excerpt import excerpt_bytes
from sidecar.store.runs import Run

__all__ = ["answer_lines", "runs_with_output"]

INDENT = "    "
# A base64 line is broken every this many characters.
BASE64_LINE = 76


def answer_lines(run: Run) -> list[str]:
    """What the record kept of the app's answer to `run`, indented; [] when none."""
    if run.answer is None:
        return []
    ctype = printable(run.answer_type) if run.answer_type else "no content type"
    size = len(excerpt_bytes(run.answer, run.answer_base64))
    what = f"first {size} bytes" if run.answer_cut else f"{size} bytes"
    if run.answer_base64:
        head = f"{INDENT}answer ({ctype}, {what}, binary, base64):"
        text = run.answer
        body = [text[i : i + BASE64_LINE] for i in range(0, len(text), BASE64_LINE)]
    else:
        head = f"{INDENT}answer ({ctype}, {what}):"
        body = run.answer.split("\n")
        if body and body[-1] == "":
            body.pop()
    lines = [head, *(f"{INDENT}| {printable(line)}" for line in body)]
    if run.answer_cut:
        lines.append(f"{INDENT}| ... (cut)")
    return lines


def runs_with_output(runs: list[Run], tz: ZoneInfo) -> list[str]:
    """The runs' table with each run's answer under its row."""
    table = runs_table(runs, tz)
    out = table[:1]
    for run, row in zip(runs, table[1:], strict=True):
        out.append(row)
        out.extend(answer_lines(run))
    return out
