// SPDX-License-Identifier: MIT
/*
 * conn.c - the API calls on a connection: send, receive, wait, poll,
 * shutdown, connect, options, watch mode; and the one wait loop they all
 * sleep in (eng_wait).
 *
 * Every call holds the socket's lock (eng_enter/eng_leave, sock.c) around
 * the protocol (proto.c, sans I/O) and runs the provider's completions
 * through it (eng_progress, progress.c) before it decides.  A thread
 * sleeps only after arm -> re-poll found nothing, and never with the lock
 * held; a signal ends any sleep (signals.c).
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
#include <pthread.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>

#include "engine.h"
#include "ring.h"

/* A spin longer than this looks at Python's wakeup fd this often
 * (signals.c). */
#define SPIN_SIG_LOOK_NS 5000000ll


int rsk_notify_fds(rsk_sock *s, int *notify_fd, int *live_fd)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_CONN) {
		rc = -ENOTCONN;
	} else {
		*notify_fd = s->p.ops->notify_fd(s->p.qp);
		*live_fd = s->live_fd;
		if (*notify_fd < 0)
			rc = *notify_fd;
	}
	eng_leave(s);
	return rc;
}

int rsk_check_peer(rsk_sock *s)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_CONN && s->bell && s->live_drained &&
	    !(s->p.flags & F_PEER_GONE)) {
		/* The bells were read to the end since the last look (the
		 * caller's reads acknowledged the wake-up that brought it
		 * here): no syscall.  Whatever came since keeps the fd
		 * readable, and its watcher calls again. */
		s->live_drained = 0;
	} else if (s->kind == K_CONN) {
		s->live_drained = 0;
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
	if (!rc) {
		s->spin_ns = -1; /* the new opts.spin_us, to start with */
		s->spin_long = 0;
	}
	eng_leave(s);
	return rc;
}

/* Watch mode: no notification can be pending on our notify fd (we are
 * armed and have not kicked it), so if the fd looked readable, the
 * liveness channel did it. */
static int eng_quiet(rsk_sock *s)
{
	return s->kind == K_CONN && !s->kicked && s->p.ops->armed(s->p.qp);
}

/* ---------------------------------------------------------------- wait */

typedef int (*eng_pred)(const rsk_sock *s);


/* The calling thread's kick eventfd, made at its first sleep on a
 * connection's fds and closed when the thread ends (and by a fork's child,
 * whose copy would share the parent's thread's counter): another thread
 * that must wake the sleeper (close, shutdown, the end of a zero-copy
 * receive) writes it, so that a connection needs no fd of its own for
 * that.  -1 if none can be made (the sleeper then looks every 100 ms). */
static __thread int eng_tkfd = -1;
static pthread_key_t eng_tk_key;
static pthread_once_t eng_tk_once = PTHREAD_ONCE_INIT;

static void eng_tk_close(void *v)
{
	close((int)(intptr_t)v - 1);
}

static void eng_tk_child(void)
{
	if (eng_tkfd >= 0)
		close(eng_tkfd); /* (the parent's thread keeps its own) */
	eng_tkfd = -1;
	pthread_setspecific(eng_tk_key, NULL);
}

static void eng_tk_init(void)
{
	pthread_key_create(&eng_tk_key, eng_tk_close);
	pthread_atfork(NULL, NULL, eng_tk_child);
}

static int eng_thread_kfd(void)
{
	if (eng_tkfd < 0) {
		pthread_once(&eng_tk_once, eng_tk_init);
		eng_tkfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (eng_tkfd >= 0)
			pthread_setspecific(eng_tk_key,
					    (void *)(intptr_t)(eng_tkfd + 1));
	}
	return eng_tkfd;
}

/* The fd_waiter polls its connection's wait fd when it has one (eventfd
 * mode, verbs): a kick of the provider's notify fd wakes it, as it always
 * did; in bell mode it polls its thread's kick eventfd. */
#define WAITER_PROV_KICK (-2)

static int eng_waiter_kfd(rsk_sock *s)
{
	return s->kind == K_CONN && eng_wait_fd(s) >= 0 ? WAITER_PROV_KICK
							 : eng_thread_kfd();
}

