"""rsock.asyncio against asyncio's own TCP (the oracle), on asyncio and uvloop.

Every test runs on loop {asyncio, uvloop} x transport {tcp, rsock}; ``tcp``
uses the loop's ``create_server``/``create_connection`` and asyncio's
``start_server``/``open_connection``, ``rsock`` the same entry points of
``rsock.asyncio``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import resource
import signal
import ssl
import time
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from support import FAST_PROVIDER, hi_peer

T = TypeVar("T")
LOOPS = ["asyncio", "uvloop"]


@pytest.fixture(params=LOOPS)
def loop_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def run(loop_name: str) -> Callable[[Coroutine[Any, Any, T]], T]:
    def runner(coro: Coroutine[Any, Any, T]) -> T:
        if loop_name == "uvloop":
            import uvloop

            return uvloop.run(coro)  # type: ignore[no-any-return]
        return asyncio.run(coro)

    return runner


@pytest.fixture
def api(transport: str) -> SimpleNamespace:
    if transport == "rsock":
        import rsock.asyncio as ra

        return SimpleNamespace(
            create_server=ra.create_server,
            create_connection=ra.create_connection,
            start_server=ra.start_server,
            open_connection=ra.open_connection,
        )

    async def create_server(factory: Any, *a: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().create_server(factory, *a, **kw)

    async def create_connection(factory: Any, *a: Any, **kw: Any) -> Any:
        return await asyncio.get_running_loop().create_connection(factory, *a, **kw)

    return SimpleNamespace(
        create_server=create_server,
        create_connection=create_connection,
        start_server=asyncio.start_server,
        open_connection=asyncio.open_connection,
    )


def provider(transport: str, writer_or_transport: Any) -> None:
    sock = writer_or_transport.get_extra_info("socket")
    if transport == "rsock":
        assert sock.provider == FAST_PROVIDER


async def echo_handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(1 << 16):
            w.write(data)
            await w.drain()
        w.write_eof()
    finally:
        w.close()


def port_of(server: Any) -> int:
    return int(server.sockets[0].getsockname()[1])


def test_echo_streams(api: SimpleNamespace, transport: str, run: Any) -> None:
    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0)
        async with server:
            r, w = await api.open_connection("127.0.0.1", port_of(server))
            provider(transport, w)
            w.write(b"hello\nworld\n")
            await w.drain()
            assert await r.readline() == b"hello\n"
            assert await r.readline() == b"world\n"
            assert w.get_extra_info("peername")[1] == port_of(server)
            w.close()
            await w.wait_closed()

    run(asyncio.wait_for(main(), 20))


def test_write_buffer_kinds(
    api: SimpleNamespace, transport: str, loop_name: str, run: Any
) -> None:
    """transport.write takes bytes, bytearray and memoryviews of any item size
    (counted in bytes, also when only part fits at once), copies what it
    keeps (mutating the bytearray afterwards changes nothing), and the peer
    gets exactly the bytes in order.  A multi-byte memoryview larger than
    what fits at once is left out on asyncio's own TCP transport: CPython
    3.11 slices the unsent rest by items instead of bytes there and loses
    data (uvloop's TCP transport, the oracle for it, is right)."""
    import array

    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0)
        async with server:
            r, w = await api.open_connection("127.0.0.1", port_of(server))
            provider(transport, w)
            big = transport == "rsock" or loop_name == "uvloop"
            # itemsize 4; 12 MB is more than fits at once
            ints = array.array("i", range(3_000_000 if big else 10_000))
            ba = bytearray(b"mutable")
            parts: list[Any] = [b"bytes", ba, memoryview(b"0123456789")[3:8], memoryview(ints),
                                b"", memoryview(bytearray(5000)).cast("I")]
            expect = b"".join(bytes(p) for p in parts)
            for p in parts:
                w.transport.write(p)
            ba[:] = b"CHANGED"
            w.write_eof()
            got = await r.read()
            assert len(got) == len(expect)
            assert hashlib.sha256(got).digest() == hashlib.sha256(expect).digest()
            w.close()
            await w.wait_closed()

    run(asyncio.wait_for(main(), 30))


