/*
 * test_proto.c - the stream protocol (proto.h) driven with bytes: two
 * instances joined by memcpy (memqp.h), no fd, no thread, no clock.  Each
 * stream test runs with both wire personalities (rsock's own and
 * librdmacm's rsockets), so the rsockets personality is tested on every
 * `make check`, not only on rxe.
 */
#include <stdio.h>

#include "memqp.h"
#include "tharness.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static uint8_t stream_byte(uint64_t pos)
{
	return (uint8_t)((pos * 2654435761u) >> 13);
}

/* Send what fits of [*sent, total) in chunks of at most chunk bytes. */
static void send_some(struct prov_qp *a, uint64_t *sent, uint64_t total,
		      uint32_t chunk)
{
	static uint8_t buf[1 << 17];
	int credit_stall;

	while (*sent < total && !(a->p.flags & F_DEAD)) {
		uint32_t n = proto_send_room(&a->p, &credit_stall), i;

		if (n == 0)
			return;
		if (n > chunk)
			n = chunk;
		if (n > total - *sent)
			n = (uint32_t)(total - *sent);
		for (i = 0; i < n; i++)
			buf[i] = stream_byte(*sent + i);
		if (proto_send(&a->p, buf, n))
			return;
		*sent += n;
	}
}

/* Consume at most max bytes, checking each; returns the count, or -1 on
 * a wrong byte. */
static long recv_some(struct prov_qp *b, uint64_t *got, uint32_t max)
{
	const uint8_t *ptr;
	uint32_t n = mq_readable(b, &ptr), i;

	if (n > max)
		n = max;
	for (i = 0; i < n; i++)
		if (ptr[i] != stream_byte(*got + i))
			return -1;
	proto_consume(&b->p, n);
	*got += n;
	return n;
}

/* A stream of total bytes in random chunks through a small ring (many
 * wrap-arounds), each side running in a random order. */
static void stream(int rs, uint32_t ring, uint32_t qd, uint64_t total)
{
	struct prov_qp a, b;
	uint64_t sent = 0, got = 0;
	long steps = 0;

	CHECK_EQ(mq_pair(&a, &b, ring, qd, 64, rs), 0);
	while (got < total && steps++ < 10000000) {
		switch (rng() % 4) {
		case 0:
			send_some(&a, &sent, total, 1 + (uint32_t)(rng() % ring));
			break;
		case 1:
			CHECK(recv_some(&b, &got, 1 + (uint32_t)(rng() % ring)) >= 0);
			break;
		case 2:
			mq_pump(&a);
			break;
		default:
			mq_pump(&b);
		}
		CHECK(!(a.p.flags & F_DEAD) && !(b.p.flags & F_DEAD));
		CHECK(b.p.r_tail - b.p.r_head <= ring);
		/* rsockets: the sender's window is the published SGEs */
		CHECK(rs || a.p.s_tail - a.p.s_acked <= ring);
		CHECK(!rs || a.p.rs_tsgl[0].length + a.p.rs_tsgl[1].length <= ring);
	}
	CHECK_EQ(got, total);
	CHECK_EQ(a.st.tx_bytes, total);
	CHECK_EQ(b.st.rx_bytes, total);
	CHECK(b.p.r_head / ring > 20); /* wrapped many times */
	/* an orderly end: FIN after the data, seen once all is read */
	proto_shutdown_wr(&a.p);
	mq_settle(&a, &b);
	CHECK(b.p.flags & F_PEER_FIN);
	CHECK(!(a.p.flags & F_DEAD) && !(b.p.flags & F_DEAD));
	CHECK(mq_canaries_ok(&a) && mq_canaries_ok(&b));
	mq_free(&a);
	mq_free(&b);
}

static void t_stream_rsock(void) { stream(0, 4096, 16, 3u << 20); }
static void t_stream_rsockets(void) { stream(1, 4096, 16, 3u << 20); }
static void t_stream_tiny_queue(void) { stream(0, 1024, 4, 1u << 20); }
static void t_stream_rsockets_tiny_queue(void) { stream(1, 1024, 4, 1u << 20); }

