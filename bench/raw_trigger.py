"""The idle baseline: a timer, one raw ``js.publish`` with a msg id, one raw POST.

``python -m bench.raw_trigger NATS_URL APP_URL SECONDS``. Half a second after
every whole second, on asyncio's timer as the sidecar waits for a slot: one
JetStream publish of a claim-sized body with a fresh msg id, then one POST
over a fresh connection to the app, written by hand (no HTTP library).
Prints ``{slot_ms: {"scheduled": t, "wake": t}}`` as JSON; the app notes the
arrival under path ``/raw``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from urllib.parse import urlsplit

import nats

from bench.wire import MSG_ID, PREFIX, STREAM, claim_body


async def run(url: str, app_url: str, seconds: float) -> dict[int, dict[str, float]]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    app = urlsplit(app_url)
    marks: dict[int, dict[str, float]] = {}
    end = time.time() + seconds
    while True:
        scheduled = int(time.time()) + 1.5
        if scheduled > end:
            break
        await asyncio.sleep(scheduled - time.time())
        wake = time.time()
        slot = round(scheduled * 1000)
        body = claim_body("raw", slot, "f" * 32)
        try:
            await js.publish(
                f"{PREFIX}raw.claims", body, stream=STREAM, headers={MSG_ID: f"raw:{slot}"}
            )
        except nats.errors.Error:
            continue  # the stream is not there yet (the sidecar creates it)
        reader, writer = await asyncio.open_connection(app.hostname, app.port)
        writer.write(
            b"POST /raw HTTP/1.1\r\nHost: app\r\nX-Anarchon-Slot: %d\r\n"
            b"Content-Length: 0\r\nConnection: close\r\n\r\n" % slot
        )
        await reader.read()
        writer.close()
        marks[slot] = {"scheduled": scheduled, "wake": wake}
    await nc.close()
    return marks


def main() -> None:
    url, app_url, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    print(json.dumps(asyncio.run(run(url, app_url, seconds))))


if __name__ == "__main__":
    main()
