"""A Flask application, as Flask's quickstart shows, run by ``flask --app
flask_app run --debug`` (the development server with its reloader, which
serves from a child process on the listener the parent bound): GET /small
returns 5 bytes, other GETs 1 MiB, POST the body's sha256."""

import hashlib

from flask import Flask, request

BIG = bytes(range(256)) * 4096

app = Flask(__name__)


@app.get("/small")
def small() -> bytes:
    return b"hello"


@app.get("/<path:rest>")
def big(rest: str) -> bytes:
    return BIG


@app.post("/<path:rest>")
def digest(rest: str) -> str:
    return hashlib.sha256(request.get_data()).hexdigest()
