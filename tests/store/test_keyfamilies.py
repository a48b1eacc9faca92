"""The one table of state bucket key families: complete, documented, and read through.

A function anywhere in sidecar/ that makes a key of a family the table lacks
fails here, and so does a family that SECURITY.md does not list: no family
ships without its entry (issue 48).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sidecar.store.keyfamilies import BY_PREFIX, FAMILIES, family_of
from sidecar.store.state import View

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = ROOT / "sidecar"
PREFIX = re.compile(r"([a-z_]+)\.")


def key_prefixes() -> dict[str, str]:
    """Every key family sidecar/ makes keys of: prefix -> where.

    The key functions (``def <x>_key(...)`` returning ``f"<family>.{...}"``) and the
    named prefixes (``PREFIX = "job."``, atkey's ``KIND = "at"``)."""
    found: dict[str, str] = {}
    for path in sorted(SIDECAR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_key"):
                returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
                texts = [j for r in returns for j in ast.walk(r) if isinstance(j, ast.JoinedStr)]
                for joined in texts:
                    first = joined.values[0] if joined.values else None
                    text = first.value if isinstance(first, ast.Constant) else None
                    if isinstance(text, str) and (m := PREFIX.match(text)):
                        found[f"{m[1]}."] = f"{where}:{node.name}"
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                value = node.value.value
                if "PREFIX" in names and isinstance(value, str) and PREFIX.fullmatch(value):
                    found[value] = f"{where}:PREFIX"
                if "KIND" in names and where.endswith("atkey.py") and isinstance(value, str):
                    found[f"{value}."] = f"{where}:KIND"
    return found


def test_every_key_the_code_makes_is_of_a_family_in_the_table() -> None:
    found = key_prefixes()
    # The scan sees every family of the table (else it proves nothing, or the
    # table names a family nothing makes any more).
    assert set(found) >= set(BY_PREFIX), set(BY_PREFIX) - set(found)
    missing = {p: where for p, where in found.items() if p not in BY_PREFIX}
    assert not missing, f"key families without an entry in sidecar/store/keyfamilies.py: {missing}"


def test_each_family_names_an_existing_check_and_its_writers() -> None:
    assert len(BY_PREFIX) == len(FAMILIES)  # one entry a prefix
    for family in FAMILIES:
        module = family.check.split(":")[0]
        assert (ROOT / module).is_file(), (family.prefix, module)
        assert family.writers and set(family.writers) <= {"command", "lease", "sidecar"}
        assert family.shape.startswith(family.prefix)


def test_security_md_lists_every_family() -> None:
    text = (ROOT / "SECURITY.md").read_text()
    rows = set(re.findall(r"^\| `([a-z]+\.)[^`]*` \|", text, re.M))
    assert rows == set(BY_PREFIX), (rows ^ set(BY_PREFIX), "SECURITY.md's key family table")


def test_a_key_of_no_family_is_claimed_by_none() -> None:
    assert family_of("lock.a") is BY_PREFIX["lock."]
    assert family_of("run.a.1.2") is BY_PREFIX["run."]
    for key in ("foo.a", "lock.", "lock", "", "locks.a", ".a", "LOCK.a"):
        assert family_of(key) is None, key


def test_the_view_ignores_a_key_of_no_family_and_says_so_once_per_value() -> None:
    unknown: list[tuple[str, int]] = []
    changed: list[str] = []
    view = View(on_change=changed.append, on_unknown=lambda k, r: unknown.append((k, r)))
    view.apply("evil.a", b'{"slot": 1}', 1, False)
    view.apply("evil.a", None, 2, True)  # its delete: nothing to say
    view.apply("paused.a", b'{"by": "x"}', 3, False)
    assert unknown == [("evil.a", 1)]
    assert set(view.keys) == {"paused.a"} and changed == ["paused.a"]
    assert view.last_revision == 3
