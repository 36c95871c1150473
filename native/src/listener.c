// SPDX-License-Identifier: MIT
/*
 * listener.c - listening and accepting: the rendezvous sockets of the local
 * connection manager (and the listener of a manager that has its own:
 * rdma_cm's, through cm.h's struct cm_ops) joined in the listener's epoll
 * fd, clients parked until their REQ arrives, accept's wait.
 *
 * Rule: everything here runs under the listener's lock (eng_enter/
 * eng_leave); a connection being accepted is a fresh rsk_sock that nobody
 * else can see until rsk_accept returns it.  Sharing: a listener's
 * rendezvous fds may be held by other processes too (fork, multiprocessing:
 * eng_listen_shared), which accept from the same kernel queue.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"

/* s listens from now on; its fa becomes epfd (the first time): readable
 * while a connection waits. */
static void eng_become_listener(rsk_sock *s)
{
	s->kind = K_LISTEN;
	if (s->fb < 0)
		return;
	if (dup3(s->epfd, s->fa, O_CLOEXEC) < 0)
		return; /* fa stays a never-readable socket: accept still works */
	close(s->fb);
	s->fb = -1;
}


/* Under s's lock: the rendezvous socket fd (bound, listening) joins s,
 * which owns it from then on (on success only). */
static int eng_listen_add(rsk_sock *s, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	int rc;

	if (s->kind == K_CONN)
		return -EISCONN;
	if (s->nlfd == RSK_MAX_NAMES)
		return -ENOSPC;
	if ((rc = eng_fd_renew(s)))
		return rc;
	if (!s->pend && !(s->pend = calloc(RSK_MAX_PEND, sizeof(*s->pend))))
		return -ENOMEM;
	/* EEXIST: a process that shares this epoll instance with us (a
	 * socket bound before a fork) made the same socket listen first */
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && errno != EEXIST)
		return -errno;
	s->lfd[s->nlfd++] = fd;
	eng_become_listener(s);
	return 0;
}

int rsk_listen(rsk_sock *s, const char *name, size_t namelen, int backlog)
{
	int rc, fd;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_CONN)
		rc = -EISCONN;
	else if (s->nlfd == RSK_MAX_NAMES)
		rc = -ENOSPC;
	else if ((fd = cm_listen_fd(name, namelen, backlog)) < 0)
		rc = fd;
	else if ((rc = eng_listen_add(s, fd)))
		close(fd);
	eng_leave(s);
	return rc;
}

int rsk_rendezvous_bind(const char *name, size_t namelen)
{
	return cm_bind_fd(name, namelen);
}

int rsk_listen_adopt(rsk_sock *s, int fd, int backlog, int shared)
{
	int rc;

	if (fd < 0)
		return -EBADF;
	if ((rc = cm_is_rendezvous(fd)))
		return rc;
	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_CONN)
		rc = -EISCONN;
	else if (listen(fd, backlog < 0 ? 0 : backlog) < 0)
		rc = -errno;
	else if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0 ||
		 fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		rc = -errno;
	else if (!(rc = eng_listen_add(s, fd)) && shared)
		s->lshared = 1;
	eng_leave(s);
	return rc;
}

int rsk_listen_fds(rsk_sock *s, int *fds, int n)
{
	int rc, i;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_LISTEN) {
		rc = -EINVAL;
	} else {
		for (i = 0; i < s->nlfd && i < n; i++)
			fds[i] = s->lfd[i];
		rc = s->nlfd;
		s->lshared = 1; /* another process may accept from them now */
	}
	eng_leave(s);
	return rc;
}

int rsk_listen_fd(rsk_sock *s, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	int rc;

	if (fd < 0)
		return -EBADF;
	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_LISTEN)
		rc = -EINVAL;
	else if (s->xfd >= 0)
		rc = -EBUSY;
	else if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 &&
		 errno != EEXIST) /* as in eng_listen_add */
		rc = -errno;
	else
		s->xfd = fd;
	eng_leave(s);
	return rc;
}

/* Is a connection waiting on the external listening fd? */
static int eng_xfd_ready(const rsk_sock *s)
{
	struct pollfd p = { .fd = s->xfd, .events = POLLIN };

	return s->xfd >= 0 && poll(&p, 1, 0) > 0;
}

