"""tornado clients, as its documentation shows: AsyncHTTPClient (1 MiB both
ways) and TCPClient/IOStream line round trips; prints OK."""

import asyncio
import hashlib
import sys

import tornado.httpclient
import tornado.tcpclient

BIG = bytes(range(256)) * 4096


async def main(hport: int, tport: int) -> None:
    client = tornado.httpclient.AsyncHTTPClient()
    for _ in range(5):
        r = await client.fetch(f"http://127.0.0.1:{hport}/big")
        assert r.body == BIG
        r = await client.fetch(f"http://127.0.0.1:{hport}/echo", method="POST", body=BIG)
        assert r.body.decode() == hashlib.sha256(BIG).hexdigest()
    stream = await tornado.tcpclient.TCPClient().connect("127.0.0.1", tport)
    for i in range(500):
        line = b"%d\n" % i
        await stream.write(line)
        assert await stream.read_until(b"\n") == line
    stream.close()
    print("OK")


asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
