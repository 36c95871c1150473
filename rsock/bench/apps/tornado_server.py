"""tornado, as its documentation shows: a TCPServer that echoes lines over IOStream
(no rsock import).  Prints ``PORT <n>``, serves until its standard input closes."""

import asyncio
import sys

import tornado.iostream
import tornado.tcpserver


class EchoServer(tornado.tcpserver.TCPServer):
    async def handle_stream(self, stream: tornado.iostream.IOStream, address: object) -> None:
        try:
            while True:
                stream.write(await stream.read_until(b"\n"))
        except tornado.iostream.StreamClosedError:
            pass


async def main() -> None:
    server = EchoServer()
    server.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    print("PORT", port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.stop()


asyncio.run(main())
