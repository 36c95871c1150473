// SPDX-License-Identifier: MIT
/*
 * proto_rsockets.c - librdmacm's rsockets stream protocol as a wire
 * personality of proto.c (PROTOCOL.md section 9), sans I/O as proto.h
 * says.
 *
 * Data goes where the peer's published SGEs say; the receiver publishes a
 * free half of its ring (an rs_sge RDMA-written into the sender's target
 * SGL, imm SGL | message limit) when its application has consumed one;
 * message credits count *consumed* data messages (16-bit sequence
 * numbers); control messages take no credit (RNR retry covers them).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "ring.h"

/* The area is the bare ring; the peer's first buffer is in our target
 * SGL's entry 0, and it has the first half of our ring. */
static int rs_init(struct proto *p, const struct proto_geom *g)
{
	p->rs_mq = calloc((size_t)p->lq + 1, sizeof(*p->rs_mq));
	if (!p->rs_mq)
		return -ENOMEM;
	p->lctrl = NULL;
	p->ring = g->area;
	p->rs_tsgl = g->rs_tsgl;
	p->rs_rbuf_addr = g->rs_rbuf_addr;
	p->rs_rbuf_key = g->rs_rbuf_key;
	p->rs_pub = p->rsize >> 1; /* the half the handshake gave */
	p->rs_sgl_addr = g->rs_sgl_addr;
	p->rs_sgl_key = g->rs_sgl_key;
	p->rs_sgl_len = g->rs_sgl_len;
	p->rs_rsge = 1 % g->rs_sgl_len;
	p->rs_sseq_comp = (uint16_t)g->peer_q;
	p->rs_rseq_comp = (uint16_t)(p->lq >> 1);
	return 0;
}

static int rs_post(struct proto *p, const struct iovec *iov, int iovcnt,
		   uint64_t raddr, uint32_t rkey, uint32_t imm)
{
	int flags = 0;
	uint64_t wr_id = 0;
	int rc;

	if (++p->s_unsignaled >= 16) {
		flags |= PROV_SIGNALED;
		wr_id = p->s_unsignaled;
		p->s_unsignaled = 0;
	}
	rc = p->ops->post_write_at(p->qp, iov, iovcnt, raddr, rkey, imm,
				   flags, wr_id);
	if (rc) {
		proto_fail(p, ECONNRESET, 0, "provider %s: post failed (%s)",
			   p->ops->name, strerror(-rc));
		return rc;
	}
	p->sq_out++;
	return 0;
}

static uint32_t rs_half(const struct proto *p)
{
	return p->rsize >> 1;
}

static int rs_credit_due(const struct proto *p)
{
	return p->r_head + p->rsize - p->rs_pub >= rs_half(p) ||
	       (int16_t)(p->rs_rseq_no - p->rs_rseq_comp) >= 0;
}

/* Publish a consumed half of the ring (or message credits only). */
static int rs_send_credits(struct proto *p)
{
	uint32_t limit = (uint32_t)(uint16_t)(p->rs_rseq_no + p->lq);
	int rc;

	p->rs_rseq_comp = (uint16_t)(p->rs_rseq_no + (p->lq >> 1));
	if (p->r_head + p->rsize - p->rs_pub >= rs_half(p)) {
		struct rs_sge sge = {
			.addr = p->rs_rbuf_addr + ring_off(p->rs_pub, p->rsize),
			.key = p->rs_rbuf_key,
			.length = rs_half(p),
		};
		struct iovec iov = { .iov_base = &sge, .iov_len = sizeof(sge) };

		rc = rs_post(p, &iov, 1,
			     p->rs_sgl_addr + (uint64_t)p->rs_rsge * sizeof(sge),
			     p->rs_sgl_key, IMM(RS_OP_SGL, limit));
		if (rc)
			return rc;
		p->rs_pub += rs_half(p);
		p->rs_rsge = (p->rs_rsge + 1) % p->rs_sgl_len;
	} else if ((rc = rs_post(p, NULL, 0, 0, 0, IMM(RS_OP_SGL, limit)))) {
		return rc;
	}
	p->r_credited = p->r_head;
	p->st->tx_ctrl++;
	return 0;
}

static int rs_post_ctrl(struct proto *p, enum eng_op op)
{
	if (op == OP_CREDIT)
		return rs_send_credits(p);
	p->st->tx_ctrl++;
	return rs_post(p, NULL, 0, 0, 0,
		       IMM(RS_OP_CTRL, op == OP_FIN ? RS_CTRL_SHUTDOWN :
						      RS_CTRL_DISCONNECT));
}

