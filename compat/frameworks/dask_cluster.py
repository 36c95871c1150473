"""dask.distributed as its documentation shows (no rsock import): a
LocalCluster of worker processes (started with the multiprocessing method
given on the command line: spawn, dask's default, or fork), a Client,
scatter, futures, and a large numpy array made on one worker and read on the
other; every result checked by its SHA-256; prints each operation's latency
(``LATENCIES`` and a JSON object: seconds per kind) and OK."""

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator

import dask
import numpy as np
from dask.distributed import Client, LocalCluster

N = 8_000_000  # 64 MB of float64 made on one worker, read on the other

LATENCIES: dict[str, list[float]] = {}  # seconds, per kind of request, in order


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Times what runs in the block: one request (or message) of ``kind``."""
    start = time.perf_counter()
    yield
    LATENCIES.setdefault(kind, []).append(time.perf_counter() - start)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def make(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).random(n)


def main(method: str) -> None:
    dask.config.set({"distributed.worker.multiprocessing-method": method})
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        data = np.arange(4_000_000, dtype=np.float64)
        with timed("scatter"):
            [remote] = client.scatter([data])
            assert client.submit(digest, remote).result() == digest(data)
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2, workers
        for seed in range(3):
            with timed("worker_to_worker"):
                a = client.submit(make, seed, N, workers=[workers[0]], pure=False)
                b = client.submit(digest, a, workers=[workers[1]], pure=False)
                got = b.result()
            assert got == digest(make(seed, N))
        with timed("map"):
            total = client.submit(sum, client.map(lambda x: x * x, range(100))).result()
        assert total == sum(x * x for x in range(100))
    print("LATENCIES", json.dumps(LATENCIES))
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "spawn")
