"""An ``ftplib`` client: in passive and in active mode, uploads 3 MiB
(``storbinary``), downloads it back (``retrbinary``: the server sends it
with ``os.sendfile``) and checks it, lists the directory; prints each command's
latency (``LATENCIES`` and a JSON object: seconds per kind, the 3 MiB transfers
apart) and OK."""

import contextlib
import hashlib
import io
import json
import sys
import time
from collections.abc import Iterator
from ftplib import FTP

DATA = hashlib.sha256(b"ftp").digest() * (3 * 1024 * 1024 // 32)

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


for passive in (True, False):
    with FTP() as ftp:
        with timed("command"):
            ftp.connect("127.0.0.1", int(sys.argv[1]), timeout=30)
        with timed("command"):
            ftp.login("user", "12345")
        ftp.set_pasv(passive)
        name = f"up-{passive}.bin"
        with timed("transfer"):
            assert ftp.storbinary(f"STOR {name}", io.BytesIO(DATA)).startswith("226")
        got = bytearray()
        with timed("transfer"):
            assert ftp.retrbinary(f"RETR {name}", got.extend).startswith("226")
        assert hashlib.sha256(got).digest() == hashlib.sha256(DATA).digest(), len(got)
        with timed("command"):
            assert name in ftp.nlst()
        with timed("command"):
            ftp.voidcmd("TYPE I")
        with timed("command"):
            assert ftp.size(name) == len(DATA)
print("LATENCIES", json.dumps(LATENCIES))
print("OK")
