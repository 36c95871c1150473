"""The programs of ``python -m rsock.bench apps``: servers and clients written as each
framework's documentation shows, with no rsock import.  The bench runs each of them
once with plain Python (TCP) and once under ``python -m rsock run``.

Servers print ``PORT <n>...`` once they listen (uvicorn is started by its own command
line and says so on stderr) and serve until their standard input closes.  Clients take
``PORT... MODE SECONDS WARMUP``, run their loop for WARMUP seconds, then for SECONDS
seconds, and print one JSON line: ``{"count": ..., "bytes": ..., "elapsed": ...,
"rusage": [...], "latencies": [...]}`` (the process's user and system CPU seconds,
``getrusage``, at the timed loop's start and end: the bench's busy shares; and the
seconds each request, round trip or message of the timed loop took, in order: the
bench's stall rule)."""
