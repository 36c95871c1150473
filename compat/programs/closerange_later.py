"""A program that closes every fd above 2 by number after it made sockets
(as a daemonizing library does at the wrong time), then makes new ones:
an echo round trip on a listener and a client made before, another on ones
made after, each waited for with select() on the client's fileno().
Prints what came back."""

import os
import select
import socket
import threading


def round_trip(word: bytes) -> bytes:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    ls.settimeout(10)

    def serve() -> None:
        conn, _ = ls.accept()
        with conn:
            conn.sendall(conn.recv(100).upper())

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(ls.getsockname(), timeout=10) as c:
        c.sendall(word)
        assert select.select([c], [], [], 10)[0] == [c]
        got = c.recv(100)
    t.join()
    ls.close()
    return got


print(round_trip(b"before").decode())
os.closerange(3, 65536)
print(round_trip(b"after").decode())
print(round_trip(b"again").decode())
