// SPDX-License-Identifier: MIT
/*
 * engine.c - the rsock stream protocol over an RC-queue-pair provider.
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
 *     and nothing outside our rings is ever touched;
 *   - a thread sleeps only after arm -> re-poll found nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>

#include "engine.h"
#include "ring.h"

#define WC_BATCH 32

/* ------------------------------------------------------------ signals */

/*
 * Python runs a signal's handler in the main thread, between bytecodes: a
 * call blocked in C must return (-EINTR) for it to run.  The kernel gives
 * a process's signal to the main thread unless it blocks it, and a signal
 * ends a sleeping syscall with EINTR, so every sleep here is one that a
 * signal interrupts (epoll_wait, a futex; never a condition variable).
 * What no syscall sees is a signal handled while the thread runs in user
 * space, as it does while it spins: Python's C handler only takes note.
 * For that, rsock gives Python a wakeup fd (signal.set_wakeup_fd; the
 * handler writes the signal's number into it): the main thread looks at
 * it while it spins (every SPIN_SIG_LOOK_NS, and before it sleeps) and
 * sleeps in poll() on it beside the socket's epoll fd.
 */

/* A spin longer than this looks at the wakeup fd this often. */
#define SPIN_SIG_LOOK_NS 5000000ll

static int eng_sigfd = -1; /* read end of Python's wakeup fd, or -1 */
static __thread int eng_main_tls = -1; /* is this the main thread? */

void eng_signals_child(void)
{
	eng_main_tls = -1; /* the forking thread is the child's main thread */
	__atomic_store_n(&eng_sigfd, -1, __ATOMIC_RELEASE); /* the parent's */
}

int rsk_set_signal_fd(int fd)
{
	if (fd < -1)
		return -EINVAL;
	__atomic_store_n(&eng_sigfd, fd, __ATOMIC_RELEASE);
	return 0;
}

static int eng_is_main(void)
{
	if (eng_main_tls < 0)
		eng_main_tls = syscall(SYS_gettid) == getpid();
	return eng_main_tls;
}

/* The wakeup fd of this (main) thread, or -1. */
static int eng_my_sigfd(void)
{
	int fd = __atomic_load_n(&eng_sigfd, __ATOMIC_ACQUIRE);

	return fd >= 0 && eng_is_main() ? fd : -1;
}

/* Did a signal come (a byte in the wakeup fd)?  Drains it. */
static int eng_sig_came(int sigfd)
{
	char b[64];
	int came = 0;

	if (sigfd < 0)
		return 0;
	while (read(sigfd, b, sizeof(b)) > 0)
		came = 1;
	return came;
}

/* The watcher thread blocks every asynchronous signal (not those a fault
 * raises), so that a process's signals go to the program's threads. */
void eng_sig_block_all(sigset_t *old)
{
	sigset_t all;

	sigfillset(&all);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	sigdelset(&all, SIGTRAP);
	sigdelset(&all, SIGABRT);
	pthread_sigmask(SIG_BLOCK, &all, old);
}

/* ------------------------------------------------------------- options */

void rsk_opts_default(struct rsk_opts *o)
{
	/* 8 MiB: measured (interleaved A/B, README "Where the time goes"),
	 * 64 KiB streams are 13-23% faster than with 4 MiB, 2 and 16 MiB are
	 * slower; likely because a credit batch (half the ring) then exceeds
	 * the 2 MiB L2, so the receiver copies out of L3 rather than out of
	 * the other core's L2.  Rings are touched lazily.  (rsock.socket keeps
	 * 4 MiB for a verbs connection: registered memory is pinned.) */
	o->ring_size = 8u << 20;
	o->qdepth = 256;
	o->inline_max = 256;
	o->spin_us = 50;
}

int rsk_opts_check(struct rsk_opts *o)
{
	uint32_t r;

	if (o->ring_size < RSK_RING_MIN || o->ring_size > RSK_RING_MAX)
		return -EINVAL;
	r = ring_roundup_pow2(o->ring_size);
	if (!r || r > RSK_RING_MAX)
		return -EINVAL;
	o->ring_size = r;
	if (o->qdepth < RSK_QDEPTH_MIN || o->qdepth > RSK_QDEPTH_MAX)
		return -EINVAL;
	if (o->spin_us > RSK_SPIN_MAX_US)
		return -EINVAL;
	return 0;
}

/* -------------------------------------------------------------- basics */

void eng_set_detail(rsk_sock *s, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->detail, sizeof(s->detail), fmt, ap);
	va_end(ap);
}

int rsk_socket(rsk_sock **out)
{
	rsk_sock *s;
	int fab[2];

	eng_fork_init();
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	eng_fork_stamp(s, 1);
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (s->epfd < 0) {
		int rc = -errno;

		free(s);
		return rc;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
		       fab) < 0) {
		int rc = -errno;

		close(s->epfd);
		free(s);
		return rc;
	}
	s->fa = fab[0];
	s->fb = fab[1];
	s->wslot = -1;
	eng_fd_init(s);
	pthread_mutex_init(&s->lock, NULL);
	s->live_fd = -1;
	s->xfd = -1;
	s->interest = RSK_POLLIN;
	rsk_opts_default(&s->opts);
	*out = s;
	return 0;
}

/* Enter an API call: lock, refuse closed sockets, count the user. */
int eng_enter(rsk_sock *s)
{
	eng_lock(s);
	if (s->closed) {
		pthread_mutex_unlock(&s->lock);
		return -EBADF;
	}
	if (eng_forked(s) && !eng_claim(s)) {
		eng_set_detail(s, "connection in use by process %u (fork)",
			       *s->ops->owner_word(s->qp));
		pthread_mutex_unlock(&s->lock);
		return -EBADF;
	}
	s->users++;
	return 0;
}

static void eng_release(rsk_sock *s);

void eng_leave(rsk_sock *s)
{
	if (!s->closed)
		eng_sync_fd(s);
	if (--s->users == 0 && s->closed)
		eng_release(s);
	pthread_mutex_unlock(&s->lock);
}

int rsk_fileno(rsk_sock *s)
{
	return s->fa;
}

int rsk_notify_fds(rsk_sock *s, int *notify_fd, int *live_fd)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_CONN) {
		rc = -ENOTCONN;
	} else {
		*notify_fd = s->ops->notify_fd(s->qp);
		*live_fd = s->live_fd;
	}
	eng_leave(s);
	return rc;
}

int rsk_check_peer(rsk_sock *s)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_CONN) {
		eng_progress(s);
		rc = eng_poll_live(s);
	}
	eng_leave(s);
	return rc;
}

