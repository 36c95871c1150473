// SPDX-License-Identifier: MIT
/*
 * fuzz_engine.c - a hostile peer against the engine, in one process.
 *
 * Each input sets up a fresh connection over the shm provider (a listener
 * made once per process; connect, then accept) and is read as a sequence
 * of actions, interleaving
 *
 *   - what a hostile peer can do: write-with-imm of any imm, length and
 *     offset into the victim's area (through the peer's provider, which
 *     range-checks like an HCA), plausible DATA and control messages with
 *     fuzzed lengths, credits and sequence numbers, and plain stores
 *     anywhere in the victim's segment (the peer maps it read-write: ctrl
 *     slots, ring, CQ entries, cq_prod, even the owner's fields), or
 *     vanishing (its liveness socket shut down);
 *   - what a well-behaved peer does: rsk_send/rsk_recv/rsk_shutdown/close;
 *   - the victim's own API calls, all non-blocking: rsk_send, rsk_recv
 *     (peek/waitall), rsk_recv_zc + rsk_recv_done, rsk_poll, rsk_wait,
 *     rsk_shutdown, watch mode, rsk_check_peer, ...
 *
 * It checks, besides the sanitizers (ASan/UBSan: nothing outside the
 * engine's own memory is touched; the rings are mmap'ed, which ASan does
 * not track, so zero-copy pointers are bounds-checked here): every call
 * returns >= 0 or one of the errnos the API documents for it; a receive
 * never returns more than asked; the engine's counters keep their
 * invariants; and while the peer has only behaved, every byte either side
 * receives is the byte the other sent at that stream position.
 *
 * The harness includes prov_shm.c for its internals (the segment layout a
 * peer sees); it is linked with the other sources of native/src.
 */
#include "prov_shm.c"

#include <signal.h>
#include <sys/socket.h>

#include "engine.h"

#define FUZZ_NAME "fuzz_engine"
#include "fuzz_input.h"

#define MAX_STEPS 200
#define MAX_IO 20000

/* the byte at stream position pos of direction dir (0: peer -> victim) */
static uint8_t pat(uint64_t pos, int dir)
{
	return (uint8_t)((pos * 131u) ^ (pos >> 9) ^ (uint64_t)(dir * 0x5a));
}

static rsk_sock *listener;
static char lname[64];

static void setup_once(void)
{
	signal(SIGPIPE, SIG_IGN);
	unsetenv("RSOCK_FAULT"); /* the provider as it ships */
	snprintf(lname, sizeof(lname), "rsock-fuzz/engine/%d", (int)getpid());
	if (rsk_socket(&listener) || rsk_listen(listener, lname, strlen(lname), 64)) {
		fprintf(stderr, "fuzz_engine: cannot listen on %s\n", lname);
		abort();
	}
}

struct conn {
	rsk_sock *v; /* the victim */
	rsk_sock *p; /* the peer: its engine for good behaviour, its QP for bad */
	int p_closed;
	int clean;          /* the peer has only behaved so far */
	uint64_t v_sent;    /* victim -> peer stream positions */
	uint64_t p_got;
	uint64_t p_sent;    /* peer -> victim */
	uint64_t v_got;
};

static uint8_t iobuf[MAX_IO], cmpbuf[MAX_IO];

static void fill(uint8_t *b, size_t n, uint64_t pos, int dir)
{
	size_t i;

	for (i = 0; i < n; i++)
		b[i] = pat(pos + i, dir);
}

static void expect_stream(const struct conn *c, const uint8_t *b, size_t n,
			  uint64_t pos, int dir)
{
	size_t i;

	if (!c->clean)
		return;
	for (i = 0; i < n; i++)
		FUZZ_CHECK(b[i] == pat(pos + i, dir),
			   "dir %d: byte %llu is %u, sent %u", dir,
			   (unsigned long long)(pos + i), b[i], pat(pos + i, dir));
}

/* Invariants of a connected socket that the peer must not be able to
 * break. */
