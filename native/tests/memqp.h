/*
 * memqp.h - two protocol instances (proto.h) joined by memcpy: a queue
 * pair in plain memory, with no fd, no thread, no lock and no clock.
 * Used by tests/test_proto.c and fuzz/fuzz_proto.c.
 *
 * It keeps RC's rules, as prov.h states them: a write lands in the
 * peer's registered memory and consumes one posted receive there, which
 * completes with the immediate data and the length; a send completion
 * comes only for signaled writes; a write outside the peer's registered
 * memory breaks the queue pair (an error completion on both sides), as
 * an HCA would; a write that finds no receive posted waits for one (RNR
 * retry), up to MQ_RNR of them, and then breaks it too.  Completions wait in each
 * side's CQ until mq_pump hands them to the protocol, so a test decides
 * when each side runs.
 *
 * Every registered region sits between canary bytes, checked by
 * mq_canaries_ok: nothing the protocol does may write outside them.
 */
#ifndef MEMQP_H
#define MEMQP_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "ring.h"

#define MQ_CQ 4096
#define MQ_RQ 1024
#define MQ_GUARD 64
#define MQ_RNR 64
#define MQ_CANARY 0xa5
#define MQ_RING_KEY 0x1111u
#define MQ_SGL_KEY 0x2222u

struct prov_qp {
	struct prov_qp *peer;
	struct proto p;
	struct rsk_stats st;
	char detail[160];
	int rs; /* rsockets personality */
	/* registered memory: [MQ_GUARD canary][area][MQ_GUARD canary] */
	uint8_t *mem;
	uint8_t *area;
	size_t area_len;
	uint8_t *ring; /* rs: the bare ring (area) */
	uint32_t rsize, q;
	struct rs_sge *tsgl; /* rs: the target SGL the peer writes into */
	uint8_t *tsgl_mem;
	/* posted receives (FIFO) and the CQ */
	uint64_t rq[MQ_RQ];
	uint32_t rq_head, rq_n;
	struct prov_wc cq[MQ_CQ];
	uint32_t cq_head, cq_n;
	/* writes that found no receive posted wait here (RNR retry, as
	 * rsockets' control messages rely on) until one is */
	struct prov_wc rnr[MQ_RNR];
	uint32_t rnr_n;
	int broken;       /* the QP is in the error state */
	int fail_post;    /* > 0: the fail_post-th next post fails (-EIO) */
	int fail_recv;    /* > 0: the fail_recv-th next repost fails */
	uint64_t writes;  /* writes delivered */
};

static void mq_push(struct prov_qp *q, const struct prov_wc *wc)
{
	if (q->cq_n == MQ_CQ) { /* CQ overrun: an HCA errors the QP */
		q->broken = 1;
		return;
	}
	q->cq[(q->cq_head + q->cq_n++) % MQ_CQ] = *wc;
}

static void mq_break(struct prov_qp *q, int err)
{
	struct prov_wc wc = { .status = -err, .is_recv = 1 };

	if (q->broken)
		return;
	q->broken = q->peer->broken = 1;
	mq_push(q, &wc);
	wc.status = -ESHUTDOWN;
	mq_push(q->peer, &wc);
}

static int mq_post_recv(struct prov_qp *q, uint64_t wr_id)
{
	if (q->fail_recv && --q->fail_recv == 0)
		return -EIO;
	if (q->rnr_n) { /* a write waited for this receive */
		struct prov_wc wc = q->rnr[0];

		memmove(q->rnr, q->rnr + 1, --q->rnr_n * sizeof(q->rnr[0]));
		wc.wr_id = wr_id;
		mq_push(q, &wc);
		return 0;
	}
	if (q->rq_n == MQ_RQ)
		return -ENOMEM;
	q->rq[(q->rq_head + q->rq_n++) % MQ_RQ] = wr_id;
	return 0;
}