int rsk_get_opts(rsk_sock *s, struct rsk_opts *o)
{
	eng_lock(s);
	*o = s->opts;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int rsk_set_opts(rsk_sock *s, const struct rsk_opts *o)
{
	struct rsk_opts n = *o;
	int rc = rsk_opts_check(&n);

	if (rc)
		return rc;
	if ((rc = eng_enter(s)))
		return rc;
	/* ring geometry and inline size are fixed once connected; spin time
	 * is not */
	if (s->kind == K_CONN) {
		if (n.ring_size != s->opts.ring_size || n.qdepth != s->opts.qdepth ||
		    n.inline_max != s->opts.inline_max)
			rc = -EISCONN;
		else
			s->opts.spin_us = n.spin_us;
	} else {
		s->opts = n;
	}
	eng_leave(s);
	return rc;
}

/* ---------------------------------------------------- failure handling */

static int eng_post_ctrl(rsk_sock *s, enum eng_op op);

/* The connection is unusable from now on; tell the peer if we can. */
static void eng_fail(rsk_sock *s, int err, int tell_peer, const char *fmt, ...)
{
	va_list ap;

	if (s->flags & F_DEAD)
		return;
	if (tell_peer && (s->rs || s->s_limit != s->s_msgs))
		(void)eng_post_ctrl(s, OP_RESET);
	s->flags |= F_DEAD;
	s->err = err;
	s->so_error = err;
	va_start(ap, fmt);
	vsnprintf(s->detail, sizeof(s->detail), fmt, ap);
	va_end(ap);
	eng_wake(s);
}

/* ------------------------------------------------------ control output */

uint32_t eng_credits(const rsk_sock *s)
{
	return s->s_limit - s->s_msgs;
}

/* ---------------------------------------------- rsockets personality */

/*
 * librdmacm's rsockets stream protocol (PROTOCOL.md section 9).  Data goes
 * where the peer's published SGEs say; the receiver publishes a free half
 * of its ring (an rs_sge RDMA-written into the sender's target SGL, imm
 * SGL | message limit) when its application has consumed one; message
 * credits count *consumed* data messages (16-bit sequence numbers);
 * control messages take no credit (RNR retry covers them).
 */
static int rs_post(rsk_sock *s, const struct iovec *iov, int iovcnt,
		   uint64_t raddr, uint32_t rkey, uint32_t imm)
{
	int flags = 0;
	uint64_t wr_id = 0;
	int rc;

	if (++s->s_unsignaled >= 16) {
		flags |= PROV_SIGNALED;
		wr_id = s->s_unsignaled;
		s->s_unsignaled = 0;
	}
	rc = s->ops->post_write_at(s->qp, iov, iovcnt, raddr, rkey, imm,
				   flags, wr_id);
	if (rc) {
		eng_fail(s, ECONNRESET, 0, "provider %s: post failed (%s)",
			 s->ops->name, strerror(-rc));
		return rc;
	}
	s->sq_out++;
	return 0;
}

static uint32_t rs_half(const rsk_sock *s)
{
	return s->rsize >> 1;
}

static int rs_credit_due(const rsk_sock *s)
{
	return s->r_head + s->rsize - s->rs_pub >= rs_half(s) ||
	       (int16_t)(s->rs_rseq_no - s->rs_rseq_comp) >= 0;
}

/* Publish a consumed half of the ring (or message credits only). */
static int rs_send_credits(rsk_sock *s)
{
	uint32_t limit = (uint32_t)(uint16_t)(s->rs_rseq_no + s->lq);
	int rc;

	s->rs_rseq_comp = (uint16_t)(s->rs_rseq_no + (s->lq >> 1));
	if (s->r_head + s->rsize - s->rs_pub >= rs_half(s)) {
		struct rs_sge sge = {
			.addr = s->rs_rbuf_addr + ring_off(s->rs_pub, s->rsize),
			.key = s->rs_rbuf_key,
			.length = rs_half(s),
		};
		struct iovec iov = { .iov_base = &sge, .iov_len = sizeof(sge) };

		rc = rs_post(s, &iov, 1,
			     s->rs_sgl_addr + (uint64_t)s->rs_rsge * sizeof(sge),
			     s->rs_sgl_key, IMM(RS_OP_SGL, limit));
		if (rc)
			return rc;
		s->rs_pub += rs_half(s);
		s->rs_rsge = (s->rs_rsge + 1) % s->rs_sgl_len;
	} else if ((rc = rs_post(s, NULL, 0, 0, 0, IMM(RS_OP_SGL, limit)))) {
		return rc;
	}
	s->r_credited = s->r_head;
	s->st.tx_ctrl++;
	return 0;
}

static void rs_handle_recv(rsk_sock *s, const struct prov_wc *wc)
{
	uint32_t op = wc->imm >> IMM_OP_SHIFT, arg = wc->imm & IMM_ARG_MASK;
	int rc;

	/* receives are reposted at once; credits count consumed messages */
	rc = s->ops->post_recv(s->qp, wc->wr_id);
	if (rc) {
		eng_fail(s, ECONNRESET, 0, "provider %s: repost failed (%s)",
			 s->ops->name, strerror(-rc));
		return;
	}
	s->r_msgs++;
	switch (op) {
	case RS_OP_DATA:
		if (arg == 0 || arg != wc->byte_len ||
		    s->r_tail + arg > s->rs_pub ||
		    ring_off(s->r_tail, s->rsize) + (uint64_t)arg > s->rsize ||
		    s->rs_mq_n > s->lq) {
			eng_fail(s, ECONNRESET, 1,
				 "protocol violation (rsockets): data message "
				 "of %u bytes (imm %u) outside the published "
				 "buffer", wc->byte_len, arg);
			return;
		}
		if (s->flags & F_PEER_FIN) {
			eng_fail(s, ECONNRESET, 1,
				 "protocol violation: data after shutdown");
			return;
		}
		s->r_tail += arg;
		s->rs_mq[(s->rs_mq_head + s->rs_mq_n++) % (s->lq + 1)] =
			s->r_tail;
		s->st.rx_msgs++;
		s->st.rx_bytes += arg;
		return;
	case RS_OP_SGL:
		/* new message limit; a published SGE is already in place */
		s->rs_sseq_comp = (uint16_t)arg;
		s->st.rx_ctrl++;
		return;
	case RS_OP_CTRL:
		s->st.rx_ctrl++;
		if (arg == RS_CTRL_SHUTDOWN || arg == RS_CTRL_DISCONNECT)
			s->flags |= F_PEER_FIN;
		return;
	default:
		eng_fail(s, ECONNRESET, 1,
			 "protocol violation (rsockets): opcode %u", op);
	}
}

/* The application consumed up to r_head: count finished messages. */
static void rs_consumed(rsk_sock *s)
{
	while (s->rs_mq_n && s->rs_mq[s->rs_mq_head] <= s->r_head) {
		s->rs_mq_head = (s->rs_mq_head + 1) % (s->lq + 1);
		s->rs_mq_n--;
		s->rs_rseq_no++;
	}
}

/* What a data message may take now: 0 if no SGE or no credit. */
uint32_t rs_send_room(const rsk_sock *s)
{
	const struct rs_sge *t = &s->rs_tsgl[s->rs_tsge];
	uint32_t len = __atomic_load_n(&t->length, __ATOMIC_ACQUIRE);

	if (s->rs_sseq_no == s->rs_sseq_comp)
		return 0;
	return len > IMM_ARG_MASK ? IMM_ARG_MASK : len;
}

static int rs_post_data(rsk_sock *s, const void *p, uint32_t n)
{
	struct rs_sge *t = &s->rs_tsgl[s->rs_tsge];
	struct iovec iov = { .iov_base = (void *)p, .iov_len = n };
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
		s->rs_tsge = (s->rs_tsge + 1) % 2;
	rc = rs_post(s, &iov, 1, addr, key, IMM(RS_OP_DATA, n));
	if (rc)
		return rc;
	s->rs_sseq_no++;
	return 0;
}

static int eng_post(rsk_sock *s, const struct iovec *iov, int iovcnt,
		    uint64_t roff, uint32_t imm, int inl)
{
	int flags = inl ? PROV_INLINE : 0;
	uint64_t wr_id = 0;
	int rc;

	if (++s->s_unsignaled >= (s->opts.qdepth >> 2) || s->s_unsignaled >= 16) {
		flags |= PROV_SIGNALED;
		wr_id = s->s_unsignaled;
		s->s_unsignaled = 0;
	}
	rc = s->ops->post_write_imm(s->qp, iov, iovcnt, roff, imm, flags, wr_id);
	if (rc) {
		eng_fail(s, ECONNRESET, 0, "provider %s: post failed (%s)",
			 s->ops->name, strerror(-rc));
		return rc;
	}
	s->sq_out++;
	s->s_msgs++;
	return 0;
}

/* Send one control message carrying our current credits. */
static int eng_post_ctrl(rsk_sock *s, enum eng_op op)
{
	struct eng_ctrl m = {
		.consumed = s->r_head,
		.limit = s->r_reposted,
		.op = op,
	};
	struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
	uint64_t roff = (uint64_t)(s->s_msgs % s->peer_q) * sizeof(m);
	int rc;

	if (s->rs) {
		if (op == OP_CREDIT)
			return rs_send_credits(s);
		s->st.tx_ctrl++;
		return rs_post(s, NULL, 0, 0, 0,
			       IMM(RS_OP_CTRL, op == OP_FIN ? RS_CTRL_SHUTDOWN :
							      RS_CTRL_DISCONNECT));
	}
	rc = eng_post(s, &iov, 1, roff, IMM(op, 0), 1);
	if (rc)
		return rc;
	s->r_credited = m.consumed;
	s->r_limit_sent = m.limit;
	s->st.tx_ctrl++;
	return 0;
}

/* Byte credits go back once this much of the ring has been consumed. */
static uint64_t eng_credit_bytes(const rsk_sock *s)
{
	return s->rsize >> CREDIT_BYTES_SHIFT;
}

/* May a control message go out (need: credits to keep beyond it)?  The
 * rsockets protocol sends control messages without credits. */
static int eng_ctrl_room(const rsk_sock *s, uint32_t need)
{
	return s->rs || eng_credits(s) > need;
}

static int eng_credit_due(const rsk_sock *s)
{
	if (s->rs)
		return rs_credit_due(s);
	return (s->pending & P_CREDIT) ||
	       s->r_head - s->r_credited >= eng_credit_bytes(s) ||
	       s->r_reposted - s->r_limit_sent >= (s->lq >> 1);
}

/* Send what control traffic is due and allowed by the credit reserve. */
static void eng_flush_ctrl(rsk_sock *s)
{
	if (s->flags & F_DEAD)
		return;
	if (eng_credit_due(s)) {
		if (eng_ctrl_room(s, 1) && !eng_post_ctrl(s, OP_CREDIT))
			s->pending &= ~P_CREDIT;
		else
			s->pending |= P_CREDIT;
	}
	if ((s->pending & P_RESET) && eng_ctrl_room(s, 0)) {
		s->pending &= ~(P_RESET | P_FIN);
		eng_fail(s, ECONNRESET, 1, "connection reset");
		return;
	}
	if ((s->pending & P_FIN) && eng_ctrl_room(s, 0) &&
	    !eng_post_ctrl(s, OP_FIN))
		s->pending &= ~P_FIN;
}

/* ------------------------------------------------------- control input */

static void eng_apply_ctrl(rsk_sock *s, const struct eng_ctrl *m)
{
	if (m->consumed < s->s_acked || m->consumed > s->s_tail) {
		eng_fail(s, ECONNRESET, 1,
			 "protocol violation: credit for %llu bytes, %llu sent",
			 (unsigned long long)m->consumed,
			 (unsigned long long)s->s_tail);
		return;
	}
	if ((int32_t)(m->limit - s->s_limit) < 0 ||
	    m->limit - s->s_msgs > s->peer_q) {
		eng_fail(s, ECONNRESET, 1,
			 "protocol violation: message limit %u (sent %u)",
			 m->limit, s->s_msgs);
		return;
	}
	s->s_acked = m->consumed;
	s->s_limit = m->limit;
}

static void eng_handle_recv(rsk_sock *s, const struct prov_wc *wc)
{
	uint32_t op = wc->imm >> IMM_OP_SHIFT, arg = wc->imm & IMM_ARG_MASK;
	uint32_t slot = s->r_msgs % s->lq;
	struct eng_ctrl m;
	int rc;

	if (s->rs) {
		rs_handle_recv(s, wc);
		return;
	}
	if (wc->wr_id != (PROV_WRID_RECV | slot)) {
		/* receives complete in the order they were posted: another
		 * one means a completion was lost (or forged) */
		eng_fail(s, ECONNRESET, 1,
			 "provider %s: receive completion %llu out of order "
			 "(expected slot %u)", s->ops->name,
			 (unsigned long long)(wc->wr_id & ~PROV_WRID_RECV), slot);
		return;
	}
	s->r_msgs++;
	rc = s->ops->post_recv(s->qp, PROV_WRID_RECV | slot);
	if (rc) {
		eng_fail(s, ECONNRESET, 0, "provider %s: repost failed (%s)",
			 s->ops->name, strerror(-rc));
		return;
	}
	s->r_reposted++;

	if (op == OP_DATA) {
		if (arg != wc->byte_len ||
		    !ring_msg_fits(s->r_head, s->r_tail, s->rsize, arg)) {
			eng_fail(s, ECONNRESET, 1,
				 "protocol violation: data message of %u bytes "
				 "(imm %u) does not fit the ring",
				 wc->byte_len, arg);
			return;
		}
		if (s->flags & F_PEER_FIN) {
			eng_fail(s, ECONNRESET, 1,
				 "protocol violation: data after FIN");
			return;
		}
		s->r_tail += arg;
		s->st.rx_msgs++;
		s->st.rx_bytes += arg;
		return;
	}
	if (op > OP_KEEPALIVE || arg != 0 || wc->byte_len != sizeof(m)) {
		eng_fail(s, ECONNRESET, 1,
			 "protocol violation: opcode %u arg %u len %u", op, arg,
			 wc->byte_len);
		return;
	}
	memcpy(&m, s->lctrl + (size_t)slot * sizeof(m), sizeof(m));
	if (m.op != op) {
		eng_fail(s, ECONNRESET, 1,
			 "protocol violation: ctrl slot op %u != imm op %u",
			 m.op, op);
		return;
	}
	s->st.rx_ctrl++;
	eng_apply_ctrl(s, &m);
	if (s->flags & F_DEAD)
		return;
	if (op == OP_FIN)
		s->flags |= F_PEER_FIN;
	else if (op == OP_RESET)
		eng_fail(s, ECONNRESET, 0, "the peer aborted the connection");
}

/* The peer is gone: stop watching its liveness channel. */
static void eng_set_gone(rsk_sock *s)
{
	s->flags |= F_PEER_GONE;
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->live_fd, NULL);
	eng_wake(s);
}