void eng_kick_waiter(rsk_sock *s)
{
	if (!s->fd_waiter)
		return;
	if (s->waiter_kfd == WAITER_PROV_KICK)
		s->p.ops->kick(s->p.qp);
	else if (s->waiter_kfd >= 0)
		(void)eventfd_write(s->waiter_kfd, 1);
}

/* What eng_wait sleeps on (no epoll fd per connection: a few fds are
 * cheaper to poll than an epoll set is to make): the provider's wait fd
 * if it has one, the liveness fd until the peer is gone (on shm it also
 * carries the peer's bells), the thread's kick eventfd, and Python's
 * wakeup fd.  Set up under s->lock, polled without it. */
struct eng_pollset {
	struct pollfd p[4];
	int n, i_live, i_sig, i_kick, sigfd, n_kick_missing;
};

static void eng_pollset(const rsk_sock *s, int sigfd, int kfd,
			struct eng_pollset *w)
{
	w->n = 0;
	w->i_live = w->i_sig = w->i_kick = -1;
	w->sigfd = sigfd;
	w->n_kick_missing = kfd == -1;
	if (s->kind == K_CONN) {
		int wfd = eng_wait_fd(s);

		if (wfd >= 0)
			w->p[w->n++] = (struct pollfd){ .fd = wfd,
							.events = POLLIN };
		if (s->live_fd >= 0 && !(s->p.flags & F_PEER_GONE)) {
			w->i_live = w->n;
			w->p[w->n++] = (struct pollfd){
				.fd = s->live_fd, .events = POLLIN | POLLRDHUP
			};
		}
	}
	if (kfd >= 0) {
		w->i_kick = w->n;
		w->p[w->n++] = (struct pollfd){ .fd = kfd, .events = POLLIN };
	}
	if (sigfd >= 0) {
		w->i_sig = w->n;
		w->p[w->n++] = (struct pollfd){ .fd = sigfd, .events = POLLIN };
	}
}

/* Returns the number of fds ready (a signal's byte: -1, EINTR, drained),
 * *live set if the liveness fd is one of them. */
