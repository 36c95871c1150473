"""Path policy: which way a connection goes (shm, verbs or plain TCP).

``RSOCK_PROVIDER`` picks the provider and ``RSOCK_FALLBACK`` whether a
connection no rsock listener takes falls back to plain TCP; a destination on
this host goes over shared memory (``shm``), one elsewhere over RDMA
(``verbs``) where a device is there.  Clients find listeners by rendezvous
names derived from the address.  rdma_cm cannot route loopback, so verbs on
127.0.0.1/::1 dials the RDMA device's own address and both ends show the
connection as the loopback one it stands for.

Decisions and names only: no engine calls but the verbs probe, no sockets
but the kernel's answers about addresses.  ``rsock._socket`` acts on them.
"""

from __future__ import annotations

import errno as _errno
import functools
import ipaddress
import os
import random
import socket as _std
import time
from typing import Any

from rsock import _lowlevel as _ll

# the default ring of a verbs connection whose size nobody chose: its rings
# are registered (pinned) memory, so it keeps the smaller size; shm rings
# (the engine's default, 8 MiB) are touched lazily and never pinned
VERBS_RING_SIZE = 4 << 20

# socket._connect's answer when no rsock listener took the connection and
# plain TCP should be tried (a positive value: never an engine result)
FALLBACK = 1 << 30


def fallback_mode() -> str:
    """``RSOCK_FALLBACK``: "" (fall back to TCP where rsock cannot go),
    "never" (an rsock client never does: ECONNREFUSED) or "strict" (never,
    and rsock listeners refuse plain TCP clients too)."""
    mode = os.environ.get("RSOCK_FALLBACK", "")
    return mode if mode in ("never", "strict") else ""


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v, 0)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not an integer") from None


_CONFIG_VARS = (
    "RSOCK_PROVIDER",
    "RSOCK_RING_SIZE",
    "RSOCK_QDEPTH",
    "RSOCK_INLINE",
    "RSOCK_SPIN_US",
)
_CONFIG_KEYS = tuple(os.environ.encodekey(name) for name in _CONFIG_VARS)
_config_cache: dict[tuple[Any, ...], tuple[str, _ll.Opts]] = {}


def env_raw(key: bytes, name: str) -> Any:
    """The environment's value of ``name`` as the dict behind ``os.environ``
    holds it (``key``: ``name`` encoded, ``os.fsencode``), or None:
    read without ``os.environ.get``'s encode and decode (per connection)."""
    data = getattr(os.environ, "_data", None)
    return data.get(key) if type(data) is dict else os.environ.get(name)


def provider_config() -> tuple[str, _ll.Opts]:
    """The provider and tunables new sockets get, read from the environment
    (``RSOCK_PROVIDER``, ``RSOCK_RING_SIZE``, ``RSOCK_QDEPTH``,
    ``RSOCK_INLINE``, ``RSOCK_SPIN_US``) at every call; parsed once per set
    of values."""
    data = getattr(os.environ, "_data", None)
    if type(data) is dict:
        # the dict behind os.environ (its keys encoded), read without
        # os.environ.get's encode and decode per name: ten times cheaper,
        # and this runs for every socket
        key = tuple(map(data.get, _CONFIG_KEYS))
    else:
        key = tuple(map(os.environ.get, _CONFIG_VARS))
    hit = _config_cache.get(key)
    if hit is None:
        if len(_config_cache) >= 64:
            _config_cache.clear()
        hit = _config_cache[key] = _provider_config()
    return hit


# the engine's defaults (what a new socket has): provider_config gives this
# very object when the environment sets nothing else
DEFAULT_OPTS = _ll.default_opts()


