"""A websockets client, as its documentation shows: small messages and 1 MiB
messages echoed and checked; prints OK."""

import asyncio
import sys

from websockets.asyncio.client import connect

BIG = bytes(range(256)) * 4096


async def main(port: int) -> None:
    async with connect(f"ws://127.0.0.1:{port}", max_size=4 * 1024 * 1024) as ws:
        for i in range(500):
            await ws.send(f"m{i}")
            assert await ws.recv() == f"m{i}"
        for _ in range(5):
            await ws.send(BIG)
            assert await ws.recv() == BIG
    print("OK")


asyncio.run(main(int(sys.argv[1])))
