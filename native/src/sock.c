// SPDX-License-Identifier: MIT
/*
 * sock.c - the socket object: made (rsk_socket), entered and left by every
 * API call (eng_enter/eng_leave: its lock, the user count, fileno() brought
 * up to date), attached to the connection a connection manager made
 * (eng_attach), closed and freed.  Below the API files (conn.c,
 * listener.c): it calls down into the protocol, readiness, fork and
 * progress code, never up.
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
	/* a blocking call's spin before it sleeps, at most (adapted per
	 * connection: eng_spin_adapt): a little more than a Python peer takes
	 * between two messages here (a server's answer: 100-200 us; a
	 * requests client's next request: ~350 us) */
	o->spin_us = 500;
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

	eng_fork_init();
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	eng_fork_stamp(s, 1);
	/* No fd yet: a connection needs only what its connection manager
	 * makes; the epoll fd comes with listen(), fileno()'s pair with
	 * the first fileno() (eng_fd_make). */
	s->epfd = -1;
	s->fa = -1;
	s->fb = -1;
	s->wslot = -1;
	pthread_mutex_init(&s->lock, NULL);
	s->live_fd = -1;
	s->waiter_kfd = -1;
	s->spin_ns = -1;
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
			       *s->p.ops->owner_word(s->p.qp));
		pthread_mutex_unlock(&s->lock);
		return -EBADF;
	}
	s->users++;
	return 0;
}

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
	int rc;

	/* not eng_enter: asking for the fd is no use of a connection that
	 * crossed a fork (it does not claim it) */
	eng_lock(s);
	if (s->released) {
		rc = -EBADF;
	} else if (s->fa >= 0) {
		rc = s->fa;
		/* made before a fork: this process's watcher follows it too
		 * while nobody has claimed it (the parent's stops when the
		 * parent closes its copy) */
		if (!s->closed && eng_forked(s) && !eng_owned(s))
			eng_watch_unowned(s);
	} else {
		rc = eng_fd_make(s);
		/* made now: show the state it must (as eng_leave does) */
		if (rc >= 0 && !s->closed && (!eng_forked(s) || eng_owned(s)))
			eng_sync_fd(s);
		else if (rc >= 0)
			eng_watch_unowned(s);
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int rsk_fileno_onto(rsk_sock *s, int fd)
{
	int rc, fl;

	if (fd < 0)
		return -EBADF;
	eng_lock(s);
	if (s->released || s->closed) {
		rc = -EBADF;
	} else if ((rc = eng_fd_make(s)) >= 0 && rc != fd) {
		fl = fcntl(rc, F_GETFL);
		if (dup3(rc, fd, O_CLOEXEC) < 0) {
			rc = -errno;
		} else {
			eng_fd_set_nonblock(fd, fl >= 0 && (fl & O_NONBLOCK));
			close(s->fa);
			s->fa = rc = fd;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int rsk_fd_blocking(rsk_sock *s, int blocking)
{
	int rc = 0;

	eng_lock(s);
	if (s->released || s->fa < 0) {
		rc = -EBADF;
	} else {
		eng_fd_set_nonblock(s->fa, !blocking);
		s->fd_mode = 1;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

const char *rsk_detail(rsk_sock *s)
{
	return s->detail;
}

/* ---------------------------------------------------- connection setup */

int eng_attach(rsk_sock *s, struct cm_result *res)
{
	struct proto_geom g = {
		.pers = res->rs ? &proto_rsockets : &proto_rsock,
		.area = res->area,
		.ring = res->ring,
		.q = res->q,
		.peer_ring = res->peer_ring,
		.peer_q = res->peer_q,
		.inline_max = s->opts.inline_max,
		.rs_tsgl = res->rs_tsgl,
		.rs_rbuf_addr = res->rs_rbuf_addr,
		.rs_rbuf_key = res->rs_rbuf_key,
		.rs_sgl_addr = res->rs_sgl_addr,
		.rs_sgl_key = res->rs_sgl_key,
		.rs_sgl_len = res->rs_sgl_len,
	};
	int rc;

	/* bell mode: the peer's wake-ups come on the liveness socket, with
	 * its end (set_bell also lets us ring a peer in bell mode) */
	s->bell = res->live_fd >= 0 && res->ops->set_bell &&
		  res->ops->set_bell(res->qp, res->live_fd) == 1;
	rc = proto_init(&s->p, res->ops, res->qp, &g, &s->st, s->detail,
			sizeof(s->detail));
	if (rc) {
		memset(&s->p, 0, sizeof(s->p));
		return rc;
	}
	s->live_fd = res->live_fd;
	s->opts.ring_size = res->ring;
	s->opts.qdepth = res->q;
	s->laddr = res->dst;
	s->paddr = res->src;
	res->qp = NULL;
	res->live_fd = -1;
	/* the peer was there a moment ago (it sent the REQ, or took it): a
	 * sender's first look at the liveness channel is one tick from now,
	 * not a poll at the connection's first send */
	s->live_next = eng_now_ns() + LIVE_TICK_NS;
	eng_fork_stamp(s, 0);
	eng_fork_own(s);
	s->kind = K_CONN;
	return 0;
}

/* ---------------------------------------------------------------- close */

/* Do other processes accept from s's listening fds (handed over, or held
 * since a fork)?  Then close cannot shut them down to wake an accept. */
int eng_listen_shared(const rsk_sock *s)
{
	return s->lshared || eng_crossed_fork(s);
}

/* Frees rings and fds; s->lock held, no user left. */
void eng_release(rsk_sock *s)
{
	int i;

	if (s->released)
		return;
	s->released = 1;
	eng_watch_del(s);
	if (s->p.qp)
		s->p.ops->destroy(s->p.qp);
	s->p.qp = NULL;
	if (s->live_fd >= 0)
		close(s->live_fd);
	s->live_fd = -1;
	for (i = 0; i < CM_NMANAGERS; i++)
		if (s->ls[i])
			cm_managers[i]->listen_close(s->ls[i]);
	memset(s->ls, 0, sizeof(s->ls));
	proto_free(&s->p);
	s->xfd = -1; /* not ours */
	if (s->epfd >= 0)
		close(s->epfd);
	s->epfd = -1;
	if (s->fa >= 0)
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
	if (s->users == 0)
		/* before the peer learns of the close: its answer (closing its
		 * side hangs up the liveness fd) would wake the watcher thread
		 * for a socket about to go, and race this close for the lock */
		eng_watch_del(s);
	/* after a fork, only the process that owns the connection ends it
	 * (FIN): nobody else may use it any more (another process that
	 * still holds it gets EBADF), so its close is the last one that
	 * counts; a copy nobody used since the fork closes quietly (the
	 * child of an accept-then-fork server still serves it) */
	if (s->kind == K_CONN && !(s->p.flags & F_DEAD) &&
	    (!eng_forked(s) || eng_owned(s))) {
		eng_progress(s);
		proto_close(&s->p);
	}
	s->closed = 1;
	eng_wake(s);
	if (s->users == 0) {
		eng_release(s);
	} else if (s->kind == K_CONN && s->p.qp && !eng_forked(s)) {
		eng_kick_waiter(s); /* wake the thread in poll */
	} else if (s->kind == K_LISTEN && !eng_listen_shared(s)) {
		/* wake accept: shutting the listeners down makes them readable
		 * (not those other processes may accept from too; accept's wait
		 * there is bounded: eng_accept_wait_ms) */
		int i;

		for (i = 0; i < CM_NMANAGERS; i++)
			if (s->ls[i])
				cm_managers[i]->listen_shutdown(s->ls[i]);
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int rsk_abort(rsk_sock *s)
{
	int rc = 0;

	eng_lock(s);
	if (s->closed)
		rc = -EBADF;
	else if (s->kind != K_CONN)
		rc = -ENOTCONN;
	else if (!(s->p.flags & F_DEAD) && (!eng_forked(s) || eng_owned(s))) {
		eng_progress(s);
		proto_fail(&s->p, ECONNRESET, 1,
			   "the connection was aborted (SO_LINGER 0)");
		eng_wake(s);
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
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