/* Reap and handle completions, then send due control messages.
 * Returns the number of completions handled. */
int eng_progress(rsk_sock *s)
{
	struct prov_wc wc[WC_BATCH];
	int n, i, total = 0;

	if (s->kind != K_CONN || (s->flags & F_DEAD))
		return 0;
	do {
		n = s->ops->poll_cq(s->qp, wc, WC_BATCH);
		s->st.cq_polls++;
		for (i = 0; i < n && !(s->flags & F_DEAD); i++) {
			if (wc[i].status == -ESHUTDOWN &&
			    (s->flags & F_PEER_FIN)) {
				/* flushed after the peer's orderly close: it
				 * is gone, as a hang-up after FIN says */
				eng_set_gone(s);
			} else if (wc[i].status == -ESHUTDOWN && s->hup_at) {
				/* the fence after a hang-up (eng_hup_grace):
				 * everything the peer delivered came first,
				 * and there was no FIN */
				eng_set_gone(s);
				eng_fail(s, ECONNRESET, 0,
					 "peer vanished without closing");
			} else if (wc[i].status) {
				eng_fail(s, ECONNRESET, 0,
					 "provider %s: completion error (%s)",
					 s->ops->name, strerror(-wc[i].status));
			} else if (wc[i].is_recv) {
				eng_handle_recv(s, &wc[i]);
			} else {
				s->sq_out -= (uint32_t)wc[i].wr_id;
			}
		}
		total += n;
	} while (n == WC_BATCH && !(s->flags & F_DEAD));
	s->st.completions += (uint64_t)total;
	eng_flush_ctrl(s);
	if (total)
		eng_wake(s);
	return total;
}

