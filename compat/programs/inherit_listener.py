"""A server that hands its listener to a child process it starts, as
werkzeug's reloader (``flask run --debug``) and gunicorn's re-exec do: the
parent binds and listens, makes the socket inheritable, and starts itself
again with the fd's number in the environment (``close_fds=False``); the
child adopts the fd and serves; the parent is the client.  Prints what the
client got, the seconds each connection took (``LATENCIES`` and a JSON object;
the first one waits for the child to start) and the child's exit status.  With
``--pass-fds`` the fd goes by ``pass_fds`` instead, without set_inheritable()."""

import json
import os
import socket
import subprocess
import sys
import time

if "SERVER_FD" in os.environ:
    fd = int(os.environ["SERVER_FD"])
    nfd = os.dup(fd)
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, nfd)
    os.close(fd)
    assert ls.fileno() == nfd and ls.getsockname()[0] == "127.0.0.1"
    for _ in range(3):
        conn, _ = ls.accept()
        with conn:
            conn.sendall(conn.recv(100).upper())
    ls.close()
    sys.exit(0)

ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen()
env = dict(os.environ, SERVER_FD=str(ls.fileno()))
if "--pass-fds" in sys.argv:
    child = subprocess.Popen([sys.executable, __file__], env=env, pass_fds=[ls.fileno()])
else:
    ls.set_inheritable(True)
    child = subprocess.Popen([sys.executable, __file__], env=env, close_fds=False)
latencies = {}
try:
    for i in range(3):
        wait = 5 if "--pass-fds" in sys.argv else 20  # (rsock: the child fails)
        start = time.perf_counter()
        with socket.create_connection(ls.getsockname(), timeout=wait) as c:
            c.sendall(b"hello %d" % i)
            print(c.recv(100).decode())
        latencies.setdefault("first" if i == 0 else "connection", []).append(
            time.perf_counter() - start
        )
    print("LATENCIES", json.dumps(latencies))
finally:
    print("child", child.wait(30))