def test_big_transfer_both_ways_sha256(api: SimpleNamespace, transport: str, run: Any) -> None:
    # (make test-rdma runs this over rxe in an emulated guest, ~40 MB/s: less there)
    total = 256 << 20 if FAST_PROVIDER == "shm" else 32 << 20
    seed = 1234

    def chunks(rng: random.Random) -> Any:
        left = total
        while left:
            n = min(left, rng.randint(1, 1 << 20))
            yield rng.randbytes(n)
            left -= n

    async def main() -> None:
        digests: dict[str, str] = {}

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            async def pump_out() -> None:
                for c in chunks(random.Random(seed + 1)):
                    w.write(c)
                    await w.drain()
                w.write_eof()

            t = asyncio.create_task(pump_out())
            h = hashlib.sha256()
            while data := await r.read(1 << 18):
                h.update(data)
            digests["server_got"] = h.hexdigest()
            await t
            w.close()

        server = await api.start_server(handler, "127.0.0.1", 0)
        async with server:
            r, w = await api.open_connection("127.0.0.1", port_of(server))

            async def pump() -> None:
                for c in chunks(random.Random(seed)):
                    w.write(c)
                    await w.drain()
                w.write_eof()

            t = asyncio.create_task(pump())
            h = hashlib.sha256()
            while data := await r.read(1 << 18):
                h.update(data)
            await t
            w.close()
            await w.wait_closed()
        want_c = hashlib.sha256(b"".join(chunks(random.Random(seed)))).hexdigest()
        want_s = hashlib.sha256(b"".join(chunks(random.Random(seed + 1)))).hexdigest()
        assert digests["server_got"] == want_c
        assert h.hexdigest() == want_s

    run(asyncio.wait_for(main(), 120))


def test_half_close(api: SimpleNamespace, run: Any) -> None:
    async def main() -> None:
        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            data = await r.read()  # until EOF
            w.write(b"got %d" % len(data))
            await w.drain()
            w.close()

        server = await api.start_server(handler, "127.0.0.1", 0)
        async with server:
            r, w = await api.open_connection("127.0.0.1", port_of(server))
            assert w.can_write_eof()
            w.write(b"x" * 1000)
            w.write_eof()
            assert await r.read() == b"got 1000"
            w.close()
            await w.wait_closed()

    run(asyncio.wait_for(main(), 20))


class Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.paused = 0
        self.resumed = 0
        self.eof = False
        self.lost: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


def test_flow_control_pause_and_resume(api: SimpleNamespace, run: Any) -> None:
    async def main() -> None:
        server_protos: list[Collect] = []

        def factory() -> Collect:
            p = Collect()
            server_protos.append(p)
            return p

        server = await api.create_server(factory, "127.0.0.1", 0)
        async with server:
            tr, cp = await api.create_connection(Collect, "127.0.0.1", port_of(server))
            while not server_protos or server_protos[0].transport is None:
                await asyncio.sleep(0.01)
            sp = server_protos[0]
            sp.transport.pause_reading()  # a slow reader
            assert not sp.transport.is_reading()
            tr.set_write_buffer_limits(high=256 * 1024)
            assert tr.get_write_buffer_limits() == (64 * 1024, 256 * 1024)
            block = b"z" * (1 << 20)
            sent = 0
            while not cp.paused and sent < (512 << 20):
                tr.write(block)
                sent += len(block)
                await asyncio.sleep(0)
            assert cp.paused == 1, "pause_writing was not called"
            # memory stays bounded: the writer stops producing once paused
            assert tr.get_write_buffer_size() < sent
            sp.transport.resume_reading()
            deadline = time.monotonic() + 30
            while len(sp.data) < sent and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert len(sp.data) == sent
            assert cp.resumed == 1
            assert tr.get_write_buffer_size() == 0
            tr.close()
            await cp.lost

    run(asyncio.wait_for(main(), 60))


def test_abort_and_peer_sees_end(api: SimpleNamespace, run: Any) -> None:
    async def main() -> None:
        server_protos: list[Collect] = []

        def factory() -> Collect:
            p = Collect()
            server_protos.append(p)
            return p

        server = await api.create_server(factory, "127.0.0.1", 0)
        async with server:
            tr, cp = await api.create_connection(Collect, "127.0.0.1", port_of(server))
            while not server_protos:
                await asyncio.sleep(0.01)
            tr.write(b"abc")
            tr.abort()
            assert tr.is_closing()
            assert await asyncio.wait_for(cp.lost, 5) is None
            sp = server_protos[0]
            await asyncio.wait_for(sp.lost, 5)  # EOF (None) or a reset, never a hang

    run(asyncio.wait_for(main(), 20))


