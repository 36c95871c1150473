"""rsock: a socket-compatible drop-in stream transport.

The bytes of a TCP-style connection travel through rsock's ring-buffer
engine over reliable-connected queue pairs: shared memory between processes
of one host (``shm``), RDMA verbs between hosts (``verbs``), kernel TCP when
neither can reach the peer.  Three ways in:

* ``python -m rsock run prog.py`` (or ``rsock.patch()``): an unmodified
  program's TCP sockets, and asyncio's servers and connections, are rsock's;
  ``--report FILE`` says which path each connection took.
* ``import rsock as socket``: ``rsock.socket`` behaves like ``socket.socket``
  for AF_INET/AF_INET6 SOCK_STREAM; the stdlib's constants, exceptions and
  resolver functions are re-exported.
* ``rsock.asyncio``: ``start_server``, ``open_connection``,
  ``create_server`` and ``create_connection`` over rsock, on asyncio's loops
  and on uvloop.

``python -m rsock.bench`` measures rsock against TCP.
"""

from __future__ import annotations

import socket as _std
from socket import (
    AF_INET,
    AF_INET6,
    AF_UNSPEC,
    AI_PASSIVE,
    INADDR_ANY,
    IPPROTO_IPV6,
    IPPROTO_TCP,
    IPV6_V6ONLY,
    MSG_DONTWAIT,
    MSG_NOSIGNAL,
    MSG_PEEK,
    MSG_WAITALL,
    SHUT_RD,
    SHUT_RDWR,
    SHUT_WR,
    SO_ERROR,
    SO_KEEPALIVE,
    SO_RCVBUF,
    SO_REUSEADDR,
    SO_SNDBUF,
    SOCK_STREAM,
    SOL_SOCKET,
    SOMAXCONN,
    TCP_NODELAY,
    AddressFamily,
    SocketIO,
    SocketKind,
    error,
    gaierror,
    getaddrinfo,
    getdefaulttimeout,
    getfqdn,
    gethostbyaddr,
    gethostbyname,
    gethostbyname_ex,
    gethostname,
    getnameinfo,
    getprotobyname,
    getservbyname,
    getservbyport,
    has_ipv6,
    herror,
    htonl,
    htons,
    if_indextoname,
    if_nameindex,
    if_nametoindex,
    inet_aton,
    inet_ntoa,
    inet_ntop,
    inet_pton,
    ntohl,
    ntohs,
    setdefaulttimeout,
    timeout,
)
from typing import Any

from rsock._patch import patch, unpatch
from rsock._socket import (
    RSOCK_INLINE,
    RSOCK_QDEPTH,
    RSOCK_RING_SIZE,
    RSOCK_SPIN_US,
    SOL_RSOCK,
    create_connection,
    create_server,
    has_dualstack_ipv6,
    provider_config,
    socket,
)

# isinstance(s, rsock.SocketType) holds for rsock sockets, as the stdlib's
# SocketType does for its own
SocketType = socket

__version__ = "0.1.0"

__all__ = [
    "socket",
    "create_connection",
    "create_server",
    "has_dualstack_ipv6",
    "provider_config",
    "SOL_RSOCK",
    "RSOCK_RING_SIZE",
    "RSOCK_QDEPTH",
    "RSOCK_INLINE",
    "RSOCK_SPIN_US",
    "SocketType",
    "SocketIO",
    "patch",
    "unpatch",
    "SSLSocket",
    "ssl_wrap_socket",
    "AF_INET",
    "AF_INET6",
    "AF_UNSPEC",
    "AI_PASSIVE",
    "INADDR_ANY",
    "IPPROTO_IPV6",
    "IPPROTO_TCP",
    "IPV6_V6ONLY",
    "MSG_DONTWAIT",
    "MSG_NOSIGNAL",
    "MSG_PEEK",
    "MSG_WAITALL",
    "SHUT_RD",
    "SHUT_RDWR",
    "SHUT_WR",
    "SO_ERROR",
    "SO_KEEPALIVE",
    "SO_RCVBUF",
    "SO_REUSEADDR",
    "SO_SNDBUF",
    "SOCK_STREAM",
    "SOL_SOCKET",
    "SOMAXCONN",
    "TCP_NODELAY",
    "AddressFamily",
    "SocketKind",
    "error",
    "gaierror",
    "getaddrinfo",
    "getdefaulttimeout",
    "getfqdn",
    "gethostbyaddr",
    "gethostbyname",
    "gethostbyname_ex",
    "gethostname",
    "getnameinfo",
    "getprotobyname",
    "getservbyname",
    "getservbyport",
    "has_ipv6",
    "herror",
    "htonl",
    "htons",
    "if_indextoname",
    "if_nameindex",
    "if_nametoindex",
    "inet_aton",
    "inet_ntoa",
    "inet_ntop",
    "inet_pton",
    "ntohl",
    "ntohs",
    "setdefaulttimeout",
    "timeout",
]


def __getattr__(name: str) -> Any:
    """TLS (``SSLSocket``, ``ssl_wrap_socket``: imported on first use, with
    the ``ssl`` module) and every other stdlib constant (``SO_*``, ``TCP_*``,
    ``EAI_*``, ...)."""
    if name in ("SSLSocket", "ssl_wrap_socket"):
        from rsock import _ssl

        return _ssl.SSLSocket if name == "SSLSocket" else _ssl.wrap_socket
    if name.isupper() and hasattr(_std, name):
        return getattr(_std, name)
    raise AttributeError(f"module 'rsock' has no attribute {name!r}")
