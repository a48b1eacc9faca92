"""What every section of the config shares: the section reader, choices and name patterns.

:class:`ConfigSection` is the map reader of ``sidecar.config.fields`` with
``history_ttl`` refused by its own message wherever it appears; ``one_of``
reads one of a fixed set of words; the patterns are those of names that
become NATS subject tokens or state-bucket keys.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import MappingProxyType

from sidecar.config.fields import Section, short
from sidecar.core.errors import ConfigError

_HISTORY_TTL = "history is trimmed by count only; remove history_ttl"
JOB_NAME = re.compile(r"[A-Za-z0-9_-]+")
INSTANCE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
BUCKET_NAME = re.compile(r"[A-Za-z0-9_-]+")


class ConfigSection(Section):
    """A config map; ``history_ttl`` gets its own message wherever it appears."""

    refused = MappingProxyType({"history_ttl": _HISTORY_TTL})


def one_of(choices: tuple[str, ...]) -> Callable[[object, str], str]:
    """A converter for ``Section.get`` that accepts only one of ``choices``."""

    def convert(value: object, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(key, f"expected one of {', '.join(choices)}, got {short(value)}")
        return value

    return convert
