// SPDX-License-Identifier: MIT
/*
 * proto.c - the rsock stream protocol, sans I/O (the rule: proto.h).
 *
 * Invariants (see native/PROTOCOL.md for the wire side):
 *   - ring bytes [r_head, r_tail) are data the peer wrote and the app has
 *     not consumed; the peer never writes there because it only learns of
 *     free space through our credits (consumed = r_head);
 *   - the sender may write at most peer_rsize - (s_tail - s_acked) bytes
 *     and send message seq k only while k < s_limit; data keeps
 *     CREDIT_RESERVE message credits back for control messages;
 *   - every value taken from the peer (imm, byte_len, ctrl slot) is checked
 *     before use; a violation kills the connection (ECONNRESET + detail)
 *     and nothing outside our rings is ever touched.
 *
 * This file holds what both personalities share (the entry points of
 * proto.h) and rsock's own personality; proto_rsockets.c holds librdmacm's.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "ring.h"

/* ------------------------------------------------------------ failure */

void proto_fail(struct proto *p, int err, int tell_peer, const char *fmt, ...)
{
	va_list ap;

	if (p->flags & F_DEAD)
		return;
	if (tell_peer && p->pers->ctrl_room(p, 0))
		(void)p->pers->post_ctrl(p, OP_RESET);
	if (p->ops->publish_consumed) /* should we vanish now: a reset */
		p->ops->publish_consumed(p->qp, UINT64_MAX);
	p->flags |= F_DEAD;
	p->err = err;
	p->so_error = err;
	va_start(ap, fmt);
	vsnprintf(p->detail, p->dlen, fmt, ap);
	va_end(ap);
	p->wake = 1;
}

/* ------------------------------------------------------ setup, teardown */

int proto_init(struct proto *p, const struct prov_ops *ops,
	       struct prov_qp *qp, const struct proto_geom *g,
	       struct rsk_stats *st, char *detail, size_t dlen)
{
	int rc;

	p->pers = g->pers;
	p->ops = ops;
	p->qp = qp;
	p->st = st;
	p->detail = detail;
	p->dlen = dlen;
	p->inline_max = g->inline_max;
	p->rsize = g->ring;
	p->lq = g->q;
	p->peer_rsize = g->peer_ring;
	p->peer_q = g->peer_q;
	if ((rc = p->pers->init(p, g)))
		return rc;
	p->r_reposted = p->lq;
	p->r_limit_sent = p->lq;
	p->s_limit = g->peer_q;
	p->flags = F_CONN;
	proto_flush(p);
	return 0;
}

void proto_free(struct proto *p)
{
	free(p->rs_mq);
	p->rs_mq = NULL;
}

/* ------------------------------------------------- shared entry points */

uint32_t proto_credits(const struct proto *p)
{
	return p->s_limit - p->s_msgs;
}

/* Send what control traffic is due and allowed by the credit reserve. */
void proto_flush(struct proto *p)
{
	if (p->flags & F_DEAD)
		return;
	if (p->pers->credit_due(p)) {
		if (p->pers->ctrl_room(p, 1) && !p->pers->post_ctrl(p, OP_CREDIT))
			p->pending &= ~P_CREDIT;
		else
			p->pending |= P_CREDIT;
	}
	if ((p->pending & P_RESET) && p->pers->ctrl_room(p, 0)) {
		p->pending &= ~(P_RESET | P_FIN);
		proto_fail(p, ECONNRESET, 1, "connection reset");
		return;
	}
	if ((p->pending & P_FIN) && p->pers->ctrl_room(p, 0) &&
	    !p->pers->post_ctrl(p, OP_FIN))
		p->pending &= ~P_FIN;
}

void proto_vanished(struct proto *p)
{
	uint64_t consumed;

	p->flags |= F_PEER_GONE;
	p->wake = 1;
	if (p->flags & (F_DEAD | F_PEER_FIN))
		return;
	if (p->ops->peer_consumed && !p->ops->peer_consumed(p->qp, &consumed) &&
	    consumed == p->s_tail) {
		/* nothing of ours was left unread: the end a FIN gives */
		p->flags |= F_PEER_FIN;
		return;
	}
	proto_fail(p, ECONNRESET, 0, "peer vanished without closing");
}

