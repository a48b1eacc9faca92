"""``jobs[].answer``: how much of the app's answer a run's result keeps, and what is
redacted from it (docs/TRIGGER.md, "The app's answer in history").

``answer: {bytes: 512, redact: [Authorization]}``; ``bytes`` from 0 (keep
nothing) to the hard cap of sidecar/core/excerpt.py, ``redact`` the request
headers whose values are replaced by ``[redacted]`` wherever they appear in
the answer (unset: every header the request sends from the config).
"""

from __future__ import annotations

from sidecar.config.fields import _HEADER_NAME_RE, key_text
from sidecar.config.keys import ConfigSection
from sidecar.config.model import AnswerConfig
from sidecar.core.errors import ConfigError
from sidecar.core.excerpt import DEFAULT_ANSWER_BYTES, MAX_ANSWER_BYTES

__all__ = ["describe_answer", "parse_answer"]

_ANSWER_KEYS = ("bytes", "redact")


def describe_answer(answer: AnswerConfig) -> str:
    """``check``'s words for what a job's results keep of the app's answer."""
    if answer.size == 0:
        return "answer: none kept in history"
    if answer.redact is None:
        redacted = "every configured header's value"
    else:
        redacted = ", ".join(answer.redact) or "nothing"
    return f"answer: first {answer.size} bytes kept in history, redacting {redacted}"


def parse_answer(job: ConfigSection) -> AnswerConfig:
    """The job's ``answer`` (the default when absent)."""
    sec = ConfigSection(job.data.get("answer"), job.key("answer"), _ANSWER_KEYS)
    size = sec.integer("bytes", DEFAULT_ANSWER_BYTES, 0, MAX_ANSWER_BYTES)
    if not sec.has("redact"):
        return AnswerConfig(size=size)
    raw = sec.data["redact"]
    key = sec.key("redact")
    if not isinstance(raw, list):
        raise ConfigError(key, "expected a list of request header names")
    names = []
    for i, name in enumerate(raw):
        if not isinstance(name, str) or not _HEADER_NAME_RE.fullmatch(name):
            raise ConfigError(f"{key}[{i}]", f"{key_text(name)} is not a header name")
        names.append(name.lower())
    return AnswerConfig(size=size, redact=tuple(names))
