"""Run parameters (sidecar/config/params.py): parsing, escaping and the config's checks.

Pure tables: what a text becomes for one run's values, where each value is
escaped as its place needs, and which texts are config errors (naming the key).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.admin.jobcheck import parse_bucket_job
from sidecar.config import params
from sidecar.config.load import ConfigError, JobConfig, parse_config
from tests.support import ROOT, run_cli

SLOT = 1_796_227_910_000
AT = "2026-12-02T16:11:50.000Z"
RUN = params.values("sync", SLOT, "5d8a0ddd", 2, "catchup", "web-1", AT)
# An instance id as odd as a value could be, to see each escaping at work.
ODD = {**RUN, "instance": 'a b/c?d&e=f#g%h"i\\j\r\nk\x7f'}


def job_of(request: dict[str, Any], **target: Any) -> JobConfig:
    config = parse_config(
        {
            "target": {"url": "http://127.0.0.1:8080", **target},
            "jobs": [{"name": "sync", "schedule": "* * * * *", "request": request}],
        },
        {},
    )
    return config.jobs[0]


def rendered(request: dict[str, Any], values: dict[str, str] = RUN, **target: Any) -> Any:
    return params.render_request(job_of(request, **target).request, values)


@pytest.mark.parametrize(
    ("text", "where", "out"),
    [
        ("/jobs/{job}/{slot}", params.PATH, f"/jobs/sync/{SLOT}"),
        ("/r/{scheduled_at}", params.PATH, f"/r/{AT}"),  # ':' is allowed in a segment
        ("/r?at={scheduled_at}&id={run_id}", params.PATH, f"/r?at={AT}&id=5d8a0ddd"),
        ("/r/{attempt}?t={trigger}&i={instance}", params.PATH, "/r/2?t=catchup&i=web-1"),
        ("/r/{{slot}}", params.PATH, "/r/{slot}"),  # the literal text
        ("/r/{{sloot}}/{", params.PATH, "/r/{sloot}/{"),  # any other brace as written
        ("run {run_id}", params.HEADER, "run 5d8a0ddd"),
        (
            '{"slot": {slot}, "at": "{scheduled_at}"}',
            params.BODY,
            f'{{"slot": {SLOT}, "at": "{AT}"}}',
        ),
        ('{"who": {instance}, "n": {attempt}}', params.BODY, '{"who": "web-1", "n": 2}'),
        (
            '{"a": {"b": [1, {}]}, "s": "{{job}}"}',
            params.BODY,
            '{"a": {"b": [1, {}]}, "s": "{job}"}',
        ),
        ("slot={slot}&at={scheduled_at}", params.BODY, f"slot={SLOT}&at={AT}"),
        ("plain {job} text { 1 } {}", params.BODY, "plain sync text { 1 } {}"),
    ],
)
def test_rendered_text(text: str, where: str, out: str) -> None:
    template = params.parse(text, where, "k")
    assert template is not None
    assert template.render(RUN) == out


@pytest.mark.parametrize(
    ("text", "where", "out"),
    [
        # A path segment and a query value: nothing that ends or splits them.
        ("/r/{instance}", params.PATH, "/r/a%20b%2Fc%3Fd%26e%3Df%23g%25h%22i%5Cj%0D%0Ak%7F"),
        ("/r?i={instance}", params.PATH, "/r?i=a%20b%2Fc%3Fd%26e%3Df%23g%25h%22i%5Cj%0D%0Ak%7F"),
        # A header value gains no CR, LF or other control character.
        ("x {instance}", params.HEADER, 'x a b/c?d&e=f#g%h"i\\j%0D%0Ak%7F'),
        # Inside a JSON string: that string's content, escaped as json.dumps does.
        ('{"i": "<{instance}>"}', params.BODY, '{"i": "<a b/c?d&e=f#g%h\\"i\\\\j\\r\\nk\\u007f>"}'),
        # Where a JSON value stands: a JSON string.
        ('{"i": {instance}}', params.BODY, '{"i": "a b/c?d&e=f#g%h\\"i\\\\j\\r\\nk\\u007f"}'),
        # Not JSON: as it is.
        ("i={instance}", params.BODY, 'i=a b/c?d&e=f#g%h"i\\j\r\nk\x7f'),
    ],
)
def test_each_value_is_escaped_for_where_it_stands(text: str, where: str, out: str) -> None:
    template = params.parse(text, where, "k")
    assert template is not None
    got = template.render(ODD)
    assert got == out
    if where == params.BODY and text.startswith("{"):
        assert json.loads(got)["i"].strip("<>") == ODD["instance"]


def test_a_text_without_placeholders_is_not_a_template() -> None:
    for text in ("/jobs/sync", '{"full": false}', "{", "}", "{}", '{"a":{"b":1}}'):
        assert params.parse(text, params.BODY, "k") is None, text
    job = job_of({"path": "/jobs/sync?x=1", "body": '{"full": false}', "headers": {"A": "b"}})
    assert job.request.params is False  # never rendered on the way out


@pytest.mark.parametrize(
    ("request_", "key", "words"),
    [
        ({"path": "/jobs/{sloot}"}, "jobs[0].request.path", "unknown placeholder {sloot}; known: "),
        ({"headers": {"X-At": "{ slot }"}}, "jobs[0].request.headers.X-At", "placeholder { slot }"),
        ({"body": '{"at": "{scheduled_at:%Y}"}'}, "jobs[0].request.body", "malformed placeholder"),
        ({"body": "{slot!r}"}, "jobs[0].request.body", "malformed placeholder {slot!r}"),
        ({"headers": {"X-Run": "{runid}"}}, "jobs[0].request.headers.X-Run", "unknown placeholder"),
        ({"query": {"at": "{when}"}}, "jobs[0].request.query.at", "unknown placeholder {when}"),
        ({"query": ["at"]}, "jobs[0].request.query", "expected a map"),
        ({"query": {"at": [1]}}, "jobs[0].request.query.at", "expected a string"),
    ],
)
def test_an_unknown_or_malformed_placeholder_is_a_config_error(
    request_: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        job_of(request_)
    assert caught.value.key == key and words in caught.value.message, caught.value
    if "unknown" in words:
        assert "{scheduled_at}, {slot}, {run_id}, {attempt}, {trigger}, {job}, {instance}" in (
            caught.value.message
        )


def test_a_target_header_is_named_by_its_own_key() -> None:
    with pytest.raises(ConfigError) as caught:
        job_of({}, headers={"X-Who": "{host}"})
    assert caught.value.key == "target.headers.X-Who", caught.value


def test_query_map_is_encoded_and_appended_to_the_path() -> None:
    query = {"since": "{scheduled_at}", "a b": "x&y {{run_id}}", "n": 3, "i": "{instance}"}
    job = job_of({"path": "/r/{slot}?x=1", "query": query})
    assert job.request.path == (
        "/r/{slot}?x=1&since={scheduled_at}&a%20b=x%26y%20%7Brun_id%7D&n=3&i={instance}"
    )
    got = params.render_request(job.request, ODD).path
    assert got == (
        f"/r/{SLOT}?x=1&since={AT}&a%20b=x%26y%20%7Brun_id%7D&n=3"
        "&i=a%20b%2Fc%3Fd%26e%3Df%23g%25h%22i%5Cj%0D%0Ak%7F"
    )
    assert job_of({"query": {"q": "1"}}).request.path == "/jobs/sync?q=1"


def test_the_whole_request_is_rendered_once_per_run() -> None:
    req = rendered(
        {
            "path": "/jobs/{job}/{slot}",
            "query": {"at": "{scheduled_at}"},
            "headers": {"X-Run": "{run_id}/{attempt}", "X-Plain": "{{run_id}}"},
            "body": '{"trigger": "{trigger}", "slot": {slot}, "instance": "{instance}"}',
        },
        headers={"X-From-Target": "{job}"},
    )
    assert req.params is False
    assert req.path == f"/jobs/sync/{SLOT}?at={AT}"
    assert dict(req.headers) == {
        "X-From-Target": "sync",
        "X-Run": "5d8a0ddd/2",
        "X-Plain": "{run_id}",
    }
    assert json.loads(req.body) == {"trigger": "catchup", "slot": SLOT, "instance": "web-1"}


def test_the_cancel_path_is_checked_and_marked() -> None:
    base = {"name": "r", "schedule": "* * * * *", "overlap": "replace"}
    config = parse_config({"jobs": [{**base, "cancel": {"path": "/cancel/{run_id}"}}]}, {})
    assert config.jobs[0].cancel.params and not config.jobs[0].request.params
    with pytest.raises(ConfigError) as caught:
        parse_config({"jobs": [{**base, "cancel": {"path": "/cancel/{run}"}}]}, {})
    assert caught.value.key == "jobs[0].cancel.path"


def test_values_carry_the_headers_formats() -> None:
    assert params.values("j", SLOT, "t", 1, None, "", AT) == {
        "scheduled_at": AT,
        "slot": str(SLOT),
        "run_id": "t",
        "attempt": "1",
        "trigger": "manual",  # where X-Anarchon-Trigger is not sent
        "job": "j",
        "instance": "",
    }


def test_a_bucket_job_gets_the_same_checks() -> None:
    config = parse_config({"jobs": [{"name": "keep", "schedule": "0 0 1 1 *"}]}, {})
    ok = parse_bucket_job(
        config, {"name": "t", "schedule": "* * * * *", "request": {"path": "/t/{slot}"}}, "job"
    )
    assert ok.job.request.params
    with pytest.raises(ConfigError) as caught:
        parse_bucket_job(
            config,
            {"name": "t", "schedule": "* * * * *", "request": {"body": "{sloot}"}},
            "job",
        )
    assert caught.value.key == "job.request.body" and "unknown placeholder" in caught.value.message


def test_check_refuses_an_unknown_placeholder_and_shows_a_rendered_path(tmp_path: Path) -> None:
    jobs = [
        {"name": "a", "schedule": "* * * * *"},
        {"name": "b", "schedule": "* * * * *"},
        {"name": "c", "schedule": "* * * * *", "request": {"path": "/c/{sloot}"}},
    ]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"instance_id": "web-1", "jobs": jobs}))
    bad = run_cli("check", "-c", str(cfg))
    assert bad.returncode == 2, bad
    assert "config error: jobs[2].request.path: unknown placeholder {sloot}; known: " in bad.stderr
    assert "Traceback" not in bad.stderr
    jobs[2]["request"] = {"path": "/c/{slot}", "query": {"by": "{instance}"}}
    cfg.write_text(yaml.safe_dump({"instance_id": "web-1", "jobs": jobs}))
    good = run_cli("check", "-c", str(cfg))
    assert good.returncode == 0, good.stderr
    line = next(x for x in good.stdout.splitlines() if "run parameters" in x)
    assert "e.g. for the next slot: POST /c/" in line and line.endswith("?by=web-1"), line


def test_the_trigger_doc_example_is_what_is_sent() -> None:
    doc = (ROOT / "docs" / "TRIGGER.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Run parameters") : doc.index("## Cancel requests")]
    config = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    request = yaml.safe_load(config)["request"]
    run = params.values("sync", SLOT, "5d8a0ddd930d5616b1e006bafbf38ed3", 1, "scheduled", "w", AT)
    req = params.render_request(job_of(request).request, run)
    head, body = shown.split("\n\n", 1)
    assert head.splitlines() == [
        f"{req.method} {req.path}",
        *(f"{name}: {value}" for name, value in req.headers.items()),
    ]
    assert body.rstrip("\n") == req.body