static void eng_pend_drop(rsk_sock *s, int i, int close_it)
{
	/* (a short_of client is not in epfd: the DEL fails, harmlessly) */
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->pend[i].fd, NULL);
	if (close_it)
		close(s->pend[i].fd);
	s->pend[i] = s->pend[--s->npend];
}

/* The parked client that waited longest (its deadline is the earliest). */
static int eng_pend_oldest(const rsk_sock *s)
{
	int i, o = 0;

	for (i = 1; i < s->npend; i++)
		if (s->pend[i].until < s->pend[o].until)
			o = i;
	return o;
}

/* Our own shortage of fds or memory (not the client's doing). */
static int eng_short(int rc)
{
	return rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM;
}

/* Handshake of a client whose REQ arrived, into *cp (made here first, so
 * that a shortage leaves the client as it was: see cm_accept_req). */
static int eng_take(rsk_sock *s, int fd, struct cm_result *res,
		    rsk_sock **cp)
{
	int rc;

	if (!*cp && (rc = rsk_socket(cp)))
		return rc;
	return cm_accept_req(fd, &s->opts, res, s->detail, sizeof(s->detail));
}

static void eng_park(rsk_sock *s, int fd, int short_of, int64_t now)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

	if (s->npend == RSK_MAX_PEND) /* the longest silent goes */
		eng_pend_drop(s, eng_pend_oldest(s), 1);
	if (!short_of && epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		close(fd);
		return;
	}
	s->pend[s->npend++] = (struct eng_pend){
		.fd = fd, .short_of = short_of,
		.until = now + (short_of ? CM_SHORT_WAIT_NS : CM_REQ_WAIT_NS)
	};
}

/* A client's REQ follows its connect() at once (it made its segments
 * before connecting): a non-blocking accept that woke for the connection
 * gives the REQ a moment (1 ms at most, once per client) rather than fail
 * with EAGAIN on a listener that polled readable, which TCP's never does. */
static int eng_req_soon(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 1) > 0 && cm_req_ready(fd);
}

/*
 * One step of accepting, never blocking (but eng_req_soon): a pending
 * client whose REQ has arrived is handshaken; new clients are taken off the
 * listening fds and either handshaken at once or parked until their REQ
 * comes (the parked fds are in epfd, so the listener turns readable then).  Returns 0 with
 * *res (and *cp made), -EAGAIN if nothing is ready, or -ENOMEM/-EMFILE/
 * -ENFILE: then every client stays (parked, or in the kernel's queue)
 * for a later accept, as TCP keeps them queued.
 */
static int eng_accept_step(rsk_sock *s, struct cm_result *res, rsk_sock **cp,
			   int nb)
{
	int64_t now = eng_now_ns();
	int i, fd, rc, short_rc = 0;

	for (i = 0; i < s->npend;) {
		struct eng_pend *p = &s->pend[i];

		fd = p->fd;
		if (p->short_of || cm_req_ready(fd)) {
			rc = eng_take(s, fd, res, cp);
			if (rc == 0) {
				eng_pend_drop(s, i, 0);
				return 0;
			}
			if (!eng_short(rc)) {
				eng_pend_drop(s, i, 0); /* a bad client costs only
							 * itself (fd closed) */
				continue;
			}
			short_rc = rc;
			if (!p->short_of) {
				/* waits for fds or memory now, not for its REQ:
				 * out of epfd, whose level would not drop */
				epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
				p->short_of = 1;
				p->until = now + CM_SHORT_WAIT_NS;
			}
		}
		if (now >= p->until) {
			eng_pend_drop(s, i, 1); /* silent (or short) too long */
			continue;
		}
		i++;
	}
	if (short_rc)
		return short_rc; /* short of fds or memory: take no one new */
	for (i = 0; i < s->nlfd; i++) {
		for (;;) {
			fd = cm_accept_conn(s->lfd[i], s->detail, sizeof(s->detail));
			if (fd == -EAGAIN)
				break;
			if (eng_short(fd))
				return fd;
			if (fd < 0)
				continue;
			if (cm_req_ready(fd) || (nb && eng_req_soon(fd))) {
				rc = eng_take(s, fd, res, cp);
				if (rc == 0)
					return 0;
				if (eng_short(rc)) {
					eng_park(s, fd, 1, now);
					return rc;
				}
				continue;
			}
			eng_park(s, fd, 0, now);
		}
	}
	/* then the listener of a manager's own (rdma_cm's) */
	if (s->vl && s->vl_cm->accept(s->vl, res) == 0)
		return 0;
	return -EAGAIN;
}

