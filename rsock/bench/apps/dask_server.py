"""A dask.distributed cluster as its documentation shows (no rsock import): a
``LocalCluster`` of two worker processes (started by spawn, dask's default) with one
thread each; prints ``PORT <n>`` (the scheduler's port) once both workers are up and
serves until its standard input closes."""

import sys

from dask.distributed import Client, LocalCluster


def main() -> None:
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address=None,
    ) as cluster:
        with Client(cluster) as client:
            client.wait_for_workers(2)
        print("PORT", cluster.scheduler.port, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