/* Without the receiver running, the sender stops at CREDIT_RESERVE
 * message credits (rsock) and control messages still go out. */
static void t_credits_and_reserve(void)
{
	struct prov_qp a, b;
	uint8_t byte = 1;
	int credit_stall, sent = 0;

	CHECK_EQ(mq_pair(&a, &b, 1 << 16, 16, 64, 0), 0);
	while (proto_send_room(&a.p, &credit_stall) > 0) {
		CHECK_EQ(proto_send(&a.p, &byte, 1), 0);
		sent++;
	}
	CHECK_EQ(sent, 16 - CREDIT_RESERVE);
	CHECK_EQ(credit_stall, 1);
	CHECK_EQ(proto_credits(&a.p), CREDIT_RESERVE);
	CHECK(!proto_writable(&a.p));
	/* the reserve carries a FIN though no data may go */
	proto_shutdown_wr(&a.p);
	CHECK_EQ(proto_credits(&a.p), CREDIT_RESERVE - 1);
	CHECK_EQ(a.p.pending & P_FIN, 0);
	mq_pump(&b);
	CHECK_EQ(b.p.r_tail - b.p.r_head, 16 - CREDIT_RESERVE);
	CHECK(b.p.flags & F_PEER_FIN);
	/* b reposted 15 receives: a credit update went back at once */
	CHECK(b.st.tx_ctrl >= 1);
	mq_pump(&a);
	CHECK(proto_credits(&a.p) > CREDIT_RESERVE);
	CHECK(mq_canaries_ok(&a) && mq_canaries_ok(&b));
	mq_free(&a);
	mq_free(&b);
}

/* A full ring stops the sender (a space stall); consuming half of it
 * returns byte credits. */
static void t_ring_space(void)
{
	struct prov_qp a, b;
	uint64_t sent = 0, got = 0;
	int credit_stall;

	CHECK_EQ(mq_pair(&a, &b, 4096, 64, 0, 0), 0);
	for (;;) {
		send_some(&a, &sent, 1 << 20, 512);
		if (!mq_pump(&b) && proto_send_room(&a.p, &credit_stall) == 0)
			break;
		mq_pump(&a);
	}
	CHECK_EQ(sent, 4096);
	CHECK_EQ(credit_stall, 0);
	CHECK_EQ(proto_send_room(&a.p, &credit_stall), 0);
	/* less than half consumed: no byte credit yet */
	CHECK_EQ(recv_some(&b, &got, 1000), 1000);
	mq_settle(&a, &b);
	CHECK_EQ(proto_send_room(&a.p, &credit_stall), 0);
	CHECK_EQ(recv_some(&b, &got, 1048), 1048);
	mq_settle(&a, &b);
	CHECK_EQ(proto_send_room(&a.p, &credit_stall), 2048);
	mq_free(&a);
	mq_free(&b);
}

/* close() with unread data is abortive: the peer sees a reset. */
static void close_unread(int rs)
{
	struct prov_qp a, b;
	uint64_t sent = 0;

	CHECK_EQ(mq_pair(&a, &b, 4096, 16, 64, rs), 0);
	send_some(&a, &sent, 100, 100);
	mq_pump(&b);
	proto_close(&b.p);
	CHECK(b.p.flags & F_DEAD);
	CHECK(strstr(b.detail, "closed with unread data"));
	mq_pump(&a);
	if (rs) {
		/* rsockets has no reset: a disconnect, seen as an end */
		CHECK(a.p.flags & F_PEER_FIN);
	} else {
		CHECK(a.p.flags & F_DEAD);
		CHECK_EQ(a.p.err, ECONNRESET);
		CHECK(strstr(a.detail, "the peer aborted"));
	}
	mq_free(&a);
	mq_free(&b);
}