def _provider_config() -> tuple[str, _ll.Opts]:
    d = DEFAULT_OPTS
    opts = _ll.Opts(
        ring_size=_env_int("RSOCK_RING_SIZE", d.ring_size),
        qdepth=_env_int("RSOCK_QDEPTH", d.qdepth),
        inline_max=_env_int("RSOCK_INLINE", d.inline_max),
        spin_us=_env_int("RSOCK_SPIN_US", d.spin_us),
    )
    return os.environ.get("RSOCK_PROVIDER", "") or "shm", d if opts == d else opts


def check_provider(name: str) -> None:
    """Raises unless provider ``name`` can be used here."""
    if name not in ("shm", "tcp", "verbs"):
        raise OSError(
            _errno.EPROTONOSUPPORT,
            f"RSOCK_PROVIDER={name!r}: rsock has 'shm', 'verbs' and 'tcp'",
        )
    if name == "verbs":
        rc, why = verbs_available()
        if rc <= 0:
            raise OSError(-rc if rc < 0 else _errno.ENODEV, why)


def refusal(detail: str) -> str | None:
    """No rsock listener answered: None to fall back to plain TCP, or, under
    RSOCK_FALLBACK=never/strict, the refusal's reason (it stands)."""
    mode = fallback_mode()
    if mode:
        return f"{detail or 'no rsock listener'}; RSOCK_FALLBACK={mode}"
    return None


def _mapped_v4(host: str) -> str | None:
    """The IPv4 address of an IPv4-mapped IPv6 one (``::ffff:a.b.c.d``), or None."""
    if not host.startswith("::ffff:") and not host.startswith("::FFFF:"):
        return None
    try:
        v4 = ipaddress.IPv6Address(host).ipv4_mapped
    except ValueError:
        return None
    return None if v4 is None else str(v4)


# client_names per (family, host, port): a client of a server dials the same
# few addresses again and again (a new connection per request)
_names_cache: dict[tuple[int, str, int], tuple[bytes, ...]] = {}


def client_names(family: int, host: str, port: int) -> tuple[bytes, ...]:
    """Rendezvous names a client tries for (host, port), most specific first.
    An IPv4-mapped address is IPv4 to the kernel: its listeners are the
    IPv4 ones (and dual-stack ones, which take the IPv4 wildcard's name),
    never an IPv6-only one."""
    key = (family, host, port)
    names = _names_cache.get(key)
    if names is None:
        if len(_names_cache) >= 256:
            _names_cache.clear()
        names = _names_cache[key] = tuple(_client_names(family, host, port))
    return names


def _client_names(family: int, host: str, port: int) -> list[bytes]:
    if family == _std.AF_INET6:
        v4 = _mapped_v4(host)
        if v4 is not None:
            family, host = _std.AF_INET, v4
    tag = "4" if family == _std.AF_INET else "6"
    names = [f"rsock/{tag}/{host}/{port}".encode()]
    wild = "0.0.0.0" if family == _std.AF_INET else "::"
    if host != wild:
        names.append(f"rsock/{tag}/{wild}/{port}".encode())
    return names


def port_name(family: int, host: str, port: int) -> bytes:
    """The rendezvous name an rsock client binds to hold its local port
    ``(host, port)`` while it is connected (no kernel socket for that)."""
    tag = "4" if family == _std.AF_INET else "6"
    return f"rsock/c{tag}/{host}/{port}".encode()


def _port_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        if 1 <= lo <= hi <= 65535:
            return lo, hi
    except (OSError, ValueError):
        pass
    return 32768, 60999


PORT_RANGE = _port_range()


@functools.cache
def syn_retries() -> int:
    """net.ipv4.tcp_syn_retries (what TCP_SYNCNT reads on a socket that did
    not set it), read once."""
    try:
        with open("/proc/sys/net/ipv4/tcp_syn_retries") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 6


# ports for port_name: a private generator (a program's random.seed() does
# not steer it), reseeded in a fork child so that parent and child differ
_ports = random.Random()
os.register_at_fork(after_in_child=_ports.seed)


_PORT_SPAN = PORT_RANGE[1] - PORT_RANGE[0] + 1


