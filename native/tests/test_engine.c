// SPDX-License-Identifier: MIT
/*
 * Two engines joined by the shm provider inside one process: credits,
 * wrap-around, the credit-return threshold, the control reserve, EOF and
 * protocol violations.  White-box where it helps (engine.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "engine.h"
#include "rsock.h"
#include "tharness.h"

static int name_seq;

struct conn_arg {
	char name[64];
	struct rsk_opts o;
	rsk_sock *s;
	int rc;
};

static void *connector(void *p)
{
	struct conn_arg *a = p;
	struct rsk_addr src = { .family = AF_INET, .port = 1 };
	struct rsk_addr dst = { .family = AF_INET, .port = 2 };

	a->rc = rsk_socket(&a->s);
	if (a->rc)
		return NULL;
	rsk_set_opts(a->s, &a->o);
	a->rc = rsk_connect(a->s, a->name, strlen(a->name), &src, &dst, 5000);
	return NULL;
}

/* a = accepted side (options ao), b = connecting side (options bo) */
static int make_pair(const struct rsk_opts *ao, const struct rsk_opts *bo,
		     rsk_sock **a, rsk_sock **b)
{
	struct conn_arg arg = { 0 };
	struct rsk_addr src, dst;
	rsk_sock *l;
	pthread_t t;
	int rc;

	snprintf(arg.name, sizeof(arg.name), "rsock-ctest/%d/%d", getpid(),
		 name_seq++);
	arg.o = *bo;
	if (rsk_socket(&l))
		return -1;
	rsk_set_opts(l, ao);
	if ((rc = rsk_listen(l, arg.name, strlen(arg.name), 4)))
		return rc;
	pthread_create(&t, NULL, connector, &arg);
	rc = rsk_accept(l, 5000, a, &src, &dst);
	pthread_join(t, NULL);
	rsk_free(l);
	if (rc || arg.rc)
		return rc ? rc : arg.rc;
	if (src.port != 1 || dst.port != 2)
		return -1;
	*b = arg.s;
	return 0;
}

static struct rsk_opts opts(uint32_t ring, uint32_t q)
{
	struct rsk_opts o;

	rsk_opts_default(&o);
	o.ring_size = ring;
	o.qdepth = q;
	o.spin_us = 0;
	return o;
}

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 2654435761u >> 13);
}

static void t_echo(void)
{
	struct rsk_opts o = opts(1 << 16, 64);
	rsk_sock *a, *b;
	char buf[16];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(b, "hello", 5, 0, -1), 5);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 5);
	CHECK(!memcmp(buf, "hello", 5));
	CHECK_EQ(rsk_send(a, "world!", 6, 0, -1), 6);
	CHECK_EQ(rsk_recv(b, buf, 3, RSK_F_PEEK, -1), 3);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, -1), 6);
	CHECK(!memcmp(buf, "world!", 6));
	/* nothing left: non-blocking and timed receives */
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), -EAGAIN);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), RSK_F_DONTWAIT, -1), -EAGAIN);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 50), -ETIMEDOUT);
	rsk_free(a);
	rsk_free(b);
}

struct stream_arg {
	rsk_sock *s;
	uint64_t total;
	uint32_t seed;
	int rc;
};

static void *stream_sender(void *p)
{
	struct stream_arg *a = p;
	static __thread uint8_t buf[1 << 17];
	uint64_t sent = 0;
	uint32_t x = a->seed;

	while (sent < a->total) {
		uint64_t n, i;
		ssize_t r;

		x = x * 1103515245 + 12345;
		n = 1 + (x >> 8) % sizeof(buf);
		if (n > a->total - sent)
			n = a->total - sent;
		for (i = 0; i < n; i++)
			buf[i] = pattern(sent + i);
		r = rsk_send(a->s, buf, n, 0, -1);
		if (r != (ssize_t)n) {
			a->rc = (int)r;
			return NULL;
		}
		sent += n;
	}
	a->rc = rsk_shutdown(a->s, RSK_SHUT_WR);
	return NULL;
}

/* Streams total bytes b -> a with random chunk sizes; verifies every byte. */
static void stream_check(uint32_t ring, uint32_t q, uint64_t total,
			 size_t rmax)
{
	struct rsk_opts o = opts(ring, q);
	struct stream_arg sa = { .total = total, .seed = ring ^ q };
	static uint8_t buf[1 << 17];
	uint64_t got = 0;
	uint32_t x = 7;
	rsk_sock *a, *b;
	pthread_t t;
	ssize_t r;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	sa.s = b;
	pthread_create(&t, NULL, stream_sender, &sa);
	for (;;) {
		size_t want, i;

		x = x * 1103515245 + 12345;
		want = 1 + (x >> 8) % rmax;
		r = rsk_recv(a, buf, want, 0, 10000);
		if (r <= 0)
			break;
		for (i = 0; i < (size_t)r; i++)
			if (buf[i] != pattern(got + i))
				break;
		if (i != (size_t)r) {
			fprintf(stderr, "mismatch at byte %llu\n",
				(unsigned long long)(got + i));
			r = -EIO;
			break;
		}
		got += (uint64_t)r;
	}
	pthread_join(t, NULL);
	CHECK_EQ(sa.rc, 0);
	CHECK_EQ(r, 0);
	CHECK_EQ(got, total);
	/* credits came back up to the return threshold */
	rsk_poll(b);
	CHECK(b->p.s_tail - b->p.s_acked < ring >> CREDIT_BYTES_SHIFT);
	rsk_free(a);
	rsk_free(b);
}

static void t_stream_wrap_small_ring(void)
{
	/* 4 KiB ring, 16 slots: constant wrap-around and credit exhaustion */
	stream_check(4096, 16, 8u << 20, 5000);
}

static void t_stream_default(void)
{
	stream_check(1 << 20, 256, 64u << 20, sizeof(((uint8_t[1 << 17]){ 0 })));
}

/* n one-byte sends of (char)(first + i), none of which may wait. */
static void send_one_by_one(rsk_sock *s, int first, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		char c = (char)(first + i);

		CHECK_EQ(rsk_send(s, &c, 1, 0, 0), 1);
	}
}

/* Message credits run out at qdepth - reserve while the receiver takes
 * nothing in; small sends go on into the ring as plain writes (a TCP
 * sender's queue is bounded by bytes, not by writes), the receiver reads
 * them all, in order, and the stream goes back to messages (an
 * announcement of the plain bytes first) once credits come back. */
static void t_credit_exhaustion(void)
{
	struct rsk_opts o = opts(1 << 16, 16);
	rsk_sock *a, *b;
	char buf[512];
	int i;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	send_one_by_one(b, 0, 300);
	CHECK(b->st.credit_stalls > 0);
	CHECK_EQ(b->p.s_limit - b->p.s_msgs, CREDIT_RESERVE);
	CHECK_EQ(b->p.s_tail - b->p.s_announced, 300 - (16 - CREDIT_RESERVE));
	CHECK(rsk_poll(b) & RSK_POLLOUT);
	CHECK(rsk_poll(a) & RSK_POLLIN);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 2000), 300);
	for (i = 0; i < 300; i++)
		CHECK_EQ(buf[i], (char)i);
	CHECK(a->p.r_tail > a->p.r_msg_tail); /* (no announcement yet) */
	/* the receiver reaped: credits back; messages again */
	send_one_by_one(b, 100, 5);
	CHECK_EQ(b->p.s_announced, b->p.s_tail);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 2000), 5);
	for (i = 0; i < 5; i++)
		CHECK_EQ(buf[i], (char)(100 + i));
	CHECK_EQ(a->p.r_msg_tail, a->p.r_tail);
	/* plain bytes, then the FIN: all of them before the EOF */
	for (i = 0; i < 40; i++)
		CHECK_EQ(rsk_send(b, "z", 1, 0, 0), 1);
	CHECK(b->p.s_tail > b->p.s_announced);
	CHECK_EQ(rsk_shutdown(b, RSK_SHUT_WR), 0);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 2000), 40);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 2000), 0);
	rsk_free(a);
	rsk_free(b);
}

