"""trio, as its tutorial shows: ``trio.serve_tcp`` with a handler that echoes
what it receives (no rsock import).  Prints ``PORT <n>``, serves until its
standard input closes."""

import functools
import sys

import trio


async def echo(stream: trio.SocketStream) -> None:
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def main() -> None:
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        print("PORT", listeners[0].socket.getsockname()[1], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


trio.run(main)
