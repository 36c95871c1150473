from typing import Any

def recv_into(sock_addr: int, buffer: Any, timeout_ms: int, nbytes: int = 0, /) -> int: ...
def recv_bytes(sock_addr: int, nbytes: int, timeout_ms: int, /) -> bytes | int: ...
def send(sock_addr: int, data: Any, timeout_ms: int, /) -> int: ...
def sendall(sock_addr: int, data: Any, timeout_ms: int, /) -> int | None: ...
def accept(
    listener_addr: int, timeout_ms: int, /
) -> int | tuple[int, int, tuple[Any, ...] | None, tuple[Any, ...] | None, str]: ...
def connect(
    sock_addr: int,
    name: bytes,
    bound: bytes | None,
    family: int,
    src: tuple[Any, ...],
    dst: tuple[Any, ...],
    timeout_ms: int,
    /,
) -> int: ...
def socket() -> int: ...
def bind(
    rsk_send_addr: int,
    rsk_recv_addr: int,
    rsk_recv_zc_addr: int = ...,
    rsk_recv_done_addr: int = ...,
    rsk_free_addr: int = ...,
    rsk_accept_addr: int = ...,
    rsk_connect_bound_addr: int = ...,
    rsk_socket_addr: int = ...,
    rsk_provider_addr: int = ...,
    /,
) -> None: ...

class Owner:
    """Owns an rsk_sock: rsk_free() when released (not a GC type, no finalizer)."""

    def __init__(self, sock_addr: int, /) -> None: ...
