"""Clients for aio_chat_server.py on asyncio streams (``asyncio.open_connection``).

    python aio_chat_client.py HOST PORT [--clients N] [--messages M] [--blob-kib K]
                              [--loop asyncio|uvloop] [--timeout S]

N members join at once, wait for each other, each sends M messages of varied
length (up to 20 kB) to the others, meet at a second barrier and check that
every other member's messages arrived complete and in order; then each sends
blobs (1 B .. K KiB) and checks the reversed echo, and quits.  Prints the
latencies of every command that has a reply (``LATENCIES`` and a JSON object:
seconds per command, blobs per size), then one JSON line (connections, messages
sent and received, blob bytes, SHA-256 of all it received, in a canonical order)
and exits 1 if anything differs.
"""

import argparse
import asyncio
import contextlib
import hashlib
import json
import sys
import time

LATENCIES = {}  # seconds, per kind of request, in order of completion


@contextlib.contextmanager
def timed(kind):
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


def text(sender, k):
    """Message k of member sender: printable, 1 byte to 20 kB."""
    unit = hashlib.sha256(b"%d/%d" % (sender, k)).hexdigest().encode()
    length = 1 + (k * 7919 + sender * 104729) % (20000 if k % 10 == 0 else 300)
    return (unit * (length // len(unit) + 1))[:length]


def blob(size, seed):
    unit = hashlib.sha256(b"blob %d" % seed).digest() * 64
    return (unit * (size // len(unit) + 1))[:size]


async def expect(reader, want):
    line = await reader.readline()
    if line != want:
        raise AssertionError(f"expected {want!r}, got {line[:200]!r}")


async def member(i, host, port, clients, messages, blob_sizes):
    name = b"c%d" % i
    reader, writer = await asyncio.open_connection(host, port)
    digest = hashlib.sha256()
    with timed("NICK"):
        writer.write(b"NICK " + name + b"\n")
        await writer.drain()
        await expect(reader, b"OK " + name + b"\n")
    with timed("SYNC 1"):
        writer.write(b"SYNC 1 %d\n" % clients)
        await writer.drain()
        await expect(reader, b"SYNCED 1\n")

    for k in range(messages):
        writer.write(b"MSG " + text(i, k) + b"\n")
        if k % 16 == 15:
            await writer.drain()
    with timed("SYNC 2"):
        writer.write(b"SYNC 2 %d\n" % clients)
        await writer.drain()
        received = {}
        while True:
            line = await reader.readline()
            if line == b"SYNCED 2\n":
                break
            tag, sender, body = line.rstrip(b"\n").split(b" ", 2)
            if tag != b"FROM":
                raise AssertionError(f"member {i}: unexpected {line[:200]!r}")
            received.setdefault(int(sender[1:]), []).append(body)
    for j in range(clients):
        if j == i:
            continue
        want = [text(j, k) for k in range(messages)]
        if received.get(j) != want:
            got = received.get(j, [])
            raise AssertionError(f"member {i}: {len(got)} of {messages} messages from c{j} ok?")
        for body in want:
            digest.update(body)
    if i in received:
        raise AssertionError(f"member {i} got its own messages back")

    for n, size in enumerate(blob_sizes):
        data = blob(size, i * 100 + n)
        want = b"BLOB %d %s\n" % (size, hashlib.sha256(data).hexdigest().encode())
        with timed(f"BLOB {size}"):
            writer.write(b"BLOB %d\n" % size)
            writer.write(data)
            await writer.drain()
            await expect(reader, want)
            back = await reader.readexactly(size)
        if back != data[::-1]:
            raise AssertionError(f"member {i}: blob of {size} bytes came back wrong")
        digest.update(back)

    with timed("QUIT"):
        writer.write(b"QUIT\n")
        await writer.drain()
        await expect(reader, b"BYE " + name + b" %d\n" % messages)
    rest = await reader.read()
    if rest:
        raise AssertionError(f"member {i}: {rest[:200]!r} after BYE")
    writer.close()
    await writer.wait_closed()
    received_count = sum(len(v) for v in received.values())
    return digest.hexdigest(), received_count, sum(blob_sizes)


async def main(args):
    sizes = [1, 1000, 65536, 1 << 20, args.blob_kib * 1024]
    results = await asyncio.wait_for(
        asyncio.gather(
            *(
                member(i, args.host, args.port, args.clients, args.messages, sizes)
                for i in range(args.clients)
            )
        ),
        args.timeout,
    )
    total = hashlib.sha256()
    for digest, _, _ in results:
        total.update(digest.encode())
    return {
        "connections": len(results),
        "messages_sent": args.clients * args.messages,
        "messages_received": sum(r[1] for r in results),
        "blob_bytes": sum(r[2] for r in results),
        "sha256": total.hexdigest(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--blob-kib", type=int, default=4096)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        run = uvloop.run
    else:
        run = asyncio.run
    result = run(main(args))
    print("LATENCIES", json.dumps(LATENCIES))
    print(json.dumps(result, sort_keys=True))
    sys.exit(0)
