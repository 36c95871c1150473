"""``rsock.socket`` has the shape of ``socket.socket``: the same methods with the same
signatures, and the same answers to bad input (wrong types, closed sockets, negative
sizes, unknown hosts) on both transports, with no crash, hang or partial write.
"""

from __future__ import annotations

import errno
import inspect
import re
import socket
import tempfile
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from support import recv_exact

Pair = tuple[Any, Any]

# Public members of socket.socket rsock leaves out on purpose, each with its reason.
EXCLUDED = {
    "sendmsg_afalg": "AF_ALG (kernel crypto API) sockets only; no meaning for a stream socket",
}

# Properties and attributes (not methods): they must exist on rsock as read-only data.
ATTRIBUTES = ("family", "type", "proto", "timeout")

# The stdlib methods written in C have no introspectable signature; these are their
# shapes as documented (positional-only, as CPython parses them, except where the C
# code takes keywords: recv_into, recvfrom_into).  The test checks the table itself
# against the stdlib: arity against each docstring, keyword support by calling.
C_SIGNATURES = {
    "bind": "(self, address, /)",
    "connect": "(self, address, /)",
    "connect_ex": "(self, address, /)",
    "fileno": "(self)",
    "getblocking": "(self)",
    "getpeername": "(self)",
    "getsockname": "(self)",
    "getsockopt": "(self, level, optname, buflen=None, /)",
    "gettimeout": "(self)",
    "listen": "(self, backlog=-1, /)",
    "recv": "(self, bufsize, flags=0, /)",
    "recv_into": "(self, buffer, nbytes=0, flags=0)",
    "recvfrom": "(self, bufsize, flags=0, /)",
    "recvfrom_into": "(self, buffer, nbytes=0, flags=0)",
    "recvmsg": "(self, bufsize, ancbufsize=0, flags=0, /)",
    "recvmsg_into": "(self, buffers, ancbufsize=0, flags=0, /)",
    "send": "(self, data, flags=0, /)",
    "sendall": "(self, data, flags=0, /)",
    "sendmsg": "(self, buffers, ancdata=(), flags=0, address=None, /)",
    "sendto": "(self, data, flags_or_address, address=None, /)",
    "setblocking": "(self, flag, /)",
    "setsockopt": "(self, level, optname, value, optlen=None, /)",
    "settimeout": "(self, value, /)",
    "shutdown": "(self, how, /)",
}

# Sample arguments for calling a stdlib method with keywords (to learn whether it
# takes them); none of these calls can block on a fresh, unconnected socket.
SAMPLES: dict[str, Any] = {
    "address": ("127.0.0.1", 9),
    "level": socket.SOL_SOCKET,
    "optname": socket.SO_KEEPALIVE,
    "value": 1,
    "bufsize": 1,
    "buffer": bytearray(1),
    "buffers": [bytearray(1)],
    "data": b"x",
    "flags_or_address": ("127.0.0.1", 9),
    "flag": True,
    "how": socket.SHUT_RDWR,
    "backlog": 1,
}

DUNDERS = ("__init__", "__enter__", "__exit__", "__repr__", "__getstate__")


