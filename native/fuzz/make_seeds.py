#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (native/fuzz/corpus/*/seed-*).

Each seed is a small, readable scenario in the harness's input language (see the
readers in fuzz_engine.c and fuzz_handshake.c): the fuzzer starts from inputs that
already reach deep states (a working connection, a valid handshake) instead of
having to discover them.  Run it after changing an input format:

    python3 native/fuzz/make_seeds.py
"""

from __future__ import annotations

import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent

# fuzz_engine.c actions, in enum order
(
    RAW_POST,
    PEER_DATA,
    PEER_CTRL,
    STORE_AREA,
    STORE_SEG,
    FAKE_CQE,
    V_SEND,
    V_RECV,
    V_RECV_ZC,
    V_POLL,
    V_SHUTDOWN,
    V_MISC,
    P_SEND,
    P_RECV,
    P_SHUTDOWN,
    P_CLOSE,
    P_VANISH,
    P_LIVE,
) = range(18)

PEEK, WAITALL = 1, 2


def u8(v: int) -> bytes:
    return struct.pack("<B", v & 0xFF)


def u16(v: int) -> bytes:
    return struct.pack("<H", v & 0xFFFF)


def u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def geometry(ring_shift: int = 0, q32: bool = False, victim_client: bool = False) -> bytes:
    return u8(ring_shift | (4 if q32 else 0) | (16 if victim_client else 0))


def p_send(n: int) -> bytes:
    return u8(P_SEND) + u16(n)


def p_recv(n: int) -> bytes:
    return u8(P_RECV) + u16(n - 1)


def v_send(n: int) -> bytes:
    return u8(V_SEND) + u16(n) + u8(0)


def v_recv(n: int, flags: int = 0) -> bytes:
    return u8(V_RECV) + u16(n - 1) + u8(flags)


def v_recv_zc(n: int, done: int) -> bytes:
    return u8(V_RECV_ZC) + u16(n) + u16(done)


def imm(op: int, arg: int) -> int:
    return (op << 29) | (arg & ((1 << 29) - 1))


# one scenario per expression, laid out as the harness reads it
# fmt: off
def engine_seeds() -> dict[str, bytes]:
    traffic = (
        p_send(3000) + v_recv(1000) + v_recv(5000, PEEK) + v_recv(5000) + v_send(7000)
        + p_recv(20000) + u8(V_POLL) + u8(3) + p_send(19999) + v_recv_zc(8000, 8000)
        + v_recv(20000, WAITALL)
    )
    seeds = {
        "traffic": geometry() + traffic * 3 + u8(P_SHUTDOWN) + u8(1) + v_recv(100)
        + u8(V_SHUTDOWN) + u8(2),
        "traffic-wrap-client": geometry(0, True, True) + (p_send(4096) + v_recv(4096)) * 12,
        "traffic-close": geometry(1) + p_send(5000) + u8(P_CLOSE) + v_recv(6000) + v_recv(10),
        "traffic-vanish": geometry(2) + p_send(500) + u8(P_VANISH) + v_recv(600) + v_send(10),
        "zc-overclaim": geometry() + p_send(4000) + v_recv_zc(100, 200) + v_recv(5000),
        "watch": geometry() + u8(V_MISC) + u8(2) + u8(1) + u8(V_MISC) + u8(3) + u8(5)
        + p_send(100) + u8(V_MISC) + u8(4) + v_recv(100) + u8(V_MISC) + u8(0)
        + u8(V_MISC) + u8(1),
        # a peer that writes raw messages
        "raw-data": geometry() + u8(RAW_POST) + u32(imm(0, 64)) + u8(64)
        + u32(16 * 16) + bytes(64) + v_recv(100),
        "raw-opcode": geometry() + u8(RAW_POST) + u32(imm(7, 0)) + u8(16) + u32(0)
        + bytes(16) + v_recv(10) + v_send(10),
        "raw-outside": geometry() + u8(RAW_POST) + u32(imm(0, 16)) + u8(16)
        + u32(0xFFFFFFF0) + bytes(16) + v_recv(10),
        "peer-data": geometry() + u8(PEER_DATA) + u16(100) + u8(0) + u8(1) + v_recv(200)
        + u8(PEER_DATA) + u16(5000) + u8(0) + u8(1) + v_recv(6000),
        "peer-data-skewed": geometry() + u8(PEER_DATA) + u16(100) + u8(0xF0) + u8(3)
        + v_recv(200),
        "peer-data-badlen": geometry() + u8(PEER_DATA) + u16(100) + u8(0) + u8(0) + u8(5)
        + v_recv(200),
        "peer-credit": geometry() + v_send(3000) + u8(PEER_CTRL) + u8(0) + u8(0) + u8(0)
        + u8(0) + v_send(3000),
        "peer-credit-huge": geometry() + v_send(3000) + u8(PEER_CTRL) + u8(1)
        + u64(1 << 62) + u8(0) + u8(0) + v_send(10),
        "peer-limit": geometry() + u8(PEER_CTRL) + u8(2) + u8(0) + u32(1 << 30) + u8(0)
        + v_send(10),
        "peer-fin-then-data": geometry() + u8(PEER_CTRL) + u8(0) + u8(0) + u8(0) + u8(1)
        + u8(PEER_DATA) + u16(10) + u8(0) + u8(1) + v_recv(10) + v_recv(10),
        "peer-ctrl-seq": geometry() + u8(PEER_CTRL) + u8(8) + u8(0) + u8(0) + u8(3)
        + u8(0xFF) + v_recv(10),
        "store-area": geometry() + p_send(1000) + u8(STORE_AREA) + u32(256) + u8(15)
        + bytes(range(16)) + v_recv(1000),
        "store-cq-prod": geometry() + u8(STORE_SEG) + u32(192) + u8(3) + u32(5)
        + v_recv(10),
        "liveness-rej": geometry() + p_send(100) + u8(P_LIVE) + u8(1) + u8(6) + u16(0)
        + u32(111) + v_recv(200) + v_recv(10),
        "liveness-junk": geometry() + u8(P_LIVE) + u8(0) + u8(3) + b"abc" + v_send(10)
        + v_recv(10),
        "fake-cqe": geometry() + u8(FAKE_CQE) + u32(imm(0, 100)) + u32(100) + u8(1)
        + v_recv(200) + u8(FAKE_CQE) + u32(imm(1, 0)) + u32(16) + u8(1) + v_send(5),
    }
    return seeds


def slot_fds(m: int, m2: int, extra: bytes = b"") -> bytes:
    """REQ_SLOT's one fd: the arena (make_arena's m, m2 and what their bits
    read)."""
    return u8(1) + u8(0) + u8(m) + u8(m2) + extra


def handshake_seeds() -> dict[str, bytes]:
    # mode bits: 1 liveness read, 2 REJ kind, 4/8 raw families, 16 xor header, 128 REQ_SLOT,
    # 32 raw length+bytes, 64 client hangs up; after the fds, the bells before
    # the message (mode 1)
    good_fds = u8(2) + u8(0) + u8(0) + u8(0) + u8(0)
    geom = u8(0) + u8(0)
    reason = u32(0)
    return {
        "req-valid": u8(0) + geom + reason + good_fds,
        "req-valid-bigger": u8(0) + u8(3 | 8) + u8(2) + reason + good_fds,
        "req-valid-then-hangup": u8(64) + geom + reason + good_fds,
        "req-no-fds": u8(0) + geom + reason + u8(0),
        "req-one-fd": u8(0) + geom + reason + u8(1) + u8(0) + u8(0),
        "req-three-fds": u8(0) + geom + reason + u8(3) + u8(0) + u8(0) + u8(0) + u8(0)
        + u8(2) + u8(0),
        "req-unsealed": u8(0) + geom + reason + u8(2) + u8(0) + u8(32 | 64) + u8(0) + u8(0),
        "req-short-memfd": u8(0) + geom + reason + u8(2) + u8(0) + u8(3) + u8(7) + u8(0)
        + u8(0),
        "req-bad-magic": u8(0) + geom + reason + u8(2) + u8(0) + u8(8) + u8(5) + u8(0)
        + u8(0),
        "req-leftovers": u8(0) + geom + reason + u8(2) + u8(0) + u8(0) + u8(0)
        + u8(16) + u32(9999) + u32(77) + u32(12345) + u8(1),
        "req-eventfd-for-memfd": u8(0) + geom + reason + u8(2) + u8(0) + u8(0) + u8(2)
        + u8(0),
        "req-pipe-for-memfd": u8(0) + geom + reason + u8(2) + u8(3) + u8(1) + u8(0) + u8(0),
        "req-socket-for-memfd": u8(0) + geom + reason + u8(2) + u8(4) + u8(0) + u8(0),
        "req-raw-geometry": u8(0) + u8(0x80) + u32(4096) + u32(15) + geom[1:] + reason
        + good_fds,
        "req-bad-family": u8(4) + geom + u32(1) + reason + good_fds,
        "req-version": u8(16) + geom + reason + u32(0) + u8(1) + u8(0) + good_fds,
        "req-garbage": u8(32) + geom + reason + u8(20) + bytes(range(20)) + u8(0),
        "rej": u8(1 | 2) + geom + u32(111) + u8(0),
        "rej-after-bells": u8(1 | 2) + geom + u32(111) + u8(0) + u8(3),
        "rej-to-accept": u8(2) + geom + u32(111) + u8(0),
        "req-to-client": u8(1) + geom + reason + good_fds + u8(2),
        "bells-then-hangup": u8(1 | 32 | 64) + geom + reason + u8(0) + u8(0) + u8(3),
        # REQ_SLOT (mode 128): slot byte, then the arena (kind 0: m, m2, ...)
        "slot-valid": u8(128) + geom + u8(0) + reason + slot_fds(0, 0),
        "slot-valid-gen-second-chunk": u8(128) + geom + u8(0x18 | 3) + reason + slot_fds(0, 1),
        "slot-closed-before-accept": u8(128) + geom + u8(0) + reason + slot_fds(16, 0),
        "slot-wrong-gen": u8(128) + geom + u8(0) + reason + slot_fds(8, 0, u32(0x55)),
        "slot-out-of-range": u8(128) + geom + u8(0x80) + u32(99) + reason + slot_fds(0, 0),
        "slot-huge-index": u8(128) + geom + u8(0x80) + u32(1 << 31) + reason + slot_fds(0, 0),
        "slot-unsealed": u8(128) + geom + u8(0) + reason + slot_fds(64, 0),
        "slot-short-arena": u8(128) + geom + u8(0) + reason + slot_fds(32, 0, u8(5)),
        "slot-arena-size": u8(128) + geom + u8(0) + reason + slot_fds(2, 0, u32(70000)),
        "slot-bad-half": u8(128) + geom + u8(0) + reason + slot_fds(1, 0, u32(12345)),
        "slot-headerless-half": u8(128) + geom + u8(0) + reason + slot_fds(0, 8),
        "slot-bad-magic": u8(128) + geom + u8(0) + reason + slot_fds(4, 0, u8(9)),
        "slot-other-geometry": u8(128) + u8(1) + u8(0) + u8(0) + reason + slot_fds(0, 0),
        # eventfd mode: the memfds, then the client's and the server's eventfds
        "req-valid-eventfds": u8(0) + geom + reason + u8(4) + u8(0) + u8(0) + u8(0) + u8(0)
        + u8(0) + u8(0),
        "req-pipe-for-eventfd": u8(0) + geom + reason + u8(4) + u8(0) + u8(0) + u8(0) + u8(0)
        + u8(0) + u8(3) + u8(1),
        "slot-valid-eventfds": u8(128) + geom + u8(0) + reason + u8(3) + u8(0) + u8(0) + u8(0)
        + u8(2) + u8(0) + u8(2) + u8(0),
        "slot-two-fds": u8(128) + geom + u8(0) + reason + u8(2) + u8(0) + u8(0) + u8(0)
        + u8(2) + u8(0),
    }


# fmt: on


# fuzz_proto.c: the first byte is the geometry (bit 0: rsockets; bits 1-2: ring
# 1 KiB/4 KiB/16 KiB/64 KiB; bits 3-4: queue 4/8/16/64), then actions (op % 16)
(
    PR_A_SEND,
    _PR_A_SEND2,
    PR_B_CONSUME,
    _PR_B_CONSUME2,
    PR_B_SEND,
    PR_A_CONSUME,
    PR_A_RUN,
    PR_B_RUN,
    _PR_B_RUN2,
    PR_RAW_WRITE,
    PR_RAW_CTRL,
    PR_RAW_STORE,
    PR_FORGED,
    PR_SHUT,
    PR_FAIL,
    PR_B_CLOSE,
) = range(16)


def proto_geometry(rs: bool, ring: int, q: int) -> bytes:
    return u8(int(rs) | ring << 1 | q << 3)


def proto_stream(rounds: int, n: int) -> bytes:
    step = u8(PR_A_SEND) + u16(n) + u8(PR_B_RUN) + u8(PR_B_CONSUME) + u16(n) + u8(PR_A_RUN)
    back = u8(PR_B_SEND) + u16(n // 2) + u8(PR_A_RUN) + u8(PR_A_CONSUME) + u16(n) + u8(PR_B_RUN)
    return (step + back) * rounds


def proto_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    for rs in (False, True):
        tag = "rsockets" if rs else "rsock"
        g = proto_geometry(rs, 1, 1)
        seeds[f"{tag}-stream"] = g + proto_stream(20, 1500)
        seeds[f"{tag}-tiny-wrap"] = proto_geometry(rs, 0, 0) + proto_stream(40, 700)
        seeds[f"{tag}-shutdown"] = g + proto_stream(3, 900) + u8(PR_SHUT | 0x10) + u8(PR_B_RUN)
        seeds[f"{tag}-close-unread"] = (
            g + u8(PR_B_SEND) + u16(500) + u8(PR_A_RUN) + u8(PR_SHUT | 0x20) + u8(PR_B_RUN)
        )
        seeds[f"{tag}-raw-data"] = (
            g + proto_stream(2, 800) + u8(PR_RAW_WRITE) + u32(imm(0, 64)) + u16(64)
            + u32(64 + 1600) + bytes(64) + u8(0) + u8(PR_B_RUN)
        )
        seeds[f"{tag}-raw-ctrl"] = (
            g + proto_stream(2, 800) + u8(PR_B_SEND) + u16(300) + u8(PR_RAW_CTRL) + u8(0)
            + u8(1) + u8(0) + u8(4) + u8(PR_B_RUN) + u8(PR_B_SEND) + u16(100)
        )
        seeds[f"{tag}-forged"] = g + proto_stream(1, 100) + u8(PR_FORGED) + u8(201) + u8(0) + u32(
            imm(0, 8)
        ) + u16(8) + u8(PR_B_RUN)
        seeds[f"{tag}-store"] = g + u8(PR_RAW_STORE) + u16(3) + u8(0xFF) + proto_stream(2, 600)
        seeds[f"{tag}-fail"] = g + u8(PR_FAIL | 0x10) + u8(1) + proto_stream(2, 600)
    return seeds


def write(name: str, seeds: dict[str, bytes]) -> None:
    d = HERE / "corpus" / name
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("seed-*"):
        old.unlink()
    for key, data in seeds.items():
        (d / f"seed-{key}").write_bytes(data)


if __name__ == "__main__":
    write("engine", engine_seeds())
    write("handshake", handshake_seeds())
    write("proto", proto_seeds())
