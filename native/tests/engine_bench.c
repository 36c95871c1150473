// SPDX-License-Identifier: MIT
/*
 * engine_bench - the engine alone, no Python: two processes (fork), one
 * pinned per CPU (or both on CPU 0 with "same"), 64 B ping-pong RTT and
 * a stream at a given message size.
 *   engine_bench [split|same|none] [msg_size] [spin_us] [ring_size]
 * Environment: RSOCK_BENCH_VERBS=ADDR runs over the verbs provider (rdma_cm
 * on ADDR) instead of shm; RSOCK_BENCH_TOTAL (stream bytes, default 4 GiB)
 * and RSOCK_BENCH_ITERS (round trips, default 100000) scale it down for
 * emulated devices.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rsock.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int no_pin;

static void pin(int cpu)
{
	cpu_set_t set;

	if (no_pin)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static int recv_all(rsk_sock *s, void *buf, size_t n)
{
	return rsk_recv(s, buf, n, RSK_F_WAITALL, -1) == (ssize_t)n ? 0 : -1;
}

int main(int argc, char **argv)
{
	int same = argc > 1 && !strcmp(argv[1], "same");
	size_t msg = argc > 2 ? strtoul(argv[2], NULL, 0) : 65536;
	struct rsk_opts o;
	struct rsk_addr a = { .family = AF_INET };
	const char *verbs = getenv("RSOCK_BENCH_VERBS");
	const char *e_total = getenv("RSOCK_BENCH_TOTAL");
	const char *e_iters = getenv("RSOCK_BENCH_ITERS");
	const uint64_t total = e_total ? strtoull(e_total, NULL, 0) : 4ull << 30;
	const int iters = e_iters ? atoi(e_iters) : 100000;
	char name[64];
	rsk_sock *l, *s;
	uint8_t *buf;
	pid_t pid;
	int sync[2];
	char c;

	no_pin = argc > 1 && !strcmp(argv[1], "none");

	rsk_opts_default(&o);
	if (argc > 3)
		o.spin_us = (uint32_t)atoi(argv[3]);
	if (argc > 4)
		o.ring_size = (uint32_t)strtoul(argv[4], NULL, 0);
	buf = calloc(1, msg < 64 ? 64 : msg);
	snprintf(name, sizeof(name), "rsock-bench/%d", getpid());
	if (verbs) {
		/* rdma-core's state does not cross fork(): fork first, and let
		 * the server say when it listens */
		a.port = (uint16_t)(30000 + getpid() % 20000);
		inet_pton(AF_INET, verbs, a.addr);
		if (pipe(sync))
			return 1;
	}
	if (!verbs) {
		rsk_socket(&l);
		rsk_set_opts(l, &o);
		if (rsk_listen(l, name, strlen(name), 1))
			return 1;
	}
	pid = fork();
	if (pid == 0) {
		uint64_t got = 0;
		ssize_t r;

		pin(0);
		if (verbs) {
			rsk_socket(&l);
			rsk_set_opts(l, &o);
			if (rsk_listen_verbs(l, &a, 1))
				_exit(1);
			if (write(sync[1], "l", 1) != 1)
				_exit(1);
		}
		if (rsk_accept(l, -1, &s, NULL, NULL))
			_exit(1);
		while (got < total && (r = rsk_recv(s, buf, msg, 0, -1)) > 0)
			got += (uint64_t)r;
		rsk_send(s, "k", 1, 0, -1);
		while (recv_all(s, buf, 64) == 0)
			rsk_send(s, buf, 64, 0, -1);
		rsk_free(s);
		_exit(0);
	}
	pin(same ? 0 : 1);
	rsk_socket(&s);
	rsk_set_opts(s, &o);
	if (verbs) {
		if (read(sync[0], &c, 1) != 1 ||
		    rsk_connect_verbs(s, NULL, &a, 0, 30000))
			return 1;
	} else {
		if (rsk_connect(s, name, strlen(name), &a, &a, -1))
			return 1;
		rsk_free(l); /* the child has its own */
		l = NULL;
	}
	{
		double t = now(), *lat = calloc(iters, sizeof(double));
		uint64_t sent = 0;
		int i;

		while (sent < total) {
			rsk_send(s, buf, msg, 0, -1);
			sent += msg;
		}
		recv_all(s, buf, 1);
		t = now() - t;
		printf("%s %s ring=%u spin=%u: stream %zu B: %.4f GB/s; ",
		       verbs ? "verbs" : "shm",
		       no_pin ? "none" : same ? "same" : "split", o.ring_size,
		       o.spin_us, msg, (double)total / t / 1e9);
		for (i = 0; i < iters; i++) {
			double t0 = now();

			rsk_send(s, buf, 64, 0, -1);
			recv_all(s, buf, 64);
			lat[i] = now() - t0;
		}
		qsort(lat, iters, sizeof(double), cmp_d);
		printf("64 B RTT p50 %.2f us p99 %.2f us\n", lat[iters / 2] * 1e6,
		       lat[iters * 99 / 100] * 1e6);
	}
	rsk_free(s);
	waitpid(pid, NULL, 0);
	return 0;
}
