"""Waiters woken by a change of a key they name, not by every change.

The watch delivers thousands of changes in a burst, and as many tasks may wait
for one key each: the claim-to-lease window's judges (sidecar/run/claimwindow.py),
``overlap: replace``'s replacers (sidecar/run/stoprequests.py) and the runs
waiting for a concurrency limit's slot (sidecar/run/concurrency.py). One event
for all of them woke every waiter at every change.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class Wakers:
    """The tasks waiting for a change of some key, by key."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[asyncio.Event]] = {}

    def __bool__(self) -> bool:
        """Whether anyone waits."""
        return bool(self._by_key)

    def waits(self, key: str) -> bool:
        """Whether anyone waits for `key`."""
        return key in self._by_key

    def wake(self, key: str) -> None:
        """`key` changed: its waiters look again."""
        for event in self._by_key.get(key, ()):
            event.set()

    def wake_all(self) -> None:
        """Every key may have changed (a re-read): every waiter looks again."""
        for events in self._by_key.values():
            for event in events:
                event.set()

    @contextlib.contextmanager
    def watching(self, *keys: str) -> Iterator[asyncio.Event]:
        """An event set by a change of any of `keys` (``wake``) or by ``wake_all``, for
        as long as the block lasts; nothing is kept for a key once nobody waits."""
        event = asyncio.Event()
        for key in keys:
            self._by_key.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            for key in keys:
                events = self._by_key.get(key)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._by_key[key]

    async def wait(self, keys: tuple[str, ...], timeout: float) -> None:
        """Until a change of one of `keys`, ``wake_all``, or `timeout` seconds."""
        with self.watching(*keys) as event, contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
