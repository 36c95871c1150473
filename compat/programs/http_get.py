"""Download a URL with urllib.request and print what arrived (stdlib only).

    python http_get.py URL [URL...]

For each URL, one JSON line: HTTP status, Content-Length, bytes received and
their SHA-256; then the latencies (``LATENCIES`` and a JSON object: the seconds of
each URL's request and body, in order).  Proxies from the environment are ignored.
Exit status 1 if a body is shorter or longer than its Content-Length.
"""

import contextlib
import hashlib
import json
import sys
import time
import urllib.error
import urllib.request

LATENCIES = {}  # seconds, per kind of request, in order of completion


@contextlib.contextmanager
def timed(kind):
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


def fetch(opener, url):
    digest = hashlib.sha256()
    received = 0
    try:
        resp = opener.open(url, timeout=60)
    except urllib.error.HTTPError as e:
        e.read()
        e.close()
        return {"url": url, "status": e.code, "length": None, "bytes": 0, "sha256": None}
    with resp:
        length = resp.headers.get("Content-Length")
        while True:
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            received += len(chunk)
    return {
        "url": url,
        "status": resp.status,
        "length": None if length is None else int(length),
        "bytes": received,
        "sha256": digest.hexdigest(),
    }


def main(urls):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    ok = True
    for url in urls:
        with timed("get"):
            result = fetch(opener, url)
        if result["length"] is not None and result["length"] != result["bytes"]:
            ok = False
        print(json.dumps(result, sort_keys=True), flush=True)
    print("LATENCIES", json.dumps(LATENCIES), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