/* A receiver asleep in recv wakes for a plain write (the Dekker pair of
 * its arm and the writer's published position). */
static void *plain_sender(void *arg)
{
	rsk_sock *b = arg;
	int i;

	usleep(50000);
	for (i = 0; i < 64; i++)
		if (rsk_send(b, "p", 1, 0, -1) != 1)
			return NULL;
	return b;
}

static void t_plain_write_wakes(void)
{
	struct rsk_opts o = opts(1 << 16, 16);
	rsk_sock *a, *b;
	pthread_t t;
	char buf[64];
	size_t got = 0;
	void *ok;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	pthread_create(&t, NULL, plain_sender, b);
	while (got < 64) {
		/* one byte at a time: the receiver is mostly asleep when a
		 * write comes, and reaps only what each call returns */
		ssize_t r = rsk_recv(a, buf, 1, 0, 2000);

		CHECK_EQ(r, 1);
		if (r != 1)
			break;
		got++;
	}
	pthread_join(t, &ok);
	CHECK(ok == b);
	rsk_free(a);
	rsk_free(b);
}

/* Byte space: a full ring blocks until half of it is consumed. */
static void t_space_threshold(void)
{
	const size_t th = 4096 >> CREDIT_BYTES_SHIFT;
	struct rsk_opts o = opts(4096, 64);
	static uint8_t data[8192], buf[8192];
	rsk_sock *a, *b;
	ssize_t r;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(b, data, sizeof(data), 0, 0), 4096);
	CHECK_EQ(rsk_send(b, data, 1, 0, 0), -EAGAIN);
	CHECK_EQ(rsk_send(b, data, 1, 0, 30), -ETIMEDOUT);
	CHECK(b->st.space_stalls > 0);
	/* just under the threshold (ring >> CREDIT_BYTES_SHIFT): no credit yet */
	CHECK_EQ(rsk_recv(a, buf, th - 1, 0, -1), (ssize_t)th - 1);
	CHECK_EQ(rsk_send(b, data, 1, 0, 0), -EAGAIN);
	/* one more byte crosses it: credit for th bytes */
	CHECK_EQ(rsk_recv(a, buf, 1, 0, -1), 1);
	r = rsk_send(b, data, sizeof(data), 0, 0);
	CHECK_EQ(r, (ssize_t)th);
	rsk_free(a);
	rsk_free(b);
}

/* Messages sized around the credit-return threshold never stall. */
static void t_threshold_sizes(void)
{
	uint32_t ring = 1 << 16;
	struct rsk_opts o = opts(ring, 16);
	static uint8_t data[1 << 16], buf[1 << 16];
	size_t th = ring >> CREDIT_BYTES_SHIFT;
	size_t sizes[] = { th - 1, th, th + 1, ring / 2 - 1, ring / 2, ring / 2 + 1,
			   ring - 1, ring };
	rsk_sock *a, *b;
	size_t k;
	int round;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	for (round = 0; round < 20; round++)
		for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
			size_t n = sizes[k], got = 0;
			ssize_t r;

			memset(data, round + (int)k, n);
			/* sender may only get part in: the rest after reads */
			r = rsk_send(b, data, n, 0, 0);
			CHECK(r > 0);
			while (got < n) {
				ssize_t q = rsk_recv(a, buf + got, n - got, 0, 2000);

				CHECK(q > 0);
				got += (size_t)q;
				if ((size_t)r < n) {
					ssize_t more = rsk_send(b, data + r, n - (size_t)r, 0, 0);

					if (more > 0)
						r += more;
					else
						CHECK_EQ(more, -EAGAIN);
				}
			}
			CHECK_EQ(r, n);
			CHECK_EQ(buf[0], (uint8_t)(round + (int)k));
			CHECK_EQ(buf[n - 1], (uint8_t)(round + (int)k));
		}
	rsk_free(a);
	rsk_free(b);
}

/* Messages stop at the reserve (data goes on as plain writes); the
 * reserve still carries a credit update and the FIN. */
static void t_ctrl_reserve(void)
{
	struct rsk_opts o = opts(1 << 16, 16);
	static char big[40000], buf[40000];
	rsk_sock *a, *b;
	uint64_t ctrl0;
	char c = 'x';
	int i;
	ssize_t r;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(b, big, sizeof(big), 0, 0), sizeof(big));
	for (i = 0; i < 16 - CREDIT_RESERVE; i++)
		CHECK_EQ(rsk_send(a, &c, 1, 0, 0), 1);
	/* a plain write: no message credit taken */
	CHECK_EQ(rsk_send(a, &c, 1, 0, 0), 1);
	CHECK_EQ(a->p.s_limit - a->p.s_msgs, CREDIT_RESERVE);
	/* consuming more than half of a's ring makes a credit due: it
	 * goes out on the reserve although data may not */
	ctrl0 = a->st.tx_ctrl;
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 2000), sizeof(buf));
	CHECK_EQ(a->st.tx_ctrl, ctrl0 + 1);
	CHECK_EQ(a->p.s_limit - a->p.s_msgs, 1);
	/* and the last slot carries the FIN */
	CHECK_EQ(rsk_shutdown(a, RSK_SHUT_WR), 0);
	CHECK_EQ(a->p.s_limit - a->p.s_msgs, 0);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), RSK_F_WAITALL, 2000),
		 16 - CREDIT_RESERVE + 1);
	r = rsk_recv(b, buf, sizeof(buf), 0, 2000);
	CHECK_EQ(r, 0);
	CHECK(b->p.s_acked >= sizeof(big) - 16);
	rsk_free(a);
	rsk_free(b);
}

static void t_eof_and_shutdown(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char buf[16];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(b, "abc", 3, 0, -1), 3);
	CHECK_EQ(rsk_wait(a, RSK_POLLIN, 2000) & RSK_POLLRDHUP, 0);
	CHECK_EQ(rsk_shutdown(b, RSK_SHUT_WR), 0);
	CHECK_EQ(rsk_send(b, "x", 1, 0, -1), -EPIPE);
	/* the FIN polls as TCP's: POLLRDHUP with the data still unread, no
	 * POLLHUP while our side still sends */
	CHECK_EQ(rsk_poll(a) & (RSK_POLLIN | RSK_POLLRDHUP | RSK_POLLHUP),
		 RSK_POLLIN | RSK_POLLRDHUP);
	CHECK_EQ(rsk_poll(b) & (RSK_POLLRDHUP | RSK_POLLHUP), 0);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 3);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 0);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 0);
	/* half-close: a can still talk to b */
	CHECK_EQ(rsk_send(a, "back", 4, 0, -1), 4);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, -1), 4);
	rsk_close(a);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 2000), 0);
	rsk_free(a);
	rsk_free(b);
}

