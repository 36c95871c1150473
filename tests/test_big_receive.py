"""Issue 18.1's minimal big-receive program as a test: a plain asyncio
Protocol that receives 1 MiB replies (appending the chunks, then joining
them, as aiohttp's client does).  The receiver's heap must not churn more
than over TCP: rsock's minor page faults per MiB (a count, not a timing)
stay within a small margin of TCP's in the same process and run (they were
~560 per MiB against TCP's 0 before the fix).  On asyncio's loop and uvloop."""

from __future__ import annotations

import asyncio

import pytest
from measure_asyncio_replies import measure

LOOPS = ["asyncio", "uvloop"]  # uvloop is a test dependency (make test installs it)
MARGIN = 16  # faults per MiB allowed above TCP's (allocator noise)


def _run(loop: str, mode: str) -> dict[str, float]:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(measure(mode, n=60))
    return asyncio.run(measure(mode, n=60))


@pytest.mark.timeout_s(120)
@pytest.mark.parametrize("loop", LOOPS)
def test_big_replies_cost_no_more_page_faults_than_tcp(loop: str) -> None:
    tcp = _run(loop, "tcp")
    rs = _run(loop, "rsock")
    assert rs["faults_per_mib"] <= tcp["faults_per_mib"] + MARGIN, (tcp, rs)
    # every reply arrived whole (the client checks the length of each join)
    assert rs["reads_per_mib"] >= 1 and tcp["reads_per_mib"] >= 1
