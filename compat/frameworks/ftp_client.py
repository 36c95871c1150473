"""An ``ftplib`` client: in passive and in active mode, uploads 3 MiB
(``storbinary``), downloads it back (``retrbinary``: the server sends it
with ``os.sendfile``) and checks it, lists the directory; prints OK."""

import hashlib
import io
import sys
from ftplib import FTP

DATA = hashlib.sha256(b"ftp").digest() * (3 * 1024 * 1024 // 32)

for passive in (True, False):
    with FTP() as ftp:
        ftp.connect("127.0.0.1", int(sys.argv[1]), timeout=30)
        ftp.login("user", "12345")
        ftp.set_pasv(passive)
        name = f"up-{passive}.bin"
        assert ftp.storbinary(f"STOR {name}", io.BytesIO(DATA)).startswith("226")
        got = bytearray()
        assert ftp.retrbinary(f"RETR {name}", got.extend).startswith("226")
        assert hashlib.sha256(got).digest() == hashlib.sha256(DATA).digest(), len(got)
        assert name in ftp.nlst()
        ftp.voidcmd("TYPE I")
        assert ftp.size(name) == len(DATA)
print("OK")