/* Sends a byte every 5 ms until a send fails (up to 1 s): its error. */
static int send_until_fails(rsk_sock *s)
{
	int i, rc = 0;

	for (i = 0; i < 200; i++) {
		rc = (int)rsk_send(s, "x", 1, 0, 0);
		if (rc < 0)
			break;
		usleep(5000);
	}
	return rc;
}

/* A reset after the peer's FIN (its close with our data unread, after its
 * shutdown): reads keep their EOF and sends fail with EPIPE, as Linux TCP
 * takes an RST in CLOSE_WAIT. */
static void t_reset_after_fin(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char buf[16];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(b, "abc", 3, 0, -1), 3);
	CHECK_EQ(rsk_shutdown(a, RSK_SHUT_WR), 0);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 3);
	CHECK_EQ(rsk_send(b, "unread", 6, 0, -1), 6);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 2000), 0); /* the FIN */
	rsk_close(a); /* with "unread" unread: a reset */
	CHECK_EQ(send_until_fails(b), -EPIPE);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 0);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 0);
	CHECK_EQ(rsk_send(b, "x", 1, 0, 0), -EPIPE);
	rsk_free(a);
	rsk_free(b);
}

/* Plain writes, then a reset (the peer's close with our data unread) before
 * we looked: the bytes written before the reset are read first, then
 * ECONNRESET, then EOF, as Linux TCP reads what arrived before an RST.
 * (The reset used to end the connection before the plain writes were taken
 * in: CPython's test_pha_required_nocert read ECONNRESET instead of the
 * server's TLS alert, sometimes.) */
static void t_plain_writes_then_reset(void)
{
	struct rsk_opts o = opts(1 << 16, 16);
	rsk_sock *a, *b;
	char buf[512];
	int i;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(a, "unread", 6, 0, -1), 6);
	send_one_by_one(b, 0, 300);
	CHECK(b->p.s_tail > b->p.s_announced); /* plain bytes at the end */
	rsk_close(b); /* with "unread" unread: a reset */
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 2000), 300);
	for (i = 0; i < 300; i++)
		CHECK_EQ(buf[i], (char)i);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 2000), -ECONNRESET);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 2000), 0);
	rsk_free(a);
	rsk_free(b);
}

/* Our shutdown(SHUT_RD): what the peer sends before or after is still
 * read, then EOF; after shutdown(SHUT_RDWR), data that arrives is answered
 * with a reset (the peer's sends fail with EPIPE, ours read ECONNRESET) and
 * dropped, while what had arrived before stays readable: Linux TCP's. */
static void t_data_after_shutdown_rd(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char buf[16];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(b, "early", 5, 0, -1), 5);
	CHECK_EQ(rsk_shutdown(a, RSK_SHUT_RD), 0);
	CHECK_EQ(rsk_send(b, "late", 4, 0, -1), 4);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 5);
	CHECK(!memcmp(buf, "early", 5));
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 4);
	CHECK(!memcmp(buf, "late", 4));
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, -1), 0);
	rsk_free(a);
	rsk_free(b);

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(b, "kept", 4, 0, -1), 4);
	CHECK_EQ(rsk_shutdown(a, RSK_SHUT_RDWR), 0);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 2000), 0); /* a's FIN */
	CHECK_EQ(rsk_send(b, "dropped", 7, 0, -1), 7);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 0), 4); /* from before */
	CHECK(!memcmp(buf, "kept", 4));
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 0), -ECONNRESET);
	CHECK_EQ(send_until_fails(b), -EPIPE);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 0);
	rsk_free(a);
	rsk_free(b);
}

/* rsk_abort (close() with SO_LINGER {1, 0}): the peer reads what had
 * arrived, then ECONNRESET with the detail; its sends fail after. */
static void t_abort(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char buf[16];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_send(a, "last", 4, 0, -1), 4);
	CHECK_EQ(rsk_abort(a), 0);
	CHECK_EQ(rsk_abort(a), 0); /* (once is enough) */
	rsk_close(a);
	CHECK_EQ(rsk_abort(a), -EBADF);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 2000), 4);
	CHECK_EQ(memcmp(buf, "last", 4), 0);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 2000), -ECONNRESET);
	CHECK(strstr(rsk_detail(b), "aborted"));
	/* a reset polls as TCP's: error, hang-up, read side shut */
	CHECK_EQ(rsk_poll(b) & (RSK_POLLERR | RSK_POLLHUP | RSK_POLLRDHUP),
		 RSK_POLLERR | RSK_POLLHUP | RSK_POLLRDHUP);
	CHECK_EQ(rsk_send(b, "x", 1, 0, 0), -EPIPE);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 0);
	rsk_free(a);
	rsk_free(b);
}

/* RSK_F_PARTIAL: a timed send returns what fit once the ring is full (a
 * kernel socket's send() with a timeout); without it, it waits out the
 * timeout for room for the rest (sendall). */
static void t_send_partial(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	static char big[1 << 18];
	rsk_sock *a, *b;
	int64_t t0;
	ssize_t n;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	t0 = eng_now_ns();
	n = rsk_send(a, big, sizeof(big), RSK_F_PARTIAL, 2000);
	CHECK(n > 0 && n < (ssize_t)sizeof(big));
	CHECK(eng_now_ns() - t0 < 1000000000LL); /* not the 2 s timeout */
	t0 = eng_now_ns();
	CHECK_EQ(rsk_send(a, big, sizeof(big), RSK_F_PARTIAL, 100), -ETIMEDOUT);
	CHECK(eng_now_ns() - t0 >= 90000000LL);
	rsk_free(a);
	rsk_free(b);
}

/* A blocked receiver learns of close() from another thread. */
static void *closer(void *p)
{
	usleep(50000);
	rsk_close(p);
	return NULL;
}

static void t_close_wakes_blocked(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	pthread_t t;
	char buf[8];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	pthread_create(&t, NULL, closer, a);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 5000), -EBADF);
	pthread_join(t, NULL);
	/* the peer sees an orderly EOF */
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 2000), 0);
	rsk_free(a);
	rsk_free(b);
}

/* The peer's side of the "HCA": write raw messages into a's ring. */
static int raw_post(rsk_sock *b, uint32_t imm, const void *p, size_t len,
		    uint64_t roff)
{
	struct iovec iov = { .iov_base = (void *)p, .iov_len = len };
	int rc = b->p.ops->post_write_imm(b->p.qp, &iov, 1, roff, imm, 0, 0);

	b->p.s_msgs++;
	return rc;
}

static void violation(uint32_t imm, const void *p, size_t len, uint64_t roff,
		      const char *expect)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char buf[64];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(raw_post(b, imm, p, len, roff), 0);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 2000), -ECONNRESET);
	CHECK(strstr(rsk_detail(a), expect) != NULL);
	/* reported once, as TCP reports a reset: then EOF and EPIPE */
	CHECK_EQ(rsk_take_error(a), 0);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 0), 0);
	CHECK_EQ(rsk_send(a, "x", 1, 0, 0), -EPIPE);
	/* the violator is told (RESET) */
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 2000), -ECONNRESET);
	rsk_free(a);
	rsk_free(b);
}