int proto_complete(struct proto *p, const struct prov_wc *wc, int hup)
{
	if (p->flags & F_DEAD)
		return 0;
	if (wc->status == -ESHUTDOWN && (p->flags & F_PEER_FIN)) {
		/* flushed after the peer's orderly close: it is gone, as a
		 * hang-up after FIN says */
		p->flags |= F_PEER_GONE;
		p->wake = 1;
		return 1;
	}
	if (wc->status == -ESHUTDOWN && hup) {
		/* the fence after a hang-up: everything the peer delivered
		 * came first, and there was no FIN */
		proto_vanished(p);
		return 1;
	}
	if (wc->status) {
		proto_fail(p, ECONNRESET, 0, "provider %s: completion error (%s)",
			   p->ops->name, strerror(-wc->status));
	} else if (wc->is_recv) {
		p->pers->on_recv(p, wc);
	} else {
		p->sq_out -= (uint32_t)wc->wr_id;
	}
	return 0;
}

uint32_t proto_send_room(const struct proto *p, int *credit_stall)
{
	uint32_t n = p->pers->send_room(p, credit_stall);

	return n > ENG_MAX_MSG ? ENG_MAX_MSG : n;
}

int proto_send(struct proto *p, const void *buf, uint32_t n)
{
	int rc = p->pers->post_data(p, buf, n);

	if (rc)
		return rc;
	p->s_tail += n;
	p->st->tx_msgs++;
	p->st->tx_bytes += n;
	return 0;
}

void proto_consume(struct proto *p, size_t n)
{
	p->r_head += n;
	if (p->ops->publish_consumed && !(p->flags & F_DEAD))
		/* (a failed end's all ones stay: data read after a reset) */
		p->ops->publish_consumed(p->qp, p->r_head);
	if (p->pers->consumed(p))
		proto_flush(p);
}

void proto_shutdown_wr(struct proto *p)
{
	if (p->flags & F_WR_SHUT)
		return;
	p->flags |= F_WR_SHUT;
	p->pending |= P_FIN;
	proto_flush(p);
	p->wake = 1; /* a sender blocked in another thread fails now */
}

void proto_close(struct proto *p)
{
	if (p->flags & F_DEAD)
		return;
	/* unread data makes close abortive, as with TCP */
	if (p->r_tail != p->r_head && p->pers->ctrl_room(p, 0)) {
		proto_fail(p, ECONNRESET, 1, "closed with unread data");
	} else if (!(p->flags & F_WR_SHUT) || (p->pending & P_FIN)) {
		p->flags |= F_WR_SHUT;
		p->pending |= P_FIN;
		proto_flush(p);
	}
}

int proto_readable(const struct proto *p)
{
	return p->r_tail != p->r_head ||
	       (p->flags & (F_PEER_FIN | F_PEER_GONE | F_DEAD | F_RD_SHUT));
}

int proto_writable(const struct proto *p)
{
	int credit_stall;

	if (p->flags & (F_DEAD | F_PEER_GONE | F_WR_SHUT))
		return 1; /* a send would not block: it fails */
	return p->pers->send_room(p, &credit_stall) > 0;
}

/* ------------------------------------------- rsock's own personality */

/* Our area: a ctrl slot per receive, then the ring; the peer's alike. */
static int rk_init(struct proto *p, const struct proto_geom *g)
{
	p->lctrl = g->area;
	p->ring = g->area + prov_ctrl_len(g->q);
	p->peer_ring_off = prov_ctrl_len(g->peer_q);
	return 0;
}

static int rk_post(struct proto *p, const struct iovec *iov, int iovcnt,
		   uint64_t roff, uint32_t imm, int inl)
{
	int flags = inl ? PROV_INLINE : 0;
	uint64_t wr_id = 0;
	int rc;

	if (++p->s_unsignaled >= (p->lq >> 2) || p->s_unsignaled >= 16) {
		flags |= PROV_SIGNALED;
		wr_id = p->s_unsignaled;
		p->s_unsignaled = 0;
	}
	rc = p->ops->post_write_imm(p->qp, iov, iovcnt, roff, imm, flags, wr_id);
	if (rc) {
		proto_fail(p, ECONNRESET, 0, "provider %s: post failed (%s)",
			   p->ops->name, strerror(-rc));
		return rc;
	}
	p->sq_out++;
	p->s_msgs++;
	return 0;
}

/* Send one control message carrying our current credits. */
static int rk_post_ctrl(struct proto *p, enum eng_op op)
{
	struct eng_ctrl m = {
		.consumed = p->r_head,
		.limit = p->r_reposted,
		.op = op,
	};
	struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
	uint64_t roff = (uint64_t)(p->s_msgs % p->peer_q) * sizeof(m);
	int rc;

	rc = rk_post(p, &iov, 1, roff, IMM(op, 0), 1);
	if (rc)
		return rc;
	p->r_credited = m.consumed;
	p->r_limit_sent = m.limit;
	p->st->tx_ctrl++;
	return 0;
}

