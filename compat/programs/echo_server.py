"""A selectors-based echo server: non-blocking sockets, no threads, no asyncio.

    python echo_server.py [--host HOST] [--port PORT]

Prints "READY <host> <port>" once listening; serves until SIGINT, then prints
"SERVED <connections> <bytes echoed>".  Written the careful way: output that the
peer cannot take yet is buffered and the connection waits for EVENT_WRITE; a
half-closed connection is closed once everything has been echoed.
"""

import argparse
import selectors
import socket
import sys
import types

sel = selectors.DefaultSelector()
stats = {"connections": 0, "bytes": 0}


def accept(listener):
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stats["connections"] += 1
        state = types.SimpleNamespace(out=bytearray(), eof=False)
        sel.register(conn, selectors.EVENT_READ, state)


def flush(conn, state):
    while state.out:
        try:
            n = conn.send(state.out)
        except BlockingIOError:
            break
        stats["bytes"] += n
        del state.out[:n]
    events = 0 if state.eof else selectors.EVENT_READ
    if state.out:
        events |= selectors.EVENT_WRITE
    if not events:
        sel.unregister(conn)
        conn.close()
    elif sel.get_key(conn).events != events:
        sel.modify(conn, events, state)


def service(conn, mask, state):
    if mask & selectors.EVENT_READ:
        try:
            data = conn.recv(1 << 16)
        except BlockingIOError:
            data = None
        except ConnectionResetError:
            sel.unregister(conn)
            conn.close()
            return
        if data == b"":
            state.eof = True
        elif data:
            state.out += data
    flush(conn, state)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    listener.listen()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    host, port = listener.getsockname()[:2]
    print(f"READY {host} {port}", flush=True)
    try:
        while True:
            for key, mask in sel.select():
                if key.data is None:
                    accept(key.fileobj)
                else:
                    service(key.fileobj, mask, key.data)
    except KeyboardInterrupt:
        pass
    finally:
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()
    print(f"SERVED {stats['connections']} {stats['bytes']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
