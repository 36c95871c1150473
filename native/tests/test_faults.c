// SPDX-License-Identifier: MIT
/*
 * Fault injection (RSOCK_FAULT: prov_fault.c wrapping shm) under the sanitizers.
 *
 * RSOCK_FAULT is read once per process, so every case runs in a child
 * process of its own, with both ends of a connection in it (the fault
 * then applies to both QPs, each with its own counters).  A single thread
 * pumps a patterned stream b -> a with non-blocking calls; every byte a
 * receives must be the byte b sent at that position.  The Python tests
 * (tests/test_faults.py) run the same faults across processes.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "engine.h"
#include "rsock.h"
#include "tharness.h"

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 2654435761u >> 13);
}

static int make_pair(rsk_sock **a, rsk_sock **b)
{
	struct rsk_addr x = { .family = AF_INET, .port = 9 };
	struct rsk_opts o;
	char name[64];
	rsk_sock *l;
	int rc;

	rsk_opts_default(&o);
	o.ring_size = 4096;
	o.qdepth = 16;
	o.spin_us = 0;
	snprintf(name, sizeof(name), "rsock-ctest/faults/%d", (int)getpid());
	if ((rc = rsk_socket(&l)) || (rc = rsk_listen(l, name, strlen(name), 4)))
		return rc;
	rc = rsk_socket(b);
	if (!rc)
		rc = rsk_set_opts(*b, &o);
	if (!rc)
		rc = rsk_connect(*b, name, strlen(name), &x, &x, 1000);
	if (!rc)
		rc = rsk_accept(l, 1000, a, NULL, NULL);
	rsk_free(l);
	return rc;
}

struct outcome {
	uint64_t sent, got;
	ssize_t send_err, recv_err; /* first error of each side, 0 if none */
	int eof;                    /* a read EOF after everything */
	char detail[2][160];        /* a's and b's */
};

/* Pumps total bytes b -> a (then FIN) until done, an error, or stall_ms
 * without progress.  Returns 0, or -1 if a byte arrived wrong. */
static int pump(rsk_sock *a, rsk_sock *b, uint64_t total, int stall_ms,
		struct outcome *o)
{
	static uint8_t buf[3000];
	int idle = 0, shut = 0;
	size_t i;
	ssize_t r;

	memset(o, 0, sizeof(*o));
	while (idle < stall_ms) {
		int moved = 0;

		if (o->sent < total && !o->send_err) {
			size_t n = total - o->sent < 1500 ? total - o->sent : 1500;

			for (i = 0; i < n; i++)
				buf[i] = pattern(o->sent + i);
			r = rsk_send(b, buf, n, 0, 0);
			if (r > 0) {
				o->sent += (uint64_t)r;
				moved = 1;
			} else if (r != -EAGAIN) {
				o->send_err = r;
			}
		} else if (!shut && !o->send_err) {
			rsk_shutdown(b, RSK_SHUT_WR);
			shut = 1;
		}
		r = rsk_recv(a, buf, sizeof(buf), 0, 1);
		if (r > 0) {
			for (i = 0; i < (size_t)r; i++)
				if (buf[i] != pattern(o->got + i)) {
					fprintf(stderr, "byte %llu is wrong\n",
						(unsigned long long)(o->got + i));
					return -1;
				}
			o->got += (uint64_t)r;
			moved = 1;
		} else if (r == 0) {
			o->eof = 1;
			break;
		} else if (r != -EAGAIN && r != -ETIMEDOUT) {
			o->recv_err = r;
			break;
		}
		if (o->send_err && o->got == o->sent)
			break;
		idle = moved ? 0 : idle + 1;
	}
	snprintf(o->detail[0], sizeof(o->detail[0]), "%s", rsk_detail(a));
	snprintf(o->detail[1], sizeof(o->detail[1]), "%s", rsk_detail(b));
	return 0;
}

/* Runs fn in a child with RSOCK_FAULT=spec; the child's exit status is
 * its number of failed checks. */
static void in_child(const char *spec, void (*fn)(void))
{
	pid_t pid;
	int st;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		setenv("RSOCK_FAULT", spec, 1);
		fn();
		fflush(stdout);
		_exit(th_failed ? 1 : 0);
	}
	CHECK(pid > 0);
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "RSOCK_FAULT=%s: the child failed (status %#x)\n",
			spec, st);
		th_failed++;
	}
}

static const char *expect; /* a detail that one side must report */

/* The fault breaks the connection: a clean reset on one side, EPIPE or a
 * reset on the other, never a wrong byte, no hang. */
static void breaks(void)
{
	struct outcome o;
	rsk_sock *a, *b;

	CHECK_EQ(make_pair(&a, &b), 0);
	CHECK_EQ(pump(a, b, 1 << 20, 2000, &o), 0);
	CHECK(o.got < (1 << 20));
	CHECK(o.send_err == -ECONNRESET || o.send_err == -EPIPE ||
	      o.recv_err == -ECONNRESET);
	if (!strstr(o.detail[0], expect) && !strstr(o.detail[1], expect)) {
		fprintf(stderr, "expected '%s', got '%s' / '%s'\n", expect,
			o.detail[0], o.detail[1]);
		CHECK(0);
	}
	rsk_free(a);
	rsk_free(b);
}

