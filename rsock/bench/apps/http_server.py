"""http.server's ThreadingHTTPServer as its documentation shows (no rsock import): a
thread per connection, HTTP/1.1 keep-alive, TCP_NODELAY; prints ``PORT <n>``, serves until its
standard input closes.  GET /small returns 5 bytes, GET /big 1 MiB."""

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODIES = {"/small": b"hello", "/big": bytes(range(256)) * 4096}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # socketserver's documented switch (TCP_NODELAY): without it, TCP's Nagle and the
    # client's delayed ACK hold each keep-alive answer (headers and body are two
    # writes) for ~40 ms, and the case would measure that instead of the transport
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = BODIES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


with ThreadingHTTPServer(("127.0.0.1", 0), Handler) as httpd:
    print("PORT", httpd.server_address[1], flush=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    sys.stdin.read()
    httpd.shutdown()