static void t_violations(void)
{
	struct eng_ctrl m = { 0 };
	char d[16] = { 0 };
	uint64_t ring_off = prov_ctrl_len(32);

	/* imm length disagrees with the bytes written */
	violation(IMM(OP_DATA, 100), d, 10, ring_off,
		  "data message of 10 bytes (imm 100)");
	/* the plain writes' announcement carries no bytes of its own */
	violation(IMM(OP_WRITTEN, 10), d, 10, ring_off, "written message of 10");
	/* ... nor more than the ring holds */
	violation(IMM(OP_WRITTEN, (1 << 16) + 1), d, 0, 0,
		  "written message of 65537 bytes does not fit");
	/* zero-length data */
	violation(IMM(OP_DATA, 0), d, 0, ring_off, "does not fit");
	/* unknown opcode */
	violation(IMM(7, 0), &m, sizeof(m), 0, "opcode 7");
	/* ctrl slot disagrees with imm */
	m.op = OP_FIN;
	violation(IMM(OP_CREDIT, 0), &m, sizeof(m), 0, "ctrl slot op");
	/* credit for bytes never sent */
	m.op = OP_CREDIT;
	m.consumed = 12345;
	violation(IMM(OP_CREDIT, 0), &m, sizeof(m), 0, "credit for 12345");
	/* message limit beyond the queue */
	m.consumed = 0;
	m.limit = 100000;
	violation(IMM(OP_CREDIT, 0), &m, sizeof(m), 0, "message limit");
}

/* A hostile peer: random opcodes, lengths, offsets and ctrl records.  The
 * victim either goes on working or fails with ECONNRESET; the sanitizers
 * catch any access outside its rings. */
static void t_random_hostile_peer(void)
{
	uint32_t x = 12345;
	int round, resets = 0;

	for (round = 0; round < 300; round++) {
		struct rsk_opts o = opts(1 << 14, 16);
		uint8_t junk[1024], buf[1 << 15];
		size_t area = prov_area_len(16, 1 << 14);
		rsk_sock *a, *b;
		int k, rc = 0;

		CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
		for (k = 0; k < 12 && rc == 0; k++) {
			struct eng_ctrl m;
			uint32_t op, len, imm;
			uint64_t roff;
			size_t i;

			for (i = 0; i < sizeof(junk); i++) {
				x = x * 1103515245 + 12345;
				junk[i] = (uint8_t)(x >> 16);
			}
			x = x * 1103515245 + 12345;
			op = (x >> 8) % 8;
			x = x * 1103515245 + 12345;
			len = (x >> 8) % 3 == 0 ? (x >> 12) % 1024 : (op ? 16 : 64);
			x = x * 1103515245 + 12345;
			imm = (x >> 8) % 4 == 0 ? x : IMM(op, op ? 0 : len);
			roff = op ? (uint64_t)(b->p.s_msgs % 16) * 16
				  : prov_ctrl_len(16) + (b->p.s_tail & ((1 << 14) - 1));
			if ((x >> 20) % 5 == 0)
				roff = (x >> 3) % area;
			if (op && (x >> 24) % 2) {
				/* a plausible ctrl record with random credits */
				memcpy(&m, junk, sizeof(m));
				m.op = op;
				memcpy(junk, &m, sizeof(m));
			}
			if (roff + len > area)
				len = (uint32_t)(area - roff);
			rc = raw_post(b, imm, junk, len, roff);
			if (op == 0 && rc == 0)
				b->p.s_tail += len;
		}
		for (k = 0; k < 4; k++) {
			ssize_t r = rsk_recv(a, buf, sizeof(buf), 0, 0);

			if (r == -ECONNRESET) {
				resets++;
				CHECK(rsk_detail(a)[0] != 0);
				break;
			}
			CHECK(r >= 0 || r == -EAGAIN);
			r = rsk_send(a, buf, 100, 0, 0);
			CHECK(r >= 0 || r == -EAGAIN || r == -ECONNRESET || r == -EPIPE);
			rsk_poll(a);
		}
		rsk_free(a);
		rsk_free(b);
	}
	/* most rounds break the protocol somewhere and get reset */
	CHECK(resets > 100);
}

static void t_remote_access_error(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char d[16] = { 0 };

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	/* outside the peer's area: the provider refuses, QP in error */
	CHECK_EQ(raw_post(b, IMM(OP_DATA, 16), d, 16,
			  prov_area_len(32, 1 << 16) - 8),
		 -EFAULT);
	CHECK_EQ(raw_post(b, IMM(OP_DATA, 16), d, 16, 0), -EFAULT);
	rsk_free(a);
	rsk_free(b);
}

static void t_watch_fd(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	struct pollfd pfd;
	rsk_sock *a, *b;
	char buf[8];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_set_watch(a, RSK_WATCH_FD), 0);
	pfd = (struct pollfd){ .fd = rsk_fileno(a), .events = POLLIN };
	CHECK_EQ(poll(&pfd, 1, 0), 0);
	/* the watcher thread makes it readable: no call of ours between */
	CHECK_EQ(rsk_send(b, "12345678", 8, 0, -1), 8);
	CHECK_EQ(poll(&pfd, 1, 1000), 1);
	CHECK_EQ(pfd.revents, POLLIN);
	/* level-triggered: still readable until drained */
	CHECK_EQ(rsk_recv(a, buf, 4, 0, -1), 4);
	CHECK_EQ(poll(&pfd, 1, 0), 1);
	CHECK_EQ(rsk_recv(a, buf, 4, 0, -1), 4);
	CHECK_EQ(poll(&pfd, 1, 0), 0);
	rsk_close(b);
	CHECK_EQ(poll(&pfd, 1, 1000), 1);
	CHECK_EQ(rsk_recv(a, buf, 4, 0, -1), 0);
	rsk_free(a);
	rsk_free(b);
}

/* fileno() polls writable exactly while a send would not block, and the
 * reader's consumption (credits coming back) makes it writable again
 * with no call on the writer's side. */
static void t_watch_fd_writable(void)
{
	struct rsk_opts o = opts(4096, 32);
	static char data[8192], buf[8192];
	struct pollfd pfd;
	rsk_sock *a, *b;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_set_watch(b, RSK_WATCH_FD), 0);
	pfd = (struct pollfd){ .fd = rsk_fileno(b), .events = POLLIN | POLLOUT };
	CHECK_EQ(poll(&pfd, 1, 0), 1);
	CHECK_EQ(pfd.revents, POLLOUT);
	/* the application cannot write into it: no bytes lost there */
	signal(SIGPIPE, SIG_IGN);
	CHECK_EQ(write(rsk_fileno(b), "x", 1), -1);
	CHECK_EQ(errno, EPIPE);
	CHECK_EQ(rsk_send(b, data, sizeof(data), 0, 0), 4096);
	CHECK_EQ(poll(&pfd, 1, 50), 0); /* ring full, nothing to read */
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 1000), 4096);
	CHECK_EQ(poll(&pfd, 1, 1000), 1);
	CHECK_EQ(pfd.revents, POLLOUT);
	CHECK(rsk_send(b, data, sizeof(data), 0, 0) > 0);
	/* the peer closes with our data unread, which resets the connection
	 * (as TCP sends an RST): readable, writable (the send fails), and
	 * POLLERR and POLLHUP, as a reset TCP socket polls */
	rsk_close(a);
	{
		/* these come from several syscalls: a poll may wake between */
		int i;

		for (i = 0; i < 100; i++) {
			pfd.revents = 0;
			CHECK_EQ(poll(&pfd, 1, 1000), 1);
			if (pfd.revents == (POLLIN | POLLOUT | POLLERR | POLLHUP))
				break;
			usleep(10000);
		}
		CHECK_EQ(pfd.revents, POLLIN | POLLOUT | POLLERR | POLLHUP);
	}
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), -ECONNRESET);
	CHECK_EQ(rsk_set_watch(b, 8), -EINVAL);
	rsk_free(a);
	rsk_free(b);
}

