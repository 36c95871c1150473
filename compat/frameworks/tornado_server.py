"""tornado, as its documentation shows: a web.Application (GET /big: 1 MiB,
POST /echo: sha256) and a TCPServer that echoes lines over IOStream.  Prints
``PORT <http> <tcp>``, serves until its standard input closes."""

import asyncio
import hashlib
import sys

import tornado.iostream
import tornado.tcpserver
import tornado.web

BIG = bytes(range(256)) * 4096


class Big(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write(BIG)


class Echo(tornado.web.RequestHandler):
    def post(self) -> None:
        self.write(hashlib.sha256(self.request.body).hexdigest())


class EchoServer(tornado.tcpserver.TCPServer):
    async def handle_stream(self, stream: tornado.iostream.IOStream, address: object) -> None:
        try:
            while True:
                stream.write(await stream.read_until(b"\n"))
        except tornado.iostream.StreamClosedError:
            pass


async def main() -> None:
    app = tornado.web.Application([(r"/big", Big), (r"/echo", Echo)])
    http = app.listen(0, "127.0.0.1")
    tcp = EchoServer()
    tcp.listen(0, "127.0.0.1")
    hport = next(iter(http._sockets.values())).getsockname()[1]
    tport = next(iter(tcp._sockets.values())).getsockname()[1]
    print("PORT", hport, tport, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


asyncio.run(main())