/* ------------------------------------------------------------ liveness */

/* The CM said the peer is gone but no FIN was seen, where a completion may
 * lag behind the CM (an HCA's may: another path).  1 while the end is not
 * known yet: the provider fences the stream (a flushed receive then
 * follows whatever the peer delivered, and eng_progress ends the
 * connection when it sees one) and makes the liveness fd readable again
 * at hup_at, so that whoever watches it (eng_wait, the watcher thread, an
 * event loop) looks again then.  Nobody sleeps, and the socket's lock is
 * free meanwhile.  Not on shm: whatever the peer wrote (a FIN included) is
 * in our CQ ring before its liveness socket can close, so one poll sees it.
 * A provider that cannot fence (shm's delay fault) gets a bounded wait. */
static int eng_hup_grace(rsk_sock *s)
{
	int64_t now = eng_now_ns();

	if (s->hup_at)
		return now < s->hup_at;
	s->hup_at = now + LIVE_GRACE_NS;
	if (s->ops->hup_fence && s->ops->hup_fence(s->qp, LIVE_GRACE_NS) == 0)
		return 1;
	while (!(s->flags & (F_PEER_FIN | F_DEAD)) &&
	       eng_now_ns() < s->hup_at) {
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
		eng_progress(s);
	}
	return 0;
}