static int connected(int fd)
{
	struct sockaddr_un peer;
	socklen_t n = sizeof(peer);

	return getpeername(fd, (struct sockaddr *)&peer, &n) == 0;
}

/* A connection's fileno() asked for while nothing watches it exact is a
 * stand-in (an unconnected Unix stream socket); RSK_WATCH_FD makes it a socketpair's end on the
 * same number, carrying an epoll's registration of it over, unless the
 * caller says nobody polls it (RSK_WATCH_UNPOLLED: no search). */
static void t_watch_fd_stand_in(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	struct epoll_event ev = { .events = EPOLLIN }, got;
	struct pollfd pfd;
	rsk_sock *a, *b;
	int unpolled, fd, ep;
	char buf[8];

	for (unpolled = 0; unpolled < 2; unpolled++) {
		CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
		fd = rsk_fileno(a);
		CHECK(fd >= 0);
		CHECK(!connected(fd));
		CHECK_EQ(read(fd, buf, 0), 0); /* (as a socket's) */
		CHECK_EQ(write(fd, "x", 1), -1); /* no byte lost */
		pfd = (struct pollfd){ .fd = fd, .events = POLLIN | POLLOUT };
		CHECK_EQ(poll(&pfd, 1, 0), 1);
		CHECK_EQ(pfd.revents, POLLOUT | POLLHUP);
		ep = epoll_create1(EPOLL_CLOEXEC);
		CHECK(ep >= 0);
		CHECK_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), 0);
		CHECK_EQ(rsk_set_watch(a, RSK_WATCH_FD |
					      (unpolled ? RSK_WATCH_UNPOLLED : 0)),
			 0);
		CHECK_EQ(rsk_fileno(a), fd);
		CHECK(connected(fd));
		pfd = (struct pollfd){ .fd = fd, .events = POLLIN };
		CHECK_EQ(poll(&pfd, 1, 0), 0);
		CHECK_EQ(rsk_send(b, "12345678", 8, 0, -1), 8);
		CHECK_EQ(poll(&pfd, 1, 1000), 1);
		/* the registration went with the stand-in's file unless told
		 * nobody polls it (then there was none to carry: not looked for) */
		CHECK_EQ(epoll_wait(ep, &got, 1, 0), unpolled ? 0 : 1);
		CHECK_EQ(rsk_recv(a, buf, 8, 0, -1), 8);
		CHECK_EQ(poll(&pfd, 1, 0), 0);
		close(ep);
		rsk_close(b);
		rsk_free(a);
		rsk_free(b);
	}
}

/* RSK_WATCH_NOTIFY with interest in POLLOUT: the notify fd turns readable
 * when send space comes back (no thread: what an event loop watches). */
static void t_watch_write_interest(void)
{
	struct rsk_opts o = opts(4096, 32);
	static char data[8192], buf[8192];
	struct pollfd pfd;
	rsk_sock *a, *b;
	int nfd, lfd;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_set_watch(b, RSK_WATCH_NOTIFY), 0);
	CHECK_EQ(rsk_set_interest(b, RSK_POLLIN | RSK_POLLOUT), 0);
	CHECK_EQ(rsk_notify_fds(b, &nfd, &lfd), 0);
	pfd = (struct pollfd){ .fd = nfd, .events = POLLIN };
	CHECK_EQ(poll(&pfd, 1, 0), 1); /* writable */
	CHECK_EQ(rsk_send(b, data, sizeof(data), 0, 0), 4096);
	CHECK_EQ(poll(&pfd, 1, 0), 0); /* ring full, nothing to read */
	/* the reader consumes: credits come back and wake the fd (as an
	 * event loop does: the peer's bell shows on the liveness fd, and
	 * rsk_check_peer reads it and brings the notify fd up to date) */
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 1000), 4096);
	{
		struct pollfd two[2] = { { .fd = nfd, .events = POLLIN },
					 { .fd = lfd, .events = POLLIN } };

		CHECK(poll(two, 2, 1000) >= 1);
		if (two[1].revents) /* bell mode */
			CHECK_EQ(rsk_check_peer(b), 0);
	}
	CHECK_EQ(poll(&pfd, 1, 0), 1);
	CHECK(rsk_poll(b) & RSK_POLLOUT);
	CHECK_EQ(rsk_set_interest(b, 7), -EINVAL);
	rsk_free(a);
	rsk_free(b);
}

/* Polling mode (an event loop's RSOCK_LOOP_POLL_US): while b is polled, a
 * message into its ring costs the writer no notify and leaves b's notify
 * fd alone; rsk_spin_ready finds it.  Turning polling off makes the notify
 * fd exact at once (data waiting: readable) and arms again. */
static void t_polled_spin(void)
{
	struct rsk_opts o = opts(4096, 32);
	struct rsk_stats sa0, sa1, sb;
	struct pollfd two[2];
	rsk_sock *a, *b, *v[3];
	int nfd, lfd, ready[3], i;
	char buf[64];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(rsk_set_polled(a, 1), 0); /* (a's own mode: not b's) */
	CHECK_EQ(rsk_set_polled(a, 0), 0);
	CHECK_EQ(rsk_set_watch(b, RSK_WATCH_NOTIFY), 0);
	CHECK_EQ(rsk_set_interest(b, RSK_POLLIN), 0);
	CHECK_EQ(rsk_notify_fds(b, &nfd, &lfd), 0);
	two[0] = (struct pollfd){ .fd = nfd, .events = POLLIN };
	two[1] = (struct pollfd){ .fd = lfd, .events = POLLIN };
	CHECK_EQ(poll(two, 2, 0), 0); /* idle, armed */
	CHECK_EQ(rsk_set_polled(b, 1), 0);
	v[0] = NULL;
	v[1] = b;
	v[2] = a; /* nothing for a: interest POLLIN, empty ring */
	CHECK_EQ(rsk_spin_ready(v, 3, 1000, ready), 0); /* ~1 ms, nothing */
	CHECK_EQ(rsk_stats(a, &sa0), 0);
	for (i = 0; i < 50; i++) {
		CHECK_EQ(rsk_send(a, "ping", 4, 0, 0), 4);
		CHECK_EQ(rsk_spin_ready(v, 3, 1000000, ready), 1);
		CHECK_EQ(ready[0], 1);
		CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 4);
	}
	CHECK_EQ(rsk_stats(a, &sa1), 0);
	CHECK_EQ(sa1.notifies_sent - sa0.notifies_sent, 0); /* nobody was woken */
	CHECK_EQ(poll(two, 2, 0), 0);
	/* polling ends with a message waiting: the fd shows it */
	CHECK_EQ(rsk_send(a, "last", 4, 0, 0), 4);
	CHECK_EQ(poll(two, 2, 0), 0);
	CHECK_EQ(rsk_set_polled(b, 0), 0);
	CHECK_EQ(poll(&two[0], 1, 0), 1);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 4);
	CHECK(!memcmp(buf, "last", 4));
	/* and not polled, b is armed again: the next message notifies */
	CHECK_EQ(poll(&two[0], 1, 0), 0);
	CHECK_EQ(rsk_stats(b, &sb), 0);
	CHECK(sb.arms > 0);
	CHECK_EQ(rsk_send(a, "wake", 4, 0, 0), 4);
	CHECK_EQ(poll(two, 2, 1000) >= 1, 1);
	if (two[1].revents) /* bell mode */
		CHECK_EQ(rsk_check_peer(b), 0);
	CHECK_EQ(poll(&two[0], 1, 0), 1);
	/* the peer's close: ready (EOF), as the notify fd would show it */
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 4);
	CHECK_EQ(rsk_set_polled(b, 1), 0);
	CHECK_EQ(rsk_close(a), 0);
	CHECK_EQ(rsk_spin_ready(v + 1, 1, 1000000, ready), 1);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 0), 0);
	CHECK_EQ(rsk_spin_ready(v, 3, 0, ready), 1); /* a closed: skipped */
	CHECK_EQ(rsk_spin_ready(v, -1, 0, ready), -EINVAL);
	CHECK_EQ(rsk_set_polled(a, 1), -EBADF);
	rsk_free(a);
	rsk_free(b);
}

