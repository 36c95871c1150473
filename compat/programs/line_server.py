"""A line-protocol server on socketserver.ThreadingTCPServer (stdlib only).

    python line_server.py [--host HOST] [--port PORT]

Prints "READY <host> <port>" once listening; serves until SIGINT, then prints
"SERVED <connections> <commands>".  One command per line (bytes):

    ECHO <text>     -> <text>
    UPPER <text>    -> <TEXT>
    REV <text>      -> <txet>
    SUM <n> <n>...  -> the sum
    SHA <n>         -> followed by <n> raw bytes; replies with their SHA-256 (hex)
    BLOB <n> <seed> -> <n> raw bytes of pattern, then a newline
    QUIT            -> BYE, and the server closes the connection
    anything else   -> ERR unknown command
"""

import argparse
import hashlib
import socketserver
import sys
import threading

_lock = threading.Lock()
_connections = 0
_commands = 0


def pattern(n, seed):
    unit = hashlib.sha256(b"%d" % seed).digest() * 64  # 2 KiB
    return (unit * (n // len(unit) + 1))[:n]


class LineHandler(socketserver.StreamRequestHandler):
    timeout = 60
    disable_nagle_algorithm = True

    def handle(self):
        global _connections, _commands
        with _lock:
            _connections += 1
        for raw in self.rfile:
            cmd, _, arg = raw.rstrip(b"\r\n").partition(b" ")
            with _lock:
                _commands += 1
            if cmd == b"ECHO":
                reply = arg
            elif cmd == b"UPPER":
                reply = arg.upper()
            elif cmd == b"REV":
                reply = arg[::-1]
            elif cmd == b"SUM":
                reply = str(sum(int(x) for x in arg.split())).encode()
            elif cmd == b"SHA":
                data = self.rfile.read(int(arg))
                reply = hashlib.sha256(data).hexdigest().encode()
            elif cmd == b"BLOB":
                n, seed = (int(x) for x in arg.split())
                reply = pattern(n, seed)
            elif cmd == b"QUIT":
                self.wfile.write(b"BYE\n")
                return
            else:
                reply = b"ERR unknown command"
            self.wfile.write(reply + b"\n")


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with Server((args.host, args.port), LineHandler) as server:
        host, port = server.server_address[:2]
        print(f"READY {host} {port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    print(f"SERVED {_connections} {_commands}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
