"""A line-based chat server on asyncio streams (``asyncio.start_server``).

    python aio_chat_server.py [--host HOST] [--port PORT] [--loop asyncio|uvloop]

One command a line; the replies:

    NICK name    join as name                                  -> OK name
    MSG text     to every other member as "FROM name text"     -> (nothing)
    SYNC k n     barrier for n members: answered once n have    -> SYNCED k
                 sent SYNC k, so everything sent before it by
                 anyone has been delivered first
    BLOB n       followed by n bytes: echoed back reversed      -> BLOB n <sha256>, the bytes
    QUIT         leave; the server closes the connection       -> BYE name <messages sent>

Prints "READY <host> <port>" once listening; serves until SIGINT, then prints
"SERVED <connections> <messages> <blob bytes>".
"""

import argparse
import asyncio
import hashlib
import sys

members = {}  # name -> StreamWriter
barriers = {}  # k -> list of StreamWriters waiting
stats = {"connections": 0, "messages": 0, "blob_bytes": 0}


async def handle(reader, writer):
    stats["connections"] += 1
    name = None
    sent = 0
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            cmd, _, arg = line.rstrip(b"\n").partition(b" ")
            if cmd == b"NICK":
                name = arg
                members[name] = writer
                writer.write(b"OK " + name + b"\n")
            elif cmd == b"MSG":
                out = b"FROM " + name + b" " + arg + b"\n"
                for other, w in members.items():
                    if other != name:
                        w.write(out)
                sent += 1
                stats["messages"] += 1
                continue  # no reply: no drain (this member may be busy sending)
            elif cmd == b"SYNC":
                k, n = arg.split()
                waiting = barriers.setdefault(k, [])
                waiting.append(writer)
                if len(waiting) == int(n):
                    for w in barriers.pop(k):
                        w.write(b"SYNCED " + k + b"\n")
            elif cmd == b"BLOB":
                n = int(arg)
                data = await reader.readexactly(n)
                writer.write(b"BLOB %d %s\n" % (n, hashlib.sha256(data).hexdigest().encode()))
                writer.write(data[::-1])
                stats["blob_bytes"] += n
            elif cmd == b"QUIT":
                writer.write(b"BYE " + name + b" %d\n" % sent)
                await writer.drain()
                break
            else:
                writer.write(b"ERR unknown command\n")
            await writer.drain()
    finally:
        if name is not None and members.get(name) is writer:
            del members[name]
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


async def serve(host, port):
    server = await asyncio.start_server(handle, host, port)
    addr = server.sockets[0].getsockname()
    print(f"READY {addr[0]} {addr[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        run = uvloop.run
    else:
        run = asyncio.run
    try:
        run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass
    print(
        f"SERVED {stats['connections']} {stats['messages']} {stats['blob_bytes']}", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