/* Accept-then-fork: the child claims the connection the parent did not
 * use after the fork, serves it, and the parent's close sends no FIN. */
static void t_fork_child_serves(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char buf[8];
	pid_t pid;
	int st;

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	pid = fork();
	if (pid == 0) {
		int ok = rsk_recv(a, buf, sizeof(buf), 0, 2000) == 3 &&
			 rsk_send(a, "pong", 4, 0, 0) == 4 &&
			 rsk_shutdown(a, RSK_SHUT_WR) == 0;

		_exit(ok ? 0 : 1);
	}
	CHECK(pid > 0);
	/* the parent: a was handed to the child; b is still the parent's */
	rsk_close(a);
	CHECK_EQ(rsk_send(b, "abc", 3, 0, -1), 3);
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), RSK_F_WAITALL, 1000), 4);
	CHECK(!memcmp(buf, "pong", 4));
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 1000), 0); /* the child's FIN */
	rsk_free(a);
	rsk_free(b);
}

/* The creator used the connection after the fork: the child may not. */
static void t_fork_creator_keeps(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	rsk_sock *a, *b;
	char buf[8];
	pid_t pid;
	int st, p[2];

	CHECK_EQ(make_pair(&o, &o, &a, &b), 0);
	CHECK_EQ(pipe(p), 0);
	pid = fork();
	if (pid == 0) {
		char go;
		int ok;

		ok = read(p[0], &go, 1) == 1;
		{
			ssize_t r = rsk_send(a, "x", 1, 0, 0);
			int pe = rsk_poll(a);

			if (r != -EBADF || !(pe & RSK_POLLERR))
				fprintf(stderr, "child: send %zd poll %d\n", r, pe);
			ok = ok && r == -EBADF && (pe & RSK_POLLERR);
		}
		rsk_free(a); /* no FIN from here */
		rsk_free(b);
		_exit(ok ? 0 : 1);
	}
	CHECK(pid > 0);
	CHECK_EQ(rsk_send(a, "abc", 3, 0, 0), 3); /* the creator uses it */
	CHECK_EQ(write(p[1], "g", 1), 1);
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK_EQ(rsk_recv(b, buf, sizeof(buf), 0, 1000), 3);
	CHECK_EQ(rsk_send(b, "de", 2, 0, -1), 2);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 1000), 2);
	close(p[0]);
	close(p[1]);
	rsk_free(a);
	rsk_free(b);
}

/* A peer whose process exits without closing (a crash, _exit): as TCP's
 * kernel closes a dead process's socket, the end is a FIN when it had
 * nothing of ours unread (its data, then EOF; a second send fails with
 * EPIPE), else a reset (its data first, then ECONNRESET). */
static void t_vanish(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	struct rsk_addr x = { .family = AF_INET, .port = 9 };
	struct rsk_addr src, dst;
	int unread;

	for (unread = 0; unread < 2; unread++) {
		rsk_sock *l, *a;
		char buf[16];
		pid_t pid;
		int st;

		CHECK_EQ(rsk_socket(&l), 0);
		CHECK_EQ(rsk_listen(l, "rsock-ctest/van", 15, 4), 0);
		pid = fork();
		if (pid == 0) {
			rsk_sock *c;
			int ok = !rsk_socket(&c) && !rsk_set_opts(c, &o) &&
				 !rsk_connect(c, "rsock-ctest/van", 15, &x,
					      &x, 2000) &&
				 rsk_send(c, "hello", 5, 0, 0) == 5;
			int64_t until = 0;

			/* our data arrived: read it, or leave it unread */
			while (ok && !(rsk_poll(c) & RSK_POLLIN) &&
			       until++ < 2000000)
				usleep(1);
			if (ok && !unread)
				ok = rsk_recv(c, buf, 3, RSK_F_WAITALL, 2000) ==
				     3;
			_exit(ok ? 0 : 1); /* no close */
		}
		CHECK(pid > 0);
		CHECK_EQ(rsk_accept(l, 2000, &a, &src, &dst), 0);
		CHECK_EQ(rsk_send(a, "abc", 3, 0, 0), 3);
		CHECK_EQ(waitpid(pid, &st, 0), pid);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		CHECK_EQ(rsk_recv(a, buf, sizeof(buf), RSK_F_WAITALL, 2000), 5);
		CHECK(!memcmp(buf, "hello", 5));
		if (unread) {
			CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 2000),
				 -ECONNRESET);
		} else {
			CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 2000), 0);
			CHECK_EQ(rsk_send(a, "late", 4, 0, 0), 4); /* dropped */
			CHECK_EQ(rsk_send(a, "late", 4, 0, 0), -EPIPE);
		}
		rsk_free(a);
		rsk_free(l);
	}
}

/* As with TCP, connect() completes from the listen queue: one thread can
 * connect, send, and only then accept. */
static void t_connect_before_accept(void)
{
	struct rsk_opts o = opts(1 << 16, 32);
	struct rsk_addr x = { .family = AF_INET, .port = 7 };
	struct rsk_addr src, dst;
	rsk_sock *l, *c, *a;
	char buf[16];

	CHECK_EQ(rsk_socket(&l), 0);
	CHECK_EQ(rsk_listen(l, "rsock-ctest/cba", 15, 4), 0);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_set_opts(c, &o), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/cba", 15, &x, &x, 1000), 0);
	CHECK_EQ(rsk_send(c, "early", 5, 0, 0), 5);
	CHECK(rsk_poll(l) & RSK_POLLIN);
	CHECK_EQ(rsk_accept(l, 1000, &a, &src, &dst), 0);
	CHECK_EQ(src.port, 7);
	CHECK_EQ(rsk_recv(a, buf, sizeof(buf), 0, 1000), 5);
	CHECK(!memcmp(buf, "early", 5));
	CHECK_EQ(rsk_send(a, "late", 4, 0, 0), 4);
	CHECK_EQ(rsk_recv(c, buf, sizeof(buf), 0, 1000), 4);
	rsk_free(a);
	rsk_free(c);
	rsk_free(l);
}