static void t_close_unread_rsock(void) { close_unread(0); }
static void t_close_unread_rsockets(void) { close_unread(1); }

/* close() after everything was read: a FIN, no reset. */
static void t_close_orderly(void)
{
	struct prov_qp a, b;
	uint64_t sent = 0, got = 0;

	CHECK_EQ(mq_pair(&a, &b, 4096, 16, 64, 0), 0);
	send_some(&a, &sent, 100, 100);
	mq_pump(&b);
	CHECK_EQ(recv_some(&b, &got, 100), 100);
	proto_close(&b.p);
	CHECK(!(b.p.flags & F_DEAD));
	mq_pump(&a);
	CHECK(a.p.flags & F_PEER_FIN);
	CHECK(!(a.p.flags & F_DEAD));
	CHECK(proto_readable(&a.p));
	mq_free(&a);
	mq_free(&b);
}

/* ------------------------------------------------------ hostile peers */

/* The peer (b) writes raw: imm, length, and where. */
static void raw(struct prov_qp *b, const void *data, uint32_t len,
		uint64_t roff, uint32_t imm)
{
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };

	mq_post_write_imm(b, &iov, len ? 1 : 0, roff, imm, 0, 0);
	b->p.s_msgs++;
}

static void raw_ctrl(struct prov_qp *b, uint64_t consumed, uint32_t limit,
		     uint32_t slot_op, uint32_t imm_op)
{
	struct eng_ctrl m = { .consumed = consumed, .limit = limit,
			      .op = slot_op };

	raw(b, &m, sizeof(m), (uint64_t)(b->p.s_msgs % b->p.peer_q) * sizeof(m),
	    IMM(imm_op, 0));
}

/* a runs; it must end the connection with ECONNRESET and why. */
static int hostile_end(struct prov_qp *a, struct prov_qp *b, const char *why)
{
	int ok;

	mq_pump(a);
	ok = (a->p.flags & F_DEAD) && a->p.err == ECONNRESET &&
	     strstr(a->detail, why) && mq_canaries_ok(a) && mq_canaries_ok(b);
	if (!ok)
		fprintf(stderr, "  expected \"%s\", got flags %#x err %d: %s\n",
			why, a->p.flags, a->p.err, a->detail);
	return ok;
}

enum hostile {
	H_LEN_MISMATCH,
	H_OVERFLOW,
	H_BAD_OPCODE,
	H_WRITTEN_PAYLOAD,
	H_WRITTEN_OVERFLOW,
	H_CTRL_ARG,
	H_SLOT_OP,
	H_CREDIT_AHEAD,
	H_CREDIT_BACK,
	H_LIMIT_BACK,
	H_LIMIT_AHEAD,
	H_DATA_AFTER_FIN,
	H_OUT_OF_ORDER,
	H_COMPLETION_ERROR,
	H_REPOST_FAILS,
	H_RESET,
	H_END
};

static const char *hostile_why[H_END] = {
	[H_LEN_MISMATCH] = "protocol violation: data message of 10 bytes (imm 20)",
	[H_OVERFLOW] = "does not fit the ring",
	[H_BAD_OPCODE] = "protocol violation: opcode",
	[H_WRITTEN_PAYLOAD] = "protocol violation: written message of 10 bytes",
	[H_WRITTEN_OVERFLOW] = "written message of 4097 bytes does not fit",
	[H_CTRL_ARG] = "protocol violation: opcode",
	[H_SLOT_OP] = "ctrl slot op",
	[H_CREDIT_AHEAD] = "protocol violation: credit for",
	[H_CREDIT_BACK] = "protocol violation: credit for",
	[H_LIMIT_BACK] = "protocol violation: message limit",
	[H_LIMIT_AHEAD] = "protocol violation: message limit",
	[H_DATA_AFTER_FIN] = "data after FIN",
	[H_OUT_OF_ORDER] = "out of order",
	[H_COMPLETION_ERROR] = "completion error",
	[H_REPOST_FAILS] = "repost failed",
	[H_RESET] = "the peer aborted",
};