/* Deliver len bytes (already copied) with imm to the peer. */
static int mq_deliver(struct prov_qp *q, uint32_t len, uint32_t imm,
		      int flags, uint64_t wr_id)
{
	struct prov_qp *d = q->peer;
	struct prov_wc wc = { .imm = imm, .byte_len = len, .is_recv = 1 };

	if (d->rq_n == 0 && d->rnr_n == MQ_RNR) { /* RNR retries exceeded */
		mq_break(q, EPROTO);
		return 0;
	}
	if (d->rq_n == 0) {
		d->rnr[d->rnr_n++] = wc;
	} else {
		wc.wr_id = d->rq[d->rq_head];
		d->rq_head = (d->rq_head + 1) % MQ_RQ;
		d->rq_n--;
		mq_push(d, &wc);
	}
	q->writes++;
	if (flags & PROV_SIGNALED) {
		struct prov_wc s = { .wr_id = wr_id };

		mq_push(q, &s);
	}
	return 0;
}

static size_t mq_iov_len(const struct iovec *iov, int iovcnt)
{
	size_t n = 0;
	int i;

	for (i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	return n;
}

static void mq_copy(uint8_t *dst, const struct iovec *iov, int iovcnt)
{
	int i;

	for (i = 0; i < iovcnt; i++) {
		memcpy(dst, iov[i].iov_base, iov[i].iov_len);
		dst += iov[i].iov_len;
	}
}

static int mq_post_write_imm(struct prov_qp *q, const struct iovec *iov,
			     int iovcnt, uint64_t roff, uint32_t imm,
			     int flags, uint64_t wr_id)
{
	size_t len = mq_iov_len(iov, iovcnt);

	if (q->fail_post && --q->fail_post == 0)
		return -EIO;
	if (q->broken)
		return 0; /* flushed: the error completion says so */
	if (roff > q->peer->area_len || len > q->peer->area_len - roff) {
		mq_break(q, EFAULT); /* remote access error */
		return 0;
	}
	mq_copy(q->peer->area + roff, iov, iovcnt);
	return mq_deliver(q, (uint32_t)len, imm, flags, wr_id);
}

/* An rsockets write: to the peer's ring or its target SGL, by address. */
static int mq_post_write_at(struct prov_qp *q, const struct iovec *iov,
			    int iovcnt, uint64_t raddr, uint32_t rkey,
			    uint32_t imm, int flags, uint64_t wr_id)
{
	struct prov_qp *d = q->peer;
	size_t len = mq_iov_len(iov, iovcnt);
	uint8_t *base;
	size_t blen;

	if (q->fail_post && --q->fail_post == 0)
		return -EIO;
	if (q->broken)
		return 0;
	if (len) {
		if (rkey == MQ_RING_KEY) {
			base = d->ring;
			blen = d->rsize;
		} else if (rkey == MQ_SGL_KEY) {
			base = (uint8_t *)d->tsgl;
			blen = 2 * sizeof(struct rs_sge);
		} else {
			mq_break(q, EACCES);
			return 0;
		}
		if (raddr < (uintptr_t)base || raddr - (uintptr_t)base > blen ||
		    len > blen - (raddr - (uintptr_t)base)) {
			mq_break(q, EFAULT);
			return 0;
		}
		mq_copy((uint8_t *)(uintptr_t)raddr, iov, iovcnt);
	}
	return mq_deliver(q, (uint32_t)len, imm, flags, wr_id);
}

static const struct prov_ops mq_ops = {
	.name = "memqp",
	.post_recv = mq_post_recv,
	.post_write_imm = mq_post_write_imm,
	.post_write_at = mq_post_write_at,
};

static uint8_t *mq_guarded(size_t len)
{
	uint8_t *m = malloc(len + 2 * MQ_GUARD);

	if (m)
		memset(m, MQ_CANARY, len + 2 * MQ_GUARD);
	return m;
}

static int mq_guard_ok(const uint8_t *m, size_t len)
{
	size_t i;

	for (i = 0; i < MQ_GUARD; i++)
		if (m[i] != MQ_CANARY || m[MQ_GUARD + len + i] != MQ_CANARY)
			return 0;
	return 1;
}

/* Both halves' memory (not yet joined). */
static int mq_half(struct prov_qp *q, uint32_t ring, uint32_t qd, int rs)
{
	uint32_t i;

	memset(q, 0, sizeof(*q));
	q->rs = rs;
	q->rsize = ring;
	q->q = qd;
	q->area_len = rs ? ring : prov_area_len(qd, ring);
	q->mem = mq_guarded(q->area_len);
	q->tsgl_mem = mq_guarded(2 * sizeof(struct rs_sge));
	if (!q->mem || !q->tsgl_mem)
		return -ENOMEM;
	q->area = q->mem + MQ_GUARD;
	memset(q->area, 0, q->area_len);
	q->ring = rs ? q->area : q->area + prov_ctrl_len(qd);
	q->tsgl = (struct rs_sge *)(q->tsgl_mem + MQ_GUARD);
	memset(q->tsgl, 0, 2 * sizeof(struct rs_sge));
	for (i = 0; i < qd; i++)
		mq_post_recv(q, PROV_WRID_RECV | i);
	return 0;
}

/* A connected pair: rings of ring bytes, qd receives each. */
static int mq_pair(struct prov_qp *a, struct prov_qp *b, uint32_t ring,
		   uint32_t qd, uint32_t inline_max, int rs)
{
	struct prov_qp *side[2] = { a, b };
	int i, rc;

	if ((rc = mq_half(a, ring, qd, rs)) || (rc = mq_half(b, ring, qd, rs)))
		return rc;
	a->peer = b;
	b->peer = a;
	for (i = 0; i < 2; i++) {
		struct prov_qp *q = side[i], *o = side[1 - i];
		struct proto_geom g = {
			.pers = rs ? &proto_rsockets : &proto_rsock,
			.area = q->area,
			.ring = ring,
			.q = qd,
			.peer_ring = ring,
			.peer_q = qd,
			.inline_max = inline_max,
			.rs_tsgl = q->tsgl,
			.rs_rbuf_addr = (uintptr_t)q->ring,
			.rs_rbuf_key = MQ_RING_KEY,
			.rs_sgl_addr = (uintptr_t)o->tsgl,
			.rs_sgl_key = MQ_SGL_KEY,
			.rs_sgl_len = 2,
		};

		/* the handshake gives each side the peer's first half */
		q->tsgl[0] = (struct rs_sge){ .addr = (uintptr_t)o->ring,
					      .key = MQ_RING_KEY,
					      .length = ring >> 1 };
		rc = proto_init(&q->p, &mq_ops, q, &g, &q->st, q->detail,
				sizeof(q->detail));
		if (rc)
			return rc;
	}
	return 0;
}

static void mq_free(struct prov_qp *q)
{
	proto_free(&q->p);
	free(q->mem);
	free(q->tsgl_mem);
	q->mem = q->tsgl_mem = NULL;
}

static int mq_canaries_ok(const struct prov_qp *q)
{
	return mq_guard_ok(q->mem, q->area_len) &&
	       mq_guard_ok(q->tsgl_mem, 2 * sizeof(struct rs_sge));
}

/* One side runs: what is in its CQ goes to the protocol (as the engine's
 * eng_progress does), then due control messages go out.  Returns the
 * number of completions handled. */
static int mq_pump(struct prov_qp *q)
{
	int n = 0;

	while (q->cq_n && !(q->p.flags & F_DEAD)) {
		struct prov_wc wc = q->cq[q->cq_head];

		q->cq_head = (q->cq_head + 1) % MQ_CQ;
		q->cq_n--;
		proto_complete(&q->p, &wc, 0);
		n++;
	}
	proto_flush(&q->p);
	return n;
}

/* Both sides run until neither has anything left to do. */
static void mq_settle(struct prov_qp *a, struct prov_qp *b)
{
	int guard = 100000;

	while ((mq_pump(a) | mq_pump(b)) && --guard)
		;
}

/* Contiguous readable bytes at the head (what rsk_recv copies from). */
static uint32_t mq_readable(const struct prov_qp *q, const uint8_t **ptr)
{
	*ptr = q->p.ring + ring_off(q->p.r_head, q->p.rsize);
	return ring_contig_data(q->p.r_head, q->p.r_tail, q->p.rsize);
}

#endif