/* A client that speaks garbage is dropped; the listener serves the next. */
static void t_garbage_client(void)
{
	struct rsk_addr x = { .family = AF_INET };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	rsk_sock *l, *c, *a;
	int fd;

	CHECK_EQ(rsk_socket(&l), 0);
	CHECK_EQ(rsk_listen(l, "rsock-ctest/garbage", 19, 4), 0);
	memcpy(sa.sun_path + 1, "rsock-ctest/garbage", 19);
	fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	CHECK_EQ(connect(fd, (struct sockaddr *)&sa,
			 offsetof(struct sockaddr_un, sun_path) + 20), 0);
	CHECK_EQ(write(fd, "GET / HTTP/1.0\r\n\r\n", 18), 18);
	CHECK_EQ(rsk_accept(l, 200, &a, NULL, NULL), -ETIMEDOUT);
	close(fd);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/garbage", 19, &x, &x, 1000), 0);
	CHECK_EQ(rsk_accept(l, 1000, &a, NULL, NULL), 0);
	CHECK_EQ(rsk_send(c, "ok", 2, 0, 0), 2);
	rsk_free(a);
	rsk_free(c);
	rsk_free(l);
}

/* An external listening fd joins the listener: a connection there makes
 * the listener readable and rsk_accept say -EXDEV. */
static void t_listen_external_fd(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct pollfd pfd;
	rsk_sock *l, *a;
	int xl, c;

	memcpy(sa.sun_path + 1, "rsock-ctest/xfd", 15);
	xl = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK_EQ(bind(xl, (struct sockaddr *)&sa,
		      offsetof(struct sockaddr_un, sun_path) + 16), 0);
	CHECK_EQ(listen(xl, 4), 0);
	CHECK_EQ(rsk_socket(&l), 0);
	CHECK_EQ(rsk_listen_fd(l, xl), -EINVAL); /* not listening yet */
	CHECK_EQ(rsk_listen(l, "rsock-ctest/xfd-rsk", 19, 4), 0);
	CHECK_EQ(rsk_listen_fd(l, xl), 0);
	CHECK_EQ(rsk_listen_fd(l, xl), -EBUSY);
	CHECK_EQ(rsk_accept(l, 0, &a, NULL, NULL), -EAGAIN);
	pfd = (struct pollfd){ .fd = rsk_fileno(l), .events = POLLIN };
	CHECK_EQ(poll(&pfd, 1, 0), 0);
	c = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK_EQ(connect(c, (struct sockaddr *)&sa,
			 offsetof(struct sockaddr_un, sun_path) + 16), 0);
	CHECK_EQ(poll(&pfd, 1, 1000), 1);
	CHECK_EQ(rsk_accept(l, 1000, &a, NULL, NULL), -EXDEV);
	close(c);
	rsk_free(l);
	close(xl);
}

/* rsk_fileno_onto: a listener's pollable fd moves onto another number (what
 * was there is closed), keeps its flags and still shows a pending client. */
static void t_fileno_onto(void)
{
	struct rsk_addr x = { .family = AF_INET };
	struct pollfd pfd;
	rsk_sock *l, *c, *a;
	int old, fd, p[2];

	CHECK_EQ(rsk_socket(&l), 0);
	CHECK_EQ(rsk_fileno_onto(l, -1), -EBADF);
	CHECK_EQ(rsk_listen(l, "rsock-ctest/onto", 16, 4), 0);
	old = rsk_fileno(l);
	CHECK(old >= 0);
	CHECK_EQ(pipe(p), 0); /* p[0]: a number in use, to be replaced */
	fd = p[0];
	CHECK_EQ(rsk_fileno_onto(l, fd), fd);
	CHECK_EQ(rsk_fileno(l), fd);
	CHECK_EQ(fcntl(old, F_GETFD), -1); /* the old number is closed */
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
	CHECK_EQ(rsk_fileno_onto(l, fd), fd); /* already there */
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/onto", 16, &x, &x, 1000), 0);
	pfd = (struct pollfd){ .fd = fd, .events = POLLIN };
	CHECK_EQ(poll(&pfd, 1, 1000), 1);
	CHECK_EQ(rsk_accept(l, 1000, &a, NULL, NULL), 0);
	rsk_free(a);
	rsk_free(c);
	rsk_close(l);
	CHECK_EQ(rsk_fileno_onto(l, fd), -EBADF);
	rsk_free(l);
	CHECK_EQ(fcntl(fd, F_GETFD), -1); /* closed with the socket */
	close(p[1]);
}

/* fileno() made before listen() and added to two epolls (one with
 * edge-triggered events and its own data): listen() changes its file, and
 * both registrations are on the new one, events and data kept; one that
 * the program removed before stays removed. */
static void t_fileno_epoll_carried(void)
{
	struct rsk_addr x = { .family = AF_INET };
	struct epoll_event ev, got;
	rsk_sock *l, *c, *a;
	int fd, e1, e2, e3;

	CHECK_EQ(rsk_socket(&l), 0);
	fd = rsk_fileno(l);
	CHECK(fd >= 0);
	e1 = epoll_create1(EPOLL_CLOEXEC);
	e2 = epoll_create1(EPOLL_CLOEXEC);
	e3 = epoll_create1(EPOLL_CLOEXEC);
	CHECK(e1 >= 0 && e2 >= 0 && e3 >= 0);
	ev = (struct epoll_event){ .events = EPOLLIN, .data.fd = fd };
	CHECK_EQ(epoll_ctl(e1, EPOLL_CTL_ADD, fd, &ev), 0);
	ev = (struct epoll_event){ .events = EPOLLIN | EPOLLET,
				   .data.u64 = 0x1234567890abcdefULL };
	CHECK_EQ(epoll_ctl(e2, EPOLL_CTL_ADD, fd, &ev), 0);
	CHECK_EQ(epoll_ctl(e3, EPOLL_CTL_ADD, fd, &ev), 0);
	CHECK_EQ(epoll_ctl(e3, EPOLL_CTL_DEL, fd, NULL), 0);
	CHECK_EQ(rsk_listen(l, "rsock-ctest/carry", 17, 4), 0);
	CHECK_EQ(rsk_fileno(l), fd);
	CHECK_EQ(epoll_wait(e1, &got, 1, 0), 0); /* nothing pending yet */
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/carry", 17, &x, &x, 1000), 0);
	CHECK_EQ(epoll_wait(e1, &got, 1, 1000), 1);
	CHECK_EQ(got.data.fd, fd);
	CHECK_EQ(epoll_wait(e2, &got, 1, 1000), 1);
	CHECK(got.data.u64 == 0x1234567890abcdefULL);
	CHECK_EQ(epoll_wait(e2, &got, 1, 0), 0); /* edge-triggered: once */
	CHECK_EQ(epoll_wait(e3, &got, 1, 0), 0);
	CHECK_EQ(epoll_ctl(e3, EPOLL_CTL_ADD, fd, &ev), 0); /* not there */
	CHECK_EQ(rsk_accept(l, 1000, &a, NULL, NULL), 0);
	CHECK_EQ(epoll_wait(e1, &got, 1, 0), 0); /* level: the queue is empty */
	rsk_free(a);
	rsk_free(c);
	rsk_free(l);
	close(e1);
	close(e2);
	close(e3);
}