def public_members(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def bare(sig: inspect.Signature) -> inspect.Signature:
    """The signature without annotations (rsock's are strings, the stdlib has none)."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


def doc_arity(name: str, doc: str) -> tuple[int, int]:
    """(fewest, most) arguments the docstring's call lines allow, e.g.
    ``recv_into(buffer, [nbytes[, flags]])`` -> (1, 3)."""
    shapes = []
    for line in doc.splitlines():
        line = line.strip()
        if not line.startswith(name + "("):
            continue
        inner = line[len(name) + 1 : line.index(")")]
        inner = re.sub(r":\s*\w+", "", inner)  # "value: int" -> "value"
        required = optional = depth = 0
        for tok in re.findall(r"\[|\]|[A-Za-z_]\w*", inner):
            if tok == "[":
                depth += 1
            elif tok == "]":
                depth -= 1
            elif depth:
                optional += 1
            else:
                required += 1
        shapes.append((required, required + optional))
    assert shapes, f"no call line for {name} in its docstring"
    return min(s[0] for s in shapes), max(s[1] for s in shapes)


def takes_keywords(method: Callable[..., Any], first: str) -> bool:
    try:
        method(**{first: SAMPLES[first]})
    except TypeError as e:
        if "keyword" in str(e):
            return False
    except OSError:
        pass
    return True


def test_every_stdlib_method_is_there() -> None:
    import rsock

    missing = public_members(socket.socket) - public_members(rsock.socket) - set(EXCLUDED)
    assert not missing
    for name in EXCLUDED:
        assert hasattr(socket.socket, name), f"stale exclusion {name}"
    for name in ATTRIBUTES:
        assert isinstance(inspect.getattr_static(rsock.socket, name), property), name
    covered = set(C_SIGNATURES) | set(ATTRIBUTES) | set(EXCLUDED)
    python_level = {
        n
        for n in public_members(socket.socket)
        if inspect.isfunction(inspect.getattr_static(socket.socket, n))
    }
    assert public_members(socket.socket) == covered | python_level


def test_python_level_signatures_match() -> None:
    """Methods the stdlib writes in Python: identical signatures."""
    import rsock

    names = [
        n
        for n in sorted(public_members(socket.socket)) + list(DUNDERS)
        if inspect.isfunction(inspect.getattr_static(socket.socket, n))
    ]
    assert {"makefile", "sendfile", "dup", "detach", "accept", "close"} <= set(names)
    for name in names:
        std = bare(inspect.signature(getattr(socket.socket, name)))
        mine = bare(inspect.signature(getattr(rsock.socket, name)))
        assert mine == std, f"{name}{mine} != {name}{std}"


@pytest.mark.parametrize("name", sorted(C_SIGNATURES))
def test_c_level_signatures_match(name: str) -> None:
    import rsock

    sig = bare(inspect.signature(getattr(rsock.socket, name)))
    assert str(sig) == C_SIGNATURES[name]
    params = list(sig.parameters.values())[1:]  # without self
    required = sum(p.default is inspect.Parameter.empty for p in params)
    std_method = getattr(socket.socket, name)
    assert (required, len(params)) == doc_arity(name, std_method.__doc__ or "")
    if params:
        with socket.socket() as std:
            keywords = takes_keywords(getattr(std, name), params[0].name)
        positional_only = all(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params)
        assert positional_only == (not keywords)


# --------------------------------------------------------------------------- bad input


def assert_nothing_to_read(sock: Any) -> None:
    """In blocking mode: CPython's TCP socket with a timeout waits out the timeout
    even with MSG_DONTWAIT."""
    old = sock.gettimeout()
    sock.settimeout(None)
    try:
        with pytest.raises(BlockingIOError):
            sock.recv(1, socket.MSG_DONTWAIT)
    finally:
        sock.settimeout(old)


BAD_TYPES: list[tuple[str, tuple[Any, ...]]] = [
    ("recv", ("10",)),
    ("recv", (1.5,)),
    ("recv", (10, "flags")),
    ("recv", (None,)),
    ("recv_into", (b"read-only",)),
    ("recv_into", ("str",)),
    ("recv_into", (bytearray(4), "4")),
    ("recvfrom", ("10",)),
    ("recvfrom_into", (bytearray(4), 1.0)),
    ("recvmsg", ("10",)),
    ("recvmsg", (10, "anc")),
    ("recvmsg_into", (5,)),
    ("recvmsg_into", ([b"read-only"],)),
    ("send", ("str",)),
    ("send", (None,)),
    ("send", (b"x", "flags")),
    ("sendall", ("str",)),
    ("sendall", (123,)),
    ("sendto", ("str", ("127.0.0.1", 9))),
    ("sendto", (b"x", "not an address")),
    ("sendmsg", (5,)),
    ("sendmsg", (["str"],)),
    ("sendmsg", ([b"x"], 5)),
    ("sendmsg", ([b"x"], [(1, 2)])),
    ("sendmsg", ([b"x"], [("1", 2, b"")])),
    ("sendmsg", ([b"x"], [(1, 2, "str")])),
    ("settimeout", ("1",)),
    ("setblocking", (None,)),
    ("setsockopt", ("1", 1, 1)),
    ("setsockopt", (socket.SOL_SOCKET, socket.SO_KEEPALIVE, "1")),
    ("setsockopt", (socket.SOL_SOCKET, socket.SO_RCVBUF, 1.5)),
    ("getsockopt", ("1", 1)),
    ("getsockopt", (socket.SOL_SOCKET, socket.SO_RCVBUF, "4")),
    ("shutdown", ("1",)),
    ("shutdown", (1.0,)),
    ("connect", ("127.0.0.1:80",)),
    ("connect", (("127.0.0.1", "80"),)),
    ("connect", (("127.0.0.1",),)),
    ("connect", ((80, 80),)),
    ("connect_ex", (42,)),
    ("bind", (42,)),
    ("bind", (("127.0.0.1", "0"),)),
]


@pytest.mark.parametrize(("name", "args"), BAD_TYPES, ids=[f"{n}{a!r}" for n, a in BAD_TYPES])
def test_wrong_types_raise_typeerror(pair: Pair, name: str, args: tuple[Any, ...]) -> None:
    client, server = pair
    server.settimeout(10)
    with pytest.raises(TypeError):
        getattr(client, name)(*args)
    # no byte went anywhere, and the connection is unharmed
    assert_nothing_to_read(server)
    client.sendall(b"ok")
    assert recv_exact(server, 2) == b"ok"


def test_listen_wrong_type(sockmod: ModuleType) -> None:
    with sockmod.socket() as s:
        with pytest.raises(TypeError):
            s.listen("1")
        with pytest.raises(TypeError):
            sockmod.socket("AF_INET")


def test_no_partial_write_on_bad_sendmsg(pair: Pair) -> None:
    """Everything is checked before a byte goes: a bad last buffer or bad ancillary
    data sends nothing, even after large good buffers."""
    client, server = pair
    server.settimeout(10)
    big = b"x" * 300_000
    for args in (
        ([big, b"y", "str"],),
        ([big, b"y"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"\0\0\0\0"), (1, 2)]),
        ([big, memoryview(b"abcd")[::2]],),  # not contiguous: BufferError
    ):
        with pytest.raises((TypeError, BufferError)):
            client.sendmsg(*args)
        assert_nothing_to_read(server)
    client.sendall(b"clean")
    assert recv_exact(server, 5) == b"clean"


def test_non_contiguous_buffers(pair: Pair) -> None:
    client, server = pair
    server.settimeout(10)
    strided = memoryview(b"abcdef")[::2]
    for call in (
        lambda: client.send(strided),
        lambda: client.sendall(strided),
        lambda: client.sendmsg([strided]),
    ):
        with pytest.raises(BufferError):
            call()
    assert_nothing_to_read(server)


NEGATIVE_SIZES: list[tuple[str, tuple[Any, ...]]] = [
    ("recv", (-1,)),
    ("recv_into", (bytearray(4), -1)),
    ("recv_into", (bytearray(4), 5)),  # more than the buffer holds
    ("recvfrom", (-1,)),
    ("recvfrom_into", (bytearray(4), -1)),
    ("recvmsg", (-1,)),
    ("recvmsg", (1, -1)),
    ("recvmsg_into", ([bytearray(4)], -1)),
    ("settimeout", (-1,)),
    ("settimeout", (float("nan"),)),
]


@pytest.mark.parametrize(
    ("name", "args"), NEGATIVE_SIZES, ids=[f"{n}{a!r}" for n, a in NEGATIVE_SIZES]
)
def test_negative_sizes_raise_valueerror(pair: Pair, name: str, args: tuple[Any, ...]) -> None:
    client, server = pair
    server.sendall(b"data")  # ValueError even with data waiting, and it stays there
    with pytest.raises(ValueError):
        getattr(client, name)(*args)
    client.settimeout(10)
    assert recv_exact(client, 4) == b"data"


def test_sendfile_bad_counts(pair: Pair) -> None:
    client, _ = pair
    with tempfile.TemporaryFile() as f:
        f.write(b"abc")
        for count in (0, -5):
            with pytest.raises(ValueError):
                client.sendfile(f, 0, count)
        with pytest.raises(TypeError):
            client.sendfile(f, 0, 1.5)


def closed_socket_calls(sockmod: ModuleType) -> list[tuple[str, tuple[Any, ...]]]:
    return [
        ("recv", (1,)),
        ("recv_into", (bytearray(1),)),
        ("recvfrom", (1,)),
        ("recvfrom_into", (bytearray(1),)),
        ("recvmsg", (1,)),
        ("recvmsg_into", ([bytearray(1)],)),
        ("send", (b"x",)),
        ("sendall", (b"x",)),
        ("sendto", (b"x", ("127.0.0.1", 9))),
        ("sendmsg", ([b"x"],)),
        ("connect", (("127.0.0.1", 9),)),
        ("bind", (("127.0.0.1", 0),)),
        ("listen", ()),
        ("accept", ()),
        ("getsockname", ()),
        ("getpeername", ()),
        ("shutdown", (sockmod.SHUT_RDWR,)),
        ("setsockopt", (sockmod.SOL_SOCKET, sockmod.SO_KEEPALIVE, 1)),
        ("setsockopt", (sockmod.SOL_SOCKET, sockmod.SO_RCVBUF, 4096)),
        ("getsockopt", (sockmod.SOL_SOCKET, sockmod.SO_ERROR)),
        ("getsockopt", (sockmod.SOL_SOCKET, sockmod.SO_RCVBUF)),
        ("settimeout", (1.0,)),
        ("setblocking", (False,)),
        ("dup", ()),
        ("get_inheritable", ()),
        ("set_inheritable", (True,)),
    ]


def test_closed_socket_raises_ebadf(sockmod: ModuleType) -> None:
    for opened_by in ("fresh", "connected"):
        if opened_by == "fresh":
            sock = sockmod.socket()
            sock.close()
        else:
            with sockmod.create_server(("127.0.0.1", 0)) as srv:
                sock = sockmod.create_connection(srv.getsockname(), timeout=10)
                srv.accept()[0].close()
                sock.close()
        for name, args in closed_socket_calls(sockmod):
            with pytest.raises(OSError) as info:
                getattr(sock, name)(*args)
            assert info.value.errno == errno.EBADF, (opened_by, name)
        assert sock.connect_ex(("127.0.0.1", 9)) == errno.EBADF
        assert sock.fileno() == -1
        assert sock.detach() == -1
        sock.close()  # again: harmless
        sock.gettimeout()  # no error (the value: whatever the failed calls left)
        sock.getblocking()
        # sendfile: the stdlib's zero-copy path fails on fd -1 with ValueError
        with tempfile.TemporaryFile() as f:
            f.write(b"abc")
            f.seek(0)
            with pytest.raises((OSError, ValueError)):
                sock.sendfile(f)


@pytest.mark.parametrize(
    "call",
    ["connect", "connect_ex", "bind", "create_connection", "sendto"],
)
def test_unknown_host_raises_gaierror(sockmod: ModuleType, call: str) -> None:
    bad = ("no-such-host.invalid", 80)
    with sockmod.socket() as s:
        with pytest.raises(sockmod.gaierror):
            if call == "create_connection":
                sockmod.create_connection(bad, timeout=10)
            elif call == "sendto":
                s.sendto(b"x", bad)
            else:
                getattr(s, call)(bad)


def test_port_out_of_range(sockmod: ModuleType) -> None:
    with sockmod.socket() as s:
        for port in (-1, 65536):
            with pytest.raises(OverflowError):
                s.connect(("127.0.0.1", port))
            with pytest.raises(OverflowError):
                s.bind(("127.0.0.1", port))


def test_unsupported_flags(pair: Pair, sockmod: ModuleType, transport: str) -> None:
    """MSG_OOB: TCP supports urgent data, rsock raises EOPNOTSUPP (a documented
    difference); neither hangs."""
    client, server = pair
    if transport == "tcp":
        assert client.send(b"!", sockmod.MSG_OOB) == 1
    else:
        with pytest.raises(OSError) as info:
            client.send(b"!", sockmod.MSG_OOB)
        assert info.value.errno == errno.EOPNOTSUPP


def test_extension_exports_only_its_init() -> None:
    """The engine's symbols stay inside rsock._native (-fvisibility=hidden):
    nothing a process loads beside it can bind to them or clash with them."""
    import ctypes

    import rsock._native as native

    lib = ctypes.CDLL(native.__file__)
    assert hasattr(lib, "PyInit__native")
    for name in ("rsk_socket", "rsk_send", "eng_now_ns", "cm_connect", "shm_ops", "verbs_ops",
                 "ring_roundup_pow2"):
        assert not hasattr(lib, name), name
