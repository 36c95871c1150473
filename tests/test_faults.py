"""Injected provider faults (``RSOCK_FAULT``, native/src/prov_fault.c) across processes.

Each test runs an rsock listener in this process and an rsock client in a child
process (this file run as a script) whose environment sets ``RSOCK_FAULT``: the
fault hits only the child's queue pair.  A numbered byte stream (8-byte
little-endian counters) flows one way; whatever either side received must be
exactly a prefix of what was sent (nothing lost in the middle, reordered or
delivered twice), and both sides must end the stdlib way, never hang:

* a fault that breaks the queue pair: ``ConnectionResetError`` where it hit, and
  ``ConnectionResetError``/``BrokenPipeError`` (or a prefix, then
  ``ConnectionResetError``) at the other end;
* a corrupted header: the victim resets the connection (the detail says which
  check caught it) and the other end gets ``ConnectionResetError``;
* a harmless fault (a lost send completion, slow completions): the whole stream
  and then EOF ``b''``; a timeout shorter than the delay is ``TimeoutError``.

The counts make every test deterministic: ``kind:N`` lets N operations through.
"""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from support import connected_pair

RING = 65536  # small rings: many messages and credit updates, senders block
QDEPTH = 16
TOTAL = 2 << 20  # bytes in a stream
CHILD_TIMEOUT_S = 30.0


