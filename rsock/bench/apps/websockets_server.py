"""A websockets echo server, as its documentation shows (no rsock import); prints
``PORT <n>``, serves until its standard input closes."""

import asyncio
import sys

from websockets.asyncio.server import ServerConnection, serve


async def echo(websocket: ServerConnection) -> None:
    async for message in websocket:
        await websocket.send(message)


async def main() -> None:
    async with serve(echo, "127.0.0.1", 0, max_size=4 * 1024 * 1024) as server:
        print("PORT", next(iter(server.sockets)).getsockname()[1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


asyncio.run(main())
