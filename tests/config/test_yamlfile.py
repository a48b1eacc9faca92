"""sidecar/config/yamlfile.py: the config's YAML, built directly when plain, by PyYAML otherwise.

The direct way must give exactly what ``yaml.load(text, Loader=_Loader)``
gives (values and their types) or the very same error, for any document.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import yamlfile
from sidecar.core.errors import ConfigError
from tests.support import examples


def typed(value: Any) -> Any:
    """The value with every type spelled out: 1, 1.0 and True differ."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    if isinstance(value, set):
        return ("set", sorted(map(repr, value)))
    return (type(value).__name__, value)


def pyyaml(text: str) -> Any:
    return yaml.load(text, Loader=yamlfile._Loader)


def outcome(load: Any, text: str) -> Any:
    try:
        return typed(load(text))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["yes", "no", "on", "null", "~", "0x1F", "0o17", "1_000", "1:30", "<<"])
    | st.dates()
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(scalars, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=examples(400), deadline=None, derandomize=True)
@given(data=documents, flow=st.sampled_from([None, True, False]))
def test_any_dumped_document_loads_as_pyyaml_loads_it(data: Any, flow: bool | None) -> None:
    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True)
    assert outcome(yamlfile.load, text) == outcome(pyyaml, text)


UNUSUAL = [
    "a: &x [1, 2]\nb: *x\n",  # an alias: one shared list
    "base: &b {x: 1}\njob:\n  <<: *b\n  y: 2\n",  # a merge key
    "a: !!set {x, y}\n",
    "a: !!omap [{x: 1}, {y: 2}]\n",
    "a: !!binary aGVsbG8=\n",
    "a: !!str 123\nb: !!int '5'\nc: !!float '1'\n",
    "a: 2026-12-04\nb: 2026-12-04T10:00:00Z\n",
    "'<<': quoted\nb: 1\n",
    "a: 1\nb: 2\na: 3\n",  # a duplicate key
    "jobs:\n- {name: a, name: b}\n",
    "'1': a\n1: b\n",  # the same text twice: refused, as before
    "? [1, 2]\n: x\n",  # a key that is a list
    "a: !custom 1\n",
    "a: &r [*r]\n",  # recursive
    "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n",
    "--- 1\n--- 2\n",  # two documents
    "",
    "# nothing\n",
    "just a string\n",
    "[1, {a: [2, {b: null}]}]\n",
    "a: .nan\nb: -.inf\nc: 0b101\nd: +12\n",
    "a: !!map {x: 1}\nb: !!seq [1]\n",
    "a: !!map 1\n",
    "x: {y: {z: [" + "[" * 200 + "]" * 200 + "]}}\n",
    "a: !!set x\n",  # PyYAML's constructors of these build in steps: never called here
    "a: !!omap x\n",
    "a: !!pairs x\n",
    "a: !!set\n",
    "? !!set x\n: 1\n",
    "a: !!int ''\n",  # PyYAML itself slips: IndexError
    "a: !!timestamp 2026-12-04\nb: !!null ''\nc: !!bool yes\n",
]


@pytest.mark.parametrize("text", UNUSUAL)
def test_every_unusual_document_loads_or_fails_as_pyyaml_decides(text: str) -> None:
    assert outcome(yamlfile.load, text) == outcome(pyyaml, text)


def test_a_shared_value_stays_shared() -> None:
    data = yamlfile.load("a: &x [1, 2]\nb: *x\n")
    assert isinstance(data, dict) and data["a"] is data["b"]


def test_a_plain_config_never_reaches_pyyamls_constructor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole point: maps, lists and scalars are built directly."""

    def refuse(*_: object) -> None:
        raise AssertionError("PyYAML's constructor was used")

    monkeypatch.setattr(yamlfile._Loader, "construct_document", refuse)
    monkeypatch.setattr(yamlfile._Loader, "construct_object", refuse)
    text = (
        "nats: {servers: ['nats://127.0.0.1:4222'], history_size: 100}\n"
        "jobs:\n- name: a\n  schedule: '*/5 * * * *'\n  jitter: 2s\n  catchup: none\n"
        "  retry: {max: 2}\n  enabled: yes\n  weight: 0.5\n  note: null\n"
        "  since: 2026-12-04\n"
    )
    assert yamlfile.load(text) == {
        "nats": {"servers": ["nats://127.0.0.1:4222"], "history_size": 100},
        "jobs": [
            {
                "name": "a",
                "schedule": "*/5 * * * *",
                "jitter": "2s",
                "catchup": "none",
                "retry": {"max": 2},
                "enabled": True,
                "weight": 0.5,
                "note": None,
                "since": dt.date(2026, 12, 4),
            }
        ],
    }


@pytest.mark.parametrize(
    ("text", "kind"),
    [("a: !!set x\n", "ValueError"), ("a: !!int ''\n", "IndexError"), ("a: [\n", "line 2")],
)
def test_any_error_of_the_yaml_is_a_config_error_naming_the_file(
    tmp_path: Path, text: str, kind: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        yamlfile.read_yaml(str(path))
    assert info.value.key == "config" and str(path) in info.value.message
    assert kind in info.value.message


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("    schedule: */5 * * * *\n", 'quote the cron line (a value starting with * must be '
         'quoted in YAML): schedule: "*/5 * * * *"'),
        ("    schedule: @daily\n", 'quote the cron line (a value starting with @ must be '
         'quoted in YAML): schedule: "@daily"'),
        ("    schedule:\n      - * * * * *  # every minute\n", 'quote the cron line (a value '
         'starting with * must be quoted in YAML): "* * * * *"'),
    ],
)  # fmt: skip
def test_an_unquoted_cron_line_is_told_to_be_quoted(tmp_path: Path, line: str, says: str) -> None:
    """`schedule: */5 * * * *` is YAML's alias syntax: the error says what to write
    (issue 51), not only the parser's words."""
    path = tmp_path / "c.yaml"
    path.write_text("jobs:\n  - name: sync\n" + line)
    with pytest.raises(ConfigError) as info:
        yamlfile.read_yaml(str(path))
    assert info.value.message.endswith(says), info.value.message
    assert f"{path}, line " in info.value.message


def test_another_yaml_error_gets_no_quoting_hint(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("jobs: [\n")
    with pytest.raises(ConfigError) as info:
        yamlfile.read_yaml(str(path))
    assert "quote" not in info.value.message
