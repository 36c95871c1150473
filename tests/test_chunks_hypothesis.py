"""Property: whatever the send chunking and receive sizes, the stream arrives intact.

Chunk sizes include 0-length sends and sizes around the 32 KiB, 64 KiB and 512 KiB
boundaries (typical inline / ring / batching limits).
"""

from __future__ import annotations

import random
import socket
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import Background, assert_fast_path, connected_pair

KiB = 1024
BOUNDARIES = [b + d for b in (32 * KiB, 64 * KiB, 512 * KiB) for d in (-1, 0, 1)]

chunk_sizes = st.one_of(
    st.just(0),
    st.integers(1, 64),
    st.sampled_from(BOUNDARIES),
    st.integers(0, 600 * KiB),
)
recv_sizes = st.one_of(
    st.integers(1, 64),
    st.sampled_from([1, 4 * KiB, *BOUNDARIES]),
    st.integers(1, 1024 * KiB),
)


def send_chunks(sock: socket.socket, data: bytes, chunks: list[int]) -> None:
    view = memoryview(data)
    for size in chunks:
        if size == 0:
            assert sock.send(b"") == 0
            sock.sendall(b"")
        else:
            sock.sendall(view[:size])
            view = view[size:]
    sock.shutdown(socket.SHUT_WR)


@pytest.mark.timeout_s(300)
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # sockmod/transport are stateless
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    chunks=st.lists(chunk_sizes, min_size=1, max_size=16),
    reads=st.lists(recv_sizes, min_size=1, max_size=16),
    use_recv_into=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_chunking_arrives_intact(
    sockmod: ModuleType,
    transport: str,
    chunks: list[int],
    reads: list[int],
    use_recv_into: bool,
    seed: int,
) -> None:
    data = random.Random(seed).randbytes(sum(chunks))
    client, server = connected_pair(sockmod)
    with client, server:
        assert_fast_path(transport, client, server)
        client.settimeout(30)
        server.settimeout(30)
        sender = Background(lambda: send_chunks(client, data, chunks), name="send")
        received = bytearray()
        buf = bytearray(max(reads))
        i = 0
        while True:
            size = reads[i % len(reads)]
            i += 1
            if use_recv_into:
                n = server.recv_into(memoryview(buf)[:size])
                piece = bytes(buf[:n])
            else:
                piece = server.recv(size)
                n = len(piece)
            assert n <= size
            if n == 0:
                break
            received += piece
        sender.result()
    assert len(received) == len(data)
    assert received == data