static int eng_poll_wait(struct eng_pollset *w, int ms, int *live)
{
	int rc;

	*live = 0;
	if (w->n_kick_missing && (ms < 0 || ms > 100))
		ms = 100; /* no kick eventfd: look now and then */
	rc = poll(w->p, (nfds_t)w->n, ms);
	if (rc <= 0)
		return rc;
	if (w->i_kick >= 0 && w->p[w->i_kick].revents) {
		eventfd_t v;

		(void)eventfd_read(w->p[w->i_kick].fd, &v);
	}
	if (w->i_sig >= 0 && w->p[w->i_sig].revents && eng_sig_came(w->sigfd)) {
		errno = EINTR;
		return -1;
	}
	*live = w->i_live >= 0 && w->p[w->i_live].revents != 0;
	return rc;
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

/* Shorter spin budgets are not spun at all (eng_spin_adapt). */
#define SPIN_MIN_NS 5000ll

/*
 * A blocking call's spin adapts to how long this connection's waits take,
 * as an event loop's polling does (rsock/asyncio.py, _LoopPoller.touch):
 * a wait that ended after `waited` ns (spin, sleep and wake-up included)
 * raises the budget to twice that, at most opts.spin_us, unless it took
 * longer than opts.spin_us (SPIN_LONG: no spin the cap allows catches
 * it): the second such wait in a row halves the budget, and below
 * SPIN_MIN_NS the call sleeps at once (a peer that slow gains nothing from
 * a spin: an idle keep-alive connection, a slow server, requests at a
 * fixed rate a little slower than the cap), until a quicker wait comes.
 * One slow answer is not a tempo.  No margin for the wake-up a wait that
 * slept includes: waits a little longer than the cap would otherwise keep
 * the budget at the cap, and each would spin all of it and sleep as well
 * (at 1,600 requests/s against a 500 us cap: a CPU per side for nothing).
 */
#define SPIN_LONG(cap) (cap)

/* s's spin budget as it stands (ns): its own, at most opts.spin_us. */
static int64_t eng_spin_cur(const rsk_sock *s)
{
	int64_t cap = (int64_t)s->opts.spin_us * 1000;

	return s->spin_ns < 0 || s->spin_ns > cap ? cap : s->spin_ns;
}

static void eng_spin_adapt(rsk_sock *s, int64_t waited)
{
	int64_t cap = (int64_t)s->opts.spin_us * 1000, b = eng_spin_cur(s);

	if (waited > SPIN_LONG(cap)) {
		if (++s->spin_long > 1)
			b /= 2;
	} else {
		s->spin_long = 0;
		if (b < 2 * waited)
			b = 2 * waited;
		if (b < SPIN_MIN_NS)
			b = SPIN_MIN_NS;
		if (b > cap)
			b = cap;
	}
	s->spin_ns = b;
}

/* The spin a blocking call on s starts with (ns; 0: none). */
static int64_t eng_spin_budget(const rsk_sock *s)
{
	int64_t b = eng_spin_cur(s);

	return b < SPIN_MIN_NS ? 0 : b;
}

/*
 * Wait until ready(s), with s->lock held on entry and exit.  Spins for
 * the connection's budget first (eng_spin_budget: at most opts.spin_us;
 * polling the CQ, yielding the CPU between polls so a peer on the same
 * core can run), then arms, re-polls and sleeps.  Returns 0 when ready,
 * -EAGAIN (non-blocking), -ETIMEDOUT, -EINTR or -EBADF (closed meanwhile).
 */
static int eng_wait(rsk_sock *s, eng_pred ready, int64_t deadline, int nb)
{
	int64_t spin_end = 0, sig_look = 0, t0 = 0;
	int sigfd = eng_my_sigfd();
	struct eng_pollset w;
	int n, live, rc, kfd, muted;

	for (;;) {
		eng_progress(s);
		if (s->closed)
			return -EBADF;
		if (ready(s)) {
			if (t0 && s->kind == K_CONN)
				eng_spin_adapt(s, eng_now_ns() - t0);
			return 0;
		}
		if (nb || (deadline >= 0 && eng_now_ns() >= deadline)) {
			/* before giving up: did the peer vanish meanwhile?  In
			 * watch mode only when our notify fd cannot be what
			 * made the fd readable (then it was the liveness
			 * channel): no syscall on the common EAGAIN */
			if ((!(s->watch & RSK_WATCH_NOTIFY) || eng_quiet(s)) &&
			    eng_poll_live(s) &&
			    ready(s))
				return 0;
			if (t0 && s->kind == K_CONN) /* (a timed wait's end) */
				eng_spin_adapt(s, eng_now_ns() - t0);
			return nb ? -EAGAIN : -ETIMEDOUT;
		}
		if (!t0)
			t0 = eng_now_ns();
		if (s->kind == K_CONN && !spin_end && !eng_spin_budget(s))
			spin_end = -1; /* no spin for this connection now */
		if (s->kind == K_CONN && s->opts.spin_us && spin_end >= 0) {
			int64_t now = eng_now_ns();

			if (!spin_end) {
				spin_end = now + eng_spin_budget(s);
				sig_look = now + SPIN_SIG_LOOK_NS;
				if (s->wslot >= 0 && !s->fd_waiter)
					/* This thread takes in what comes while
					 * it spins (as eng_watch_mute's sleeper
					 * does): no wake-up of the watcher
					 * thread meanwhile, which would share
					 * this CPU and the lock with the spin
					 * (httpx's keep-alive: 6 futex calls per
					 * request).  Armed again before a sleep
					 * (below) or when the call ends
					 * (eng_sync_fd), each time followed by a
					 * look at what came. */
					s->p.ops->disarm(s->p.qp);
			}
			if (now >= sig_look && now < spin_end) {
				/* a long spin looks for signals now and then */
				sig_look = now + SPIN_SIG_LOOK_NS;
				if (eng_sig_came(sigfd))
					return -EINTR;
			}
			if (now < spin_end) {
				int hit = s->p.ops->cq_pending(s->p.qp);

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
		s->waiter_kfd = kfd = eng_waiter_kfd(s);
		if (s->kind == K_CONN && !(s->p.flags & F_DEAD)) {
			s->p.ops->arm(s->p.qp);
			s->st.arms++;
			if (eng_progress(s) || ready(s)) {
				s->p.ops->disarm(s->p.qp);
				s->fd_waiter = 0;
				continue;
			}
		}
		s->st.sleeps++;
		eng_pollset(s, sigfd, kfd, &w);
		muted = s->kind == K_CONN && eng_watch_mute(s, 1);
		pthread_mutex_unlock(&s->lock);
		n = eng_poll_wait(&w, eng_ms_left(deadline), &live);
		rc = n < 0 ? -errno : 0;
		pthread_mutex_lock(&s->lock);
		s->fd_waiter = 0;
		s->waiter_kfd = -1;
		if (s->kind == K_CONN && !s->released) {
			eng_ack(s);
			if (live && !s->bell)
				eng_check_live(s);
		}
		if (muted && !s->released) /* (after the ack: what came since wakes it) */
			eng_watch_mute(s, 0);
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
	int e = s->p.so_error;

	s->p.so_error = 0;
	if (e)
		eng_fd_error_taken(s);
	return e ? -e : after;
}

/* Error a send should report now, or 0.  keep: bytes already went out in
 * this call (which returns their count), so the error stays pending for
 * the next call, as TCP reports a reset after a partial send. */
static int send_error(rsk_sock *s, int keep)
{
	if (s->kind != K_CONN)
		return -EPIPE;
	if (s->p.flags & F_DEAD)
		return keep ? -EPIPE : eng_take_dead(s, -EPIPE);
	if (s->p.flags & F_WR_SHUT)
		return -EPIPE;
	if (s->p.flags & F_PEER_GONE)
		return (s->p.flags & F_PEER_FIN) ? -EPIPE : -ECONNRESET;
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
	if (s->kind == K_CONN && (s->p.flags & F_PEER_FIN) &&
	    !(s->p.flags & F_PEER_GONE))
		eng_check_live(s); /* a peer that closed makes sends fail */
	else
		eng_live_tick(s);
	if (s->kind == K_CONN &&
	    (s->p.flags & (F_PEER_FIN | F_PEER_GONE | F_DEAD | F_WR_SHUT |
			 F_SENT_LATE)) == (F_PEER_FIN | F_PEER_GONE)) {
		/* The peer closed in order and is gone.  TCP's first send then
		 * still goes out (the peer's kernel answers it with a reset),
		 * and only later ones fail with EPIPE: the same here, the
		 * bytes being dropped (a zero-length send changes nothing). */
		if (len)
			s->p.flags |= F_SENT_LATE;
		eng_leave(s);
		return (ssize_t)len;
	}
	while ((rc = send_error(s, done > 0)) == 0 && (done < len || len == 0)) {
		uint32_t n;
		int credit_stall;

		if (len == 0)
			break;
		eng_progress(s);
		if ((rc = send_error(s, done > 0)))
			break;
		if ((s->p.flags & F_PEER_FIN) && !done && s->p.ops->peer_shut &&
		    s->p.ops->peer_shut(s->p.qp)) {
			/* The peer shut down both directions (and may never
			 * look at its socket again): TCP's kernel answers this
			 * data with a reset, so this send goes (its bytes
			 * dropped) and later ones fail with EPIPE; the peer
			 * reads the reset at its next call.  (A peer that takes
			 * data in so answers too: eng_progress.) */
			proto_fail(&s->p, EPIPE, 1,
				   "the peer shut down both directions");
			done = len;
			break;
		}
		n = proto_send_room(&s->p, &credit_stall);
		if (credit_stall) /* (a plain write, or a wait) */
			s->st.credit_stalls++;
		if (n == 0) {
			if (!credit_stall)
				s->st.space_stalls++;
			if (done && (nb || (flags & RSK_F_PARTIAL)))
				break;
			if (!nb && deadline < 0 && eng_fd_nonblock(s)) {
				nb = 1; /* (fcntl on the fd: as a kernel socket) */
				if (done)
					break;
			}
			rc = eng_wait(s, send_ready, deadline, nb);
			if (rc)
				break;
			continue;
		}
		if (n > len - done)
			n = (uint32_t)(len - done);
		rc = proto_send(&s->p, p + done, n);
		if (rc) {
			rc = done ? -ECONNRESET : eng_take_dead(s, -EPIPE);
			break;
		}
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
	/* the peer's FIN came first: EOF, whatever happened after (Linux TCP
	 * reads EOF once the FIN is in, before a pending error; its own
	 * SHUT_RD only after one) */
	if (s->p.flags & F_PEER_FIN)
		return 0;
	if (s->p.flags & F_DEAD)
		return keep && s->p.so_error ? -s->p.so_error : eng_take_dead(s, 0);
	if (s->p.flags & F_RD_SHUT)
		return 0;
	if (s->p.flags & F_PEER_GONE)
		return -ECONNRESET;
	return 1; /* nothing to report: wait */
}

/* Consume n bytes at the head and return credits as due. */
static void eng_consume(rsk_sock *s, size_t n)
{
	proto_consume(&s->p, n);
	eng_wake_due(s);
}

/* Wait for data; returns bytes readable (> 0), 0 at EOF, or -errno.
 * keep: see recv_end. */
static ssize_t recv_wait(rsk_sock *s, int flags, int64_t deadline, int keep)
{
	int nb = (flags & RSK_F_DONTWAIT) || deadline == -2;
	int rc;

	for (;;) {
		if (!s->rx_busy && s->p.r_tail != s->p.r_head)
			return (ssize_t)(s->p.r_tail - s->p.r_head);
		if (!s->rx_busy && (s->p.flags & F_RD_SHUT) &&
		    !(s->p.flags & F_PEER_FIN)) {
			/* our SHUT_RD reads EOF only once nothing has come:
			 * bytes the peer sent before or after it are read
			 * first, as Linux TCP queues them (nobody may have
			 * taken them in since) */
			uint64_t tail = s->p.r_tail;

			eng_progress(s);
			if (s->p.r_tail != tail)
				continue;
		}
		if (!s->rx_busy && (rc = recv_end(s, keep)) <= 0)
			return rc;
		if (!nb && deadline == -1 && eng_fd_nonblock(s))
			nb = 1; /* (fcntl on the fd: as a kernel socket) */
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
			uint64_t head = s->p.r_head + ((flags & RSK_F_PEEK) ? done : 0);
			uint32_t c = ring_contig_data(head, s->p.r_tail, s->p.rsize);
			size_t n = len - done < c ? len - done : c;

			memcpy(p + done, s->p.ring + ring_off(head, s->p.rsize), n);
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
		c = ring_contig_data(s->p.r_head, s->p.r_tail, s->p.rsize);
		avail = (ssize_t)(len < c ? len : c);
		*ptr = s->p.ring + ring_off(s->p.r_head, s->p.rsize);
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
		if (n > s->p.r_tail - s->p.r_head)
			rc = -EINVAL;
		else
			eng_consume(s, n);
		/* a receiver that slept as fd waiter while we held the head
		 * must look again: wake it */
		if (s->kind == K_CONN)
			eng_kick_waiter(s);
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
			/* what came before is in (readable), what comes
			 * after is "after" (eng_progress) */
			eng_progress(s);
			s->p.flags |= F_RD_SHUT;
			eng_wake(s);
			eng_kick_waiter(s);
		}
		if (how != RSK_SHUT_RD && !(s->p.flags & F_WR_SHUT)) {
			eng_progress(s);
			proto_shutdown_wr(&s->p);
			/* a sender blocked in another thread fails now (EPIPE) */
			eng_wake_due(s);
			eng_kick_waiter(s);
		}
		if ((s->p.flags & (F_RD_SHUT | F_WR_SHUT)) ==
			    (F_RD_SHUT | F_WR_SHUT) &&
		    s->p.ops->publish_shut)
			s->p.ops->publish_shut(s->p.qp);
	}
	eng_leave(s);
	return rc;
}

/* Does a client wait on one of the listening fds of s?  (Parked clients
 * show only in fileno().) */
static int eng_listen_waiting(rsk_sock *s)
{
	struct pollfd pfd[CM_MAX_NAMES];
	int fds[CM_MAX_NAMES];
	int i, j, n;

	for (i = 0; i < CM_NMANAGERS; i++) {
		if (!s->ls[i])
			continue;
		n = cm_managers[i]->listen_fds(s->ls[i], fds, CM_MAX_NAMES);
		if (n > CM_MAX_NAMES)
			n = CM_MAX_NAMES;
		for (j = 0; j < n; j++)
			pfd[j] = (struct pollfd){ .fd = fds[j], .events = POLLIN };
		if (n > 0 && poll(pfd, (nfds_t)n, 0) > 0)
			return 1;
	}
	return 0;
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
		if (s->p.flags & F_DEAD)
			rev |= RSK_POLLERR;
		if (s->p.flags & (F_PEER_GONE | F_DEAD) ||
		    ((s->p.flags & F_PEER_FIN) && (s->p.flags & F_WR_SHUT)))
			rev |= RSK_POLLHUP;
		if (s->p.flags & (F_PEER_FIN | F_PEER_GONE | F_DEAD))
			rev |= RSK_POLLRDHUP;
	} else if (s->kind == K_LISTEN && eng_listen_waiting(s)) {
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
	/* what has arrived first (a reset behind unread data shows at once,
	 * as TCP's SO_ERROR does; not a forked copy another process owns) */
	if (s->kind == K_CONN && !s->closed && !s->released && s->p.qp &&
	    !(s->p.flags & F_DEAD) && (!eng_forked(s) || eng_owned(s)) &&
	    eng_progress(s))
		eng_sync_fd(s);
	e = s->p.so_error;
	s->p.so_error = 0;
	if (e)
		eng_fd_error_taken(s);
	if (s->refused && s->fa >= 0) {
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


int rsk_stats(rsk_sock *s, struct rsk_stats *st)
{
	eng_lock(s);
	*st = s->st;
	if (s->kind == K_CONN && !s->released)
		st->notifies_sent = s->p.ops->notifies_sent(s->p.qp);
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
		eng_watch_unowned(s);
	}
	pthread_mutex_unlock(&s->lock);
	return noted;
}

int rsk_set_watch(rsk_sock *s, int on)
{
	int rc;

	int unpolled = (on & RSK_WATCH_UNPOLLED) && (on & RSK_WATCH_FD);

	if (on & ~(RSK_WATCH_NOTIFY | RSK_WATCH_FD | RSK_WATCH_UNPOLLED))
		return -EINVAL;
	on &= ~RSK_WATCH_UNPOLLED;
	if (eng_note_unowned(s, &s->watch, on))
		return 0;
	if ((rc = eng_enter(s)))
		return rc;
	if ((s->watch & RSK_WATCH_FD) && !(on & RSK_WATCH_FD))
		eng_watch_del(s);
	s->watch = on;
	s->unpolled = unpolled && s->stand_in;
	eng_leave(s); /* syncs the fds (a stand-in becomes exact) */
	return 0;
}

int rsk_set_dialing(rsk_sock *s, int on)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind == K_NEW || !on)
		s->dialing = on != 0; /* (off: also once the dial connected) */
	else
		rc = -EISCONN;
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
	} else {
		/* as a reset connection's (eng_sync_pair): fb closes with the
		 * filler queued, so fa gets a pending error and hangs up (a
		 * pair made later does the same: eng_fd_make) */
		if (s->fb >= 0)
			close(s->fb);
		s->fb = -1;
		s->refused = 1;
	}
	eng_leave(s);
	return rc;
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
	return rsk_connect_bound(s, name, namelen, NULL, 0, src, dst,
				 timeout_ms);
}

int rsk_connect_bound(rsk_sock *s, const char *name, size_t namelen,
		      const char *bound, size_t bound_len,
		      const struct rsk_addr *src, const struct rsk_addr *dst,
		      int timeout_ms)
{
	struct cm_dial d = { .name = name, .namelen = namelen,
			     .bound = bound, .bound_len = bound_len,
			     .src = src, .dst = dst, .timeout_ms = timeout_ms };

	if (!name || (bound && !bound_len))
		return -EINVAL;
	return eng_connect(s, &d);
}

int rsk_trim(void)
{
	return shm_arena_trim();
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
	if (s->kind == K_CONN && s->p.ops)
		n = s->p.ops->name;
	pthread_mutex_unlock(&s->lock);
	return n;
}

