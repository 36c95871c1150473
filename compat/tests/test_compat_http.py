"""(a) stdlib ``http.server`` serves a 100 MB file to ``urllib.request``.

The server is ``python -m http.server`` itself (``python -m rsock run -m
http.server`` over rsock); the client, ``programs/http_get.py``, runs in this
process, patched over rsock.  The client times each request: the stall rule
applies to the small ones (the 100 MB one is recorded, and exempt).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from compat_support import (
    TRANSPORTS,
    check_fast_path,
    check_listener,
    check_no_stall,
    no_tracebacks,
    program,
    python_cmd,
    read_report,
    run_in_process,
    running_server,
    split_latencies,
)

SIZE = 100 * 1000 * 1000


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A directory with a 100 MB file of random bytes; (directory, its SHA-256)."""
    root = tmp_path_factory.mktemp("site")
    digest = hashlib.sha256()
    chunk = 1 << 20
    with open(root / "big.bin", "wb") as f:
        left = SIZE
        while left:
            data = os.urandom(min(chunk, left))
            digest.update(data)
            f.write(data)
            left -= len(data)
    (root / "small.txt").write_text("hello over rsock\n")
    return root, digest.hexdigest()


def serving_port(line: str) -> int | None:
    m = re.match(r"Serving HTTP on \S+ port (\d+) ", line)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_http_server_100mb(transport: str, site: tuple[Path, str], tmp_path: Path) -> None:
    root, sha = site
    report = tmp_path / "server-report.json"
    cmd = python_cmd(transport, report) + [
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        "--directory",
        str(root),
        "0",
    ]
    with running_server(cmd, tmp_path, "http.server", serving_port) as server:
        check_listener(transport, server.port)
        base = f"http://127.0.0.1:{server.port}"
        code, out, counts = run_in_process(
            transport,
            program("http_get.py"),
            [f"{base}/big.bin", f"{base}/small.txt", f"{base}/", f"{base}/missing"],
        )
        assert server.stop() == 0, server.stderr()
    assert code == 0, out
    out, latencies = split_latencies(out)
    # one request a URL, in order: the 100 MB body's time is a transfer's, not a
    # latency (recorded, exempt); the rule on the three small ones
    assert len(latencies["get"]) == 4, latencies
    check_no_stall({"small": latencies["get"][1:]}, f"http_get.py over {transport}")
    big, small, listing, missing = (json.loads(line) for line in out.splitlines())
    assert big == {
        "url": f"{base}/big.bin",
        "status": 200,
        "length": SIZE,
        "bytes": SIZE,
        "sha256": sha,
    }
    assert small["status"] == 200
    assert small["sha256"] == hashlib.sha256(b"hello over rsock\n").hexdigest()
    assert listing["status"] == 200 and listing["bytes"] > 0
    assert missing["status"] == 404
    log = server.stderr()
    assert log.count('"GET /big.bin HTTP/1.1" 200') == 1, log
    no_tracebacks(log, "http.server")
    if transport == "rsock":
        check_fast_path(transport, counts, connect=4)
        check_fast_path(transport, read_report(report), accept=4)
        assert counts.get("stdlib", 0) == 0, counts
