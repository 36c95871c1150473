"""A dask.distributed client as its documentation shows (no rsock import), against the
cluster of ``dask_server.py``.

``dask_client.py PORT MODE SECONDS WARMUP``; MODE: scatter (``Client.scatter`` of a
64 MB numpy array to one worker, then released) or w2w (a task on one worker makes a
64 MB array, a task on the other worker takes it, so the array crosses from worker to
worker; its checksum there must be the one a task on the first worker computed).  Runs
WARMUP seconds, then SECONDS seconds, and prints one JSON line: transfers, bytes moved,
elapsed, and each one's latency (in order)."""

import json
import resource
import sys
import time
import zlib

import numpy as np
from dask.distributed import Client, wait

SIZE = 64 << 20  # bytes per transfer


def make(seed: int) -> np.ndarray:
    a = np.empty(SIZE, dtype=np.uint8)
    a[:] = seed % 251
    a[::4096] = np.arange(len(a[::4096])) % 256  # not one repeated byte
    return a


def checksum(a: np.ndarray) -> int:
    return zlib.adler32(a.data)


def run(
    client: Client, mode: str, seconds: float, workers: list[str], seq: list[int]
) -> dict[str, object]:
    count = 0
    latencies: list[float] = []  # of each step: the bench applies its stall rule
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    last = start
    data = make(7)
    want = checksum(data)
    while True:
        seq[0] += 1
        if mode == "scatter":
            [future] = client.scatter([data], workers=[workers[0]], hash=False)
            wait(future)
            assert client.submit(checksum, future, workers=[workers[0]]).result() == want
        else:
            a = client.submit(make, seq[0], workers=[workers[0]], pure=False)
            here = client.submit(checksum, a, workers=[workers[0]], pure=False)
            there = client.submit(checksum, a, workers=[workers[1]], pure=False)
            assert there.result() == here.result(), "checksum"
            del a, here, there
        count += 1
        now = time.perf_counter()
        latencies.append(now - last)
        last = now
        elapsed = now - start
        if elapsed >= seconds:
            return {
                "count": count,
                "bytes": count * SIZE,
                "elapsed": elapsed,
                "rusage": [*cpu[:2], *resource.getrusage(resource.RUSAGE_SELF)[:2]],
                "latencies": [round(x, 7) for x in latencies],
            }


def main(port: int, mode: str, seconds: float, warmup: float) -> None:
    assert mode in ("scatter", "w2w"), mode
    with Client(f"tcp://127.0.0.1:{port}") as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2, workers
        seq = [0]
        run(client, mode, warmup, workers, seq)
        print(json.dumps(run(client, mode, seconds, workers, seq)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