def numbered(total: int) -> bytes:
    """The stream: 8-byte little-endian counters 0, 1, 2, ... (total % 8 == 0)."""
    words = array.array("Q", range(total // 8))
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes()


def assert_prefix(got: bytes, sent: bytes) -> None:
    if got != sent[: len(got)]:
        bad = next(i for i, (a, b) in enumerate(zip(got, sent, strict=False)) if a != b)
        raise AssertionError(
            f"received {len(got)} bytes, not a prefix of the stream: first difference "
            f"at byte {bad} (counter {bad // 8})"
        )


def outcome(e: BaseException | None) -> dict[str, str]:
    """What ended a transfer, as strings.  (Only strings: an exception kept past its
    ``except`` block is a reference cycle with the frames of the failed send, and on
    CPython < 3.12 collecting a memoryview slice still exported to cffi in such a
    cycle crashes the interpreter: python/cpython#77894.)"""
    return {"outcome": "ok" if e is None else type(e).__name__, "detail": str(e or "")}


# --------------------------------------------------------------------------- child side


def child_send(sock: Any, total: int) -> dict[str, Any]:
    data = memoryview(numbered(total))
    sent = 0
    end = outcome(None)
    try:
        while sent < total:
            sent += sock.send(data[sent : sent + 1 + (sent * 7919) % 100000])
        sock.shutdown(socket.SHUT_WR)
        tail = sock.recv(1)  # the parent closes after reading everything
        assert tail == b"", tail
    except OSError as e:
        end = outcome(e)
    return {"sent": sent, **end}


def child_recv(sock: Any, total: int) -> dict[str, Any]:
    got = bytearray()
    end = outcome(None)
    try:
        while chunk := sock.recv(1 + len(got) % 70000):
            got += chunk
    except OSError as e:
        end = outcome(e)
    assert_prefix(bytes(got), numbered(total))
    return {"received": len(got), **end}


def child_sendall(sock: Any, total: int) -> dict[str, Any]:
    """One sendall of the whole stream (several messages in one engine call)."""
    end = outcome(None)
    try:
        sock.sendall(numbered(total))
    except OSError as e:
        end = outcome(e)
    return end


def child_timeout(sock: Any, total: int) -> dict[str, Any]:
    """recv with a timeout shorter than the completion delay, then a longer one."""
    sock.settimeout(0.05)
    t0 = time.monotonic()
    try:
        sock.recv(total)
        first = "data"
    except TimeoutError:
        first = "TimeoutError"
    waited = time.monotonic() - t0
    sock.settimeout(10)
    got = bytearray()
    while len(got) < total and (chunk := sock.recv(total - len(got))):
        got += chunk
    assert_prefix(bytes(got), numbered(total))
    tail = sock.recv(1)
    return {"first": first, "waited": waited, "received": len(got), "tail": tail.hex()}


def child_main(role: str, port: int, total: int) -> None:
    import rsock
    from rsock import _lowlevel

    with rsock.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert sock.provider == "shm", sock.provider
        sock.settimeout(CHILD_TIMEOUT_S)
        roles = {
            "send": child_send,
            "sendall": child_sendall,
            "recv": child_recv,
            "timeout": child_timeout,
        }
        result = roles[role](sock, total)
        # the engine's reason, whichever error the caller saw (white-box)
        h = sock._h
        result["why"] = _lowlevel.detail(h) if h is not None else ""
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------- parent side


def run_child(
    fault: str, role: str, port: int, total: int, ring: int = RING
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        RSOCK_FAULT=fault,
        RSOCK_RING_SIZE=str(ring),
        RSOCK_QDEPTH=str(QDEPTH),
        RSOCK_FALLBACK="never",
    )
    return subprocess.Popen(
        [sys.executable, __file__, role, str(port), str(total)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def child_result(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S + 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, f"child failed ({proc.returncode}): {err.decode()[-3000:]}"
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def serve(
    fault: str, child_role: str, total: int = TOTAL, linger: bool = False, ring: int = RING
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs the child with ``fault`` in ``child_role``; this process plays the other
    role.  Returns (child's result, ours).  With ``linger`` this process, once it
    has received everything, half-closes and waits for the child to finish before
    it closes (its close then cannot overtake its FIN)."""
    import rsock

    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(10)
        proc = run_child(fault, child_role, srv.getsockname()[1], total, ring)
        try:
            conn, _ = srv.accept()
            with conn:
                assert conn.provider == "shm"
                conn.settimeout(CHILD_TIMEOUT_S)
                if child_role.startswith("send"):
                    ours = parent_recv(conn, total)
                else:
                    ours = parent_send(conn, total)
                if linger:
                    conn.shutdown(socket.SHUT_WR)
                    result = child_result(proc)
        except BaseException:
            proc.kill()
            raise
        return (result if linger else child_result(proc)), ours


def parent_send(conn: Any, total: int) -> dict[str, Any]:
    data = numbered(total)
    end = outcome(None)
    try:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        tail = conn.recv(1)  # EOF when the child closes
        assert tail == b"", tail
    except OSError as e:
        end = outcome(e)
    assert end["outcome"] != "TimeoutError", "the sender hung"
    return end


def parent_recv(conn: Any, total: int) -> dict[str, Any]:
    got = bytearray()
    end = outcome(None)
    try:
        while chunk := conn.recv(65536):
            got += chunk
    except OSError as e:
        end = outcome(e)
    assert end["outcome"] != "TimeoutError", "the receiver hung"
    assert_prefix(bytes(got), numbered(total))
    return {"received": len(got), **end}


RESET = "ConnectionResetError"
SENDER_FAILS = {RESET, "BrokenPipeError"}

# --------------------------------------------------------------------------- tests


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize(
    "fault, detail",
    [
        ("drop_recv:5", "completion error"),
        ("fail_recv:3", "repost failed"),
        ("fail_recv:3:ENOMEM", "repost failed"),
        ("qp_error:1", "provider shm"),
        ("corrupt:7:opcode", "opcode 7"),
        ("corrupt:7:len", "does not fit"),
    ],
)
def test_receiver_fault_resets_both_ends(fault: str, detail: str) -> None:
    """The fault hits the receiving child: it gets a prefix, then ConnectionResetError
    saying why; the sender in this process fails instead of blocking forever."""
    child, ours = serve(fault, "recv")
    assert child["outcome"] == RESET, child
    assert detail in child["detail"], child
    assert 0 < child["received"] < TOTAL, child
    assert ours["outcome"] in SENDER_FAILS, ours


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize(
    "fault, detail",
    [
        ("drop_recv:2", "completion error"),
        ("fail_write:20", "post failed"),
        ("fail_write:20:ENOMEM", "post failed"),
        ("qp_error:20", "provider shm"),
        ("corrupt:2:consumed", "credit for"),
        ("corrupt:2:limit", "message limit"),
        ("corrupt:2:ctrlop", "ctrl slot op"),
    ],
)
def test_sender_fault_resets_both_ends(fault: str, detail: str) -> None:
    """The fault hits the sending child (its writes, or the credit messages it
    receives): its send fails with ConnectionResetError/BrokenPipeError, and this
    process receives a prefix of the stream, then ConnectionResetError."""
    child, ours = serve(fault, "send")
    assert child["outcome"] in SENDER_FAILS, child
    assert detail in child["why"], child
    assert 0 < child["sent"], child
    assert ours["outcome"] == RESET, ours
    assert ours["received"] <= child["sent"], (ours, child)


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize(
    "fault, child_role",
    [
        ("drop_send:0", "send"),
        ("drop_send:3", "send"),
        ("delay:2", "recv"),
        ("delay:2", "send"),
        # faults whose counts are never reached change nothing
        ("drop_recv:100000,fail_write:100000,corrupt:100000:opcode", "send"),
    ],
)
def test_harmless_fault_delivers_everything(fault: str, child_role: str) -> None:
    """Lost send completions and slow receive completions cost nothing but time: the
    whole stream arrives in order, then EOF b''."""
    child, ours = serve(fault, child_role, total=512 << 10, linger=True)
    receiver = ours if child_role == "send" else child
    sender = child if child_role == "send" else ours
    assert (receiver["received"], receiver["outcome"]) == (512 << 10, "ok"), receiver
    assert sender["outcome"] == "ok", sender


@pytest.mark.timeout_s(60)
def test_delayed_completion_times_out_then_arrives() -> None:
    """A receive completion held back 400 ms: a 50 ms recv timeout raises
    TimeoutError (the engine sleeps, it does not spin or hang), and a longer wait
    is woken by the delayed completion and gets the data, then EOF."""
    child, ours = serve("delay:400", "timeout", total=4096)
    assert ours["outcome"] == "ok", ours
    assert child["first"] == "TimeoutError", child
    assert child["waited"] > 0.04, child  # it slept for its timeout
    assert child["received"] == 4096 and child["tail"] == "", child


@pytest.mark.timeout_s(60)
def test_fin_completion_delayed_past_close_is_still_eof() -> None:
    """The peer sends everything, FIN, and closes at once; the FIN's completion
    reaches the child 40 ms after the liveness channel reports the close (the
    engine gives a lagging FIN 100 ms).  TCP would give EOF: the close was
    orderly."""
    child, ours = serve("delay:40", "send", total=4096)
    assert ours["outcome"] == "ok", ours
    assert child["outcome"] == "ok", child


@pytest.mark.timeout_s(60)
def test_reset_during_a_partial_send_is_reported() -> None:
    """The queue pair breaks after the first of the three messages one sendall of
    600 KiB takes: as with TCP, sendall must raise ConnectionResetError (the reset
    is reported by the call after the partial one), not BrokenPipeError."""
    child, ours = serve("qp_error:1", "sendall", total=600 << 10, ring=1 << 20)
    assert "completion error" in child["why"], child
    assert ours["outcome"] == RESET, ours
    assert child["outcome"] == RESET, child


@pytest.mark.timeout_s(30)
def test_reset_after_partial_waitall_recv_is_reported(
    sockmod: Any, transport: str, request: pytest.FixtureRequest
) -> None:
    """A recv(MSG_WAITALL) that copied some bytes and then met a reset returns those
    bytes; the reset must still be reported by the next call, as TCP does, not turn
    into a clean EOF (which would hide a truncated stream)."""
    client, server = connected_pair(sockmod)
    with client, server:
        server.sendall(b"x")  # left unread: the client's close is abortive
        client.sendall(b"0123456789")
        time.sleep(0.1)
        client.close()
        time.sleep(0.1)
        server.settimeout(5)
        assert server.recv(100, socket.MSG_WAITALL) == b"0123456789"
        with pytest.raises(ConnectionResetError):
            server.recv(100)


@pytest.mark.timeout_s(30)
@pytest.mark.parametrize(
    "fault", ["bogus:1", "drop_recv", "corrupt:1:nothing", "fail_write:1:EWHAT"]
)
def test_malformed_fault_spec_refuses_to_connect(fault: str) -> None:
    """A typo in RSOCK_FAULT must not silently test nothing: the child cannot
    create a queue pair (it says why on stderr)."""
    import rsock

    with rsock.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        proc = run_child(fault, "recv", srv.getsockname()[1], 8)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode != 0
    assert b"RSOCK_FAULT: bad entry" in err, err.decode()


if __name__ == "__main__":
    child_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
