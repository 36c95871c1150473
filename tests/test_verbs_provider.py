"""The verbs provider from Python on this host.

``make test`` runs on machines without RDMA (the kernel has none here): what must hold
there is the "no device" path — ``RSOCK_PROVIDER=verbs`` gives one clear ``OSError``
(never a crash or a hang), and the default provider keeps working.  The same tests
pass inside the rxe guest, where a device exists (``make test-rdma``).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

import rsock
from rsock import _paths

pytestmark = pytest.mark.timeout_s(60)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    e = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=50
    )


def test_probe_is_one_sentence() -> None:
    n, why = _paths.verbs_available()
    if n > 0:
        assert why.endswith(("device", "devices"))
    else:
        assert n in (-errno.ENODEV, -errno.ENOSYS)
        assert why.startswith("verbs provider: ")
        assert "\n" not in why


def test_forced_verbs_without_device_is_a_clear_error() -> None:
    n, why = _paths.verbs_available()
    code = (
        "import errno, rsock\n"
        "for op in ('connect', 'listen'):\n"
        "    s = rsock.socket()\n"
        "    try:\n"
        "        if op == 'connect':\n"
        "            s.connect(('127.0.0.1', 9))\n"
        "        else:\n"
        "            s.bind(('127.0.0.1', 0)); s.listen()\n"
        "    except OSError as e:\n"
        "        print(op, e.errno, e.strerror)\n"
        "    else:\n"
        "        print(op, 'ok')\n"
        "    s.close()\n"
    )
    out = _run(code, RSOCK_PROVIDER="verbs")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if n > 0:
        assert lines[0].startswith("connect 111")  # nobody listens on port 9
        assert lines[1] == "listen ok"
    else:
        for line, op in zip(lines, ("connect", "listen"), strict=True):
            assert line == f"{op} {-n} {why}"


def test_default_provider_unaffected(
    pair: tuple[rsock.socket, rsock.socket], transport: str
) -> None:
    client, server = pair
    client.sendall(b"x" * 100_000)
    got = b""
    while len(got) < 100_000:
        got += server.recv(65536)
    assert got == b"x" * 100_000
    if transport == "rsock":
        assert client.provider == server.provider == "shm"


def test_no_device_no_rdma_core_mapped() -> None:
    """A host whose kernel lists no RDMA device: a listener and a
    connection never load rdma-core (libibverbs, librdmacm and the netlink
    libraries would be mapped into every process that listens, and copied
    by each of its forks)."""
    try:
        listed = [d for d in os.listdir("/sys/class/infiniband") if not d.startswith(".")]
    except FileNotFoundError:
        listed = []
    code = (
        "import rsock\n"
        "l = rsock.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n"
        "c = rsock.create_connection(l.getsockname()); s, _ = l.accept()\n"
        "print(c.provider, any('libibverbs' in m or 'librdmacm' in m\n"
        "      for m in open('/proc/self/maps')))\n"
    )
    proc = _run(code, RSOCK_PROVIDER="")  # (the default: shm to this host)
    assert proc.returncode == 0, proc.stderr
    provider, mapped = proc.stdout.split()
    assert provider == "shm"
    if not listed:
        assert mapped == "False", "rdma-core loaded on a host without an RDMA device"
