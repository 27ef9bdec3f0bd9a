"""A TCP load balancer for tests: every connection to one address goes to the next node in turn.

`ThroughBalancer` is the `addressResolverClass` the docs describe for this case: it maps every
node's address to the balancer's (here from `RMQS_TEST_BALANCER`, `host:port`), and the client
checks which node each connection landed on.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections import Counter


class ThroughBalancer:
    """addressResolverClass: every address -> the balancer."""

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        h, _, p = os.environ["RMQS_TEST_BALANCER"].rpartition(":")
        return h, int(p)


class Balancer:
    """Round-robin TCP proxy on 127.0.0.1 (a free port) over `backends`, on a thread of its own."""

    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = backends
        self._next = itertools.cycle(range(len(backends)))
        self.connections: Counter[tuple[str, int]] = Counter()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True, name="balancer")
        self.thread.start()
        ready.wait(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = self.backends[next(self._next)]
        self.connections[backend] += 1
        try:
            up_r, up_w = await asyncio.open_connection(*backend)
        except OSError:
            writer.close()
            return

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