/* The liveness channel fired: closed (peer gone) or a protocol error. */
static void eng_check_live(rsk_sock *s)
{
	char b, why[sizeof(s->detail)];
	ssize_t n;

	if (s->live_fd < 0 || (s->flags & F_PEER_GONE))
		return;
	if (s->ops->live_event) {
		/* the provider's CM says (it has no reject messages) */
		if (!s->ops->live_event(s->qp))
			return;
		n = 0;
	} else {
		n = recv(s->live_fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
	}
	/* gone: take in whatever it wrote before dying, then stop watching */
	eng_progress(s);
	if ((s->flags & F_PEER_GONE) ||
	    (!(s->flags & (F_PEER_FIN | F_DEAD)) && s->kind == K_CONN &&
	     s->ops->completions_lag && s->ops->completions_lag(s->qp) &&
	     eng_hup_grace(s)))
		return; /* (ended by a fenced flush meanwhile, or not yet) */
	eng_set_gone(s);
	if (n > 0 && cm_read_reject(s->live_fd, why, sizeof(why)) == 0)
		eng_fail(s, ECONNRESET, 0, "%s", why);
	else if (n > 0)
		eng_fail(s, ECONNRESET, 1,
			 "protocol violation: data on the liveness channel");
	else if (!(s->flags & F_PEER_FIN) && !(s->flags & F_DEAD))
		eng_fail(s, ECONNRESET, 0, "peer vanished without closing");
}

/* Non-blocking look at the liveness channel; 1 if the peer is gone. */
int eng_poll_live(rsk_sock *s)
{
	struct pollfd p;

	if (s->kind != K_CONN || s->live_fd < 0)
		return 0;
	if (s->flags & F_PEER_GONE)
		return 1;
	p = (struct pollfd){ .fd = s->live_fd, .events = POLLIN | POLLRDHUP };
	if (poll(&p, 1, 0) <= 0)
		return 0;
	eng_check_live(s);
	return (s->flags & F_PEER_GONE) != 0;
}

/* A send into a ring with room never waits, so it would never learn that
 * the peer died: look at the liveness channel at most every LIVE_TICK_NS
 * (a clock read per call; a syscall per tick), as a TCP sender learns of
 * a reset when the peer's RST arrives. */
static void eng_live_tick(rsk_sock *s)
{
	int64_t now;

	if (s->kind != K_CONN || s->live_fd < 0 || (s->flags & F_PEER_GONE))
		return;
	now = eng_now_ns();
	if (now < s->live_next)
		return;
	s->live_next = now + LIVE_TICK_NS;
	eng_poll_live(s);
}

/* Watch mode: no notification can be pending on our notify fd (we are
 * armed and have not kicked it), so if the fd looked readable, the
 * liveness channel did it. */
static int eng_quiet(rsk_sock *s)
{
	return s->kind == K_CONN && !s->kicked && s->ops->armed(s->qp);
}

/* ---------------------------------------------------------------- wait */

typedef int (*eng_pred)(const rsk_sock *s);

/*
 * A thread that waits while another sleeps on the fd sleeps on a futex
 * (s->cseq), not a condition variable, so that a signal ends its sleep
 * (see "signals" at the top: the caller returns -EINTR, Python runs the
 * handler and, PEP 475, calls again with the deadline it had).
 */
void eng_wake(rsk_sock *s)
{
	if (s->cwaiters) {
		s->cseq++;
		syscall(SYS_futex, &s->cseq, FUTEX_WAKE_PRIVATE, INT_MAX,
			NULL, NULL, 0);
	}
}

/* epoll_wait, and (sigfd >= 0) a signal's byte in sigfd ends it with
 * EINTR (drained) */
static int eng_epoll_wait(int epfd, int sigfd, struct epoll_event *ev,
			  int max, int ms)
{
	struct pollfd p[2];

	if (sigfd < 0)
		return epoll_wait(epfd, ev, max, ms);
	p[0] = (struct pollfd){ .fd = epfd, .events = POLLIN };
	p[1] = (struct pollfd){ .fd = sigfd, .events = POLLIN };
	if (poll(p, 2, ms) < 0)
		return -1;
	if (eng_sig_came(sigfd)) {
		errno = EINTR;
		return -1;
	}
	return p[0].revents ? epoll_wait(epfd, ev, max, 0) : 0;
}

/* Sleep until eng_wake, the deadline or a signal (-EINTR); s->lock held
 * on entry and exit, not meanwhile. */
static int eng_sleep(rsk_sock *s, int64_t deadline)
{
	uint32_t seq = s->cseq;
	struct timespec ts, *tsp = NULL;
	long r;
	int e;

	if (deadline >= 0) {
		int64_t d = deadline - eng_now_ns();

		if (d <= 0)
			return 0;
		ts.tv_sec = d / 1000000000;
		ts.tv_nsec = d % 1000000000;
		tsp = &ts;
	}
	s->cwaiters++;
	pthread_mutex_unlock(&s->lock);
	r = syscall(SYS_futex, &s->cseq, FUTEX_WAIT_PRIVATE, seq, tsp, NULL,
		    0);
	e = errno;
	pthread_mutex_lock(&s->lock);
	s->cwaiters--;
	return r < 0 && e == EINTR ? -EINTR : 0;
}

/*
 * Wait until ready(s), with s->lock held on entry and exit.  Spins for
 * opts.spin_us first (polling the CQ, yielding the CPU between polls so a
 * peer on the same core can run), then arms, re-polls and sleeps.
 * Returns 0 when ready, -EAGAIN (non-blocking), -ETIMEDOUT, -EINTR or
 * -EBADF (closed meanwhile).
 */
static int eng_wait(rsk_sock *s, eng_pred ready, int64_t deadline, int nb)
{
	struct epoll_event ev[4];
	int64_t spin_end = 0, sig_look = 0;
	int sigfd = eng_my_sigfd();
	int n, i, rc;

	for (;;) {
		eng_progress(s);
		if (s->closed)
			return -EBADF;
		if (ready(s))
			return 0;
		if (nb || (deadline >= 0 && eng_now_ns() >= deadline)) {
			/* before giving up: did the peer vanish meanwhile?  In
			 * watch mode only when our notify fd cannot be what
			 * made the fd readable (then it was the liveness
			 * channel): no syscall on the common EAGAIN */
			if ((!(s->watch & RSK_WATCH_NOTIFY) || eng_quiet(s)) &&
			    eng_poll_live(s) &&
			    ready(s))
				return 0;
			return nb ? -EAGAIN : -ETIMEDOUT;
		}
		if (s->kind == K_CONN && s->opts.spin_us && spin_end >= 0) {
			int64_t now = eng_now_ns();

			if (!spin_end) {
				spin_end = now + (int64_t)s->opts.spin_us * 1000;
				sig_look = now + SPIN_SIG_LOOK_NS;
			}
			if (now >= sig_look && now < spin_end) {
				/* a long spin looks for signals now and then */
				sig_look = now + SPIN_SIG_LOOK_NS;
				if (eng_sig_came(sigfd))
					return -EINTR;
			}
			if (now < spin_end) {
				int hit = s->ops->cq_pending(s->qp);

				if (!hit) {
					pthread_mutex_unlock(&s->lock);
					sched_yield();
					pthread_mutex_lock(&s->lock);
				} else {
					s->st.spins++;
				}
				continue;
			}
			spin_end = -1;
			if (eng_sig_came(sigfd))
				return -EINTR; /* handled while we spun */
		}
		if (s->fd_waiter) {
			/* someone sleeps on the fd; it wakes us on progress */
			if (eng_sig_came(sigfd) ||
			    eng_sleep(s, deadline) == -EINTR)
				return -EINTR;
			continue;
		}
		s->fd_waiter = 1;
		if (s->kind == K_CONN && !(s->flags & F_DEAD)) {
			s->ops->arm(s->qp);
			s->st.arms++;
			if (eng_progress(s) || ready(s)) {
				s->ops->disarm(s->qp);
				s->fd_waiter = 0;
				continue;
			}
		}
		s->st.sleeps++;
		pthread_mutex_unlock(&s->lock);
		n = eng_epoll_wait(s->epfd, sigfd, ev, 4, eng_ms_left(deadline));
		rc = n < 0 ? -errno : 0;
		pthread_mutex_lock(&s->lock);
		s->fd_waiter = 0;
		if (s->kind == K_CONN && !s->released) {
			s->ops->ack(s->qp);
			s->kicked = 0;
			for (i = 0; i < n; i++)
				if (ev[i].data.fd == s->live_fd)
					eng_check_live(s);
		}
		eng_wake(s);
		if (rc == -EINTR)
			return rc;
	}
}

/* ------------------------------------------------------------ send/recv */

static int send_ready(const rsk_sock *s)
{
	return eng_writable(s);
}

static int recv_ready(const rsk_sock *s)
{
	return !s->rx_busy && eng_readable(s);
}

/* A dead connection reports its error once (as TCP reports a reset once,
 * then EOF and EPIPE); SO_ERROR may take it first. */
static int eng_take_dead(rsk_sock *s, int after)
{
	int e = s->so_error;

	s->so_error = 0;
	return e ? -e : after;
}

/* Error a send should report now, or 0.  keep: bytes already went out in
 * this call (which returns their count), so the error stays pending for
 * the next call, as TCP reports a reset after a partial send. */
static int send_error(rsk_sock *s, int keep)
{
	if (s->kind != K_CONN)
		return -EPIPE;
	if (s->flags & F_DEAD)
		return keep ? -EPIPE : eng_take_dead(s, -EPIPE);
	if (s->flags & F_WR_SHUT)
		return -EPIPE;
	if (s->flags & F_PEER_GONE)
		return (s->flags & F_PEER_FIN) ? -EPIPE : -ECONNRESET;
	return 0;
}

ssize_t rsk_send(rsk_sock *s, const void *buf, size_t len, int flags,
		 int timeout_ms)
{
	const uint8_t *p = buf;
	int64_t deadline = eng_deadline(timeout_ms);
	int nb = timeout_ms == 0 || (flags & RSK_F_DONTWAIT);
	size_t done = 0;
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_CONN && (s->flags & F_PEER_FIN) &&
	    !(s->flags & F_PEER_GONE))
		eng_check_live(s); /* a peer that closed makes sends fail */
	else
		eng_live_tick(s);
	if (s->kind == K_CONN &&
	    (s->flags & (F_PEER_FIN | F_PEER_GONE | F_DEAD | F_WR_SHUT |
			 F_SENT_LATE)) == (F_PEER_FIN | F_PEER_GONE)) {
		/* The peer closed in order and is gone.  TCP's first send then
		 * still goes out (the peer's kernel answers it with a reset),
		 * and only later ones fail with EPIPE: the same here, the
		 * bytes being dropped (a zero-length send changes nothing). */
		if (len)
			s->flags |= F_SENT_LATE;
		eng_leave(s);
		return (ssize_t)len;
	}
	while ((rc = send_error(s, done > 0)) == 0 && (done < len || len == 0)) {
		uint64_t space;
		uint32_t n, credits;
		struct iovec iov;

		if (len == 0)
			break;
		eng_progress(s);
		if ((rc = send_error(s, done > 0)))
			break;
		if (s->rs) {
			space = rs_send_room(s);
			credits = space ? CREDIT_RESERVE + 1 : 0;
		} else {
			space = ring_contig_space(s->s_acked, s->s_tail,
						  s->peer_rsize);
			credits = eng_credits(s);
		}
		if (space == 0 || credits <= CREDIT_RESERVE) {
			if (space == 0)
				s->st.space_stalls++;
			else
				s->st.credit_stalls++;
			if (done && nb)
				break;
			rc = eng_wait(s, send_ready, deadline, nb);
			if (rc)
				break;
			continue;
		}
		n = (uint32_t)(len - done < space ? len - done : space);
		if (n > ENG_MAX_MSG)
			n = ENG_MAX_MSG;
		iov.iov_base = (void *)(p + done);
		iov.iov_len = n;
		if (s->rs)
			rc = rs_post_data(s, p + done, n);
		else
			rc = eng_post(s, &iov, 1,
				      s->peer_ring_off +
					      ring_off(s->s_tail, s->peer_rsize),
				      IMM(OP_DATA, n),
				      n <= s->opts.inline_max);
		if (rc) {
			rc = done ? -ECONNRESET : eng_take_dead(s, -EPIPE);
			break;
		}
		s->s_tail += n;
		s->st.tx_msgs++;
		s->st.tx_bytes += n;
		done += n;
	}
	eng_leave(s);
	if (done)
		return (ssize_t)done;
	return rc == -ETIMEDOUT && nb ? -EAGAIN : rc;
}