/* A rendezvous bound ahead of listen() refuses until someone listens; two
 * endpoints that adopt the same fd (as two processes that inherited it
 * would) serve one queue; any other kind of fd is refused; closing one
 * listener leaves the other serving. */
static void t_listen_shared(void)
{
	struct rsk_addr x = { .family = AF_INET };
	rsk_sock *l1, *l2, *c, *a, *b;
	int fd, fd2, p[2], fds[4];
	pthread_t t;

	fd = rsk_rendezvous_bind("rsock-ctest/shared", 18);
	CHECK(fd >= 0);
	CHECK_EQ(rsk_rendezvous_bind("rsock-ctest/shared", 18), -EADDRINUSE);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/shared", 18, &x, &x, 1000),
		 -ECONNREFUSED);
	rsk_free(c);
	fd2 = dup(fd);
	CHECK_EQ(rsk_socket(&l1), 0);
	CHECK_EQ(rsk_socket(&l2), 0);
	CHECK_EQ(pipe(p), 0);
	CHECK_EQ(rsk_listen_adopt(l1, p[0], 4, 1), -ENOTSOCK);
	close(p[0]);
	close(p[1]);
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
	CHECK_EQ(rsk_listen_adopt(l1, p[0], 4, 1), -EINVAL);
	close(p[0]);
	close(p[1]);
	CHECK_EQ(rsk_listen_fds(l1, fds, 4), -EINVAL); /* not listening */
	CHECK_EQ(rsk_listen_adopt(l1, fd, 4, 1), 0);
	CHECK_EQ(rsk_listen_adopt(l2, fd2, 4, 1), 0);
	CHECK_EQ(rsk_listen_fds(l1, fds, 4), 1);
	CHECK_EQ(fds[0], fd);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/shared", 18, &x, &x, 1000), 0);
	CHECK_EQ(rsk_accept(l2, 1000, &a, NULL, NULL), 0);
	CHECK_EQ(rsk_accept(l1, 0, &b, NULL, NULL), -EAGAIN);
	CHECK(b == NULL);
	rsk_free(a);
	rsk_free(c);
	rsk_free(l2);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/shared", 18, &x, &x, 1000), 0);
	CHECK_EQ(rsk_accept(l1, 1000, &a, NULL, NULL), 0);
	CHECK_EQ(rsk_send(c, "ok", 2, 0, 0), 2);
	rsk_free(a);
	rsk_free(c);
	/* close wakes an accept blocked on a shared listener (bounded wait,
	 * the listening fd is not shut down under the other holders) */
	pthread_create(&t, NULL, closer, l1);
	CHECK_EQ(rsk_accept(l1, 5000, &a, NULL, NULL), -EBADF);
	pthread_join(t, NULL);
	rsk_free(l1);
}

/* A thread that accepts one connection on a listener (JOINs that come
 * meanwhile are answered inside its accept). */
struct acceptor {
	rsk_sock *l;
	int rc;
	rsk_sock *a;
};

static void *acceptor_run(void *arg)
{
	struct acceptor *x = arg;

	x->rc = rsk_accept(x->l, 5000, &x->a, NULL, NULL);
	return NULL;
}

/* SO_REUSEPORT's JOIN: a listener that allows it hands its rendezvous
 * socket to a joiner through its accept (which goes on waiting); the joiner
 * adopts it and serves the same queue; one that does not allow it refuses
 * (EADDRINUSE), and a name nobody holds says -EAGAIN. */
static void t_reuseport_join(void)
{
	struct rsk_addr x = { .family = AF_INET };
	struct acceptor acc = { 0 };
	rsk_sock *l1, *l2, *c, *a;
	pthread_t t;
	int fd;

	CHECK_EQ(rsk_rendezvous_join("rsock-ctest/rp", 14, 100), -EAGAIN);
	CHECK_EQ(rsk_socket(&l1), 0);
	CHECK_EQ(rsk_listen(l1, "rsock-ctest/rp", 14, 4), 0);
	/* not allowed: its accept refuses the JOIN */
	acc.l = l1;
	pthread_create(&t, NULL, acceptor_run, &acc);
	CHECK_EQ(rsk_rendezvous_join("rsock-ctest/rp", 14, 2000), -EADDRINUSE);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/rp", 14, &x, &x, 1000), 0);
	pthread_join(t, NULL);
	CHECK_EQ(acc.rc, 0);
	rsk_free(acc.a);
	rsk_free(c);
	/* allowed: the accept hands the socket over and takes the client */
	CHECK_EQ(rsk_listen_reuseport(l1, 1), 0);
	acc.a = NULL;
	pthread_create(&t, NULL, acceptor_run, &acc);
	fd = rsk_rendezvous_join("rsock-ctest/rp", 14, 2000);
	CHECK(fd >= 0);
	CHECK_EQ(rsk_socket(&l2), 0);
	CHECK_EQ(rsk_listen_adopt(l2, fd, 4, 1), 0);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/rp", 14, &x, &x, 1000), 0);
	pthread_join(t, NULL);
	CHECK_EQ(acc.rc, 0);
	rsk_free(acc.a);
	rsk_free(c);
	/* both serve one queue; the first closing leaves the joiner serving */
	rsk_free(l1);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect(c, "rsock-ctest/rp", 14, &x, &x, 1000), 0);
	CHECK_EQ(rsk_accept(l2, 1000, &a, NULL, NULL), 0);
	rsk_free(a);
	rsk_free(c);
	rsk_free(l2);
}

static void t_refused(void)
{
	struct rsk_addr x = { .family = AF_INET };
	rsk_sock *s;

	CHECK_EQ(rsk_socket(&s), 0);
	CHECK_EQ(rsk_connect(s, "rsock-ctest/nobody", 18, &x, &x, 1000),
		 -ECONNREFUSED);
	rsk_free(s);
}

int main(void)
{
	RUN(t_echo);
	RUN(t_refused);
	RUN(t_connect_before_accept);
	RUN(t_vanish);
	RUN(t_garbage_client);
	RUN(t_listen_external_fd);
	RUN(t_fileno_onto);
	RUN(t_fileno_epoll_carried);
	RUN(t_reset_after_fin);
	RUN(t_data_after_shutdown_rd);
	RUN(t_abort);
	RUN(t_send_partial);
	RUN(t_listen_shared);
	RUN(t_reuseport_join);
	RUN(t_credit_exhaustion);
	RUN(t_plain_write_wakes);
	RUN(t_plain_writes_then_reset);
	RUN(t_space_threshold);
	RUN(t_threshold_sizes);
	RUN(t_ctrl_reserve);
	RUN(t_eof_and_shutdown);
	RUN(t_close_wakes_blocked);
	RUN(t_violations);
	RUN(t_remote_access_error);
	RUN(t_random_hostile_peer);
	RUN(t_watch_fd);
	RUN(t_watch_fd_writable);
	RUN(t_watch_fd_stand_in);
	RUN(t_watch_write_interest);
	RUN(t_polled_spin);
	RUN(t_fork_child_serves);
	RUN(t_fork_creator_keeps);
	RUN(t_stream_wrap_small_ring);
	RUN(t_stream_default);
	return th_summary();
}
