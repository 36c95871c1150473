"""The other process of a cross-process test: ``python peer.py TRANSPORT MODE ARGS...``.

It reports on stdout, one line per event (``PORT n``, ``READY provider``,
``RESULT json``), and treats EOF on stdin as "let go": a peer holding a
connection closes it and exits.  It also dies with its parent (PR_SET_PDEATHSIG),
so a test run that is killed leaves nothing behind.

Modes:
  hold-server             listen on 127.0.0.1:0, accept one connection, neither read nor
                          write, hold it until stdin closes (or SIGKILL)
  hold-client PORT        connect, then hold as above
  echo-server             accept one connection and echo until EOF
  stream PORT SEND_SEED RECV_SEED NBYTES
                          connect, then send and receive at once (support.duplex_stream)
"""

from __future__ import annotations

import ctypes
import json
import signal
import sys
from typing import Any

from support import assert_fast_path, duplex_stream, load_sockmod, provider_of

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def say(*fields: object) -> None:
    print(*fields, flush=True)


def wait_for_release() -> None:
    sys.stdin.buffer.read()


def listen(mod: Any) -> Any:
    listener = mod.socket(mod.AF_INET, mod.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    say("PORT", listener.getsockname()[1])
    return listener


def accept_one(mod: Any) -> Any:
    with listen(mod) as listener:
        listener.settimeout(60)
        conn, _ = listener.accept()
    conn.settimeout(None)
    return conn


def connect(mod: Any, port: int) -> Any:
    sock = mod.socket(mod.AF_INET, mod.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(None)
    return sock


def main(argv: list[str]) -> int:
    die_with_parent()
    transport, mode, *args = argv
    mod = load_sockmod(transport)

    if mode in ("hold-server", "hold-client"):
        sock = accept_one(mod) if mode == "hold-server" else connect(mod, int(args[0]))
        with sock:
            assert_fast_path(transport, sock)
            say("READY", provider_of(transport, sock))
            wait_for_release()
        return 0

    if mode == "echo-server":
        with accept_one(mod) as conn:
            assert_fast_path(transport, conn)
            say("READY", provider_of(transport, conn))
            while data := conn.recv(1 << 16):
                conn.sendall(data)
        say("DONE")
        return 0

    if mode == "stream":
        port, send_seed, recv_seed, nbytes = (int(a) for a in args)
        with connect(mod, port) as sock:
            assert_fast_path(transport, sock)
            sock.settimeout(240)
            say("READY", provider_of(transport, sock))
            result = duplex_stream(sock, send_seed, recv_seed, nbytes)
        say("RESULT", json.dumps(result, separators=(",", ":")))
        return 0

    raise SystemExit(f"peer.py: unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