/* Error or EOF (returns 0) a receive with no data should report.  keep:
 * this call already copied bytes (and returns them): a pending error stays
 * for the next call instead of turning into EOF. */
static int recv_end(rsk_sock *s, int keep)
{
	if (s->kind != K_CONN)
		return -ENOTCONN;
	if (s->flags & F_DEAD)
		return keep && s->so_error ? -s->so_error : eng_take_dead(s, 0);
	if (s->flags & (F_PEER_FIN | F_RD_SHUT))
		return 0;
	if (s->flags & F_PEER_GONE)
		return -ECONNRESET;
	return 1; /* nothing to report: wait */
}

/* Consume n bytes at the head and return credits as due. */
static void eng_consume(rsk_sock *s, size_t n)
{
	s->r_head += n;
	if (s->rs) {
		rs_consumed(s);
		if (rs_credit_due(s))
			eng_flush_ctrl(s);
	} else if (s->r_head - s->r_credited >= eng_credit_bytes(s)) {
		eng_flush_ctrl(s);
	}
}

/* Wait for data; returns bytes readable (> 0), 0 at EOF, or -errno.
 * keep: see recv_end. */
static ssize_t recv_wait(rsk_sock *s, int flags, int64_t deadline, int keep)
{
	int nb = (flags & RSK_F_DONTWAIT) || deadline == -2;
	int rc;

	for (;;) {
		if (!s->rx_busy && s->r_tail != s->r_head)
			return (ssize_t)(s->r_tail - s->r_head);
		if (!s->rx_busy && (rc = recv_end(s, keep)) <= 0)
			return rc;
		rc = eng_wait(s, recv_ready, deadline, nb);
		if (rc)
			return rc;
	}
}

ssize_t rsk_recv(rsk_sock *s, void *buf, size_t len, int flags,
		 int timeout_ms)
{
	int64_t deadline = timeout_ms == 0 ? -2 : eng_deadline(timeout_ms);
	uint8_t *p = buf;
	size_t done = 0;
	ssize_t avail;
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (len == 0) {
		rc = s->kind != K_CONN ? -ENOTCONN : 0;
		eng_leave(s);
		return rc;
	}
	for (;;) {
		avail = recv_wait(s, done ? flags | RSK_F_DONTWAIT : flags,
				  deadline, done > 0);
		if (avail <= 0)
			break;
		while (avail > 0 && done < len) {
			uint64_t head = s->r_head + ((flags & RSK_F_PEEK) ? done : 0);
			uint32_t c = ring_contig_data(head, s->r_tail, s->rsize);
			size_t n = len - done < c ? len - done : c;

			memcpy(p + done, s->ring + ring_off(head, s->rsize), n);
			done += n;
			avail -= (ssize_t)n;
			if (!(flags & RSK_F_PEEK))
				eng_consume(s, n);
		}
		if (done == len || !(flags & RSK_F_WAITALL) ||
		    (flags & RSK_F_PEEK))
			break;
		/* WAITALL: go on blocking for the rest */
		avail = recv_wait(s, flags, deadline, done > 0);
		if (avail <= 0)
			break;
	}
	eng_leave(s);
	if (done)
		return (ssize_t)done;
	return avail == -ETIMEDOUT && deadline == -2 ? -EAGAIN : avail;
}

ssize_t rsk_recv_zc(rsk_sock *s, size_t len, int flags, int timeout_ms,
		    const void **ptr)
{
	int64_t deadline = timeout_ms == 0 ? -2 : eng_deadline(timeout_ms);
	ssize_t avail;
	uint32_t c;
	int rc;

	/* *ptr is written only on success: another thread's zero-copy
	 * receive may share the out-pointer (it waits on rx_busy) */
	if ((rc = eng_enter(s)))
		return rc;
	avail = recv_wait(s, flags, deadline, 0);
	if (avail > 0 && len > 0) {
		c = ring_contig_data(s->r_head, s->r_tail, s->rsize);
		avail = (ssize_t)(len < c ? len : c);
		*ptr = s->ring + ring_off(s->r_head, s->rsize);
		s->rx_busy = 1;
		s->users++; /* the held head keeps the rings alive */
	} else if (avail > 0) {
		avail = 0;
	}
	eng_leave(s);
	return avail;
}

int rsk_recv_done(rsk_sock *s, size_t n)
{
	int rc = 0;

	eng_lock(s);
	if (!s->rx_busy) {
		pthread_mutex_unlock(&s->lock);
		return -EINVAL;
	}
	s->rx_busy = 0;
	if (!s->closed && !s->released) {
		if (n > s->r_tail - s->r_head)
			rc = -EINVAL;
		else
			eng_consume(s, n);
		/* a receiver that slept as fd waiter while we held the head
		 * must look again: wake it */
		if (s->fd_waiter && s->kind == K_CONN)
			s->ops->kick(s->qp);
	}
	eng_wake(s);
	eng_leave(s); /* drops the user taken by rsk_recv_zc */
	return rc;
}

/* ------------------------------------------------------------- control */

