"""The trigger request to the app, over TCP or a unix socket.

One request per won claim. A request that provably never reached the app
(connection refused, socket missing: the connection itself failed) is retried
with backoff until the slot's deadline; one that reached it is never resent,
whatever happened next (timeout, reset, 5xx). Every request goes over a fresh
connection, so a stale keep-alive connection can never blur that line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import aiohttp
import yarl

from sidecar.clock import Clock, rfc3339
from sidecar.config import JobConfig
from sidecar.errors import TriggerError, TriggerFailed, TriggerTimeout, TriggerUndelivered
from sidecar.signing import SIGNATURE_HEADER, SignedFields, Signer, signature
from sidecar.values import redact_url

__all__ = ["Trigger", "TriggerResult", "signature"]

log = logging.getLogger(__name__)

# Only this much of an error response is read (and logged), never more.
MAX_ERROR_BODY = 200


#: ``on_retry(attempts so far, why, seconds left before giving up)``
RetryReport = Callable[[int, TriggerUndelivered, float], None]


@dataclass(frozen=True)
class TriggerResult:
    """How one run went; times are wall-clock epoch seconds."""

    ok: bool
    started_at: float
    finished_at: float
    duration: float
    http_status: int | None
    error: str | None
    attempts: int


class Trigger:
    """Sends trigger requests to the app; use as ``async with Trigger(...)``."""

    def __init__(self, signer: Signer | None, clock: Clock, instance: str = "") -> None:
        self.signer = signer
        self.clock = clock
        self.instance = instance
        # One session per unix socket, one (key None) for TCP.
        self._sessions: dict[str | None, aiohttp.ClientSession] = {}

    async def __aenter__(self) -> Trigger:
        return self

    def _session(self, socket_path: str | None) -> aiohttp.ClientSession:
        session = self._sessions.get(socket_path)
        if session is None:
            connector: aiohttp.BaseConnector
            if socket_path:
                connector = aiohttp.UnixConnector(path=socket_path, force_close=True, limit=0)
            else:
                connector = aiohttp.TCPConnector(force_close=True, limit=0)
            session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False
            )
            # aiohttp resends an idempotent request (GET, PUT, DELETE, ...) once
            # when the server drops the connection, even on a fresh connection:
            # that request reached the app and must not be resent. No public
            # switch exists; aiohttp's own test client turns it off the same way.
            session._retry_connection = False
            self._sessions[socket_path] = session
        return session

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    def headers(
        self,
        job: JobConfig,
        slot: int,
        token: str,
        body: bytes,
        attempt: int = 1,
        fence: int | None = None,
    ) -> dict[str, str]:
        headers = dict(job.request.headers)
        headers.update(
            {
                "X-Anarchon-Job": job.name,
                "X-Anarchon-Slot": str(slot),
                "X-Anarchon-Run-Id": token,
                "X-Anarchon-Scheduled-At": rfc3339(slot / 1000),
            }
        )
        if self.instance:
            headers["X-Anarchon-Instance"] = self.instance
        headers["X-Anarchon-Attempt"] = str(attempt)
        if fence is not None:
            # The won claim's stream sequence: it grows with every claim on
            # the stream, so an app can refuse a request older than one it ran.
            headers["X-Anarchon-Fence"] = str(fence)
        if self.signer is not None:
            req = job.request
            signed = SignedFields(
                req.method, req.path, job.name, slot, token, body, attempt=attempt, fence=fence
            )
            headers[SIGNATURE_HEADER] = self.signer.header(int(self.clock.wall()), signed)
        return headers

    async def fire(
        self,
        job: JobConfig,
        slot: int,
        token: str,
        deadline: float,
        attempt: int = 1,
        fence: int | None = None,
        on_retry: RetryReport | None = None,
    ) -> TriggerResult:
        """Run the job's request once; retry only while undelivered and before `deadline`.

        `deadline` is on the monotonic clock. Never raises for the app's
        behaviour: the outcome is in the result. Each retry is logged (the
        first as a warning), or given to `on_retry` instead when there is one.
        """
        started_at = self.clock.wall()
        t0 = time.perf_counter()
        attempts = 0
        backoff = 0.1
        while True:
            attempts += 1
            try:
                status = await self._send(job, slot, token, attempt, fence)
            except TriggerUndelivered as exc:
                remaining = deadline - self.clock.monotonic()
                if remaining <= backoff:
                    return self._result(started_at, t0, None, f"{exc} (gave up)", attempts)
                if on_retry is not None:
                    on_retry(attempts, exc, remaining)
                else:
                    (log.warning if attempts == 1 else log.debug)(
                        "job %s slot %s: app not reachable (%s); retrying in %.1fs",
                        job.name,
                        slot,
                        exc,
                        backoff,
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except TriggerError as exc:
                return self._result(started_at, t0, exc.http_status, str(exc), attempts)
            return self._result(started_at, t0, status, None, attempts)

    def _result(
        self, started_at: float, t0: float, status: int | None, error: str | None, attempts: int
    ) -> TriggerResult:
        duration = time.perf_counter() - t0
        return TriggerResult(
            ok=error is None,
            started_at=started_at,
            finished_at=started_at + duration,
            duration=duration,
            http_status=status,
            error=error,
            attempts=attempts,
        )

    async def _send(
        self, job: JobConfig, slot: int, token: str, attempt: int, fence: int | None
    ) -> int:
        """One request; returns the 2xx status or raises a TriggerError."""
        req = job.request
        body = req.body.encode()
        # encoded=True: the path goes out exactly as configured, and as signed.
        url = yarl.URL(req.base_url + req.path, encoded=True)
        try:
            async with self._session(req.unix_socket).request(
                req.method,
                url,
                data=body,
                headers=self.headers(job, slot, token, body, attempt, fence),
                timeout=aiohttp.ClientTimeout(total=req.timeout),
                allow_redirects=False,
            ) as resp:
                if 200 <= resp.status < 300:
                    await resp.read()
                    return resp.status
                text = (await resp.content.read(MAX_ERROR_BODY)).decode(errors="replace")
                detail = " ".join(text.split())
                raise TriggerFailed(
                    f"HTTP {resp.status}" + (f": {detail}" if detail else ""), resp.status
                )
        except aiohttp.ClientConnectorError as exc:
            # The connection was never made: nothing reached the app.
            where = req.unix_socket or redact_url(req.base_url)
            raise TriggerUndelivered(f"cannot connect to {where}: {exc.os_error}") from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise TriggerTimeout(f"no answer within {req.timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            raise TriggerError(
                f"request failed after connecting: {type(exc).__name__} {exc}"
            ) from exc
