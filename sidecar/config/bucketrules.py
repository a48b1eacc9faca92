"""What a job of the state bucket may be: ``bucket_jobs:`` and the headers it may not set.

Whoever can write the state bucket is not whoever wrote the config file
(SECURITY.md, "Jobs added at run time"): a ``job.<name>`` key may choose its
schedule, path, body and headers, but not where the request goes nor how it
is framed, and the fleet runs at most ``bucket_jobs.max_jobs`` of them, each
named in at most ``max_name_length`` characters and stored in at most
``max_value_bytes`` (docs/CONFIG.md). Pure: no NATS.

A job of the file is its operator's: it may set ``Host`` (a virtual host
behind a local proxy) or a forwarded header; the framing headers
(``Content-Length``, ``Transfer-Encoding``, ``Connection``) are the sidecar's
own for every job and dropped from any config at the wire (run/trigger.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sidecar.config.fields import key_text
from sidecar.config.keys import ConfigSection
from sidecar.core.errors import ConfigError

# Defaults of ``bucket_jobs:``, and the largest values it accepts.
MAX_JOBS = 1000
MAX_JOBS_LIMIT = 100_000
MAX_NAME_LENGTH = 64
MAX_NAME_LIMIT = 200
MAX_VALUE_BYTES = 16 * 1024
MAX_VALUE_LIMIT = 512 * 1024

# Headers that choose the request's backend, its method or its framing (hop-by-hop,
# RFC 9110 7.6.1), or speak for a proxy: a proxy or mesh beside the app would act
# on them, so a bucket job could reach what target.url does not name.
REFUSED_HEADERS = frozenset(
    {
        "host",
        "forwarded",
        "via",
        "x-real-ip",
        "true-client-ip",
        "x-client-ip",
        "x-host",
        "x-original-url",
        "x-rewrite-url",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
        "http2-settings",
    }
)
REFUSED_PREFIXES = ("x-forwarded-", "proxy-", "x-original-", "x-envoy-")
SECTION_KEYS = ("max_jobs", "max_name_length", "max_value_bytes")


@dataclass(frozen=True)
class BucketJobsConfig:
    """``bucket_jobs:``: how many jobs of the state bucket the fleet runs, and how big."""

    max_jobs: int = MAX_JOBS
    max_name_length: int = MAX_NAME_LENGTH
    max_value_bytes: int = MAX_VALUE_BYTES


def parse_bucket_jobs(raw: object) -> BucketJobsConfig:
    """The ``bucket_jobs:`` section (every key optional)."""
    sec = ConfigSection(raw, "bucket_jobs", SECTION_KEYS)
    return BucketJobsConfig(
        max_jobs=sec.integer("max_jobs", MAX_JOBS, 0, MAX_JOBS_LIMIT),
        max_name_length=sec.integer("max_name_length", MAX_NAME_LENGTH, 1, MAX_NAME_LIMIT),
        max_value_bytes=sec.integer("max_value_bytes", MAX_VALUE_BYTES, 256, MAX_VALUE_LIMIT),
    )


def refused_header(name: str) -> bool:
    """Whether a job of the state bucket may not set header `name` (any case)."""
    low = name.lower()
    return low in REFUSED_HEADERS or low.startswith(REFUSED_PREFIXES)


def check_headers(names: Iterable[object], path: str) -> None:
    """ConfigError naming the first header of `names` a bucket job may not set."""
    for name in names:
        if isinstance(name, str) and refused_header(name):
            raise ConfigError(
                f"{path}.{key_text(name)}",
                "a job of the state bucket cannot set this header: it chooses where the "
                "request goes or how it is framed, which the config file decides "
                "(target.url)",
            )


def value_size(value: Mapping[str, object]) -> int:
    """The size of a job's stored value as compact JSON (what the limit counts)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return len(text.encode())


def check_name_length(limits: BucketJobsConfig, name: str, key: str) -> None:
    """ConfigError naming ``bucket_jobs.max_name_length`` when `name` is longer."""
    if len(name) > limits.max_name_length:
        raise ConfigError(
            f"{key}.name",
            f"at most {limits.max_name_length} characters for a job of the state bucket "
            f"(bucket_jobs.max_name_length), got {len(name)}",
        )


def check_value_size(limits: BucketJobsConfig, value: Mapping[str, object], key: str) -> None:
    """ConfigError naming ``bucket_jobs.max_value_bytes`` when `value` is larger."""
    size = value_size(value)
    if size > limits.max_value_bytes:
        raise ConfigError(
            key,
            f"at most {limits.max_value_bytes} bytes for a job of the state bucket "
            f"(bucket_jobs.max_value_bytes), got {size}",
        )
