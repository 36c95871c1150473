"""The stall rule the compat suite (and ``python -m rsock.bench apps``) applies to
the latencies its clients record: stalled when the slowest is above 100 ms while
the median is below 10 ms.  Arithmetic only: no sockets."""

from __future__ import annotations

import pytest
from compat_support import (
    STALL_MAX_S,
    STALL_MEDIAN_S,
    check_no_stall,
    latency_median,
    split_latencies,
    stall_problem,
    stalled,
)

MS = 0.001


def test_the_thresholds() -> None:
    assert STALL_MAX_S == 0.100 and STALL_MEDIAN_S == 0.010


@pytest.mark.parametrize(
    ("latencies", "want"),
    [
        ([1 * MS] * 50 + [200 * MS], True),  # one slow request among fast ones
        ([1 * MS] * 50, False),  # all fast
        ([20 * MS] * 50 + [200 * MS], False),  # the median is not below 10 ms
        ([200 * MS] * 51, False),  # all slow: a speed figure, not a stall
        ([1 * MS] * 50 + [100 * MS], False),  # the slowest not above 100 ms
        ([1 * MS] * 50 + [100.001 * MS], True),
        ([10 * MS] * 50 + [200 * MS], False),  # the median not below 10 ms
        ([9.999 * MS] * 50 + [200 * MS], True),
        ([200 * MS] + [1 * MS] * 50, True),  # where the slow one is does not matter
        ([1 * MS] * 26 + [150 * MS] * 25, True),  # nearly half of them slow
        ([1 * MS] * 25 + [150 * MS] * 26, False),  # more than half: the median is slow
        ([1 * MS, 500 * MS] * 50, True),  # every second one waits: the lower median
        ([500 * MS, 1 * MS] * 50, True),
        ([1 * MS, 500 * MS], True),
        ([500 * MS], False),  # a single transfer cannot stall
        ([], False),
    ],
)
def test_stalled(latencies: list[float], want: bool) -> None:
    assert stalled(latencies) is want
    assert (stall_problem(latencies, "x") is not None) is want


def test_the_median_of_an_even_count_is_the_lower_one() -> None:
    assert latency_median([1.0, 2.0, 3.0]) == 2.0
    assert latency_median([4.0, 1.0, 3.0, 2.0]) == 2.0
    assert latency_median([0.5, 0.001]) == 0.001


def test_the_message_names_count_median_max_and_the_slowest() -> None:
    latencies = [1 * MS] * 50 + [200 * MS]
    latencies[7] = 300 * MS
    latencies[20] = 2 * MS
    text = stall_problem(latencies, "my client, 'keepalive'")
    assert text is not None
    assert text.startswith("stall in my client, 'keepalive': 51 latencies"), text
    assert "median 1.000 ms (< 10 ms)" in text and "max 300.0 ms (> 100 ms)" in text, text
    # the slowest few, slowest first, by index in the order they were recorded
    assert text.endswith("slowest: #7 300.0 ms, #50 200.0 ms, #20 2.0 ms, #0 1.0 ms, #1 1.0 ms")


def test_split_latencies() -> None:
    out = 'first\nLATENCIES {"a": [0.001, 0.002], "b": [1]}\nOK\n'
    rest, latencies = split_latencies(out)
    assert rest == "first\nOK\n"
    assert latencies == {"a": [0.001, 0.002], "b": [1.0]}
    with pytest.raises(AssertionError, match="no LATENCIES line"):
        split_latencies("OK\n")
    with pytest.raises(AssertionError, match="two LATENCIES lines"):
        split_latencies('LATENCIES {"a": [1]}\nLATENCIES {"a": [1]}\n')


def test_check_no_stall_per_kind_with_exemptions() -> None:
    fast, stall = [1 * MS] * 20, [1 * MS] * 20 + [150 * MS]
    check_no_stall({"small": fast, "big": [0.5, 0.6]}, "ok")
    # kinds are judged apart: fast ones do not lower a slow kind's median
    check_no_stall({"small": fast, "big": [150 * MS] * 3}, "ok")
    with pytest.raises(AssertionError, match=r"stall in prog over rsock, 'small': 21 latencies"):
        check_no_stall({"small": stall, "big": [0.5]}, "prog over rsock")
    check_no_stall({"small": stall}, "prog", exempt=("small",))  # recorded, not judged
    with pytest.raises(AssertionError):
        check_no_stall({"small": fast}, "prog", exempt=("typo",))  # an exemption names a kind
    with pytest.raises(AssertionError, match="no 'small' latency"):
        check_no_stall({"small": []}, "prog")