static void check_invariants(const rsk_sock *s)
{
	if (s->kind != K_CONN || s->released)
		return;
	FUZZ_CHECK(s->p.r_tail - s->p.r_head <= s->p.rsize, "rx %llu..%llu ring %u",
		   (unsigned long long)s->p.r_head, (unsigned long long)s->p.r_tail,
		   s->p.rsize);
	FUZZ_CHECK(s->p.s_tail - s->p.s_acked <= s->p.peer_rsize,
		   "tx %llu..%llu ring %u", (unsigned long long)s->p.s_acked,
		   (unsigned long long)s->p.s_tail, s->p.peer_rsize);
	FUZZ_CHECK(s->p.s_limit - s->p.s_msgs <= s->p.peer_q, "limit %u sent %u q %u",
		   s->p.s_limit, s->p.s_msgs, s->p.peer_q);
}

static int send_errno_ok(ssize_t r)
{
	return r >= 0 || r == -EAGAIN || r == -EPIPE || r == -ECONNRESET;
}

static int recv_errno_ok(ssize_t r)
{
	return r >= 0 || r == -EAGAIN || r == -ECONNRESET;
}

/* The peer's raw write-with-imm into the victim's area (through its QP,
 * which range-checks like an HCA: a bad offset puts it in error). */
static void peer_post(struct conn *c, uint32_t imm, const uint8_t *b,
		      size_t len, uint64_t roff)
{
	struct iovec iov = { .iov_base = (void *)b, .iov_len = len };
	int rc;

	if (c->p_closed || c->p->released)
		return;
	rc = c->p->p.ops->post_write_imm(c->p->p.qp, &iov, 1, roff, imm, 0, 0);
	FUZZ_CHECK(rc == 0 || rc == -EFAULT || rc == -EPROTO ||
			   rc == -ENOTCONN,
		   "post_write_imm: %d", rc);
	if (rc == 0)
		c->p->p.s_msgs++; /* the peer's engine counts what went out */
	c->clean = 0;
}

enum {
	A_RAW_POST,
	A_PEER_DATA,
	A_PEER_CTRL,
	A_STORE_AREA,
	A_STORE_SEG,
	A_FAKE_CQE,
	A_V_SEND,
	A_V_RECV,
	A_V_RECV_ZC,
	A_V_POLL,
	A_V_SHUTDOWN,
	A_V_MISC,
	A_P_SEND,
	A_P_RECV,
	A_P_SHUTDOWN,
	A_P_CLOSE,
	A_P_VANISH,
	A_P_LIVE,
	A_COUNT,
};

