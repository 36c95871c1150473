# rsock top-level Makefile.  `make test` and `make bench` are all a fresh machine needs:
# missing Debian build tools are installed (as root), the venv is created, and the C
# extension is rebuilt whenever a native source changes.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Stamp: the editable install (and its compiled extension) is newer than these inputs.
STAMP := $(VENV)/.rsock-installed
NATIVE_INPUTS := $(wildcard native/src/*.c native/src/*.h native/py/*.c) native/include/rsock.h \
	native/build_ffi.py pyproject.toml setup.py
# Directories that exist (git does not keep empty ones, so compat/ may be absent).
LINT_PATHS := $(wildcard rsock tests compat conftest.py native/linkgraph.py)
PYTEST_ARGS ?=
BENCH_ARGS ?=

export DEBIAN_FRONTEND := noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all help venv sysdeps check-native lint test bench bench-apps bench-ucxx clean

all: test

help:
	@echo "rsock's make targets (each installs what it needs: Debian packages as root, the venv)"
	@echo "  make test          the C tests under ASan+UBSan and TSan, lint (ruff, mypy), tests/ and"
	@echo "                     compat/ over TCP and rsock (~20 min on 2 cores)"
	@echo "  make venv          .venv: rsock editable with its test and compat extras (pytest,"
	@echo "                     hypothesis, mypy, ruff, uvloop, the frameworks compat/ runs)"
	@echo "  make lint          ruff and mypy"
	@echo "  make check-native  the C tests alone (ASan+UBSan, TSan)"
	@echo "  make bench         python -m rsock.bench, rsock against TCP (BENCH_ARGS=...)"
	@echo "  make bench-apps    the application benchmark (unmodified framework programs)"
	@echo "  make bench-ucxx    the UCXX reference in .venv-ucxx (~350 MB from PyPI)"
	@echo "  make test-cpython  CPython's networking tests under rsock, in a private netns"
	@echo "  make test-rdma     the verbs provider on Soft-RoCE in a qemu guest"
	@echo "  make soak          a bounded soak (SOAK_SECONDS, default 600)"
	@echo "  make fuzz          the protocol and engine fuzzers (FUZZ_SECONDS each)"
	@echo "  make clean         remove the venvs and build products"

venv: $(STAMP)

# apt-get install only what is missing, and only as root.
define apt_install
	if [ "$$(id -u)" -ne 0 ]; then \
		echo "error: missing Debian packages: $(1); install them (as root: apt-get install -y $(1))" >&2; \
		exit 1; \
	fi; \
	echo "installing Debian packages: $(1)"; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $(1)
endef

# Build tools for the C extension: a C compiler, make, the headers of $(PYTHON), and
# rdma-core's headers (the verbs provider is compiled whenever they are there; the
# libraries themselves are loaded at run time).
sysdeps:
	@missing=""; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	command -v make >/dev/null 2>&1 || missing="$$missing make"; \
	$(PYTHON) -c 'import os, sys, sysconfig; \
		sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
		|| missing="$$missing python3-dev"; \
	[ -f /usr/include/infiniband/verbs.h ] || missing="$$missing libibverbs-dev"; \
	[ -f /usr/include/rdma/rdma_cma.h ] || missing="$$missing librdmacm-dev"; \
	if [ -n "$$missing" ]; then $(call apt_install,$$missing); fi

$(VPY): | sysdeps
	@if ! $(PYTHON) -m venv $(VENV); then \
		echo "'$(PYTHON) -m venv' failed (python3-venv / ensurepip missing?)" >&2; \
		rm -rf $(VENV); \
		$(call apt_install,python3-venv); \
		$(PYTHON) -m venv $(VENV); \
	fi
	$(VPY) -m pip install --quiet --upgrade pip

# A stale extension under another name (a direct `python native/build_ffi.py` names it
# _native.cpython-3XX-...so, pip _native.abi3.so) would shadow the fresh one: drop them.
$(STAMP): $(VPY) $(NATIVE_INPUTS) | sysdeps
	rm -f rsock/_native*.so
	$(VPY) -m pip install --quiet --upgrade "setuptools>=77" wheel "cffi>=1.15"
	$(VPY) -m pip install --quiet --no-build-isolation -e '.[test,compat]'
	touch $@

check-native: sysdeps
	$(MAKE) -C native check

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy rsock
	@# the architecture page's link graphs are the code's (C files, Python modules)
	$(VPY) native/linkgraph.py --check docs/architecture.md

# pytest exits 5 when it collected nothing; like any non-zero exit, that fails the target.
BELL_TESTS = tests/test_asyncio.py tests/test_socket_behaviour.py tests/test_readiness.py \
	tests/test_robust_hostile.py tests/test_robust_close.py tests/test_robust_threads.py \
	tests/test_robust_scale.py tests/test_fork.py tests/test_multiprocess.py \
	compat/tests/test_patch_asyncio.py compat/tests/test_patch_pollers.py

test: venv
	$(MAKE) check-native
	$(MAKE) lint
	@paths="tests"; \
	if [ -d compat ] && [ -n "$$(find compat -name 'test_*.py' -o -name '*_test.py' | head -n1)" ]; then \
		paths="$$paths compat"; \
	fi; \
	echo "$(VPY) -m pytest $$paths $(PYTEST_ARGS)"; \
	$(VPY) -m pytest $$paths $(PYTEST_ARGS)
	@# the suites that wake connections up, again with every connection in
	@# bell mode (the default picks eventfd mode below its fd budget)
	RSOCK_WAKE=bell $(VPY) -m pytest $(BELL_TESTS) $(PYTEST_ARGS)

bench: venv
	$(VPY) -m rsock.bench $(BENCH_ARGS)

# The application benchmark: unmodified framework programs (rsock/bench/apps) over TCP
# and under `python -m rsock run`, interleaved (the frameworks: the compat extra).
bench-apps: venv
	$(VPY) -m rsock.bench apps $(BENCH_ARGS)

# The UCXX reference (issue 18): UCX's Python bindings in an optional venv of their own
# (~350 MB from PyPI, runs without a GPU), never a dependency of rsock; the benchmark
# then runs ucxx beside rsock and TCP on the asyncio api, 64 B and 1 MiB ping-pong.
UCXX_VENV := .venv-ucxx
UCXX_PKG ?= ucxx-cu12
UCXX_STAMP := $(UCXX_VENV)/.rsock-installed

$(UCXX_STAMP): $(NATIVE_INPUTS) | sysdeps
	$(PYTHON) -m venv $(UCXX_VENV)
	$(UCXX_VENV)/bin/python -m pip install --quiet --upgrade pip "setuptools>=77" wheel "cffi>=1.15"
	$(UCXX_VENV)/bin/python -m pip install --quiet $(UCXX_PKG)
	$(UCXX_VENV)/bin/python -m pip install --quiet --no-build-isolation -e '.[uvloop,bench]'
	touch $@

bench-ucxx: $(UCXX_STAMP)
	$(UCXX_VENV)/bin/python -m rsock.bench --transport rsock,tcp,ucxx --api asyncio \
		--tests pingpong --ping-sizes 64,1M $(BENCH_ARGS)

clean:
	-[ -f native/Makefile ] && $(MAKE) -C native clean
	rm -rf $(VENV) $(UCXX_VENV) build native/build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	rm -f rsock/_native.c rsock/_native.o rsock/_native*.so
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# The long soak (tests/soak.py): mixed traffic across processes, random sizes, closes and
# reconnects, every byte checked; SOAK_SECONDS=60 make soak for a shorter one.
SOAK_SECONDS ?= 600
SOAK_ARGS ?=

.PHONY: soak
soak: venv
	$(VPY) tests/soak.py --seconds $(SOAK_SECONDS) $(SOAK_ARGS)

# Fuzzing (native/fuzz): each libFuzzer harness runs FUZZ_SECONDS (clang and its
# libFuzzer runtime are installed if missing).  Where libFuzzer cannot be had (not
# root, no package), the same harnesses run under gcc's ASan/UBSan with
# native/fuzz/replay.c as driver: seed corpus, then random mutations, not
# coverage-guided.
FUZZ_SECONDS ?= 60

.PHONY: fuzz
fuzz:
	@probe='int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }'; \
	has_libfuzzer() { echo "$$probe" | clang -fsanitize=fuzzer,address,undefined -x c - -o /dev/null >/dev/null 2>&1; }; \
	if ! has_libfuzzer && [ "$$(id -u)" -eq 0 ]; then \
		echo "installing clang and its libFuzzer runtime"; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends clang || true; \
		v=$$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1); \
		[ -z "$$v" ] || apt-get install -y -qq --no-install-recommends "libclang-rt-$$v-dev" \
			|| apt-get install -y -qq --no-install-recommends "libclang-common-$$v-dev" || true; \
	fi; \
	if has_libfuzzer; then \
		$(MAKE) -C native fuzz FUZZ_SECONDS=$(FUZZ_SECONDS); \
	else \
		echo "fuzz: no clang with libFuzzer here (not root, or no package): running the" \
			"harnesses under gcc ASan/UBSan with random mutations instead" >&2; \
		$(MAKE) -C native fuzz-replay FUZZ_REPLAY_SECONDS=$(FUZZ_SECONDS); \
	fi

# CPython's own networking tests, twice in one job: plain (the oracle) and under
# `python -m rsock run`, each inside a private network namespace with only loopback up
# (the patch bypasses the mocks of some tests, which then try real addresses: none may
# leave this host); tests/cpython/compare.py fails on any test that passes on the
# stdlib and not under rsock unless tests/cpython/expected.txt lists it with the README
# difference it comes from.  The set: 31 modules (test_asyncio counts 30 of its own):
# those of CPython 3.11 we found that open TCP connections or test sockets, TLS,
# selectors, epoll or sendfile (this Python has no test_multiprocessing_* modules);
# ~5,000 tests that pass on the stdlib here.  Root (unshare); ~4 minutes.
CPYTHON_TESTS ?= test_socket test_ssl test_asyncio test_selectors test_select test_poll \
	test_epoll test_socketserver test_httplib test_httpservers test_urllib2_localnet \
	test_urllib2 test_xmlrpc test_docxmlrpc test_ftplib test_poplib test_imaplib \
	test_smtplib test_smtpd test_telnetlib test_nntplib test_wsgiref test_asyncore \
	test_asynchat test_logging test_robotparser test_urllib test_timeout \
	test_largefile test_os test_signal

# test_socket's VSOCK tests are left out of both runs: AF_VSOCK is not namespaced and not
# TCP (rsock never sees it), and on some hosts (a VM whose vsock goes to its hypervisor)
# their accept() hangs until the per-file timeout, which then drops all of test_socket
# from the stdlib run (the oracle), silently.
CPYTHON_IGNORE := -i "*VSOCK*"

# The namespace: a private network (loopback only) and a private mount table in which
# /etc/resolv.conf names 127.0.0.1, so that the tests' lookups of outside names fail at
# once (the host's resolver is unreachable from the namespace: each lookup waited for
# its timeout, and test_socket took over 15 minutes).
CPYTHON_NS := unshare -n -m sh -c
CPYTHON_NS_SETUP := mount --bind $(CURDIR)/build/cpython/resolv.conf /etc/resolv.conf && ip link set lo up

.PHONY: test-cpython
test-cpython: venv
	@command -v unshare >/dev/null 2>&1 || { $(call apt_install,util-linux); }
	@command -v ip >/dev/null 2>&1 || { $(call apt_install,iproute2); }
	rm -rf build/cpython && mkdir -p build/cpython
	echo "nameserver 127.0.0.1" > build/cpython/resolv.conf
	cd build/cpython && $(CPYTHON_NS) '$(CPYTHON_NS_SETUP) && timeout 1200 \
		$(CURDIR)/$(VPY) -m test $(CPYTHON_TESTS) -u network -j2 --timeout 300 $(CPYTHON_IGNORE) \
		--junit-xml $(CURDIR)/build/cpython/stdlib.xml' > stdlib.log 2>&1 || true
	cd build/cpython && $(CPYTHON_NS) '$(CPYTHON_NS_SETUP) && timeout 1200 \
		$(CURDIR)/$(VPY) -m rsock run -m test $(CPYTHON_TESTS) -u network -j2 --timeout 300 $(CPYTHON_IGNORE) \
		--junit-xml $(CURDIR)/build/cpython/rsock.xml' > rsock.log 2>&1 || true
	@# failures of the full run are run again, alone, once (compare.py prints them FLAKY);
	@# nothing to rerun when what failed was a module missing from the stdlib run
	$(VPY) tests/cpython/compare.py build/cpython/stdlib.xml build/cpython/rsock.xml \
		tests/cpython/expected.txt --write-rerun build/cpython > build/cpython/first.txt \
		|| { mods=$$(cat build/cpython/rerun.modules); \
		[ -z "$${mods// /}" ] || { cd build/cpython && $(CPYTHON_NS) '$(CPYTHON_NS_SETUP) && timeout 600 \
		$(CURDIR)/$(VPY) -m rsock run -m test '"$$mods"' -u network --timeout 300 $(CPYTHON_IGNORE) \
		--matchfile $(CURDIR)/build/cpython/rerun.match \
		--junit-xml $(CURDIR)/build/cpython/rerun.xml' > rerun.log 2>&1 || true; }; }
	[ -f build/cpython/rerun.xml ] || cp build/cpython/rsock.xml build/cpython/rerun.xml
	$(VPY) tests/cpython/compare.py build/cpython/stdlib.xml build/cpython/rsock.xml \
		tests/cpython/expected.txt --rerun build/cpython/rerun.xml

# Real RDMA: a qemu guest with Soft-RoCE (rdma_rxe) runs the verbs provider's C test,
# the conformance suite with RSOCK_PROVIDER=verbs, the rsockets peer tests and the
# rstream comparison (rdma/run-tests.sh; root, ~10-20 min under emulation; the guest
# image is cached in build/rxe-vm).
.PHONY: test-rdma
test-rdma: venv
	bash rdma/run-tests.sh
