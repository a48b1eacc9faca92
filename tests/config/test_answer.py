"""``jobs[].answer``: how much of the app's answer a result keeps, what is redacted."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config.load import parse_config
from sidecar.config.model import AnswerConfig
from sidecar.core.errors import ConfigError
from sidecar.core.excerpt import DEFAULT_ANSWER_BYTES, MAX_ANSWER_BYTES


def answer_of(answer: Any = None, **request: Any) -> AnswerConfig:
    entry: dict[str, Any] = {"name": "sync", "schedule": "*/5 * * * *"}
    if answer is not None:
        entry["answer"] = answer
    if request:
        entry["request"] = request
    return parse_config({"instance_id": "web-1", "jobs": [entry]}, {}).jobs[0].answer


def test_default_keeps_a_little_and_redacts_every_configured_header() -> None:
    answer = answer_of()
    assert answer == AnswerConfig(size=DEFAULT_ANSWER_BYTES, redact=None)
    sent = {"Authorization": "Bearer abc", "X-Env": "prod"}
    assert answer.secrets(sent) == ["Bearer abc", "prod"]


def test_bytes_and_redact() -> None:
    answer = answer_of({"bytes": 0, "redact": ["Authorization", "x-api-key"]})
    assert answer == AnswerConfig(size=0, redact=("authorization", "x-api-key"))
    sent = {"authorization": "Bearer abc", "X-Api-Key": "k", "X-Env": "prod"}
    assert answer.secrets(sent) == ["Bearer abc", "k"]
    assert answer_of({"bytes": MAX_ANSWER_BYTES, "redact": []}).secrets(sent) == []


@pytest.mark.parametrize(
    ("answer", "key", "words"),
    [
        (
            {"bytes": MAX_ANSWER_BYTES + 1},
            "jobs[0].answer.bytes",
            f"between 0 and {MAX_ANSWER_BYTES}",
        ),
        ({"bytes": -1}, "jobs[0].answer.bytes", "between 0"),
        ({"bytes": "1KiB"}, "jobs[0].answer.bytes", "whole number"),
        ({"bytes": True}, "jobs[0].answer.bytes", "whole number"),
        ({"redact": "Authorization"}, "jobs[0].answer.redact", "list of request header names"),
        ({"redact": ["ok", "bad name"]}, "jobs[0].answer.redact[1]", "not a header name"),
        ({"redact": [3]}, "jobs[0].answer.redact[0]", "not a header name"),
        ({"headers": ["X"]}, "jobs[0].answer.headers", "unknown key; allowed: bytes, redact"),
        ("all", "jobs[0].answer", "expected a map"),
    ],
)
def test_errors_name_the_key(answer: Any, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        answer_of(answer)
    assert info.value.key == key
    assert words in str(info.value)


def test_check_says_what_is_kept() -> None:
    from sidecar.config.answer import describe_answer

    assert describe_answer(AnswerConfig(size=0)) == "answer: none kept in history"
    assert describe_answer(AnswerConfig(size=2048, redact=("authorization",))) == (
        "answer: first 2048 bytes kept in history, redacting authorization"
    )
    assert describe_answer(AnswerConfig()).endswith("redacting every configured header's value")
