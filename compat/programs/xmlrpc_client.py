"""Client for xmlrpc_server.py on xmlrpc.client.ServerProxy (stdlib only).

    python xmlrpc_client.py URL [--repeat N]

Checks every result; prints the latencies (``LATENCIES`` and a JSON object: the
seconds of each HTTP request per method, timed by a ``Transport`` subclass), then
one JSON line (calls made, SHA-256 of the results) and exits 1 on the first wrong
one.
"""

import argparse
import contextlib
import hashlib
import json
import sys
import time
import xmlrpc.client

LATENCIES = {}  # seconds, per kind of request, in order of completion


@contextlib.contextmanager
def timed(kind):
    """Times what runs in the block: one request (or message) of ``kind``; a
    request answered with a Fault too."""
    start = time.perf_counter()
    try:
        yield
    finally:
        LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


class TimedTransport(xmlrpc.client.Transport):
    """The standard transport, timing each request (one per call; a multicall is
    one ``system.multicall``)."""

    def request(self, host, handler, request_body, verbose=False):
        method = request_body.partition(b"<methodName>")[2].partition(b"<")[0]
        with timed(method.decode()):
            return super().request(host, handler, request_body, verbose)


def expect(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: expected {want!r:.80}, got {got!r:.80}")
    return got


def session(proxy, i, results):
    results.append(expect(proxy.add(i, 40), i + 40, "add"))
    results.append(expect(proxy.divide(7, 2), 3.5, "divide"))
    nested = {"i": i, "list": [1, 2.5, "three", None, True], "map": {"k": ["v"] * i}}
    results.append(expect(proxy.echo(nested), nested, "echo"))
    text = "é✓ " * (1000 * (i + 1))
    results.append(expect(proxy.echo(text), text, "echo text"))
    n = 100_000 + 250_000 * i
    unit = hashlib.sha256(b"%d" % i).digest() * 64
    data = proxy.blob(n, i)
    expect(data, (unit * (n // len(unit) + 1))[:n], "blob")
    results.append(hashlib.sha256(data).hexdigest())
    results.append(expect(proxy.sha256(data), hashlib.sha256(data).hexdigest(), "sha256"))
    try:
        proxy.fail(f"boom {i}")
    except xmlrpc.client.Fault as fault:
        results.append(expect(fault.faultString, f"<class 'ValueError'>:boom {i}", "fault"))
    else:
        raise AssertionError("fail() did not raise a Fault")
    multi = xmlrpc.client.MultiCall(proxy)
    multi.add(1, 2)
    multi.echo("m")
    multi.divide(1, 4)
    results.append(expect(list(multi()), [3, "m", 0.25], "multicall"))
    methods = proxy.system.listMethods()
    results.append(expect("blob" in methods and "system.multicall" in methods, True, "methods"))
    return 9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results = []
    calls = 0
    transport = TimedTransport(use_builtin_types=True)
    with xmlrpc.client.ServerProxy(
        args.url, transport=transport, allow_none=True, use_builtin_types=True
    ) as proxy:
        for i in range(args.repeat):
            calls += session(proxy, i, results)
    print("LATENCIES", json.dumps(LATENCIES), flush=True)
    print(
        json.dumps(
            {"calls": calls, "sha256": hashlib.sha256(repr(results).encode()).hexdigest()},
            sort_keys=True,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
