#!/usr/bin/env bash
# Runs inside the rxe guest (rdma/run-tests.sh): rsockets' rstream, rstream over
# kernel TCP (-T s), and python -m rsock.bench (rsock over verbs vs TCP), all on the
# same device in the same run.  Writes OUTDIR/bench.txt (+ raw logs, JSON).
#
# rstream counts both directions: "Gb/sec" is the average throughput of its
# back-and-forth transfers, "usec/xfer" is half a round trip.  The table below turns
# the latter into a round-trip time to compare with rsock.bench's RTT.
set -euo pipefail
OUT=${1:-build/rdma-results}
ADDR=${RSOCK_VERBS_ADDR:-10.77.0.1}
mkdir -p "$OUT"
port=7470

rstream_run() { # label, extra -T options..., then -- and the size args
	local label=$1
	shift
	local topts=()
	while [ "$1" != -- ]; do
		topts+=(-T "$1")
		shift
	done
	shift
	port=$((port + 1))
	timeout 120 rstream "${topts[@]}" -p "$port" "$@" >"$OUT/rstream-srv-$label.log" 2>&1 &
	local srv=$!
	sleep 1
	timeout 120 rstream -s "$ADDR" "${topts[@]}" -p "$port" "$@" >"$OUT/rstream-$label.log" 2>&1 || true
	wait "$srv" || true
	tail -n 1 "$OUT/rstream-$label.log"
}

{
	echo "# rsock over verbs on rxe0 (software RoCE in a TCG guest): same device, same run"
	echo "# $(uname -r), $(nproc) vCPUs; absolute figures are meaningless under emulation"
	echo
	echo "## rstream (librdmacm rsockets, blocking calls) and rstream -T s (kernel TCP)"
	printf '%-28s %s\n' "case" "name bytes xfers iters total time Gb/sec usec/xfer"
	printf '%-28s %s\n' "rsockets 64K stream" "$(rstream_run rs-bw b -- -S 65536 -C 400 -I 1)"
	printf '%-28s %s\n' "tcp(rstream) 64K stream" "$(rstream_run tcp-bw s b -- -S 65536 -C 400 -I 1)"
	printf '%-28s %s\n' "rsockets 64B latency" "$(rstream_run rs-lat b -- -S 64 -C 1 -I 2000)"
	printf '%-28s %s\n' "tcp(rstream) 64B latency" "$(rstream_run tcp-lat s b -- -S 64 -C 1 -I 2000)"
	echo
	echo "## the engine alone over verbs (native/tests/engine_bench.c: C, no Python; default spin)"
	RSOCK_BENCH_VERBS="$ADDR" RSOCK_BENCH_TOTAL=$((64 << 20)) RSOCK_BENCH_ITERS=2000 \
		timeout 300 ./native/build/rel/engine_bench none 65536 2>&1 || echo "engine_bench failed"
	echo
	echo "## python -m rsock.bench (RSOCK_PROVIDER=${RSOCK_PROVIDER:-shm}), sync API"
	# default (adaptive) completion mode: spin 50 us, then sleep; rstream's
	# blocking mode polls rsockets' default 10 us before it blocks
	timeout 900 python3 -m rsock.bench --transport rsock,tcp --api sync --mode adaptive \
		--tests stream,pingpong --sizes 64K,1M --reps 3 --rep-time 1 --warmup-bytes 4M \
		--rounds 2000 --warmup-rounds 100 --pin none --timeout 300 \
		--json "$OUT/rsock-bench.json" 2>"$OUT/rsock-bench.err" || echo "rsock.bench failed: $(tail -n 5 "$OUT/rsock-bench.err")"
} | tee "$OUT/bench.txt"
