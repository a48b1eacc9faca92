"""Repeated warnings as one line now and a count later, not one line per second.

A failure that lasts (NATS down, a stream that stays wrong) reports itself
at every retry. ``RateLimitedLog`` logs the first report of a kind (its
``key``) at once and then only counts; the first report after ``interval``
seconds is logged with the count of the ones it stood for, and so on.
``clear(key)`` ends the episode when the failure is over: it logs the count
not told yet, and the next report of that key is logged at once again.

    nats = RateLimitedLog(log)
    nats.warning("nats", "nats: %s", reason)   # every reconnect attempt
    nats.clear("nats")                         # reconnected
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar.config.fields import format_duration

#: Seconds between two lines of one kind of warning.
INTERVAL = 60.0


@dataclass
class _Episode:
    last_logged: float  # monotonic
    level: int = logging.WARNING
    msg: str = ""
    args: tuple[Any, ...] = ()
    held: int = 0  # reports since last_logged, not logged
    since: float = 0.0  # monotonic time of the first held report


@dataclass
class RateLimitedLog:
    """Logs each kind of repeated report once per `interval`, with a count."""

    logger: logging.Logger
    interval: float = INTERVAL
    clock: Callable[[], float] = time.monotonic
    _episodes: dict[str, _Episode] = field(default_factory=dict)

    def warning(self, key: str, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def log(self, level: int, key: str, msg: str, *args: Any) -> bool:
        """Log now, or count this report for later; True when it was logged."""
        now = self.clock()
        episode = self._episodes.get(key)
        if episode is None:
            self._episodes[key] = _Episode(last_logged=now)
            self.logger.log(level, msg, *args)
            return True
        if now - episode.last_logged < self.interval:
            if not episode.held:
                episode.since = now
            episode.held += 1
            episode.level, episode.msg, episode.args = level, msg, args
            return False
        held = episode.held
        episode.held = 0
        episode.last_logged = now
        self.logger.log(level, msg + self._repeated(held, now - episode.since), *args)
        return True

    def clear(self, key: str) -> None:
        """The failure is over: tell what was held back, log the next report at once."""
        episode = self._episodes.pop(key, None)
        if episode is not None and episode.held:
            suffix = self._repeated(episode.held - 1, self.clock() - episode.since)
            self.logger.log(episode.level, episode.msg + suffix, *episode.args)

    def clear_prefix(self, prefix: str) -> None:
        """``clear`` every kind whose key starts with `prefix`."""
        for key in [k for k in self._episodes if k.startswith(prefix)]:
            self.clear(key)

    @staticmethod
    def _repeated(count: int, seconds: float) -> str:
        if count <= 0:
            return ""
        times = "time" if count == 1 else "times"
        return f" (and {count} more {times} in {format_duration(round(seconds))})"
