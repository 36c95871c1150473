"""requests, as its documentation shows: a Session (keep-alive) and one-off
calls, 1 MiB bodies both ways, checked; prints OK."""

import hashlib
import sys

import requests

BIG = bytes(range(256)) * 4096
base = f"http://127.0.0.1:{sys.argv[1]}"
with requests.Session() as s:
    for _ in range(10):
        assert s.get(f"{base}/").content == BIG
        assert s.post(f"{base}/", data=BIG).text == hashlib.sha256(BIG).hexdigest()
for _ in range(5):
    assert requests.get(f"{base}/").content == BIG
print("OK")