def pick_port() -> int:
    """A random port of PORT_RANGE (for port_name; a taken one is retried)."""
    return PORT_RANGE[0] + int(_ports.random() * _PORT_SPAN)


_LOCAL_TTL = 1.0  # seconds an is_local answer is reused (addresses rarely move)
_local_cache: dict[tuple[int, str], tuple[float, bool, str]] = {}


def is_local(family: int, host: str) -> tuple[bool, str]:
    """Is host an address of this host (this network namespace)?  Also the
    source address the kernel would use to reach it.  (The kernel is asked
    through a UDP socket, 5 syscalls; the answer is reused for _LOCAL_TTL.)"""
    now = time.monotonic()
    hit = _local_cache.get((family, host))
    if hit is not None and now - hit[0] < _LOCAL_TTL:
        return hit[1], hit[2]
    try:
        with _std.socket(family, _std.SOCK_DGRAM) as u:
            u.connect((host, 9))
            src = str(u.getsockname()[0])
    except OSError:
        return False, ""
    ip = ipaddress.ip_address(host.split("%")[0])
    local = ip.is_loopback or src == host
    if len(_local_cache) >= 256:
        _local_cache.clear()
    _local_cache[(family, host)] = (now, local, src)
    return local, src


def listen_names(family: int, tcp: _std.socket) -> list[bytes]:
    """The rendezvous names a listener bound where tcp is takes."""
    host, port = tcp.getsockname()[:2]
    names = [f"rsock/{'4' if family == _std.AF_INET else '6'}/{host}/{port}".encode()]
    if (
        family == _std.AF_INET6
        and host == "::"
        and not tcp.getsockopt(_std.IPPROTO_IPV6, _std.IPV6_V6ONLY)
    ):
        names.append(f"rsock/4/0.0.0.0/{port}".encode())
    v4 = _mapped_v4(host) if family == _std.AF_INET6 else None
    if v4 is not None:  # bound to an IPv4-mapped address: an IPv4 listener
        names.append(f"rsock/4/{v4}/{port}".encode())
    return names


def takes_verbs(provider: str, local: bool = False) -> bool:
    """Does a connection (or a listener: local False) go over RDMA?  Under
    RSOCK_PROVIDER=verbs always; otherwise to another host when there is a
    device."""
    return provider == "verbs" or (not local and verbs_available()[0] > 0)


def route(provider: str, family: int, host: str) -> tuple[str, str]:
    """Which way a connect to ``host`` goes: ``("verbs", source address or
    "")``, ``("shm", source address)``, or ``("", why)`` when no rsock path
    leads there (refused; a fallback to plain TCP may follow)."""
    local, src_ip = is_local(family, host)
    if takes_verbs(provider, local):
        return "verbs", src_ip
    if not local:
        return "", f"{host} is not on this host"
    return "shm", src_ip


_verbs_state: tuple[int, str] | None = None


def verbs_available() -> tuple[int, str]:
    """(number of RDMA devices, or -errno; one sentence), probed once per process."""
    global _verbs_state
    if _verbs_state is None:
        _verbs_state = _ll.verbs_probe()
    return _verbs_state


def _ifaddr4(ifname: str) -> str | None:
    """The IPv4 address of a network interface (SIOCGIFADDR), or None."""
    import fcntl
    import struct

    try:
        with _std.socket(_std.AF_INET, _std.SOCK_DGRAM) as u:
            req = struct.pack("256s", ifname.encode()[:15])
            res = fcntl.ioctl(u.fileno(), 0x8915, req)  # SIOCGIFADDR
    except OSError:
        return None
    return _std.inet_ntoa(res[20:24])


