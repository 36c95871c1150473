"""An aiohttp server written as aiohttp's documentation shows (no rsock import).

Prints ``PORT <n>`` once it listens, serves until its standard input closes.
GET /small (5 bytes), GET /big (1 MiB), GET /stream?mb=N (N MiB streamed in
256 KiB chunks), GET /file (a 32 MiB file on disk, served with ``web.FileResponse``,
which sends it with ``loop.sendfile``)."""

import asyncio
import os
import sys
import tempfile

from aiohttp import web

BIG = bytes(range(256)) * 4096  # 1 MiB
CHUNK = BIG[: 256 * 1024]
FILE_MB = 32


async def small(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def big(request: web.Request) -> web.Response:
    return web.Response(body=BIG)


async def stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(int(request.query["mb"]) * 4):
        await response.write(CHUNK)
    await response.write_eof()
    return response


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "file.bin")
        with open(path, "wb") as f:
            for _ in range(FILE_MB):
                f.write(BIG)
        await serve(path)


async def serve(path: str) -> None:
    async def file(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    app = web.Application()
    app.add_routes([web.get("/small", small), web.get("/big", big), web.get("/stream", stream),
                    web.get("/file", file)])  # fmt: skip
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print("PORT", runner.addresses[0][1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


asyncio.run(main())