/* Byte credits go back once this much of the ring has been consumed. */
static uint64_t rk_credit_bytes(const struct proto *p)
{
	return p->rsize >> CREDIT_BYTES_SHIFT;
}

static int rk_ctrl_room(const struct proto *p, uint32_t need)
{
	/* a RESET needs a credit too; with none (s_limit == s_msgs) the
	 * peer could not take it */
	return proto_credits(p) > need;
}

static int rk_credit_due(const struct proto *p)
{
	return (p->pending & P_CREDIT) ||
	       p->r_head - p->r_credited >= rk_credit_bytes(p) ||
	       p->r_reposted - p->r_limit_sent >= (p->lq >> 1);
}

static uint32_t rk_send_room(const struct proto *p, int *credit_stall)
{
	uint32_t space = ring_contig_space(p->s_acked, p->s_tail, p->peer_rsize);

	*credit_stall = 0;
	if (space == 0)
		return 0;
	if (proto_credits(p) <= CREDIT_RESERVE) {
		/* The peer has not taken in our last messages yet.  A TCP
		 * sender's small writes queue by the byte, not by the count:
		 * with a provider that has plain writes, the bytes go into
		 * the ring all the same, and the peer reads the position we
		 * publish (section 4 of PROTOCOL.md); else wait. */
		*credit_stall = 1;
		if (!p->ops->post_write_plain)
			return 0;
	}
	return space;
}

static int rk_post_data(struct proto *p, const void *buf, uint32_t n)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = n };
	uint64_t roff = p->peer_ring_off + ring_off(p->s_tail, p->peer_rsize);
	int rc;

	if (p->s_announced != p->s_tail && proto_credits(p) > CREDIT_RESERVE) {
		/* plain writes first: the next message's bytes follow them */
		rc = rk_post(p, NULL, 0, 0,
			     IMM(OP_WRITTEN, p->s_tail - p->s_announced), 0);
		if (rc)
			return rc;
		p->s_announced = p->s_tail;
	}
	if (proto_credits(p) <= CREDIT_RESERVE) {
		rc = p->ops->post_write_plain(p->qp, &iov, 1, roff, p->s_tail + n);
		if (rc)
			proto_fail(p, ECONNRESET, 0,
				   "provider %s: plain write failed (%s)",
				   p->ops->name, strerror(-rc));
		return rc;
	}
	rc = rk_post(p, &iov, 1, roff, IMM(OP_DATA, n), n <= p->inline_max);
	if (!rc)
		p->s_announced = p->s_tail + n;
	return rc;
}

/* A message announced len bytes at r_msg_tail (DATA: its own; WRITTEN:
 * the peer's plain writes'): they must lie in the ring's window, and a
 * DATA message's in one piece.  Bytes below r_tail came in already through
 * the position the peer published: not counted twice.  0, or -1 (a
 * violation). */
static int rk_announced(struct proto *p, uint64_t len, int whole)
{
	uint64_t end = p->r_msg_tail + len;

	if (len == 0 || end > p->r_head + p->rsize ||
	    (whole && ring_off(p->r_msg_tail, p->rsize) + len > p->rsize))
		return -1;
	p->r_msg_tail = end;
	if (end > p->r_tail) {
		p->st->rx_bytes += end - p->r_tail;
		p->r_tail = end;
	}
	return 0;
}

int proto_take_written(struct proto *p)
{
	uint64_t w;

	if (!p->ops->peer_written || p->pers != &proto_rsock ||
	    (p->flags & F_DEAD))
		return 0;
	w = p->ops->peer_written(p->qp);
	if (w <= p->r_tail)
		return 0; /* (nothing new: an older position) */
	if (w > p->r_head + p->rsize) {
		proto_fail(p, ECONNRESET, 1,
			   "protocol violation: plain writes up to %llu, the "
			   "ring holds up to %llu",
			   (unsigned long long)w,
			   (unsigned long long)(p->r_head + p->rsize));
		return 1;
	}
	if (p->flags & F_PEER_FIN) {
		proto_fail(p, ECONNRESET, 1, "protocol violation: data after FIN");
		return 1;
	}
	p->st->rx_bytes += w - p->r_tail;
	p->r_tail = w;
	p->wake = 1;
	return 1;
}

/* Byte credits are due once half the ring was consumed since the last
 * update (message credits go back as receives are reposted: proto_flush
 * after completions). */
static int rk_consumed(struct proto *p)
{
	return p->r_head - p->r_credited >= rk_credit_bytes(p);
}

