#!/usr/bin/env bash
# make test-rdma: rsock's verbs provider on a real (software) RDMA device.
#
# Builds (once, cached under build/rxe-vm) a small qemu guest with Debian's kernel
# and rdma_rxe (rdma/vm/, from ../shared/rxe-vm), shares this checkout into it as
# /project, and runs inside:
#   1. native/tests/test_verbs.c: the engine over rxe (bytes+checksums, connect
#      before accept, refusal, peer death);
#   2. the conformance suite (tests/, the rsock half) with RSOCK_PROVIDER=verbs, and
#      event loops over verbs (tests/test_loop_polling.py, tests/test_asyncio.py);
#   3. rdma/tests: rsock across processes over verbs, and against a C peer that uses
#      librdmacm's rsocket API (rdma/rs_peer.c);
#   4. rdma/bench.sh: rstream (rsockets), rstream -T s (kernel TCP) and
#      python -m rsock.bench (rsock over verbs, TCP) on the same device, same run.
# Results: build/rdma-results/.  Under TCG emulation absolute figures mean nothing;
# only ratios within one run do.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
export RXE_VM_DIR=${RXE_VM_DIR:-$ROOT/build/rxe-vm}
export RXE_VM_RUN=$RXE_VM_DIR/run
export RXE_VM_PROJECT=$ROOT
export RXE_VM_CMD_TIMEOUT=${RXE_VM_CMD_TIMEOUT:-1800}
VM=$ROOT/rdma/vm
OUT=$ROOT/build/rdma-results
T0=$SECONDS
log() { echo "[test-rdma $((SECONDS - T0))s] $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
	echo "make test-rdma needs root (qemu image build, apt-get)" >&2
	exit 1
fi

# host side: the guest runs what the host built (same Debian userland)
log "building on the host"
make -s -C native build/rel/test_verbs build/rel/engine_bench
mkdir -p build
cc -O2 -Wall -Wextra -Werror -o build/rs_peer rdma/rs_peer.c -lrdmacm
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/*.json "$OUT"/*.txt

log "guest image"
bash "$VM/build-image.sh"
bash "$VM/boot.sh" --stop >/dev/null 2>&1 || true
log "booting the guest"
bash "$VM/boot.sh"
trap 'bash "$VM/boot.sh" --stop >/dev/null 2>&1 || true' EXIT

# the guest's python3 (Debian's 3.11) uses the venv's packages and the checkout
PY="cd /project && PYTHONPATH=/project:/project/.venv/lib/python3.11/site-packages RSOCK_PROVIDER=verbs RSOCK_FALLBACK=never"
fail=0
guest() { # name, command
	local name=$1
	shift
	log "$name"
	if bash "$VM/run-in-guest.sh" "$*" >"$OUT/$name.log" 2>&1; then
		tail -n 3 "$OUT/$name.log" >&2
	else
		echo "FAILED: $name (see $OUT/$name.log)" >&2
		tail -n 30 "$OUT/$name.log" >&2
		fail=1
	fi
}

guest c-verbs "timeout 600 ./native/build/rel/test_verbs"
guest rdma-tests "$PY RS_PEER=/project/build/rs_peer timeout 900 python3 -m pytest -q -p no:cacheprovider rdma/tests"
guest conformance "$PY timeout 1500 python3 -m pytest -q -p no:cacheprovider \
	tests/test_socket_behaviour.py tests/test_contract.py tests/test_stream.py \
	tests/test_readiness.py tests/test_robust_close.py::test_close_with_linger_zero_resets \
	tests/test_robust_close.py::test_reset_after_fin_keeps_eof \
	tests/test_robust_close.py::test_so_error_of_a_reset_behind_unread_data -k rsock"
# an event loop over verbs: idle loops sleep (a completion event left unacknowledged
# kept one spinning), round trips, timers, garbage; and rsock.asyncio's own suite
# (32 MiB each way in its big transfer here), but for two tests: 500 connections'
# registered rings do not fit the 2 GiB guest (the OOM killer ends the run), and
# the guest resolves no names ("localhost")
guest asyncio "$PY timeout 900 python3 -m pytest -q -p no:cacheprovider \
	tests/test_loop_polling.py tests/test_asyncio.py \
	-k 'rsock and not many_concurrent_clients and not numeric_hosts_skip'"
guest peer-death "$PY timeout 600 python3 -m pytest -q -s -p no:cacheprovider \
	tests/test_robust_reliability.py -k 'death_of_a_peer and rsock'"
guest bench "$PY timeout 1200 bash rdma/bench.sh build/rdma-results"
[ -f "$OUT/bench.txt" ] && cat "$OUT/bench.txt" >&2

log "done (fail=$fail)"
exit $fail
