"""An aiohttp server written as aiohttp's documentation shows (no rsock import).

Prints ``PORT <n>`` once it listens, serves until its standard input closes.
GET /small, GET /big (1 MiB), POST /echo (the body's sha256), GET /stream?mb=N
(N MiB of a fixed pattern, streamed in 256 KiB chunks)."""

import asyncio
import hashlib
import sys

from aiohttp import web

BIG = bytes(range(256)) * 4096  # 1 MiB


async def small(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def big(request: web.Request) -> web.Response:
    return web.Response(body=BIG)


async def echo(request: web.Request) -> web.Response:
    return web.Response(text=hashlib.sha256(await request.read()).hexdigest())


async def stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(int(request.query["mb"]) * 4):
        await response.write(BIG[: 256 * 1024])
    await response.write_eof()
    return response


async def main() -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes(
        [web.get("/small", small), web.get("/big", big), web.post("/echo", echo),
         web.get("/stream", stream)]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print("PORT", site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


asyncio.run(main())
