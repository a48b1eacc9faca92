"""A part of a job's life made on the first key of its kind, its code loaded then.

Backfills (``backfill.<job>``, sidecar/run/backfill.py) and one-off runs
(``at.<job>``, sidecar/run/atruns.py) act only on keys of the state bucket
that an operator's command writes (``anarchon-sidecar backfill``, ``at``,
``resume --catchup``), and most configs never see one. ``OnFirstKey`` stands in
for such a part from the start: it listens to the keys of its kind
(registered with its family, sidecar/fleet/listeners.py: a burst's run
leases never reach it) and, on the first one (or on a re-sync whose view
holds one), imports the part's module, makes the part and hands it that key and every key
after. Until then a key of another kind, or a re-sync with none of its kind,
is one the part would have ignored. The part reads the sidecar's job set
(sidecar/config/jobset.py) from its context like every other part.

``DueOnFirstUse`` does the same for due attempts (sidecar/run/retries.py and
its checks, sidecar/run/duecheck.py): made by the first ``due.`` key, the first
failed run of a job with ``retry.max``, or the first lost run to ``rerun``; a
config whose jobs never retry (``retry.max: 0``, the default) never loads them
(tests/cli/test_start_imports.py). Once made, every call is the part's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio

    from sidecar.config.load import JobConfig
    from sidecar.run.claim import Claim
    from sidecar.run.retries import DueAttempts
    from sidecar.store.state import View


class KeyPart(Protocol):
    def changed(self, key: str) -> None: ...


P = TypeVar("P", bound=KeyPart)


class OnFirstKey(Generic[P]):
    """`make()` called on the first key starting with ``<kind>.`` (module doc)."""

    def __init__(self, kind: str, view: View, make: Callable[[], P]) -> None:
        self.prefix = f"{kind}."
        self._view = view  # the fleet's view of the state bucket
        self._make = make
        self.part: P | None = None

    def changed(self, key: str) -> None:
        part = self.part
        if part is None:
            if key == "":  # a re-sync: made if the view holds a key of its kind
                if not any(k.startswith(self.prefix) for k in self._view.keys):
                    return
            elif not key.startswith(self.prefix):
                return
            part = self.part = self._make()
        part.changed(key)


class DueOnFirstUse:
    """``DueAttempts`` made by `make()` when first needed (module doc)."""

    def __init__(self, make: Callable[[], DueAttempts]) -> None:
        self._make = make
        self.part: DueAttempts | None = None

    def made(self) -> DueAttempts:
        if self.part is None:
            self.part = self._make()
        return self.part

    @property
    def tasks(self) -> set[asyncio.Task[Any]]:
        return self.part.tasks if self.part is not None else set()

    def due_changed(self, key: str) -> None:
        # Any other key (a re-sync's "" included) is one the part ignores.
        if self.part is not None or key.startswith("due."):
            self.made().due_changed(key)

    async def retry(self, job: JobConfig, claim: Claim, finished_at: float, seq: int) -> None:
        # Without retry.max the part makes nothing due (DueAttempts.retry).
        if self.part is not None or job.retry.max >= 1:
            await self.made().retry(job, claim, finished_at, seq)

    async def rerun(
        self, job: JobConfig, slot: int, attempt: int, lost_at: float, lost_seq: int
    ) -> None:
        await self.made().rerun(job, slot, attempt, lost_at, lost_seq)

    def claimed(self, name: str, slot: int, number: int) -> None:
        self.made().claimed(name, slot, number)