/* The fault costs nothing but time: everything arrives, then EOF. */
static void harmless(void)
{
	struct outcome o;
	rsk_sock *a, *b;

	CHECK_EQ(make_pair(&a, &b), 0);
	CHECK_EQ(pump(a, b, 256 << 10, 2000, &o), 0);
	CHECK_EQ(o.send_err, 0);
	CHECK_EQ(o.recv_err, 0);
	CHECK_EQ(o.got, 256 << 10);
	CHECK(o.eof);
	rsk_free(a);
	rsk_free(b);
}

static int64_t ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* delay:300 - a short timed receive times out; a blocking one sleeps
 * until the timer makes the completion visible (no spinning, no hang). */
static void delayed(void)
{
	rsk_sock *a, *b;
	char buf[8];
	int64_t t0;

	CHECK_EQ(make_pair(&a, &b), 0);
	CHECK_EQ(rsk_send(b, "late", 4, 0, 0), 4);
	t0 = ms_now();
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 50), -ETIMEDOUT);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 5000), 4);
	CHECK(ms_now() - t0 >= 250);
	CHECK(ms_now() - t0 < 3000);
	CHECK(!memcmp(buf, "late", 4));
	CHECK(a->st.sleeps > 0);
	/* watch mode: the fd turns readable when the delay is over */
	CHECK_EQ(rsk_set_watch(a, RSK_WATCH_FD), 0);
	CHECK_EQ(rsk_send(b, "more", 4, 0, 0), 4);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 0), -EAGAIN);
	{
		struct pollfd p = { .fd = rsk_fileno(a), .events = POLLIN };

		CHECK_EQ(poll(&p, 1, 5000), 1);
	}
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 0), 4);
	rsk_free(a);
	rsk_free(b);
}

/* A receive completion lost without a trace (a buggy provider): the data
 * delivered is still exactly the stream (the ring keeps it in order), but
 * the engine has no sequence check of its own: it notices only when a
 * later control message's slot disagrees, else the stream stalls. */
static void lost_silently(void)
{
	struct outcome o;
	rsk_sock *a, *b;

	CHECK_EQ(make_pair(&a, &b), 0);
	CHECK_EQ(pump(a, b, 1 << 20, 300, &o), 0);
	CHECK(o.got < (1 << 20));
	printf("#   lose_recv: %s (a: '%s', b: '%s')\n",
	       o.recv_err || o.send_err ? "reset" : "stalled, undetected",
	       o.detail[0], o.detail[1]);
	rsk_free(a);
	rsk_free(b);
}

static void malformed(void)
{
	rsk_sock *a, *b;

	CHECK_EQ(make_pair(&a, &b), -EINVAL);
}

static void t_drop_recv(void)
{
	expect = "completion error";
	in_child("drop_recv:5", breaks);
}

static void t_qp_error(void)
{
	expect = "provider shm";
	in_child("qp_error:7", breaks);
}

static void t_fail_write(void)
{
	expect = "post failed (Cannot allocate memory)";
	in_child("fail_write:9:ENOMEM", breaks);
}

static void t_fail_recv(void)
{
	expect = "repost failed (Input/output error)";
	in_child("fail_recv:4", breaks);
}

static void t_corrupt(void)
{
	static const char *const cases[][2] = {
		{ "corrupt:3:opcode", "opcode 7" },
		{ "corrupt:3:len", "does not fit" },
		{ "corrupt:2:consumed", "credit for" },
		{ "corrupt:2:limit", "message limit" },
		{ "corrupt:2:ctrlop", "ctrl slot op" },
	};
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		expect = cases[i][1];
		in_child(cases[i][0], breaks);
	}
}

static void t_harmless(void)
{
	in_child("drop_send:0", harmless);
	in_child("drop_send:2", harmless);
	in_child("delay:1", harmless);
	in_child("drop_recv:100000,qp_error:100000", harmless);
}

static void t_delay_wakes(void)
{
	in_child("delay:300", delayed);
}

static void t_lose_recv(void)
{
	in_child("lose_recv:4", lost_silently);
}

static void t_malformed(void)
{
	in_child("drop_recv", malformed);
	in_child("nonsense:1", malformed);
	in_child("corrupt:1:everything", malformed);
	in_child("fail_write:1:EBOGUS", malformed);
}

int main(void)
{
	RUN(t_drop_recv);
	RUN(t_qp_error);
	RUN(t_fail_write);
	RUN(t_fail_recv);
	RUN(t_corrupt);
	RUN(t_harmless);
	RUN(t_delay_wakes);
	RUN(t_lose_recv);
	RUN(t_malformed);
	return th_summary();
}
