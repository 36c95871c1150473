"""Two server processes on one port through SO_REUSEPORT, as aiohttp's
``web.run_app(reuse_port=True)`` started twice does: each runs
``asyncio.start_server(..., reuse_port=True)`` on the same port; the parent
starts the first, waits until it serves, starts the second, then connects 40
times (each connection echoes a line, upper-cased, with the server's number)
and stops both.  Prints how many replies came, the seconds each connection
took (``LATENCIES`` and a JSON object) and the servers' exit statuses."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

if len(sys.argv) == 3:  # a server: its number and the port
    me, port = sys.argv[1], int(sys.argv[2])

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        writer.write(line.upper().rstrip() + b" " + me.encode() + b"\n")
        await writer.drain()
        writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(echo, "127.0.0.1", port, reuse_port=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            print("READY", flush=True)
            await stop.wait()

    asyncio.run(serve())
    sys.exit(0)

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
servers = []
try:
    for n in ("1", "2"):
        p = subprocess.Popen([sys.executable, __file__, n, str(port)], stdout=subprocess.PIPE)
        servers.append(p)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == b"READY"
    replies = set()
    latencies = []
    for i in range(40):
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
            c.sendall(b"hello %d\n" % i)
            words = c.makefile("rb").readline().split()
            assert words[:2] == [b"HELLO", b"%d" % i] and words[2] in (b"1", b"2"), words
            replies.add(i)
        latencies.append(time.perf_counter() - start)
    print("replies", len(replies))
    print("LATENCIES", json.dumps({"connection": latencies}))
finally:
    for p in servers:  # (also when one failed: none is left running)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
        print("server", p.wait(20))
        assert p.stdout is not None
        p.stdout.close()
