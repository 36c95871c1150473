// SPDX-License-Identifier: MIT
/*
 * fuzz_proto.c - a hostile peer against the stream protocol itself
 * (proto.h), with no provider, fd or thread: two instances joined by
 * memcpy (tests/memqp.h), the victim b and the peer a.
 *
 * The first bytes choose the wire personality (rsock's own or rsockets)
 * and the geometry; the rest is read as a sequence of actions:
 *
 *   - what a well-behaved peer does: a sends stream bytes, consumes what b
 *     sent, shuts down, closes;
 *   - what a hostile peer can do: write-with-imm of any imm, length and
 *     offset into b's area (memqp range-checks like an HCA), control
 *     messages with any credits, limit and opcodes, plain stores into b's
 *     ctrl slots and its target SGL (the peer may write there), writes by
 *     address for rsockets, forged completions (any wr_id, imm, length,
 *     status), and a provider that refuses posts or reposts;
 *   - b's own calls: send, consume, shutdown, close, run (its CQ).
 *
 * It checks, besides ASan/UBSan: nothing outside the registered memory is
 * written (canaries); b's counters keep their invariants whatever a does
 * (r_tail - r_head <= ring; rsock: s_tail - s_acked <= the peer's ring and
 * s_limit - s_msgs <= the peer's queue); a failure always says why; and
 * while a has only behaved, every byte b consumes is the byte a sent at
 * that stream position.
 */
#include <stdio.h>

#include "../tests/memqp.h"

#define FUZZ_NAME "fuzz_proto"
#include "fuzz_input.h"

#define MAX_STEPS 400

static uint8_t pat(uint64_t pos, int dir)
{
	return (uint8_t)((pos * 131u) ^ (pos >> 9) ^ (uint64_t)(dir * 0x5a));
}

struct run {
	struct prov_qp a, b;
	int rs;
	uint32_t ring;
	uint64_t a_sent, b_got; /* the stream a -> b */
	uint64_t b_sent, a_got; /* the stream b -> a */
	int a_hostile;          /* a did something a real peer would not */
};

static void do_send(struct prov_qp *q, uint64_t *sent, uint32_t want, int dir)
{
	static uint8_t buf[1 << 16];
	int credit_stall;
	uint32_t n, i;

	if (q->p.flags & (F_DEAD | F_WR_SHUT))
		return;
	n = proto_send_room(&q->p, &credit_stall);
	if (n > want)
		n = want;
	for (i = 0; i < n; i++)
		buf[i] = pat(*sent + i, dir);
	if (n && proto_send(&q->p, buf, n) == 0)
		*sent += n;
}

/* Consume up to want bytes; check them against the stream when check. */
static void do_consume(struct prov_qp *q, uint64_t *got, uint32_t want,
		       int dir, int check)
{
	const uint8_t *ptr;
	uint32_t n, i;

	if (q->p.flags & F_DEAD)
		return;
	n = mq_readable(q, &ptr);
	if (n > want)
		n = want;
	FUZZ_CHECK(ptr >= q->p.ring && ptr + n <= q->p.ring + q->p.rsize,
		   "readable run %u at %p outside the ring", n, (void *)ptr);
	for (i = 0; check && i < n; i++)
		FUZZ_CHECK(ptr[i] == pat(*got + i, dir),
			   "byte %llu: %u, sent %u",
			   (unsigned long long)(*got + i), ptr[i],
			   pat(*got + i, dir));
	proto_consume(&q->p, n);
	*got += n;
}

static void check_invariants(struct run *r)
{
	struct proto *p = &r->b.p;

	FUZZ_CHECK(mq_canaries_ok(&r->a) && mq_canaries_ok(&r->b),
		   "a write outside the registered memory");
	FUZZ_CHECK(p->r_tail - p->r_head <= p->rsize, "rx %llu..%llu ring %u",
		   (unsigned long long)p->r_head,
		   (unsigned long long)p->r_tail, p->rsize);
	if (!r->rs) {
		FUZZ_CHECK(p->s_tail - p->s_acked <= p->peer_rsize,
			   "tx %llu..%llu ring %u",
			   (unsigned long long)p->s_acked,
			   (unsigned long long)p->s_tail, p->peer_rsize);
		FUZZ_CHECK(p->s_limit - p->s_msgs <= p->peer_q,
			   "limit %u sent %u q %u", p->s_limit, p->s_msgs,
			   p->peer_q);
	}
	FUZZ_CHECK(!(p->flags & F_DEAD) || (p->err && p->detail[0]),
		   "dead without a reason (err %d)", p->err);
	FUZZ_CHECK(r->a_hostile || !(p->flags & F_DEAD) ||
			   strstr(p->detail, "peer aborted") ||
			   strstr(p->detail, "unread data") ||
			   strstr(p->detail, "post failed") ||
			   strstr(p->detail, "repost failed") ||
			   strstr(p->detail, "reset"),
		   "a well-behaved peer killed the connection: %s", p->detail);
}

