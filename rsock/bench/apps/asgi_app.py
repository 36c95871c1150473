"""A plain ASGI application for uvicorn (as uvicorn's documentation shows):
GET /small returns 5 bytes, GET /big 1 MiB."""

from typing import Any

BIG = bytes(range(256)) * 4096


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    while True:
        message = await receive()
        if not message.get("more_body"):
            break
    out = b"hello" if scope["path"] == "/small" else BIG
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(out)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": out})
