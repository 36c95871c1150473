"""Two processes stream 256 MiB of seeded random data in both directions at once.

Chunk sizes (1 B .. 1 MiB, log-uniform) and receive sizes are seeded; each side
hashes what it sent and what it received, and the hashes must match across the
processes.
"""

from __future__ import annotations

import json
from types import ModuleType

import pytest
from support import MiB, Peers, assert_fast_path, duplex_stream, provider_of

STREAM_BYTES = 256 * MiB
PARENT_SEND_SEED, PARENT_RECV_SEED = 1, 2
CHILD_SEND_SEED, CHILD_RECV_SEED = 3, 4


@pytest.mark.timeout_s(300)
def test_duplex_stream_256mib_across_processes(
    sockmod: ModuleType, transport: str, peers: Peers
) -> None:
    with sockmod.socket(sockmod.AF_INET, sockmod.SOCK_STREAM) as listener:
        listener.settimeout(60)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        peer = peers.start(
            transport,
            "stream",
            listener.getsockname()[1],
            CHILD_SEND_SEED,
            CHILD_RECV_SEED,
            STREAM_BYTES,
        )
        conn, _ = listener.accept()
    with conn:
        assert_fast_path(transport, conn)
        assert peer.expect("READY", timeout=60) == [provider_of(transport, conn)]
        conn.settimeout(240)
        mine = duplex_stream(conn, PARENT_SEND_SEED, PARENT_RECV_SEED, STREAM_BYTES)
    (result,) = peer.expect("RESULT", timeout=240)
    theirs = json.loads(result)
    assert peer.wait() == 0

    assert mine["sent"] == STREAM_BYTES
    assert theirs["sent"] == STREAM_BYTES
    assert mine["received"] == theirs["sent"]
    assert theirs["received"] == mine["sent"]
    assert mine["received_sha256"] == theirs["sent_sha256"]
    assert theirs["received_sha256"] == mine["sent_sha256"]
    assert mine["sent_sha256"] != theirs["sent_sha256"]  # the seeds really differ