int rsk_shutdown(rsk_sock *s, int how)
{
	int rc;

	if (how < RSK_SHUT_RD || how > RSK_SHUT_RDWR)
		return -EINVAL;
	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_CONN) {
		rc = -ENOTCONN;
	} else {
		if (how != RSK_SHUT_WR) {
			s->flags |= F_RD_SHUT;
			eng_wake(s);
			if (s->fd_waiter)
				s->ops->kick(s->qp);
		}
		if (how != RSK_SHUT_RD && !(s->flags & F_WR_SHUT)) {
			s->flags |= F_WR_SHUT;
			s->pending |= P_FIN;
			eng_progress(s);
			eng_flush_ctrl(s);
			/* a sender blocked in another thread fails now (EPIPE) */
			eng_wake(s);
			if (s->fd_waiter)
				s->ops->kick(s->qp);
		}
	}
	eng_leave(s);
	return rc;
}

int rsk_poll(rsk_sock *s)
{
	int rev = 0;

	eng_lock(s);
	if (s->closed || (eng_forked(s) && !eng_claim(s))) {
		pthread_mutex_unlock(&s->lock);
		return RSK_POLLERR;
	}
	if (s->kind == K_CONN) {
		eng_progress(s);
		if (eng_readable(s))
			rev |= RSK_POLLIN;
		if (eng_writable(s))
			rev |= RSK_POLLOUT;
		if (s->flags & F_DEAD)
			rev |= RSK_POLLERR;
		if ((s->flags & F_PEER_GONE) ||
		    ((s->flags & F_PEER_FIN) && (s->flags & F_WR_SHUT)))
			rev |= RSK_POLLHUP;
	} else if (s->kind == K_LISTEN) {
		struct pollfd pfd[RSK_MAX_NAMES];
		int i;

		for (i = 0; i < s->nlfd; i++)
			pfd[i] = (struct pollfd){ .fd = s->lfd[i], .events = POLLIN };
		if (poll(pfd, (nfds_t)s->nlfd, 0) > 0)
			rev |= RSK_POLLIN;
	}
	pthread_mutex_unlock(&s->lock);
	return rev;
}

static int any_ready(const rsk_sock *s)
{
	return eng_readable(s) || eng_writable(s);
}

int rsk_wait(rsk_sock *s, int events, int timeout_ms)
{
	eng_pred pred;
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_CONN) {
		eng_leave(s);
		return -ENOTCONN;
	}
	if ((events & RSK_POLLIN) && (events & RSK_POLLOUT))
		pred = any_ready;
	else if (events & RSK_POLLOUT)
		pred = send_ready;
	else
		pred = recv_ready;
	rc = eng_wait(s, pred, eng_deadline(timeout_ms), timeout_ms == 0);
	eng_leave(s);
	if (rc == -ETIMEDOUT || rc == -EAGAIN)
		return 0;
	return rc < 0 ? rc : rsk_poll(s);
}

int rsk_take_error(rsk_sock *s)
{
	int e;

	eng_lock(s);
	e = s->so_error;
	s->so_error = 0;
	if (s->refused) {
		/* the caller read the refused connect's outcome: fa's pending
		 * error goes too, as SO_ERROR clears a TCP socket's (it still
		 * polls readable, writable and hung up) */
		int fe;
		socklen_t n = sizeof(fe);

		getsockopt(s->fa, SOL_SOCKET, SO_ERROR, &fe, &n);
	}
	pthread_mutex_unlock(&s->lock);
	return e;
}

const char *rsk_detail(rsk_sock *s)
{
	return s->detail;
}

int rsk_stats(rsk_sock *s, struct rsk_stats *st)
{
	eng_lock(s);
	*st = s->st;
	if (s->kind == K_CONN && !s->released)
		st->notifies_sent = s->ops->notifies_sent(s->qp);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Polling is not a use: on a connection that crossed a fork and that
 * this process has not claimed, what to watch is only noted (*field =
 * v, returns 1), to take effect once a real call claims it; the process
 * that owns it, if any, keeps it. */
static int eng_note_unowned(rsk_sock *s, int *field, int v)
{
	int noted = 0;

	eng_lock(s);
	if (!s->closed && eng_forked(s) && !eng_owned(s)) {
		*field = v;
		noted = 1;
	}
	pthread_mutex_unlock(&s->lock);
	return noted;
}

int rsk_set_watch(rsk_sock *s, int on)
{
	int rc;

	if (on & ~(RSK_WATCH_NOTIFY | RSK_WATCH_FD))
		return -EINVAL;
	if (eng_note_unowned(s, &s->watch, on))
		return 0;
	if ((rc = eng_enter(s)))
		return rc;
	if ((s->watch & RSK_WATCH_FD) && !(on & RSK_WATCH_FD))
		eng_watch_del(s);
	s->watch = on;
	eng_leave(s); /* syncs the fds */
	return 0;
}

int rsk_set_dialing(rsk_sock *s, int on)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_NEW)
		s->dialing = on != 0;
	else
		rc = on ? -EISCONN : 0;
	eng_leave(s); /* syncs the fd */
	return rc;
}

int rsk_set_refused(rsk_sock *s)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_NEW) {
		rc = -EISCONN;
	} else if (s->fb >= 0) {
		/* as a reset connection's (eng_sync_pair): fb closes with the
		 * filler queued, so fa gets a pending error and hangs up */
		close(s->fb);
		s->fb = -1;
		s->refused = 1;
	}
	eng_leave(s);
	return rc;
}

/* After rsk_set_refused, the next connect or listen needs a live fa: a new
 * socketpair, its first end moved onto fa's number.  (Pollers that
 * registered the old fa lose it, as its file is gone.) */
int eng_fd_renew(rsk_sock *s)
{
	int fab[2];

	if (!s->refused)
		return 0;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
		       fab) < 0)
		return -errno;
	if (dup3(fab[0], s->fa, O_CLOEXEC) < 0) {
		int rc = -errno;

		close(fab[0]);
		close(fab[1]);
		return rc;
	}
	close(fab[0]);
	s->fb = fab[1];
	s->tok = 0;
	s->filled = 0;
	s->refused = 0;
	eng_fd_init(s);
	return 0;
}

int rsk_set_interest(rsk_sock *s, int events)
{
	int rc;

	if (events & ~(RSK_POLLIN | RSK_POLLOUT))
		return -EINVAL;
	if (eng_note_unowned(s, &s->interest, events))
		return 0;
	if ((rc = eng_enter(s)))
		return rc;
	s->interest = events;
	eng_leave(s); /* syncs the fd */
	return 0;
}

/* ---------------------------------------------------- connection setup */

