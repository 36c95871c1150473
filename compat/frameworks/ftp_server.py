"""An FTP server as pyftpdlib's documentation shows (``DummyAuthorizer``,
``FTPHandler``, ``FTPServer``): one user with a home directory (the current
directory).  pyftpdlib registers its listeners' fds with its epoll loop
before ``listen()`` and sends files with ``os.sendfile``.  Prints
``PORT <n>``, serves until its standard input closes."""

import os
import sys
import threading

from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer

authorizer = DummyAuthorizer()
authorizer.add_user("user", "12345", os.getcwd(), perm="elradfmwMT")
handler = FTPHandler
handler.authorizer = authorizer
server = FTPServer(("127.0.0.1", 0), handler)
print("PORT", server.socket.getsockname()[1], flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    server.serve_forever(timeout=0.1, blocking=False, handle_exit=False)
server.close_all()