def test_peer_death_connection_lost_within_a_second(
    api: SimpleNamespace, transport: str, run: Any
) -> None:
    with hi_peer(transport) as (proc, port):

        async def main() -> float:
            tr, cp = await api.create_connection(Collect, "127.0.0.1", port)
            while not cp.data:
                await asyncio.sleep(0.01)
            killed = time.monotonic()
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(cp.lost, 5)
            return time.monotonic() - killed

        elapsed = run(asyncio.wait_for(main(), 20))
        assert elapsed < 1.0 + 0.25


def test_many_concurrent_clients(api: SimpleNamespace, run: Any) -> None:
    n = 500
    # an rsock connection holds a few fds per side (README: differences)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 8192:
        want = 8192 if hard == resource.RLIM_INFINITY else min(8192, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0, backlog=n)
        async with server:
            port = port_of(server)

            async def client(i: int) -> bytes:
                r, w = await api.open_connection("127.0.0.1", port)
                msg = b"client %d\n" % i
                w.write(msg)
                await w.drain()
                line = await r.readline()
                w.close()
                await w.wait_closed()
                return bytes(line)

            got = await asyncio.gather(*(client(i) for i in range(n)))
            assert got == [b"client %d\n" % i for i in range(n)]

    run(asyncio.wait_for(main(), 90))


def test_hammer_small_writes_both_ways(api: SimpleNamespace, run: Any) -> None:
    """Many small writes in both directions at once: no missed wake-up."""
    count = 20000

    async def main() -> None:
        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            async def out() -> None:
                for i in range(count):
                    w.write(b"%08d" % i)
                    if i % 100 == 0:
                        await w.drain()
                await w.drain()

            t = asyncio.create_task(out())
            for i in range(count):
                assert await r.readexactly(8) == b"%08d" % i
            await t
            w.close()

        server = await api.start_server(handler, "127.0.0.1", 0)
        async with server:
            r, w = await api.open_connection("127.0.0.1", port_of(server))

            async def out() -> None:
                for i in range(count):
                    w.write(b"%08d" % i)
                    if i % 97 == 0:
                        await w.drain()
                await w.drain()

            t = asyncio.create_task(out())
            for i in range(count):
                assert await r.readexactly(8) == b"%08d" % i
            await t
            w.close()
            await w.wait_closed()

    run(asyncio.wait_for(main(), 60))


def test_buffered_protocol(api: SimpleNamespace, run: Any) -> None:
    class Buffered(asyncio.BufferedProtocol):
        def __init__(self) -> None:
            self.buf = bytearray(4096)
            self.got = bytearray()
            self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def get_buffer(self, sizehint: int) -> bytearray:
            return self.buf

        def buffer_updated(self, nbytes: int) -> None:
            self.got += self.buf[:nbytes]

        def eof_received(self) -> bool:
            self.done.set_result(None)
            return False

    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0)
        async with server:
            tr, p = await api.create_connection(Buffered, "127.0.0.1", port_of(server))
            payload = os.urandom(1 << 20)
            tr.write(payload)
            tr.write_eof()
            await asyncio.wait_for(p.done, 20)
            assert bytes(p.got) == payload
            tr.close()

    run(asyncio.wait_for(main(), 30))


def test_callback_error_goes_to_exception_handler(api: SimpleNamespace, run: Any) -> None:
    class Boom(Collect):
        def data_received(self, data: bytes) -> None:
            raise ZeroDivisionError("boom")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        server = await api.start_server(echo_handler, "127.0.0.1", 0)
        async with server:
            tr, p = await api.create_connection(Boom, "127.0.0.1", port_of(server))
            tr.write(b"ping")
            exc = await asyncio.wait_for(p.lost, 5)
            assert isinstance(exc, ZeroDivisionError)
            assert any(isinstance(c.get("exception"), ZeroDivisionError) for c in seen)

    run(asyncio.wait_for(main(), 20))


