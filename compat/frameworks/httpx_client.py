"""httpx, as its documentation shows: a keep-alive Client and one-off calls
against an ASGI app under uvicorn, 1 MiB bodies both ways; prints OK."""

import hashlib
import sys

import httpx

BIG = bytes(range(256)) * 4096
base = f"http://127.0.0.1:{sys.argv[1]}"
with httpx.Client() as client:
    for _ in range(100):
        assert client.get(f"{base}/small").content == b"hello"
    for _ in range(5):
        assert client.get(f"{base}/big").content == BIG
        assert client.post(f"{base}/echo", content=BIG).text == hashlib.sha256(BIG).hexdigest()
for _ in range(10):
    assert httpx.get(f"{base}/small").content == b"hello"
print("OK")