static void hostile(enum hostile h)
{
	struct prov_qp a, b;
	uint8_t junk[256];
	uint64_t sent = 0;
	uint32_t ring = 4096, ro = (uint32_t)prov_ctrl_len(16);

	memset(junk, 0x5a, sizeof(junk));
	CHECK_EQ(mq_pair(&a, &b, ring, 16, 64, 0), 0);
	/* a sends 100 bytes that b's protocol takes in (s_acked moves) */
	send_some(&a, &sent, 100, 100);
	mq_settle(&a, &b);
	switch (h) {
	case H_LEN_MISMATCH:
		raw(&b, junk, 10, ro, IMM(OP_DATA, 20));
		break;
	case H_OVERFLOW: { /* more than the ring holds: no credit for it */
		static uint8_t half[2048];

		raw(&b, half, 2048, ro, IMM(OP_DATA, 2048));
		raw(&b, half, 2048, ro + 2048, IMM(OP_DATA, 2048));
		raw(&b, junk, 1, ro, IMM(OP_DATA, 1));
		break;
	}
	case H_BAD_OPCODE:
		raw_ctrl(&b, 0, 0, 6, 6);
		break;
	case H_WRITTEN_PAYLOAD: /* (the bytes of plain writes come first) */
		raw(&b, junk, 10, ro, IMM(OP_WRITTEN, 10));
		break;
	case H_WRITTEN_OVERFLOW: /* more than the ring holds */
		raw(&b, NULL, 0, 0, IMM(OP_WRITTEN, 4097));
		break;
	case H_CTRL_ARG:
		raw(&b, junk, 16, 0, IMM(OP_CREDIT, 7));
		break;
	case H_SLOT_OP:
		raw_ctrl(&b, 0, 0, OP_FIN, OP_CREDIT);
		break;
	case H_CREDIT_AHEAD:
		raw_ctrl(&b, 101, a.p.s_limit, OP_CREDIT, OP_CREDIT);
		break;
	case H_CREDIT_BACK:
		raw_ctrl(&b, 100, a.p.s_limit, OP_CREDIT, OP_CREDIT);
		mq_pump(&a);
		CHECK(!(a.p.flags & F_DEAD));
		raw_ctrl(&b, 50, a.p.s_limit, OP_CREDIT, OP_CREDIT);
		break;
	case H_LIMIT_BACK:
		raw_ctrl(&b, a.p.s_acked, a.p.s_limit - 1, OP_CREDIT, OP_CREDIT);
		break;
	case H_LIMIT_AHEAD:
		raw_ctrl(&b, a.p.s_acked, a.p.s_msgs + 17, OP_CREDIT, OP_CREDIT);
		break;
	case H_DATA_AFTER_FIN:
		proto_shutdown_wr(&b.p);
		raw(&b, junk, 10, ro + ring_off(b.p.s_tail, ring), IMM(OP_DATA, 10));
		break;
	case H_OUT_OF_ORDER: {
		struct prov_wc wc = { .wr_id = PROV_WRID_RECV | 9, .is_recv = 1 };

		mq_push(&a, &wc);
		break;
	}
	case H_COMPLETION_ERROR: {
		struct prov_wc wc = { .status = -EIO, .is_recv = 1 };

		mq_push(&a, &wc);
		break;
	}
	case H_REPOST_FAILS:
		a.fail_recv = 1;
		send_some(&b, &sent, 200, 100);
		break;
	case H_RESET:
		proto_fail(&b.p, ECONNRESET, 1, "test");
		break;
	case H_END:
		break;
	}
	CHECK(hostile_end(&a, &b, hostile_why[h]));
	/* nothing more is taken in, and sends fail */
	CHECK(proto_writable(&a.p) && proto_readable(&a.p));
	mq_free(&a);
	mq_free(&b);
}