def test_open_connection_cancelled(api: SimpleNamespace, run: Any) -> None:
    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0)
        async with server:
            task = asyncio.create_task(api.open_connection("127.0.0.1", port_of(server)))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the server is still fine afterwards
            r, w = await api.open_connection("127.0.0.1", port_of(server))
            w.write(b"ok\n")
            assert await r.readline() == b"ok\n"
            w.close()
            await w.wait_closed()

    run(asyncio.wait_for(main(), 20))


def test_serve_forever_and_close(api: SimpleNamespace, run: Any) -> None:
    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0, start_serving=False)
        assert not server.is_serving()
        task = asyncio.create_task(server.serve_forever())
        await asyncio.sleep(0.05)
        assert server.is_serving()
        r, w = await api.open_connection("127.0.0.1", port_of(server))
        w.write(b"x\n")
        assert await r.readline() == b"x\n"
        w.close()
        await w.wait_closed()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not server.is_serving()
        assert server.get_loop() is asyncio.get_running_loop()

    run(asyncio.wait_for(main(), 20))




# --------------------------------------------------------------------------- TLS

CERTS = os.path.join(os.path.dirname(__file__), "certs")


def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(
        os.path.join(CERTS, "localhost.crt"), os.path.join(CERTS, "localhost.key")
    )
    client = ssl.create_default_context(cafile=os.path.join(CERTS, "localhost.crt"))
    return server, client


def test_tls_streams_echo(api: SimpleNamespace, transport: str, run: Any) -> None:
    server_ctx, client_ctx = tls_contexts()

    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0, ssl=server_ctx)
        async with server:
            r, w = await api.open_connection(
                "127.0.0.1", port_of(server), ssl=client_ctx, server_hostname="localhost"
            )
            assert w.get_extra_info("sslcontext") is client_ctx
            assert w.get_extra_info("peercert")["subject"] == ((("commonName", "localhost"),),)
            provider(transport, w)
            payload = os.urandom(3 << 20)
            w.write(payload)
            got = bytearray()
            while len(got) < len(payload):
                chunk = await r.read(1 << 16)
                assert chunk
                got += chunk
            assert bytes(got) == payload
            w.close()
            await w.wait_closed()

    run(asyncio.wait_for(main(), 30))


def test_tls_verification_fails_for_wrong_name(api: SimpleNamespace, run: Any) -> None:
    server_ctx, client_ctx = tls_contexts()

    async def main() -> None:
        server = await api.start_server(echo_handler, "127.0.0.1", 0, ssl=server_ctx)
        async with server:
            with pytest.raises(ssl.SSLCertVerificationError):
                await api.open_connection(
                    "127.0.0.1", port_of(server), ssl=client_ctx, server_hostname="not-localhost"
                )

    run(asyncio.wait_for(main(), 30))


def test_start_tls_upgrade(api: SimpleNamespace, transport: str, run: Any) -> None:
    """STARTTLS: plain text first, then both ends upgrade the same transport."""
    server_ctx, client_ctx = tls_contexts()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        if transport == "rsock":
            import rsock.asyncio as ra

            start_tls: Any = ra.start_tls
        else:
            start_tls = loop.start_tls
        done: asyncio.Future[bytes] = loop.create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, tr: Any) -> None:
                self.tr = tr

            def data_received(self, data: bytes) -> None:
                if data == b"STARTTLS\n":
                    self.tr.write(b"OK\n")
                    asyncio.ensure_future(self.upgrade())

            async def upgrade(self) -> None:
                inner = Inner()
                tls_tr = await start_tls(self.tr, inner, server_ctx, server_side=True)
                inner.attach(tls_tr)

        class Inner(asyncio.Protocol):
            """Echoes upper-cased; data may come before start_tls returns."""

            def __init__(self) -> None:
                self.tr: Any = None
                self.pending = b""

            def attach(self, tr: Any) -> None:
                self.tr = tr
                if self.pending:
                    tr.write(self.pending.upper())

            def data_received(self, data: bytes) -> None:
                if self.tr is None:
                    self.pending += data
                else:
                    self.tr.write(data.upper())

        server = await api.create_server(Server, "127.0.0.1", 0)
        async with server:
            tr, cp = await api.create_connection(Collect, "127.0.0.1", port_of(server))
            tr.write(b"STARTTLS\n")
            while bytes(cp.data) != b"OK\n":
                await asyncio.sleep(0.01)

            class Client(asyncio.Protocol):
                def data_received(self, data: bytes) -> None:
                    if not done.done():
                        done.set_result(data)

            tls_tr = await start_tls(tr, Client(), client_ctx, server_hostname="localhost")
            tls_tr.write(b"secret")
            assert await asyncio.wait_for(done, 10) == b"SECRET"
            assert tls_tr.get_extra_info("cipher") is not None
            tls_tr.close()

    run(asyncio.wait_for(main(), 30))