/* how long a blocked accept on a shared listener sleeps before it looks
 * whether the listener was closed meanwhile */
#define ACCEPT_SHARED_WAIT_MS 200

/* Milliseconds to sleep in accept: until the deadline or the first
 * parked client's expiry (bounded on a shared listener). */
static int eng_accept_wait_ms(const rsk_sock *s, int64_t deadline)
{
	int64_t until = deadline;
	int i, ms;

	for (i = 0; i < s->npend; i++)
		if (until < 0 || s->pend[i].until < until)
			until = s->pend[i].until;
	ms = eng_ms_left(until);
	if (eng_listen_shared(s) && (ms < 0 || ms > ACCEPT_SHARED_WAIT_MS))
		ms = ACCEPT_SHARED_WAIT_MS;
	return ms;
}

int rsk_accept(rsk_sock *s, int timeout_ms, rsk_sock **out,
	       struct rsk_addr *src, struct rsk_addr *dst)
{
	int64_t deadline = eng_deadline(timeout_ms);
	struct cm_result res;
	struct epoll_event ev[RSK_MAX_NAMES];
	rsk_sock *c = NULL;
	int rc, n;

	memset(&res, 0, sizeof(res));
	res.live_fd = -1;
	*out = NULL;
	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_LISTEN) {
		rc = -EINVAL;
		goto out;
	}
	for (;;) {
		rc = eng_accept_step(s, &res, &c, timeout_ms == 0);
		if (rc != -EAGAIN)
			break;
		if (eng_xfd_ready(s)) {
			rc = -EXDEV;
			goto out;
		}
		if (timeout_ms == 0)
			goto out;
		if (s->closed) {
			rc = -EBADF;
			goto out;
		}
		if (deadline >= 0 && eng_now_ns() >= deadline) {
			rc = -ETIMEDOUT;
			goto out;
		}
		pthread_mutex_unlock(&s->lock);
		n = epoll_wait(s->epfd, ev, RSK_MAX_NAMES,
			       eng_accept_wait_ms(s, deadline));
		rc = n < 0 ? -errno : 0;
		pthread_mutex_lock(&s->lock);
		if (s->closed) {
			rc = -EBADF;
			goto out;
		}
		if (rc == -EINTR)
			goto out;
	}
	if (rc < 0)
		goto out;
	if (!c && (rc = rsk_socket(&c))) /* verbs: no c made yet */
		goto fail;
	c->opts = s->opts;
	rc = eng_attach(c, &res);
	if (rc)
		goto fail;
	if (src)
		*src = res.src;
	if (dst)
		*dst = res.dst;
	*out = c;
	eng_leave(s);
	return 0;
fail:
	cm_result_release(&res);
out:
	if (c)
		rsk_free(c); /* made for a client that is not (yet) ours */
	eng_leave(s);
	return rc;
}

int rsk_listen_verbs(rsk_sock *s, const struct rsk_addr *addr, int backlog)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct cm_dial d = { .dst = addr };
	const struct cm_ops *cm = cm_for(&d); /* the one that takes addresses */
	struct cm_listener *l;
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_CONN)
		rc = -EISCONN;
	else if (s->vl)
		rc = -EBUSY;
	if (rc)
		goto out;
	s->detail[0] = 0;
	rc = cm->listen(&d, &s->opts, backlog, &l, s->detail,
			sizeof(s->detail));
	if (rc)
		goto out;
	ev.data.fd = cm->listen_fd(l);
	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) < 0) {
		rc = -errno;
		cm->listen_close(l);
		goto out;
	}
	s->vl = l;
	s->vl_cm = cm;
	eng_become_listener(s);
out:
	eng_leave(s);
	return rc;
}
