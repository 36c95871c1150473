"""An XML-RPC server on xmlrpc.server.SimpleXMLRPCServer (stdlib only).

    python xmlrpc_server.py [--host HOST] [--port PORT]

Prints "READY <host> <port>" once listening; serves until SIGINT, then prints
"SERVED <requests>".
"""

import argparse
import hashlib
import sys
from xmlrpc.server import SimpleXMLRPCRequestHandler, SimpleXMLRPCServer

_requests = 0


class Handler(SimpleXMLRPCRequestHandler):
    rpc_paths = ("/RPC2",)

    def do_POST(self):
        global _requests
        _requests += 1
        super().do_POST()


class Calculator:
    def add(self, a, b):
        return a + b

    def divide(self, a, b):
        return a / b


def echo(value):
    return value


def blob(n, seed):
    """n bytes of a pattern."""
    unit = hashlib.sha256(b"%d" % seed).digest() * 64
    return (unit * (n // len(unit) + 1))[:n]


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def fail(message):
    raise ValueError(message)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with SimpleXMLRPCServer(
        (args.host, args.port),
        requestHandler=Handler,
        logRequests=False,
        allow_none=True,
        use_builtin_types=True,
    ) as server:
        server.register_introspection_functions()
        server.register_multicall_functions()
        server.register_instance(Calculator())
        for fn in (echo, blob, sha256, fail):
            server.register_function(fn)
        host, port = server.server_address[:2]
        print(f"READY {host} {port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    print(f"SERVED {_requests}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
