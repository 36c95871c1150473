"""A plain WSGI application for gunicorn's sync workers (as gunicorn's
documentation shows): GET /small returns 5 bytes, other GETs 1 MiB, POST the
body's sha256."""

import hashlib

BIG = bytes(range(256)) * 4096


def app(environ, start_response):  # type: ignore[no-untyped-def]
    if environ["REQUEST_METHOD"] == "POST":
        size = int(environ.get("CONTENT_LENGTH") or 0)
        out = hashlib.sha256(environ["wsgi.input"].read(size)).hexdigest().encode()
    elif environ["PATH_INFO"] == "/small":
        out = b"hello"
    else:
        out = BIG
    start_response("200 OK", [("Content-Length", str(len(out)))])
    return [out]
