"""A plain ASGI application for uvicorn (as uvicorn's documentation shows):
GET returns 1 MiB, POST returns the body's sha256, /small returns 5 bytes."""

import hashlib

BIG = bytes(range(256)) * 4096


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["method"] == "POST":
        out = hashlib.sha256(body).hexdigest().encode()
    elif scope["path"] == "/small":
        out = b"hello"
    else:
        out = BIG
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})