/* a, hostile: one write-with-imm of anything into b's area. */
static void raw_write(struct run *r, struct input *in)
{
	static uint8_t data[1 << 14];
	uint32_t imm = in_u32(in), len = in_u16(in) % sizeof(data);
	uint64_t roff = in_u32(in) % (r->b.area_len + 64), i;
	struct iovec iov = { .iov_base = data, .iov_len = len };

	for (i = 0; i < len; i++)
		data[i] = in_u8(in);
	if (r->rs) {
		uint8_t k = in_u8(in);
		uint64_t base = k & 1 ? (uintptr_t)r->b.tsgl : (uintptr_t)r->b.ring;

		mq_post_write_at(&r->a, &iov, len ? 1 : 0, base + roff,
				 k & 2 ? MQ_SGL_KEY : MQ_RING_KEY, imm, 0, 0);
	} else {
		mq_post_write_imm(&r->a, &iov, len ? 1 : 0, roff, imm, 0, 0);
	}
	r->a.p.s_msgs++;
	r->a_hostile = 1;
}

/* a, hostile: a plausible control message with fuzzed fields. */
static void raw_ctrl(struct run *r, struct input *in)
{
	uint8_t mode = in_u8(in);
	struct eng_ctrl m;
	struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
	uint32_t op = in_u8(in) % 6, seq;

	m.consumed = mode & 1 ? in_u64(in) : r->a.p.r_head + (int8_t)in_u8(in);
	m.limit = mode & 2 ? in_u32(in) : r->a.p.r_reposted + (int8_t)in_u8(in);
	m.op = mode & 4 ? in_u8(in) % 6 : op;
	seq = r->a.p.s_msgs + (mode & 8 ? (int8_t)in_u8(in) : 0);
	if (r->rs) {
		mq_post_write_at(&r->a, NULL, 0, 0, 0, IMM(op + 2, in_u16(in)), 0, 0);
	} else {
		mq_post_write_imm(&r->a, &iov, 1,
				  (uint64_t)(seq % r->a.p.peer_q) * sizeof(m),
				  IMM(op, mode & 16 ? in_u8(in) : 0), 0, 0);
	}
	r->a.p.s_msgs++;
	r->a_hostile = 1;
}

/* a, hostile: a store into what it may write directly. */
static void raw_store(struct run *r, struct input *in)
{
	uint8_t *base = r->rs ? (uint8_t *)r->b.tsgl : r->b.area;
	size_t len = r->rs ? 2 * sizeof(struct rs_sge) : prov_ctrl_len(r->b.q);
	size_t off = in_u16(in) % len;

	base[off] = in_u8(in);
	r->a_hostile = 1;
}

/* A forged completion in b's CQ. */
static void forged(struct run *r, struct input *in)
{
	struct prov_wc wc;
	uint8_t st = in_u8(in);

	wc.wr_id = in_u8(in) & 1 ? in_u64(in)
				 : PROV_WRID_RECV | (r->b.p.r_msgs % r->b.q);
	wc.imm = in_u32(in);
	wc.byte_len = in_u16(in);
	wc.status = st < 200 ? 0 : st < 230 ? -EIO : -ESHUTDOWN;
	wc.is_recv = st & 1;
	mq_push(&r->b, &wc);
	r->a_hostile = 1;
}

static const uint32_t rings[4] = { 1024, 4096, 1 << 14, 1 << 16 };
static const uint32_t qds[4] = { 4, 8, 16, 64 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = { data, size };
	static struct run r;
	uint8_t g = in_u8(&in);
	int step;

	memset(&r, 0, sizeof(r));
	r.rs = g & 1;
	r.ring = rings[(g >> 1) & 3];
	if (mq_pair(&r.a, &r.b, r.ring, qds[(g >> 3) & 3], 64, r.rs))
		abort();
	for (step = 0; step < MAX_STEPS && in.n; step++) {
		uint8_t op = in_u8(&in);

		switch (op % 16) {
		case 0:
		case 1:
			do_send(&r.a, &r.a_sent, in_u16(&in), 0);
			break;
		case 2:
		case 3:
			do_consume(&r.b, &r.b_got, in_u16(&in), 0, !r.a_hostile);
			break;
		case 4:
			do_send(&r.b, &r.b_sent, in_u16(&in), 1);
			break;
		case 5:
			do_consume(&r.a, &r.a_got, in_u16(&in), 1, 0);
			break;
		case 6:
			mq_pump(&r.a);
			break;
		case 7:
		case 8:
			mq_pump(&r.b);
			break;
		case 9:
			raw_write(&r, &in);
			break;
		case 10:
			raw_ctrl(&r, &in);
			break;
		case 11:
			raw_store(&r, &in);
			break;
		case 12:
			forged(&r, &in);
			break;
		case 13:
			if (op & 0x10)
				proto_shutdown_wr(&r.a.p);
			else if (op & 0x20)
				proto_close(&r.a.p);
			else
				proto_shutdown_wr(&r.b.p);
			break;
		case 14:
			if (op & 0x10)
				r.b.fail_post = 1 + in_u8(&in) % 4;
			else
				r.b.fail_recv = 1 + in_u8(&in) % 4;
			r.a_hostile = 1; /* a provider failure, not the peer */
			break;
		default:
			proto_close(&r.b.p);
			break;
		}
		check_invariants(&r);
	}
	mq_settle(&r.a, &r.b);
	check_invariants(&r);
	mq_free(&r.a);
	mq_free(&r.b);
	return 0;
}
