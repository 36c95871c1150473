// SPDX-License-Identifier: MIT
/*
 * listener.c - listening and accepting over the connection managers: a
 * socket's listeners (one per manager at most, cm.h's struct cm_listener:
 * the local rendezvous's names and parked clients, rdma_cm's service
 * thread) reached through struct cm_ops only, their fds joined in the
 * socket's epoll fd, and accept's wait.
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
 * while a connection waits.  Its O_NONBLOCK flag stays as it was (the
 * socket's mode: rsock.socket sets it). */
static void eng_become_listener(rsk_sock *s)
{
	s->kind = K_LISTEN;
	if (s->fa < 0 || s->fb < 0)
		return; /* none yet (eng_fd_make), or made already */
	if (eng_fd_dup_onto(s->epfd, s->fa) < 0)
		return; /* fa stays a never-readable socket: accept still works */
	close(s->fb);
	s->fb = -1;
}

int eng_epfd(rsk_sock *s)
{
	if (s->epfd < 0 && (s->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
		return -errno;
	return 0;
}

/* What s's listeners need of it (cm.h), with prepare(arg) for this call. */
static struct cm_host eng_host(rsk_sock *s, int (*prepare)(void *), void *arg)
{
	return (struct cm_host){
		.epfd = s->epfd,
		.o = &s->opts,
		.prepare = prepare,
		.arg = arg,
		.reuseport = s->reuseport,
		.lshared = &s->lshared,
		.detail = s->detail,
		.dlen = sizeof(s->detail),
	};
}

/* cm_host.prepare of a listen: fileno() live again after a refused
 * connect, before the manager's listener takes the name. */
static int eng_listen_prepare(void *arg)
{
	return eng_fd_renew(arg);
}

/* Under s's lock: s listens through cm on d, or on fd (bound before:
 * adopted) if d is NULL. */
static int eng_listen_on(rsk_sock *s, const struct cm_ops *cm,
			 const struct cm_dial *d, int fd, int backlog)
{
	struct cm_host h = eng_host(s, eng_listen_prepare, s);
	int i, rc;

	if (s->kind == K_CONN)
		return -EISCONN;
	if ((rc = eng_epfd(s)))
		return rc;
	h.epfd = s->epfd;
	for (i = 0; cm_managers[i] != cm; i++)
		; /* its listener's place */
	if (d)
		rc = cm->listen(d, &s->opts, backlog, &h, &s->ls[i]);
	else
		rc = cm->adopt(fd, backlog, &h, &s->ls[i]);
	if (rc == 0)
		eng_become_listener(s);
	return rc;
}

int rsk_listen(rsk_sock *s, const char *name, size_t namelen, int backlog)
{
	struct cm_dial d = { .name = name, .namelen = namelen };
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	rc = eng_listen_on(s, cm_kind(1), &d, -1, backlog);
	eng_leave(s);
	return rc;
}

int rsk_listen_verbs(rsk_sock *s, const struct rsk_addr *addr, int backlog)
{
	struct cm_dial d = { .dst = addr };
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	rc = eng_listen_on(s, cm_kind(0), &d, -1, backlog);
	eng_leave(s);
	return rc;
}

int rsk_rendezvous_bind(const char *name, size_t namelen)
{
	return cm_kind(1)->bind(name, namelen);
}

int rsk_rendezvous_join(const char *name, size_t namelen, int timeout_ms)
{
	return cm_kind(1)->join(name, namelen, timeout_ms);
}

int rsk_listen_reuseport(rsk_sock *s, int on)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	s->reuseport = !!on;
	eng_leave(s);
	return 0;
}

int rsk_listen_adopt(rsk_sock *s, int fd, int backlog, int shared)
{
	const struct cm_ops *cm = cm_kind(1);
	int rc;

	if (fd < 0)
		return -EBADF;
	if ((rc = cm->adoptable(fd)))
		return rc;
	if ((rc = eng_enter(s)))
		return rc;
	if (!(rc = eng_listen_on(s, cm, NULL, fd, backlog)) && shared)
		s->lshared = 1;
	eng_leave(s);
	return rc;
}

int rsk_listen_fds(rsk_sock *s, int *fds, int n)
{
	int rc, i, k;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_LISTEN) {
		rc = -EINVAL;
	} else {
		for (i = 0; i < CM_NMANAGERS; i++) {
			if (!s->ls[i])
				continue;
			k = rc < n ? n - rc : 0;
			rc += cm_managers[i]->listen_fds(s->ls[i],
							 k ? fds + rc : NULL, k);
		}
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
		 errno != EEXIST) /* (as cm_local.c's listen) */
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

/* cm_host.prepare of an accept: the socket that will hold the connection,
 * made before the manager takes it (so that a shortage here leaves the
 * client waiting). */
static int eng_accept_prepare(void *arg)
{
	rsk_sock **cp = arg;

	return *cp ? 0 : rsk_socket(cp);
}

/*
 * One step of accepting, never blocking (but a local client's REQ gets
 * 1 ms when nb): s's listeners in cm_managers[] order.  Returns 0 with
 * *res (and *cp made, unless the manager takes first: then it is made
 * after), -EAGAIN if nothing is ready, or -ENOMEM/-EMFILE/-ENFILE: then
 * every client stays for a later accept, as TCP keeps them queued.
 */
static int eng_accept_step(rsk_sock *s, struct cm_result *res, rsk_sock **cp,
			   int nb)
{
	struct cm_host h = eng_host(s, eng_accept_prepare, cp);
	int i, rc;

	h.nb = nb;

	for (i = 0; i < CM_NMANAGERS; i++)
		if (s->ls[i] && (rc = cm_managers[i]->accept(s->ls[i], &h,
							     res)) != -EAGAIN)
			return rc;
	return -EAGAIN;
}

/* how long a blocked accept on a shared listener sleeps before it looks
 * whether the listener was closed meanwhile */
#define ACCEPT_SHARED_WAIT_MS 200

/* Milliseconds to sleep in accept: until the deadline or what a listener
 * has due (a parked client's expiry; bounded on a shared listener). */
static int eng_accept_wait_ms(const rsk_sock *s, int64_t deadline)
{
	int64_t until = deadline, due;
	int i, ms;

	for (i = 0; i < CM_NMANAGERS; i++) {
		if (!s->ls[i])
			continue;
		due = cm_managers[i]->listen_due(s->ls[i]);
		if (due >= 0 && (until < 0 || due < until))
			until = due;
	}
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
	struct epoll_event ev[CM_MAX_NAMES];
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
		if (timeout_ms == 0 || (timeout_ms < 0 && eng_fd_nonblock(s)))
			goto out; /* (-EAGAIN; the second: fcntl on the fd) */
		if (s->closed) {
			rc = -EBADF;
			goto out;
		}
		if (deadline >= 0 && eng_now_ns() >= deadline) {
			rc = -ETIMEDOUT;
			goto out;
		}
		pthread_mutex_unlock(&s->lock);
		n = epoll_wait(s->epfd, ev, CM_MAX_NAMES,
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
