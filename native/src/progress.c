// SPDX-License-Identifier: MIT
/*
 * progress.c - what moves a connection along without an API call: its
 * provider's completions handed to the protocol (eng_progress), the peer's
 * liveness channel, and waking the threads that sleep on the socket.  Run
 * under the socket's lock by the API calls (conn.c), the watcher thread
 * (readiness.c) and close (sock.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>

#include "engine.h"
#include "ring.h"

#define WC_BATCH 32

/* Wake the threads that sleep on s if the protocol changed something they
 * wait for (proto.wake). */
void eng_wake_due(rsk_sock *s)
{
	if (s->p.wake) {
		s->p.wake = 0;
		eng_wake(s);
	}
}

/* The peer is gone: stop watching its liveness channel (eng_wait polls it
 * no more). */
static void eng_set_gone(rsk_sock *s)
{
	s->p.flags |= F_PEER_GONE;
	eng_wake(s);
}

/* Reap and handle completions, then send due control messages.
 * Returns the number of completions handled. */
int eng_progress(rsk_sock *s)
{
	struct prov_wc wc[WC_BATCH];
	uint64_t tail = s->p.r_tail;
	int n, i, total = 0;

	if (s->kind != K_CONN || (s->p.flags & F_DEAD))
		return 0;
	do {
		n = s->p.ops->poll_cq(s->p.qp, wc, WC_BATCH);
		s->st.cq_polls++;
		for (i = 0; i < n && !(s->p.flags & F_DEAD); i++)
			if (proto_complete(&s->p, &wc[i], s->hup_at != 0))
				eng_set_gone(s);
		total += n;
	} while (n == WC_BATCH && !(s->p.flags & F_DEAD));
	s->st.completions += (uint64_t)total;
	if (!(s->p.flags & F_DEAD))
		total += proto_take_written(&s->p);
	if (s->p.r_tail != tail &&
	    (s->p.flags & (F_RD_SHUT | F_WR_SHUT)) == (F_RD_SHUT | F_WR_SHUT)) {
		/* data after our shutdown(SHUT_RDWR): Linux TCP answers with a
		 * reset (FIN_WAIT with the receive side shut) and drops it:
		 * so do we (what was unread from before stays readable; a
		 * reset the peer sent after it already ended us) */
		s->p.r_tail = tail;
		proto_fail(&s->p, ECONNRESET, 1,
			   "data arrived after shutdown(SHUT_RDWR)");
	}
	proto_flush(&s->p);
	if (total)
		s->p.wake = 1;
	eng_wake_due(s);
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
	if (s->p.ops->hup_fence && s->p.ops->hup_fence(s->p.qp, LIVE_GRACE_NS) == 0)
		return 1;
	while (!(s->p.flags & (F_PEER_FIN | F_DEAD)) &&
	       eng_now_ns() < s->hup_at) {
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
		eng_progress(s);
	}
	return 0;
}

/*
 * Reads what the peer sent on the liveness socket: one record if it is a
 * bell (one byte: it wrote into our ring while we were armed), which is
 * taken off and forgotten; else what the record says of the connection's
 * end: hang-up (the end of the stream), a REJ (why filled), or anything
 * else (a protocol violation).  One record a call (one syscall: a bell per
 * wake-up is the common case): more bells keep the fd readable, and
 * whoever watches it comes back.  Fds sent along are never installed (no
 * control buffer).
 */
int eng_live_read(int fd, char *why, size_t wlen)
{
	char buf[CM_MSG_LEN + 1];
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	n = recvmsg(fd, &mh, MSG_DONTWAIT);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? LIVE_QUIET : LIVE_HUP;
	if (n == 1 && buf[0] == SHM_BELL && !(mh.msg_flags & MSG_CTRUNC))
		return LIVE_QUIET;
	if (n == 0)
		return LIVE_HUP; /* (a hostile empty record too: it may as well
				  * have closed) */
	return !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
			       cm_parse_reject(buf, (size_t)n, why, wlen) == 0
		       ? LIVE_REJ
		       : LIVE_BAD;
}

/* The liveness channel fired: closed (peer gone) or a protocol error.
 * Bells on it (bell mode, or a peer in bell mode that rings us) are read
 * only by whoever sleeps on it (the fd_waiter) while there is one, or they
 * would be lost to it: another caller then only looks for a hang-up. */
void eng_check_live(rsk_sock *s)
{
	char why[sizeof(s->detail)];
	int what;

	if (s->live_fd < 0 || (s->p.flags & F_PEER_GONE))
		return;
	if (s->p.ops->live_event) {
		/* the provider's CM says (it has no reject messages) */
		if (!s->p.ops->live_event(s->p.qp))
			return;
		what = LIVE_HUP;
	} else {
		if (s->fd_waiter) {
			struct pollfd p = { .fd = s->live_fd,
					    .events = POLLRDHUP };

			if (poll(&p, 1, 0) <= 0 ||
			    !(p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
				return;
		}
		what = eng_live_read(s->live_fd, why, sizeof(why));
		if (what == LIVE_QUIET) {
			s->live_drained = 1;
			return;
		}
	}
	/* gone: take in whatever it wrote before dying, then stop watching */
	eng_progress(s);
	if ((s->p.flags & F_PEER_GONE) ||
	    (what == LIVE_HUP && !(s->p.flags & (F_PEER_FIN | F_DEAD)) &&
	     s->kind == K_CONN && s->p.ops->completions_lag &&
	     s->p.ops->completions_lag(s->p.qp) && eng_hup_grace(s)))
		return; /* (ended by a fenced flush meanwhile, or not yet) */
	eng_set_gone(s);
	if (what == LIVE_REJ)
		eng_fail(s, ECONNRESET, 0, "%s", why);
	else if (what == LIVE_BAD)
		eng_fail(s, ECONNRESET, 1,
			 "protocol violation: a record on the liveness "
			 "channel that is neither a bell nor a refusal");
	else if (!(s->p.flags & F_PEER_FIN) && !(s->p.flags & F_DEAD)) {
		proto_vanished(&s->p);
		eng_wake_due(s);
	}
}

void eng_ack(rsk_sock *s)
{
	/* with bells, the provider's notify fd turns readable only by our
	 * kick (or, under the delay fault, its timer: a wait fd of its own) */
	if (!s->bell || s->kicked || eng_wait_fd(s) >= 0)
		s->p.ops->ack(s->p.qp);
	s->kicked = 0;
	if (s->bell)
		eng_check_live(s);
}

/* Non-blocking look at the liveness channel; 1 if the peer is gone. */
int eng_poll_live(rsk_sock *s)
{
	struct pollfd p;

	if (s->kind != K_CONN || s->live_fd < 0)
		return 0;
	if (s->p.flags & F_PEER_GONE)
		return 1;
	p = (struct pollfd){ .fd = s->live_fd, .events = POLLIN | POLLRDHUP };
	if (poll(&p, 1, 0) <= 0)
		return 0;
	eng_check_live(s);
	return (s->p.flags & F_PEER_GONE) != 0;
}

/* A send into a ring with room never waits, so it would never learn that
 * the peer died: look at the liveness channel at most every LIVE_TICK_NS
 * (a clock read per call; a syscall per tick), as a TCP sender learns of
 * a reset when the peer's RST arrives. */
void eng_live_tick(rsk_sock *s)
{
	int64_t now;

	if (s->kind != K_CONN || s->live_fd < 0 || (s->p.flags & F_PEER_GONE))
		return;
	now = eng_now_ns();
	if (now < s->live_next)
		return;
	s->live_next = now + LIVE_TICK_NS;
	eng_poll_live(s);
}

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
