"""An aiohttp application for gunicorn (aiohttp's documentation, "Deployment
with Gunicorn": ``gunicorn aiohttp_app:my_web_app --worker-class
aiohttp.GunicornWebWorker``): GET /small returns 5 bytes, other GETs 1 MiB,
POST the body's sha256."""

import hashlib

from aiohttp import web

BIG = bytes(range(256)) * 4096


async def small(request: web.Request) -> web.Response:
    return web.Response(body=b"hello")


async def big(request: web.Request) -> web.Response:
    return web.Response(body=BIG)


async def digest(request: web.Request) -> web.Response:
    return web.Response(text=hashlib.sha256(await request.read()).hexdigest())


my_web_app = web.Application(client_max_size=4 * 1024 * 1024)
my_web_app.add_routes([web.get("/small", small), web.get("/{tail:.*}", big),
                       web.post("/{tail:.*}", digest)])