static void t_hostile_peer(void)
{
	int h;

	for (h = 0; h < H_END; h++) {
		int f = th_failed;

		hostile((enum hostile)h);
		if (th_failed != f)
			fprintf(stderr, "  (case %d)\n", h);
	}
}

/* rsockets: data outside the published SGE, unknown opcodes, data after a
 * shutdown. */
static void t_hostile_rsockets(void)
{
	int c;

	for (c = 0; c < 3; c++) {
		struct prov_qp a, b;
		uint8_t junk[64] = { 0 };
		struct iovec iov = { .iov_base = junk, .iov_len = sizeof(junk) };
		const char *why[] = { "outside the published buffer",
				      "rsockets): opcode", "data after shutdown" };

		CHECK_EQ(mq_pair(&a, &b, 4096, 16, 64, 1), 0);
		mq_settle(&a, &b);
		switch (c) {
		case 0: /* a length its SGE never published */
			mq_post_write_at(&b, &iov, 1, (uintptr_t)a.ring,
					 MQ_RING_KEY, IMM(RS_OP_DATA, 4000), 0, 0);
			break;
		case 1:
			mq_post_write_at(&b, NULL, 0, 0, 0, IMM(5, 0), 0, 0);
			break;
		default:
			mq_post_write_at(&b, NULL, 0, 0, 0,
					 IMM(RS_OP_CTRL, RS_CTRL_SHUTDOWN), 0, 0);
			mq_post_write_at(&b, &iov, 1, (uintptr_t)a.ring,
					 MQ_RING_KEY, IMM(RS_OP_DATA, 64), 0, 0);
		}
		CHECK(hostile_end(&a, &b, why[c]));
		mq_free(&a);
		mq_free(&b);
	}
}

/* A post the provider refuses ends the connection; the send says so. */
static void t_post_fails(void)
{
	struct prov_qp a, b;
	uint8_t byte = 0;

	CHECK_EQ(mq_pair(&a, &b, 4096, 16, 64, 0), 0);
	a.fail_post = 1;
	CHECK_EQ(proto_send(&a.p, &byte, 1), -EIO);
	CHECK(a.p.flags & F_DEAD);
	CHECK(strstr(a.detail, "post failed"));
	CHECK_EQ(a.st.tx_bytes, 0);
	mq_free(&a);
	mq_free(&b);
}

/* A QP that breaks under the peer (its writes went out of bounds) flushes
 * our receives: after a FIN that is the peer's end, without one a
 * reset. */
static void t_flush_after_fin(void)
{
	struct prov_qp a, b;
	struct prov_wc wc = { .status = -ESHUTDOWN, .is_recv = 1 };

	CHECK_EQ(mq_pair(&a, &b, 4096, 16, 64, 0), 0);
	proto_shutdown_wr(&b.p);
	mq_pump(&a);
	CHECK(a.p.flags & F_PEER_FIN);
	CHECK_EQ(proto_complete(&a.p, &wc, 0), 1);
	CHECK(a.p.flags & F_PEER_GONE);
	CHECK(!(a.p.flags & F_DEAD));
	mq_free(&a);
	mq_free(&b);

	CHECK_EQ(mq_pair(&a, &b, 4096, 16, 64, 0), 0);
	CHECK_EQ(proto_complete(&a.p, &wc, 1), 1);
	CHECK(a.p.flags & F_DEAD);
	CHECK(strstr(a.detail, "peer vanished"));
	mq_free(&a);
	mq_free(&b);
}

int main(void)
{
	RUN(t_stream_rsock);
	RUN(t_stream_rsockets);
	RUN(t_stream_tiny_queue);
	RUN(t_stream_rsockets_tiny_queue);
	RUN(t_credits_and_reserve);
	RUN(t_ring_space);
	RUN(t_close_unread_rsock);
	RUN(t_close_unread_rsockets);
	RUN(t_close_orderly);
	RUN(t_hostile_peer);
	RUN(t_hostile_rsockets);
	RUN(t_post_fails);
	RUN(t_flush_after_fin);
	return th_summary();
}