@pytest.mark.timeout_s(30)
def test_create_connection_local_addr_with_no_host(api: SimpleNamespace) -> None:
    """local_addr=(None, port) is resolved as the loops resolve it (was:
    TypeError from bind).  asyncio's loop only: on uvloop the oracle itself
    (uvloop over TCP) hangs in uvloop.run's shutdown after this call."""

    async def main() -> str:
        server = await api.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await api.create_connection(
            asyncio.Protocol, "127.0.0.1", port, local_addr=(None, 0)
        )
        host = str(transport.get_extra_info("sockname")[0])
        transport.close()
        server.close()
        return host

    assert asyncio.run(main()) == "127.0.0.1"


@pytest.mark.timeout_s(30)
def test_numeric_hosts_skip_the_resolver_thread(api: SimpleNamespace) -> None:
    """A numeric host is used as it is, as the loops use it: no
    getaddrinfo in the loop's executor (a thread round per connection);
    a name still goes there.  asyncio's loop only (uvloop resolves in
    libuv's own pool, which no executor sees)."""
    import concurrent.futures

    class Counting(concurrent.futures.ThreadPoolExecutor):
        calls = 0

        def submit(self, *a: Any, **kw: Any) -> Any:
            Counting.calls += 1
            return super().submit(*a, **kw)

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(Counting(max_workers=1))
        server = await api.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for host in ("127.0.0.1", b"127.0.0.1"):
            transport, _ = await api.create_connection(
                asyncio.Protocol, host, str(port), local_addr=("127.0.0.1", 0)
            )
            assert transport.get_extra_info("peername") == ("127.0.0.1", port)
            transport.close()
        numeric = Counting.calls
        transport, _ = await api.create_connection(asyncio.Protocol, "localhost", port)
        transport.close()
        server.close()
        await server.wait_closed()
        return numeric, Counting.calls - numeric

    numeric, named = asyncio.run(main())
    assert numeric == 0
    assert named >= 1


@pytest.mark.timeout_s(60)
def test_loop_sendfile(api: SimpleNamespace, tmp_path: Any) -> None:
    """loop.sendfile() on a transport sends the file (rsock: asyncio's
    read-and-write fallback; was RuntimeError), from an offset, a count, and
    leaves the file position after what was sent; data written after it
    follows it.  asyncio's loop (uvloop has no loop.sendfile)."""
    import hashlib
    import random

    data = random.Random(5).randbytes(3_000_000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    want = data + data[1000:201_000] + b"after"

    async def main() -> tuple[int, int, int, int, bytes]:
        loop = asyncio.get_running_loop()
        got = bytearray()
        done = loop.create_future()

        class Sink(asyncio.Protocol):
            def data_received(self, chunk: bytes) -> None:
                got.extend(chunk)
                if len(got) >= len(want) and not done.done():
                    done.set_result(None)

        server = await api.create_server(Sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await api.create_connection(asyncio.Protocol, "127.0.0.1", port)
        with open(path, "rb") as f:
            n1 = await loop.sendfile(transport, f)
            pos1 = f.tell()
            n2 = await loop.sendfile(transport, f, 1000, 200_000)
            pos2 = f.tell()
        transport.write(b"after")
        await asyncio.wait_for(done, 20)
        transport.close()
        server.close()
        return n1, pos1, n2, pos2, bytes(got)

    n1, pos1, n2, pos2, got = asyncio.run(main())
    assert (n1, pos1, n2, pos2) == (len(data), len(data), 200_000, 201_000)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(want).hexdigest()