static void rs_on_recv(struct proto *p, const struct prov_wc *wc)
{
	uint32_t op = wc->imm >> IMM_OP_SHIFT, arg = wc->imm & IMM_ARG_MASK;
	int rc;

	/* receives are reposted at once; credits count consumed messages */
	rc = p->ops->post_recv(p->qp, wc->wr_id);
	if (rc) {
		proto_fail(p, ECONNRESET, 0, "provider %s: repost failed (%s)",
			   p->ops->name, strerror(-rc));
		return;
	}
	p->r_msgs++;
	switch (op) {
	case RS_OP_DATA:
		if (arg == 0 || arg != wc->byte_len ||
		    p->r_tail + arg > p->rs_pub ||
		    ring_off(p->r_tail, p->rsize) + (uint64_t)arg > p->rsize ||
		    p->rs_mq_n > p->lq) {
			proto_fail(p, ECONNRESET, 1,
				   "protocol violation (rsockets): data message "
				   "of %u bytes (imm %u) outside the published "
				   "buffer", wc->byte_len, arg);
			return;
		}
		if (p->flags & F_PEER_FIN) {
			proto_fail(p, ECONNRESET, 1,
				   "protocol violation: data after shutdown");
			return;
		}
		p->r_tail += arg;
		p->rs_mq[(p->rs_mq_head + p->rs_mq_n++) % (p->lq + 1)] =
			p->r_tail;
		p->st->rx_msgs++;
		p->st->rx_bytes += arg;
		return;
	case RS_OP_SGL:
		/* new message limit; a published SGE is already in place */
		p->rs_sseq_comp = (uint16_t)arg;
		p->st->rx_ctrl++;
		return;
	case RS_OP_CTRL:
		p->st->rx_ctrl++;
		if (arg == RS_CTRL_SHUTDOWN || arg == RS_CTRL_DISCONNECT)
			p->flags |= F_PEER_FIN;
		return;
	default:
		proto_fail(p, ECONNRESET, 1,
			   "protocol violation (rsockets): opcode %u", op);
	}
}

/* The application consumed up to r_head: count finished messages. */
static int rs_consumed(struct proto *p)
{
	while (p->rs_mq_n && p->rs_mq[p->rs_mq_head] <= p->r_head) {
		p->rs_mq_head = (p->rs_mq_head + 1) % (p->lq + 1);
		p->rs_mq_n--;
		p->rs_rseq_no++;
	}
	return rs_credit_due(p);
}

/* Control messages take no credit. */
static int rs_ctrl_room(const struct proto *p, uint32_t need)
{
	(void)p;
	(void)need;
	return 1;
}

/* What a data message may take now: 0 if no SGE or no credit. */
static uint32_t rs_send_room(const struct proto *p, int *credit_stall)
{
	const struct rs_sge *t = &p->rs_tsgl[p->rs_tsge];
	uint32_t len = __atomic_load_n(&t->length, __ATOMIC_ACQUIRE);

	*credit_stall = 0; /* counted as a space stall, as before */
	if (p->rs_sseq_no == p->rs_sseq_comp)
		return 0;
	return len > IMM_ARG_MASK ? IMM_ARG_MASK : len;
}

static int rs_post_data(struct proto *p, const void *buf, uint32_t n)
{
	struct rs_sge *t = &p->rs_tsgl[p->rs_tsge];
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = n };
	uint64_t addr = t->addr;
	uint32_t key = t->key;
	int rc;

	/* Take the space before posting: once the write is out, the peer may
	 * consume the rest of this SGE and publish its next one into this
	 * very entry (an RDMA write into rs_tsgl) before this thread runs
	 * again (rxe: on another CPU, at once); updating the entry after
	 * the post would then clobber the new SGE and misplace what follows
	 * (seen as a corrupted stream at an rsockets server). */
	t->addr += n;
	__atomic_store_n(&t->length, t->length - n, __ATOMIC_RELEASE);
	if (t->length == 0)
		p->rs_tsge = (p->rs_tsge + 1) % 2;
	rc = rs_post(p, &iov, 1, addr, key, IMM(RS_OP_DATA, n));
	if (rc)
		return rc;
	p->rs_sseq_no++;
	return 0;
}

const struct proto_pers proto_rsockets = {
	.name = "rsockets",
	.init = rs_init,
	.on_recv = rs_on_recv,
	.post_ctrl = rs_post_ctrl,
	.credit_due = rs_credit_due,
	.ctrl_room = rs_ctrl_room,
	.send_room = rs_send_room,
	.post_data = rs_post_data,
	.consumed = rs_consumed,
};
