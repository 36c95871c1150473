"""A websockets echo server, as its documentation shows (no rsock import); prints
``PORT <n>``, serves until its standard input closes.

``websockets_server.py [raw]``: raw turns per-message compression off
(``compression=None``, as websockets' documentation says to do for data that does not
compress); by default it is on, as websockets' is."""

import asyncio
import sys

from websockets.asyncio.server import ServerConnection, serve


async def echo(websocket: ServerConnection) -> None:
    async for message in websocket:
        await websocket.send(message)


async def main(compression: str | None) -> None:
    async with serve(
        echo, "127.0.0.1", 0, max_size=4 * 1024 * 1024, compression=compression
    ) as server:
        print("PORT", next(iter(server.sockets)).getsockname()[1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


asyncio.run(main(None if sys.argv[1:] == ["raw"] else "deflate"))
