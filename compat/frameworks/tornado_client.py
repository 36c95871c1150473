"""tornado clients, as its documentation shows: AsyncHTTPClient (1 MiB both
ways) and TCPClient/IOStream line round trips; prints each request's latency
(``LATENCIES`` and a JSON object: seconds per kind of request) and OK."""

import asyncio
import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator

import tornado.httpclient
import tornado.tcpclient

BIG = bytes(range(256)) * 4096

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


async def main(hport: int, tport: int) -> None:
    client = tornado.httpclient.AsyncHTTPClient()
    for _ in range(5):
        with timed("get"):
            r = await client.fetch(f"http://127.0.0.1:{hport}/big")
        assert r.body == BIG
        with timed("post"):
            r = await client.fetch(f"http://127.0.0.1:{hport}/echo", method="POST", body=BIG)
        assert r.body.decode() == hashlib.sha256(BIG).hexdigest()
    stream = await tornado.tcpclient.TCPClient().connect("127.0.0.1", tport)
    for i in range(500):
        line = b"%d\n" % i
        with timed("line"):
            await stream.write(line)
            assert await stream.read_until(b"\n") == line
    stream.close()
    print("LATENCIES", json.dumps(LATENCIES))
    print("OK")


asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