static void step(struct conn *c, struct input *in)
{
	rsk_sock *v = c->v, *p = c->p;
	struct prov_qp *vqp = v->released ? NULL : v->p.qp;
	uint8_t op = in_u8(in) % A_COUNT;
	uint8_t b[256];
	ssize_t r;
	int rc;

	switch (op) {
	case A_RAW_POST: { /* anything at all */
		uint32_t imm = in_u32(in);
		size_t len = in_u8(in);
		uint64_t area = prov_area_len(v->p.lq, v->p.rsize);
		uint64_t roff = in_u32(in) % (area + 64);

		in_bytes(in, b, len);
		peer_post(c, imm, b, len, roff);
		break;
	}
	case A_PEER_DATA: { /* DATA at (about) the peer's tail */
		uint32_t len = in_u16(in) % (v->p.rsize + 2);
		int32_t skew = (int8_t)in_u8(in);
		uint8_t mode = in_u8(in);
		uint32_t arg = mode & 1 ? len : len + (uint32_t)(int8_t)in_u8(in);
		uint32_t opc = mode & 4 ? in_u8(in) & 7u : (uint32_t)OP_DATA;
		uint64_t pos = p->p.s_tail + (uint64_t)(int64_t)(mode & 2 ? skew : 0);
		static uint8_t data[1 << 15];

		if (len > sizeof(data))
			len = sizeof(data);
		fill(data, len, c->p_sent, 0);
		peer_post(c, IMM(opc, arg), data, len,
			  p->p.peer_ring_off + ring_off(pos, p->p.peer_rsize));
		if (!(mode & 2) && !p->released)
			p->p.s_tail += len;
		break;
	}
	case A_PEER_CTRL: { /* a control record with fuzzed credits */
		uint8_t mode = in_u8(in);
		struct eng_ctrl m;
		uint32_t seq, imm;
		size_t len;

		/* (one read per statement: the input is read in this order) */
		m.consumed = mode & 1 ? in_u64(in) : p->p.r_head + (int8_t)in_u8(in);
		m.limit = mode & 2 ? in_u32(in) : p->p.r_reposted + (int8_t)in_u8(in);
		m.op = mode & 4 ? in_u32(in) : (uint32_t)1 + in_u8(in) % 4;
		seq = p->p.s_msgs + (mode & 8 ? (int8_t)in_u8(in) : 0);
		imm = mode & 16 ? in_u32(in) : IMM(m.op, 0);
		len = mode & 32 ? in_u8(in) % 17 : 16;
		peer_post(c, imm, (const uint8_t *)&m, len,
			  (uint64_t)(seq % p->p.peer_q) * sizeof(m));
		break;
	}
	case A_STORE_AREA: { /* plain stores into the victim's area */
		uint64_t area = prov_area_len(v->p.lq, v->p.rsize);
		uint64_t off = in_u32(in) % area;
		size_t n = in_u8(in) % 64 + 1;

		if (n > area - off)
			n = area - off;
		in_bytes(in, b, n);
		if (!vqp)
			break;
		memcpy(vqp->l.area + off, b, n);
		c->clean = 0;
		break;
	}
	case A_STORE_SEG: { /* header and CQ too: the peer maps it all */
		uint64_t off = in_u32(in) % (SHM_CQ_OFF + (uint64_t)v->p.lq * 8);
		size_t n = in_u8(in) % 16 + 1;

		in_bytes(in, b, n);
		if (!vqp)
			break;
		memcpy(vqp->l.base + off, b, n);
		c->clean = 0;
		break;
	}
	case A_FAKE_CQE: { /* a completion with no write behind it */
		uint32_t prod, imm, len, delta;

		imm = in_u32(in);
		len = in_u32(in);
		delta = (uint32_t)(int8_t)in_u8(in);
		if (!vqp)
			break;
		prod = __atomic_load_n(&vqp->l.hdr->cq_prod, __ATOMIC_RELAXED);
		vqp->l.cq[prod % vqp->l.qdepth] =
			(struct shm_cqe){ .imm = imm, .len = len };
		__atomic_store_n(&vqp->l.hdr->cq_prod, prod + delta,
				 __ATOMIC_RELEASE);
		c->clean = 0;
		break;
	}
	case A_V_SEND: {
		size_t n = in_u16(in) % MAX_IO;

		fill(iobuf, n, c->v_sent, 1);
		r = rsk_send(v, iobuf, n, in_u8(in) & RSK_F_DONTWAIT, 0);
		FUZZ_CHECK(send_errno_ok(r), "rsk_send: %zd", r);
		FUZZ_CHECK(r <= (ssize_t)n, "rsk_send: %zd > %zu", r, n);
		if (r > 0)
			c->v_sent += (uint64_t)r;
		break;
	}
	case A_V_RECV: {
		size_t n = in_u16(in) % MAX_IO + 1;
		int flags = (in_u8(in) & (RSK_F_PEEK | RSK_F_WAITALL)) |
			    RSK_F_DONTWAIT;

		r = rsk_recv(v, iobuf, n, flags, 0);
		FUZZ_CHECK(recv_errno_ok(r), "rsk_recv: %zd", r);
		FUZZ_CHECK(r <= (ssize_t)n, "rsk_recv: %zd > %zu", r, n);
		if (r > 0) {
			expect_stream(c, iobuf, (size_t)r, c->v_got, 0);
			if (!(flags & RSK_F_PEEK))
				c->v_got += (uint64_t)r;
		}
		break;
	}
	case A_V_RECV_ZC: {
		size_t n = in_u16(in) % MAX_IO;
		const void *ptr = NULL;
		size_t done;

		r = rsk_recv_zc(v, n, RSK_F_DONTWAIT, 0, &ptr);
		FUZZ_CHECK(recv_errno_ok(r), "rsk_recv_zc: %zd", r);
		FUZZ_CHECK(r <= (ssize_t)n, "rsk_recv_zc: %zd > %zu", r, n);
		if (r <= 0)
			break;
		FUZZ_CHECK(!v->released && (const uint8_t *)ptr >= v->p.ring &&
				   (const uint8_t *)ptr + r <= v->p.ring + v->p.rsize,
			   "zero-copy window %p+%zd outside the ring %p+%u", ptr,
			   r, (void *)v->p.ring, v->p.rsize);
		memcpy(cmpbuf, ptr, (size_t)r);
		expect_stream(c, cmpbuf, (size_t)r, c->v_got, 0);
		done = in_u16(in) % ((size_t)r + 2); /* may claim too much */
		rc = rsk_recv_done(v, done);
		FUZZ_CHECK(rc == 0 || (rc == -EINVAL && done > (size_t)r),
			   "rsk_recv_done(%zu of %zd): %d", done, r, rc);
		if (rc == 0)
			c->v_got += done;
		break;
	}
	case A_V_POLL:
		rc = rsk_poll(v);
		FUZZ_CHECK(rc >= 0 && !(rc & ~(RSK_POLLIN | RSK_POLLOUT |
					       RSK_POLLERR | RSK_POLLHUP |
					       RSK_POLLRDHUP)),
			   "rsk_poll: %d", rc);
		rc = rsk_wait(v, in_u8(in) & (RSK_POLLIN | RSK_POLLOUT), 0);
		FUZZ_CHECK(rc >= 0, "rsk_wait: %d", rc);
		break;
	case A_V_SHUTDOWN:
		rc = rsk_shutdown(v, in_u8(in) % 3);
		FUZZ_CHECK(rc == 0, "rsk_shutdown: %d", rc);
		break;
	case A_V_MISC: {
		struct rsk_stats st;
		int nfd, lfd;

		switch (in_u8(in) % 5) {
		case 0:
			rc = rsk_take_error(v);
			/* EPIPE: a reset after the peer's FIN, or data sent to
			 * a peer that shut down both ways (TCP's CLOSE_WAIT) */
			FUZZ_CHECK(rc == 0 || rc == ECONNRESET || rc == EPIPE,
				   "take_error %d", rc);
			break;
		case 1:
			FUZZ_CHECK(rsk_stats(v, &st) == 0, "rsk_stats");
			FUZZ_CHECK(rsk_detail(v) != NULL, "rsk_detail");
			break;
		case 2:
			FUZZ_CHECK(rsk_set_watch(v, in_u8(in) & 3) == 0, "watch");
			break;
		case 3:
			FUZZ_CHECK(rsk_set_interest(v, in_u8(in) & 5) == 0,
				   "interest");
			break;
		default:
			rc = rsk_check_peer(v);
			FUZZ_CHECK(rc == 0 || rc == 1, "rsk_check_peer: %d", rc);
			rc = rsk_notify_fds(v, &nfd, &lfd);
			FUZZ_CHECK(rc == 0, "rsk_notify_fds: %d", rc);
			break;
		}
		break;
	}
	case A_P_SEND: {
		size_t n = in_u16(in) % MAX_IO;

		if (c->p_closed)
			break;
		fill(iobuf, n, c->p_sent, 0);
		r = rsk_send(p, iobuf, n, RSK_F_DONTWAIT, 0);
		FUZZ_CHECK(send_errno_ok(r), "peer rsk_send: %zd", r);
		if (r > 0)
			c->p_sent += (uint64_t)r;
		break;
	}
	case A_P_RECV: {
		size_t n = in_u16(in) % MAX_IO + 1;

		if (c->p_closed)
			break;
		r = rsk_recv(p, iobuf, n, RSK_F_DONTWAIT, 0);
		FUZZ_CHECK(recv_errno_ok(r), "peer rsk_recv: %zd", r);
		if (r > 0) {
			expect_stream(c, iobuf, (size_t)r, c->p_got, 1);
			c->p_got += (uint64_t)r;
		}
		break;
	}
	case A_P_SHUTDOWN:
		if (!c->p_closed)
			FUZZ_CHECK(rsk_shutdown(p, in_u8(in) % 3) == 0, "peer shutdown");
		break;
	case A_P_CLOSE:
		if (!c->p_closed)
			rsk_close(p);
		c->p_closed = 1;
		break;
	case A_P_VANISH: /* the peer process is gone: liveness hang-up */
		if (!c->p_closed && !p->released && p->live_fd >= 0)
			shutdown(p->live_fd, SHUT_RDWR);
		c->clean = 0;
		break;
	case A_P_LIVE: { /* a record on the liveness channel: REJ, bell or junk */
		uint8_t mode = in_u8(in);
		size_t n = in_u8(in) % 96;
		uint32_t magic = 0x434b5352u; /* cm_local.c's REJ: 80 bytes */

		memset(b, 0, sizeof(b));
		in_bytes(in, b, n);
		if (mode & 1) {
			memcpy(b, &magic, 4);
			b[4] = CM_LOCAL_VERSION;
			b[5] = 3;
			n = 80;
		} else if (mode & 2) { /* a bell (rung while not armed) */
			b[0] = SHM_BELL;
			n = 1;
		}
		if (!c->p_closed && !p->released && p->live_fd >= 0)
			(void)send(p->live_fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		c->clean = 0;
		break;
	}
	}
	check_invariants(v); /* (the peer's state is ours to tamper with) */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int once;
	struct input in = { data, size };
	struct rsk_addr src = { .family = AF_INET, .port = 1 };
	struct rsk_addr dst = { .family = AF_INET, .port = 2 };
	struct rsk_opts o;
	struct conn c = { .clean = 1 };
	rsk_sock *cli, *srv;
	uint8_t g;
	int steps, rc;

	if (!once) {
		setup_once();
		once = 1;
	}
	/* geometry: small rings, so that wrap-around and credits matter */
	g = in_u8(&in);
	rsk_opts_default(&o);
	o.ring_size = 4096u << (g & 3);
	o.qdepth = 16u << ((g >> 2) & 1);
	o.inline_max = (g & 32) ? 0 : 256;
	o.spin_us = 0;
	FUZZ_CHECK(rsk_socket(&cli) == 0, "rsk_socket");
	FUZZ_CHECK(rsk_set_opts(cli, &o) == 0, "rsk_set_opts");
	rc = rsk_connect(cli, lname, strlen(lname), &src, &dst, 1000);
	FUZZ_CHECK(rc == 0, "rsk_connect: %d", rc);
	rc = rsk_accept(listener, 1000, &srv, NULL, NULL);
	FUZZ_CHECK(rc == 0, "rsk_accept: %d", rc);
	/* the victim: the accepting side (its half was made by the client)
	 * or the connecting one */
	c.v = (g & 16) ? cli : srv;
	c.p = (g & 16) ? srv : cli;
	for (steps = 0; steps < MAX_STEPS && in.n; steps++)
		step(&c, &in);
	if (getenv("FUZZ_VERBOSE")) /* for seed maintenance */
		fprintf(stderr,
			"fuzz_engine: %d steps, %s peer, victim got %llu sent %llu, "
			"flags %#x: %s\n",
			steps, c.clean ? "clean" : "hostile",
			(unsigned long long)c.v_got, (unsigned long long)c.v_sent,
			c.v->p.flags, rsk_detail(c.v));
	rsk_free(c.v);
	rsk_free(c.p);
	return 0;
}
