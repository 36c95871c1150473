"""The echo server of the ``selectors`` module's documentation (no rsock import): one
thread, ``selectors.DefaultSelector`` (epoll), non-blocking sockets.  Prints
``PORT <n>``, serves until its standard input closes."""

import selectors
import socket
import sys

sel = selectors.DefaultSelector()


def accept(sock: socket.socket, mask: int) -> None:
    conn, addr = sock.accept()  # should be ready
    conn.setblocking(False)
    sel.register(conn, selectors.EVENT_READ, read)


def read(conn: socket.socket, mask: int) -> None:
    data = conn.recv(1000)  # should be ready
    if data:
        conn.send(data)  # hope it won't block
    else:
        sel.unregister(conn)
        conn.close()


def stop(stdin: object, mask: int) -> None:
    raise SystemExit(0)


sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(100)
sock.setblocking(False)
sel.register(sock, selectors.EVENT_READ, accept)
sel.register(sys.stdin, selectors.EVENT_READ, stop)  # (the bench closes it: the end)
print("PORT", sock.getsockname()[1], flush=True)
while True:
    for key, mask in sel.select():
        key.data(key.fileobj, mask)
