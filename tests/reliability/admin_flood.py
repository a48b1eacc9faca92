"""Flood an admin port from a process of its own: ``python -m tests.reliability.admin_flood``.

Arguments: PORT SECONDS [IDLE SLOW FAST]. For SECONDS, on loopback, it keeps
IDLE connections open without sending a byte, SLOW connections that ask for
``/metrics`` and never read the answer (a 4 KiB receive buffer), and FAST loops
that scrape ``/metrics`` and read it whole, each reopened as soon as the server
closes it. Prints one JSON line with what happened. Own process, so that its
CPU does not stall the test's app, which timestamps the triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: flood\r\n\r\n"


async def main(port: int, seconds: float, idle: int, slow: int, fast: int) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    counts = {"opened": 0, "closed_by_server": 0, "scrapes": 0, "scrape_bytes": 0, "errors": 0}

    async def hold(send: bytes) -> None:
        while loop.time() < end:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", port))
                counts["opened"] += 1
                if send:
                    await loop.sock_sendall(sock, send)
                while loop.time() < end:
                    # Peek without reading the body: has the server closed on us?
                    with contextlib.suppress(BlockingIOError):
                        if not sock.recv(1, socket.MSG_PEEK):
                            break
                    await asyncio.sleep(0.1)
                else:
                    continue
                counts["closed_by_server"] += 1
            except OSError:
                counts["closed_by_server"] += 1
                await asyncio.sleep(0.05)
            finally:
                sock.close()

    async def scrape() -> None:
        while loop.time() < end:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(REQUEST)
                data = await asyncio.wait_for(reader.read(), 15)
                writer.close()
                counts["scrapes" if data.startswith(b"HTTP/1.1 200") else "errors"] += 1
                counts["scrape_bytes"] += len(data)
            except (OSError, TimeoutError):
                counts["errors"] += 1
                await asyncio.sleep(0.01)

    await asyncio.gather(
        *(hold(b"") for _ in range(idle)),
        *(hold(REQUEST) for _ in range(slow)),
        *(scrape() for _ in range(fast)),
    )
    return counts


if __name__ == "__main__":
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    idle, slow, fast = (int(a) for a in (sys.argv[3:6] or (40, 20, 4)))
    started = time.monotonic()
    result = asyncio.run(main(port, seconds, idle, slow, fast))
    print(json.dumps({**result, "seconds": round(time.monotonic() - started, 1)}), flush=True)