static void rk_apply_ctrl(struct proto *p, const struct eng_ctrl *m)
{
	if (m->consumed < p->s_acked || m->consumed > p->s_tail) {
		proto_fail(p, ECONNRESET, 1,
			   "protocol violation: credit for %llu bytes, %llu sent",
			   (unsigned long long)m->consumed,
			   (unsigned long long)p->s_tail);
		return;
	}
	if ((int32_t)(m->limit - p->s_limit) < 0 ||
	    m->limit - p->s_msgs > p->peer_q) {
		proto_fail(p, ECONNRESET, 1,
			   "protocol violation: message limit %u (sent %u)",
			   m->limit, p->s_msgs);
		return;
	}
	p->s_acked = m->consumed;
	p->s_limit = m->limit;
}

static void rk_on_recv(struct proto *p, const struct prov_wc *wc)
{
	uint32_t op = wc->imm >> IMM_OP_SHIFT, arg = wc->imm & IMM_ARG_MASK;
	uint32_t slot = p->r_msgs % p->lq;
	struct eng_ctrl m;
	int rc;

	if (wc->wr_id != (PROV_WRID_RECV | slot)) {
		/* receives complete in the order they were posted: another
		 * one means a completion was lost (or forged) */
		proto_fail(p, ECONNRESET, 1,
			   "provider %s: receive completion %llu out of order "
			   "(expected slot %u)", p->ops->name,
			   (unsigned long long)(wc->wr_id & ~PROV_WRID_RECV), slot);
		return;
	}
	p->r_msgs++;
	rc = p->ops->post_recv(p->qp, PROV_WRID_RECV | slot);
	if (rc) {
		proto_fail(p, ECONNRESET, 0, "provider %s: repost failed (%s)",
			   p->ops->name, strerror(-rc));
		return;
	}
	p->r_reposted++;

	if (op == OP_DATA || op == OP_WRITTEN) {
		if (op == OP_DATA ? arg != wc->byte_len : wc->byte_len != 0) {
			proto_fail(p, ECONNRESET, 1,
				   "protocol violation: %s message of %u bytes "
				   "(imm %u)", op == OP_DATA ? "data" : "written",
				   wc->byte_len, arg);
			return;
		}
		if (p->flags & F_PEER_FIN) {
			proto_fail(p, ECONNRESET, 1,
				   "protocol violation: data after FIN");
			return;
		}
		if (rk_announced(p, arg, op == OP_DATA)) {
			proto_fail(p, ECONNRESET, 1,
				   "protocol violation: %s message of %u bytes "
				   "does not fit the ring",
				   op == OP_DATA ? "data" : "written", arg);
			return;
		}
		p->st->rx_msgs++;
		return;
	}
	if (op > OP_KEEPALIVE || arg != 0 || wc->byte_len != sizeof(m)) {
		proto_fail(p, ECONNRESET, 1,
			   "protocol violation: opcode %u arg %u len %u", op, arg,
			   wc->byte_len);
		return;
	}
	memcpy(&m, p->lctrl + (size_t)slot * sizeof(m), sizeof(m));
	if (m.op != op) {
		proto_fail(p, ECONNRESET, 1,
			   "protocol violation: ctrl slot op %u != imm op %u",
			   m.op, op);
		return;
	}
	p->st->rx_ctrl++;
	rk_apply_ctrl(p, &m);
	if (p->flags & F_DEAD)
		return;
	if (op == OP_FIN || (op == OP_RESET && !(p->flags & F_PEER_FIN)))
		/* the peer's plain writes, all of them before its FIN or its
		 * reset (readable before the reset's error, as TCP's bytes
		 * that came before an RST) */
		proto_take_written(p);
	if (p->flags & F_DEAD)
		return;
	if (op == OP_FIN)
		p->flags |= F_PEER_FIN;
	else if (op == OP_RESET && (p->flags & F_PEER_FIN))
		/* after its FIN, as Linux TCP takes an RST in CLOSE_WAIT: reads
		 * keep their EOF, sends fail with EPIPE */
		proto_fail(p, EPIPE, 0, "the peer aborted the connection after its FIN");
	else if (op == OP_RESET)
		proto_fail(p, ECONNRESET, 0, "the peer aborted the connection");
}

const struct proto_pers proto_rsock = {
	.name = "rsock",
	.init = rk_init,
	.on_recv = rk_on_recv,
	.post_ctrl = rk_post_ctrl,
	.credit_due = rk_credit_due,
	.ctrl_room = rk_ctrl_room,
	.send_room = rk_send_room,
	.post_data = rk_post_data,
	.consumed = rk_consumed,
};