int eng_attach(rsk_sock *s, struct cm_result *res)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int rc;

	s->ops = res->ops;
	s->qp = res->qp;
	s->live_fd = res->live_fd;
	s->lctrl = res->area;
	s->opts.ring_size = s->rsize = res->ring;
	s->opts.qdepth = s->lq = res->q;
	s->ring = res->area + prov_ctrl_len(s->lq);
	s->peer_rsize = res->peer_ring;
	s->peer_q = res->peer_q;
	s->peer_ring_off = prov_ctrl_len(res->peer_q);
	s->laddr = res->dst;
	s->paddr = res->src;
	if (res->rs) {
		/* rsockets peer: the area is the bare ring; the peer's first
		 * buffer is in our target SGL's entry 0 */
		s->rs_mq = calloc((size_t)s->lq + 1, sizeof(*s->rs_mq));
		if (!s->rs_mq) {
			errno = ENOMEM;
			goto fail;
		}
		s->rs = 1;
		s->lctrl = NULL;
		s->ring = res->area;
		s->rs_tsgl = res->rs_tsgl;
		s->rs_rbuf_addr = res->rs_rbuf_addr;
		s->rs_rbuf_key = res->rs_rbuf_key;
		s->rs_pub = s->rsize >> 1; /* the half the handshake gave */
		s->rs_sgl_addr = res->rs_sgl_addr;
		s->rs_sgl_key = res->rs_sgl_key;
		s->rs_sgl_len = res->rs_sgl_len;
		s->rs_rsge = 1 % res->rs_sgl_len;
		s->rs_sseq_comp = (uint16_t)res->peer_q;
		s->rs_rseq_comp = (uint16_t)(s->lq >> 1);
	}
	s->r_reposted = s->lq;
	s->r_limit_sent = s->lq;
	s->s_limit = res->peer_q;
	ev.data.fd = s->ops->notify_fd(s->qp);
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) < 0)
		goto fail;
	ev.events = EPOLLIN | EPOLLRDHUP;
	ev.data.fd = s->live_fd;
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->live_fd, &ev) < 0)
		goto fail;
	res->qp = NULL;
	res->live_fd = -1;
	eng_fork_stamp(s, 0);
	eng_fork_own(s);
	s->kind = K_CONN;
	s->flags = F_CONN;
	if (s->rs)
		eng_flush_ctrl(s); /* publish the other half at once */
	return 0;
fail:
	rc = -errno;
	free(s->rs_mq);
	s->rs_mq = NULL;
	s->rs = 0;
	s->ops = NULL;
	s->qp = NULL;
	s->live_fd = -1;
	return rc;
}

/* Dials d through the manager that takes it (cm.h: a rendezvous name, or
 * with none the addresses). */
static int eng_connect(rsk_sock *s, const struct cm_dial *d)
{
	const struct cm_ops *cm = cm_for(d);
	struct cm_result res;
	struct rsk_opts o;
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_CONN)
		rc = -EISCONN;
	else if (s->kind == K_LISTEN)
		rc = -EINVAL;
	else
		rc = eng_fd_renew(s);
	if (rc)
		goto out;
	o = s->opts;
	/* the handshake runs unlocked: close() may interrupt it */
	s->detail[0] = 0;
	pthread_mutex_unlock(&s->lock);
	rc = cm->connect(d, &o, &res, s->detail, sizeof(s->detail));
	pthread_mutex_lock(&s->lock);
	if (rc)
		goto out;
	if (s->closed) {
		cm_result_release(&res);
		rc = -EBADF;
		goto out;
	}
	rc = eng_attach(s, &res);
	if (rc)
		cm_result_release(&res);
out:
	eng_leave(s);
	return rc;
}

int rsk_connect(rsk_sock *s, const char *name, size_t namelen,
		const struct rsk_addr *src, const struct rsk_addr *dst,
		int timeout_ms)
{
	struct cm_dial d = { .name = name, .namelen = namelen, .src = src,
			     .dst = dst, .timeout_ms = timeout_ms };

	if (!name)
		return -EINVAL;
	return eng_connect(s, &d);
}

/* ------------------------------------------------------ verbs provider */

int rsk_verbs_probe(char *detail, size_t dlen)
{
	struct cm_dial by_addr = { .name = NULL };
	char why[160] = "";
	int rc = cm_for(&by_addr)->probe(why, sizeof(why));

	if (detail && dlen)
		snprintf(detail, dlen, "%s", why);
	return rc;
}

int rsk_connect_verbs(rsk_sock *s, const struct rsk_addr *src,
		      const struct rsk_addr *dst, int flags, int timeout_ms)
{
	struct cm_dial d = { .src = src, .dst = dst, .flags = flags,
			     .timeout_ms = timeout_ms };

	return eng_connect(s, &d);
}

int rsk_addrs(rsk_sock *s, struct rsk_addr *local, struct rsk_addr *peer)
{
	int rc = 0;

	eng_lock(s);
	if (s->kind != K_CONN) {
		rc = -ENOTCONN;
	} else {
		*local = s->laddr;
		*peer = s->paddr;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

const char *rsk_provider(rsk_sock *s)
{
	const char *n = "";

	eng_lock(s);
	if (s->kind == K_CONN && s->ops)
		n = s->ops->name;
	pthread_mutex_unlock(&s->lock);
	return n;
}

/* ---------------------------------------------------------------- close */

/* Frees rings and fds; s->lock held, no user left. */
static void eng_release(rsk_sock *s)
{
	int i;

	if (s->released)
		return;
	s->released = 1;
	eng_watch_del(s);
	if (s->qp)
		s->ops->destroy(s->qp);
	s->qp = NULL;
	if (s->live_fd >= 0)
		close(s->live_fd);
	s->live_fd = -1;
	for (i = 0; i < s->nlfd; i++)
		close(s->lfd[i]);
	s->nlfd = 0;
	for (i = 0; i < s->npend; i++)
		close(s->pend[i].fd);
	s->npend = 0;
	free(s->pend);
	s->pend = NULL;
	if (s->vl)
		cm_verbs_listen_close(s->vl);
	s->vl = NULL;
	free(s->rs_mq);
	s->rs_mq = NULL;
	s->xfd = -1; /* not ours */
	close(s->epfd);
	s->epfd = -1;
	close(s->fa);
	s->fa = -1;
	if (s->fb >= 0)
		close(s->fb);
	s->fb = -1;
}

int rsk_close(rsk_sock *s)
{
	eng_lock(s);
	if (s->closed) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	if (s->kind == K_CONN && !(s->flags & F_DEAD) && !eng_forked(s)) {
		eng_progress(s);
		/* unread data makes close abortive, as with TCP */
		if (s->r_tail != s->r_head && !(s->flags & F_DEAD) &&
		    eng_ctrl_room(s, 0)) {
			eng_fail(s, ECONNRESET, 1, "closed with unread data");
		} else if (!(s->flags & F_WR_SHUT) || (s->pending & P_FIN)) {
			s->flags |= F_WR_SHUT;
			s->pending |= P_FIN;
			eng_flush_ctrl(s);
		}
	}
	s->closed = 1;
	eng_wake(s);
	if (s->users == 0) {
		eng_release(s);
	} else if (s->kind == K_CONN && s->qp && !eng_forked(s)) {
		s->ops->kick(s->qp); /* wake the thread in epoll_wait */
	} else if (s->kind == K_LISTEN && !eng_listen_shared(s)) {
		/* wake accept: shutting the listeners down makes them readable
		 * (not those other processes may accept from too; accept's wait
		 * there is bounded: eng_accept_wait_ms) */
		int i;

		for (i = 0; i < s->nlfd; i++)
			shutdown(s->lfd[i], SHUT_RDWR);
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

void rsk_free(rsk_sock *s)
{
	if (!s)
		return;
	rsk_close(s);
	eng_lock(s);
	if (s->users) {
		/* cannot happen through the Python layer (the handle outlives
		 * every call); leak rather than free memory in use */
		pthread_mutex_unlock(&s->lock);
		return;
	}
	pthread_mutex_unlock(&s->lock);
	eng_watch_forget(s);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
