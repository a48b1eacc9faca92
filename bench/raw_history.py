"""The baseline process for ``history``: nats-py alone reading a job's messages.

``python -m bench.raw_history URL STREAM SUBJECTS``: connects, reads every
stored message on SUBJECTS with a plain ordered consumer, prints the count.
"""

from __future__ import annotations

import asyncio
import sys

import nats
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy


async def read(url: str, stream: str, subjects: str) -> int:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[bytes] = []
    done = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        out.append(msg.data)
        if msg.metadata.num_pending == 0 and not done.done():
            done.set_result(None)

    sub = await js.subscribe(
        subjects, stream=stream, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    await asyncio.wait_for(done, 10)
    await sub.unsubscribe()
    await nc.close()
    return len(out)


def main() -> None:
    print(asyncio.run(read(*sys.argv[1:4])))


if __name__ == "__main__":
    main()