def verbs_target(family: int, host: str) -> tuple[int, str]:
    """rdma_cm cannot route loopback addresses (on rxe it answers ENODEV):
    RSOCK_PROVIDER=verbs on 127.0.0.1 or ::1 uses the IPv4 address of the
    first RDMA device's network interface instead (or RSOCK_VERBS_LOOPBACK).
    Returns the (family, host) to hand to rdma_cm; an IPv4-mapped address
    as the IPv4 one it is (rdma_cm cannot bind a mapped address)."""
    if family == _std.AF_INET6:
        v4 = _mapped_v4(host)
        if v4 is not None:
            family, host = _std.AF_INET, v4
    try:
        loop = ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return family, host
    if not loop:
        return family, host
    env = os.environ.get("RSOCK_VERBS_LOOPBACK", "")
    if env:
        return _std.AF_INET, env
    import glob

    for nd in sorted(glob.glob("/sys/class/infiniband/*/ports/*/gid_attrs/ndevs/0")):
        try:
            with open(nd) as f:
                name = f.read().strip()
        except OSError:
            continue
        a = _ifaddr4(name) if name else None
        if a:
            return _std.AF_INET, a
    return family, host


def verbs_host(family: int, host: str) -> str:
    return verbs_target(family, host)[1]


def v4_mapped(addr: tuple[Any, ...]) -> tuple[Any, ...]:
    """An IPv4 peer of a dual-stack AF_INET6 socket, as the kernel shows it."""
    if len(addr) == 2:
        return (f"::ffff:{addr[0]}", addr[1], 0, 0)
    return addr


def v4_unmapped(addr: tuple[Any, ...]) -> tuple[Any, ...]:
    """An IPv4-mapped IPv6 address as an IPv4 socket shows it."""
    if len(addr) == 4:
        v4 = _mapped_v4(str(addr[0]))
        if v4 is not None:
            return (v4, addr[1])
    return addr


def verbs_dst(family: int, dst: tuple[Any, ...]) -> tuple[int, tuple[Any, ...], int]:
    """(family, address, loopback flags) to hand rdma_cm for a verbs
    connect to dst (loopback mapped: the server shows it as such)."""
    vfam, vhost = verbs_target(family, str(dst[0]))
    vdst = (vhost, *dst[1:]) if vfam == family else (vhost, dst[1])
    flags = 0
    if vhost != dst[0]:
        six = family == _std.AF_INET6 and ":" in str(dst[0])
        flags = _ll.VF_LOOPBACK6 if six else _ll.VF_LOOPBACK4
    return vfam, vdst, flags


def dialed_local(
    family: int,
    dst: tuple[Any, ...],
    vfam: int,
    vdst: tuple[Any, ...],
    local: tuple[Any, ...],
    mine: tuple[Any, ...],
) -> tuple[Any, ...] | None:
    """The local address a verbs client shows (None: the reserving socket's):
    the rdma_cm port; the host as dialed when loopback was mapped."""
    if vdst[0] != dst[0]:
        return (mine[0], local[1], *mine[2:])
    if vfam == family:
        return local
    return None


def accepted_addrs(
    family: int,
    mine: tuple[Any, ...],
    peer: tuple[Any, ...] | None,
    local: tuple[Any, ...] | None,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(peer, local) an accepted connection shows, from what the client
    announced and the listener's own address ``mine``."""
    if peer is None or local is None or local[1] != mine[1]:
        # the client's announced addresses are not ours: use what we know
        local = mine
        peer = peer or mine
    if local[0] != mine[0] and local[0] == verbs_host(family, str(mine[0])):
        # RSOCK_PROVIDER=verbs on loopback (mapped to the RDMA device's
        # address): show the connection as the loopback one it stands for
        v6 = (0, 0) if family == _std.AF_INET6 else ()
        if peer[0] == local[0]:
            peer = (mine[0], peer[1], *v6)
        local = (mine[0], local[1], *v6)
    if family == _std.AF_INET6:
        # an IPv4 client of a dual-stack listener
        peer, local = v4_mapped(peer), v4_mapped(local)
    else:
        # a client that connected to an IPv4-mapped address: IPv4 here
        peer, local = v4_unmapped(peer), v4_unmapped(local)
    return peer, local
