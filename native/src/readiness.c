// SPDX-License-Identifier: MIT
/*
 * readiness.c - what makes fileno() exact: a connection's pollable fd (one
 * end of a socketpair, readable and writable as the engine's state says),
 * brought up to date at the end of every call (eng_sync_fd) and, between
 * calls, by a watcher thread (one per process) that wakes on the notify and
 * liveness fds of the connections someone polls.
 *
 * Rule: every function here runs under the socket's lock, except the fork
 * hooks and the watcher's own loop, which takes it per event.  Lock order
 * (below, at eng_w): a socket's lock, then the watcher table's eng_w.lock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "ring.h"

/* ----------------------------------------------------------- readiness */

int eng_readable(const rsk_sock *s)
{
	if (s->kind != K_CONN)
		return 0;
	return proto_readable(&s->p);
}

int eng_writable(const rsk_sock *s)
{
	if (s->kind != K_CONN)
		return 0;
	return proto_writable(&s->p);
}

/* What watch mode shows as readability of the fd. */
int eng_fd_ready(const rsk_sock *s)
{
	return ((s->interest & RSK_POLLIN) && eng_readable(s)) ||
	       ((s->interest & RSK_POLLOUT) && eng_writable(s)) ||
	       (s->p.flags & (F_DEAD | F_PEER_GONE));
}

/* ------------------------------------------------------- fd readiness */

/*
 * fileno() of a connection is fa, one end of a socketpair; only this
 * struct holds the other end, fb.  fa polls readable while a token byte
 * we wrote into fb sits in it, and writable while its send buffer has
 * room (which we shrink while a send would block: below).  eng_sync_pair
 * sets both from the engine's state at the end of every call; between
 * calls a watcher thread
 * (one per process, started with the first connection that needs it)
 * wakes on the connection's notify and liveness fds, edge-triggered,
 * takes in what happened and does the same.  Nothing polls: the engine is
 * armed only while fa is not both readable and writable, so the thread
 * sleeps until the peer sends data or returns credit, or vanishes.
 *
 * A listener needs no thread: its fa becomes a second fd of epfd (which
 * holds the listening fds), readable while a connection is pending and
 * never writable, like a TCP listener.
 */

/*
 * Writability without writing: fa sends EN_FILLER bytes once, which stay
 * queued at fb, charged to fa's send buffer; fa then polls writable with
 * a large SO_SNDBUF and not with the smallest one (the kernel's test is
 * 4 x charged <= sndbuf), and raising it wakes pollers.  fb then shuts its
 * receive side, so a write into fa by the application (os.write,
 * os.sendfile) fails with EPIPE instead of losing bytes.
 */
#define EN_FILLER 2048
#define EN_SNDBUF_OPEN 65536 /* the kernel doubles it */
#define EN_SNDBUF_SHUT 1     /* raised to its minimum (4608) */

static int eng_fd_sndbuf(rsk_sock *s, int v)
{
	return setsockopt(s->fa, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
}

void eng_fd_init(rsk_sock *s)
{
	static const char filler[EN_FILLER];

	eng_fd_sndbuf(s, EN_SNDBUF_OPEN);
	send(s->fa, filler, sizeof(filler), MSG_DONTWAIT | MSG_NOSIGNAL);
	shutdown(s->fb, SHUT_RD);
}

/* fa polls readable: a token byte in fb (once) */
void eng_fd_token(rsk_sock *s)
{
	if (s->fb >= 0 && !s->tok &&
	    send(s->fb, "r", 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1)
		s->tok = 1;
}

/* fa polls writable or not */
static void eng_fd_writable(rsk_sock *s, int w)
{
	if (s->fb >= 0 && w == s->filled &&
	    !eng_fd_sndbuf(s, w ? EN_SNDBUF_OPEN : EN_SNDBUF_SHUT))
		s->filled = !w;
}

int eng_fd_nonblock(const rsk_sock *s)
{
	int fl;

	if (!s->fd_mode || s->fa < 0)
		return 0;
	fl = fcntl(s->fa, F_GETFL);
	return fl >= 0 && (fl & O_NONBLOCK);
}

/* The connection's error was reported (SO_ERROR, or a call that failed
 * with it): fa's pending error, which closing fb gave it, goes too, as a
 * TCP socket's does once reported (it still polls readable, writable and
 * hung up, no longer POLLERR).  (A stand-in or a live pair has none.) */
void eng_fd_error_taken(rsk_sock *s)
{
	int fe;
	socklen_t n = sizeof(fe);

	if (s->kind == K_CONN && s->fa >= 0 && s->fb < 0 && !s->stand_in)
		getsockopt(s->fa, SOL_SOCKET, SO_ERROR, &fe, &n);
}

void eng_sync_pair(rsk_sock *s)
{
	int r = eng_readable(s), w = eng_writable(s);

	if (s->fb < 0)
		return; /* reset: fa is final (below) */
	if ((s->p.flags & F_DEAD) && s->p.err) {
		/* A reset: fa shows it as a reset TCP socket does, POLLERR and
		 * POLLHUP besides POLLIN and POLLOUT, for good.  Closing fb with
		 * the filler still queued in it gives fa ECONNRESET as its
		 * pending error (nobody reads fa's, so it stays) and hangs it up,
		 * and frees the filler, so fa polls writable.  (A copy of fb
		 * that a fork left in another process keeps fa as it is.) */
		close(s->fb);
		s->fb = -1;
		if (!s->p.so_error) /* reported already (SO_ERROR, a call) */
			eng_fd_error_taken(s);
		return;
	}
	if (r && !s->tok) {
		eng_fd_token(s);
	} else if (!r && s->tok) {
		char b[64];

		/* one token byte (a forked copy may have added its own): a
		 * short read emptied it, no second call to see EAGAIN */
		while (recv(s->fa, b, sizeof(b), MSG_DONTWAIT) ==
		       (ssize_t)sizeof(b))
			;
		s->tok = 0;
	}
	/* a dial that connected in another thread shows writable only once
	 * that thread says so (rsk_set_dialing 0: its outcome is recorded) */
	eng_fd_writable(s, w && !s->dialing);
}

/* The watcher: its epoll and a table of watched connections.  epoll data
 * is (generation << 32 | slot << 1 | is_liveness_fd), so an event that
 * was already fetched for a connection since gone is recognised.
 * Lock order: a socket's lock, then eng_w.lock; the thread never holds
 * eng_w.lock while it takes a socket's lock (`busy` keeps rsk_free from
 * freeing the socket it works on meanwhile). */
struct eng_wslot {
	rsk_sock *s;
	uint32_t gen;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int epfd; /* -1: no watcher in this process (yet) */
	dev_t dev; /* epfd's identity: a program that closes fds by number */
	ino_t ino; /* (os.closerange) may have taken it, or reused it */
	uint32_t tgen; /* bumped when a thread is made: an older one leaves */
	struct eng_wslot *slot;
	uint32_t cap;
	rsk_sock *busy;
} eng_w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, -1, 0, 0,
	    0, NULL, 0, NULL };

void eng_sync_fd(rsk_sock *s);
static int eng_fd_exact(rsk_sock *s);

/* One event for s (s->lock held). */
static void eng_watch_event(rsk_sock *s, int live)
{
	if (s->closed || s->released || s->kind != K_CONN ||
	    !(s->watch & RSK_WATCH_FD))
		return;
	if (eng_forked(s) && !eng_owned(s)) {
		/* Not ours (yet): the watcher never claims one, so the child
		 * of an accept-then-fork server still can.  But while nobody
		 * has claimed it since the fork, it is this process's to take:
		 * fa turns readable ("come and look", without driving it), or
		 * the edge would be lost and a parent that polls it would
		 * never wake (its first call then claims it and reads). */
		if (eng_unclaimed(s) && (live || s->p.ops->cq_pending(s->p.qp)))
			eng_fd_token(s);
		return;
	}
	eng_progress(s);
	if (live && (!s->bell || s->fd_waiter))
		eng_poll_live(s); /* (bells: eng_ack below reads them) */
	/* consume the notification, unless it is RSK_WATCH_NOTIFY's kick
	 * that must stay (or a sleeper in eng_wait owns the notify fd) */
	if (!s->fd_waiter &&
	    !(s->kicked && (s->watch & RSK_WATCH_NOTIFY) && eng_fd_ready(s)))
		eng_ack(s);
	eng_sync_fd(s);
	eng_wake(s);
}

static void *eng_watcher(void *arg)
{
	struct epoll_event ev[64];
	uint64_t a = (uint64_t)(uintptr_t)arg;
	int epfd = (int)(uint32_t)a, n, i;
	uint32_t tgen = (uint32_t)(a >> 32);
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		n = epoll_wait(epfd, ev, 64, -1);
		if (n < 0 && errno != EINTR)
			return NULL; /* the epoll is gone (fork child, closerange) */
		pthread_mutex_lock(&eng_w.lock);
		if (eng_w.tgen != tgen) {
			/* replaced: eng_watch_add found our epoll closed
			 * underneath (its number may be another file's now) */
			pthread_mutex_unlock(&eng_w.lock);
			return NULL;
		}
		pthread_mutex_unlock(&eng_w.lock);
		for (i = 0; i < n; i++) {
			uint64_t d = ev[i].data.u64;
			uint32_t idx = (uint32_t)d >> 1;
			rsk_sock *s = NULL;

			pthread_mutex_lock(&eng_w.lock);
			if (eng_w.epfd == epfd && idx < eng_w.cap &&
			    eng_w.slot[idx].gen == (uint32_t)(d >> 32))
				s = eng_w.slot[idx].s;
			eng_w.busy = s;
			pthread_mutex_unlock(&eng_w.lock);
			if (!s)
				continue;
			pthread_mutex_lock(&s->lock);
			eng_watch_event(s, (int)(d & 1));
			pthread_mutex_unlock(&s->lock);
			pthread_mutex_lock(&eng_w.lock);
			eng_w.busy = NULL;
			pthread_cond_broadcast(&eng_w.cond);
			pthread_mutex_unlock(&eng_w.lock);
		}
	}
}

static int eng_watch_fd(int op, int fd, uint32_t events, uint64_t data)
{
	struct epoll_event ev = { .events = events, .data.u64 = data };

	return fd < 0 || epoll_ctl(eng_w.epfd, op, fd, &ev) == 0 ? 0 : -errno;
}

/* Registers s with the watcher (s->lock held); starts it if needed. */
static void eng_watch_prefork(void);
static void eng_watch_parent(void);
static void eng_watch_child(void);
static pthread_once_t eng_w_once = PTHREAD_ONCE_INIT;

/* The watcher's table across fork(): locked while a fork copies it, and
 * emptied in the child (which has no watcher thread). */
static void eng_w_atfork(void)
{
	pthread_atfork(eng_watch_prefork, eng_watch_parent, eng_watch_child);
}

int eng_watch_add(rsk_sock *s)
{
	uint32_t i;
	uint64_t d;
	int rc = 0;

	/* after fork.c's handlers (rsk_socket registered those first) */
	pthread_once(&eng_w_once, eng_w_atfork);
	pthread_mutex_lock(&eng_w.lock);
	if (eng_w.epfd >= 0) {
		struct stat st;

		/* closed underneath (os.closerange): a new epoll and thread;
		 * the connections registered in the old one lost their
		 * fileno() readiness with it (as a kernel socket closed so
		 * would be gone); the old thread leaves when it wakes */
		if (fstat(eng_w.epfd, &st) < 0 || st.st_dev != eng_w.dev ||
		    st.st_ino != eng_w.ino)
			eng_w.epfd = -1;
	}
	if (eng_w.epfd < 0) {
		pthread_t t;
		pthread_attr_t a;
		sigset_t sigs;

		struct stat st;

		eng_w.epfd = prov_fd_high(epoll_create1(EPOLL_CLOEXEC));
		if (eng_w.epfd < 0) {
			rc = -errno;
			goto out;
		}
		if (fstat(eng_w.epfd, &st) == 0) {
			eng_w.dev = st.st_dev;
			eng_w.ino = st.st_ino;
		}
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&a, 256 * 1024);
		/* the thread blocks every asynchronous signal (it inherits the
		 * mask), so that a process's signals go to threads that run
		 * the program's handlers */
		eng_sig_block_all(&sigs);
		eng_w.tgen++;
		rc = -pthread_create(&t, &a, eng_watcher,
				     (void *)(uintptr_t)((uint64_t)eng_w.tgen << 32 |
							 (uint32_t)eng_w.epfd));
		pthread_sigmask(SIG_SETMASK, &sigs, NULL);
		pthread_attr_destroy(&a);
		if (rc) {
			close(eng_w.epfd);
			eng_w.epfd = -1;
			goto out;
		}
		pthread_setname_np(t, "rsock-watch");
	}
	for (i = 0; i < eng_w.cap && eng_w.slot[i].s; i++)
		;
	if (i == eng_w.cap) {
		uint32_t cap = eng_w.cap ? eng_w.cap * 2 : 64;
		struct eng_wslot *n = realloc(eng_w.slot, cap * sizeof(*n));

		if (!n) {
			rc = -ENOMEM;
			goto out;
		}
		memset(n + eng_w.cap, 0, (cap - eng_w.cap) * sizeof(*n));
		eng_w.slot = n;
		eng_w.cap = cap;
	}
	d = (uint64_t)eng_w.slot[i].gen << 32 | (uint64_t)i << 1;
	rc = eng_watch_fd(EPOLL_CTL_ADD, eng_wait_fd(s), EPOLLIN | EPOLLET, d);
	if (!rc && !(s->p.flags & F_PEER_GONE))
		rc = eng_watch_fd(EPOLL_CTL_ADD, s->live_fd,
				  EPOLLIN | EPOLLRDHUP | EPOLLET, d | 1);
	if (rc) {
		eng_watch_fd(EPOLL_CTL_DEL, eng_wait_fd(s), 0, 0);
		goto out;
	}
	eng_w.slot[i].s = s;
	s->wslot = (int)i;
out:
	pthread_mutex_unlock(&eng_w.lock);
	return rc;
}

/*
 * A connection that crossed a fork, that nobody has claimed since, polled
 * through fileno() here (s->lock held): polling is no use of it, so it is
 * not claimed, but the poller must learn that there is something to look
 * at (its first real call then claims it), whenever the fork came: the
 * watcher is told of the peer's writes (registered, and the QP armed;
 * arming is no use either: whoever claims it arms as it needs), and what
 * is already there shows at once.
 */
void eng_watch_unowned(rsk_sock *s)
{
	if (s->kind != K_CONN || s->released || s->closed ||
	    !(s->watch & RSK_WATCH_FD) || !eng_unclaimed(s) ||
	    (s->stand_in && eng_fd_exact(s)) || s->fb < 0)
		return;
	if (s->wslot < 0 && eng_watch_add(s))
		return; /* no thread: fa stays as it is */
	s->p.ops->arm(s->p.qp);
	if (s->p.ops->cq_pending(s->p.qp))
		eng_fd_token(s);
}

/* Unregisters s (s->lock held, before its fds close). */
void eng_watch_del(rsk_sock *s)
{
	if (s->wslot < 0)
		return;
	pthread_mutex_lock(&eng_w.lock);
	if (eng_w.epfd >= 0) {
		eng_watch_fd(EPOLL_CTL_DEL, eng_wait_fd(s), 0, 0);
		eng_watch_fd(EPOLL_CTL_DEL, s->live_fd, 0, 0);
	}
	eng_w.slot[s->wslot].s = NULL;
	eng_w.slot[s->wslot].gen++;
	s->wslot = -1;
	pthread_mutex_unlock(&eng_w.lock);
}

/*
 * A thread is about to sleep on s's fds itself (eng_wait: on) or has woken
 * (off), s->lock held.  While it sleeps the watcher need not wake for s:
 * the sleeper takes in what comes, and its call brings fileno() up to date
 * when it ends.  Two epoll_ctl each way, against a thread wake-up per
 * message for a blocking call on a socket whose fileno() someone polls
 * (httpx's and urllib3's checks of an idle connection do).  With no
 * events asked, epoll still reports a hang-up of the liveness fd: the
 * watcher then learns of the peer's death as before.  Whether it muted.
 */
int eng_watch_mute(rsk_sock *s, int on)
{
	uint64_t d;

	if (s->wslot < 0)
		return 0;
	pthread_mutex_lock(&eng_w.lock);
	if (eng_w.epfd >= 0) {
		d = (uint64_t)eng_w.slot[s->wslot].gen << 32 |
		    (uint64_t)s->wslot << 1;
		eng_watch_fd(EPOLL_CTL_MOD, eng_wait_fd(s),
			     on ? 0 : EPOLLIN | EPOLLET, d);
		/* (not registered once the peer was gone: ENOENT, fine) */
		eng_watch_fd(EPOLL_CTL_MOD, s->live_fd,
			     on ? 0 : EPOLLIN | EPOLLRDHUP | EPOLLET, d | 1);
	}
	pthread_mutex_unlock(&eng_w.lock);
	return 1;
}

/* rsk_free: wait until the watcher is done with s. */
void eng_watch_forget(rsk_sock *s)
{
	pthread_mutex_lock(&eng_w.lock);
	while (eng_w.busy == s)
		pthread_cond_wait(&eng_w.cond, &eng_w.lock);
	pthread_mutex_unlock(&eng_w.lock);
}

static void eng_watch_prefork(void)
{
	pthread_mutex_lock(&eng_w.lock);
}

static void eng_watch_parent(void)
{
	pthread_mutex_unlock(&eng_w.lock);
}

/* The child has no watcher: its connections register anew when used. */
static void eng_watch_child(void)
{
	uint32_t i;

	for (i = 0; i < eng_w.cap; i++) {
		if (eng_w.slot[i].s)
			eng_w.slot[i].s->wslot = -1;
		eng_w.slot[i].s = NULL;
		eng_w.slot[i].gen++;
	}
	if (eng_w.epfd >= 0)
		close(eng_w.epfd);
	eng_w.epfd = -1;
	eng_w.busy = NULL;
	pthread_mutex_init(&eng_w.lock, NULL);
	pthread_cond_init(&eng_w.cond, NULL);
}


/* What the engine must wake us for. */
int eng_want_wake(const rsk_sock *s)
{
	if ((s->watch & RSK_WATCH_NOTIFY) && !s->polled && !eng_fd_ready(s))
		return 1;
	return (s->watch & RSK_WATCH_FD) &&
	       !(eng_readable(s) && eng_writable(s)) &&
	       !(s->p.flags & (F_DEAD | F_PEER_GONE));
}

/*
 * Called at the end of every call and by the watcher: bring fa (for
 * RSK_WATCH_FD) and the notify fd (for RSK_WATCH_NOTIFY: kicked exactly
 * while eng_fd_ready) up to date, and arm if something must wake us, then
 * re-poll (arm -> re-poll, so a completion that raced the arm is not
 * missed).  Send space comes back through completions (credit messages),
 * so arming also covers writability.
 */
void eng_sync_fd(rsk_sock *s)
{
	if (s->kind == K_NEW && (s->watch & RSK_WATCH_FD))
		eng_fd_writable(s, !s->dialing);
	if (!s->watch || s->kind != K_CONN || s->released)
		return;
	/* A zero-copy receive holds the head (rsk_recv_zc): the bytes it is
	 * taking still show as readable, and its rsk_recv_done, which comes
	 * next, syncs.  Syncing here too cost a kick of the notify fd (or a
	 * token into fa) and its drain right after: two syscalls per message
	 * for every event loop's receive. */
	if (s->rx_busy)
		return;
	if ((s->watch & RSK_WATCH_FD) && s->stand_in && eng_fd_exact(s))
		s->watch &= ~RSK_WATCH_FD; /* (EMFILE) fa stays as it is */
	if ((s->watch & RSK_WATCH_FD) && s->wslot < 0 && eng_watch_add(s))
		s->watch &= ~RSK_WATCH_FD; /* no thread: fa stays as it is */
	for (;;) {
		if (s->watch & RSK_WATCH_FD)
			eng_sync_pair(s);
		if ((s->watch & RSK_WATCH_NOTIFY) && !s->fd_waiter &&
		    !s->polled) {
			if (eng_fd_ready(s)) {
				if (!s->kicked) {
					s->p.ops->kick(s->p.qp);
					s->kicked = 1;
				}
			} else if (s->kicked || !s->p.ops->armed(s->p.qp)) {
				eng_ack(s);
			}
		}
		if (!eng_want_wake(s) || s->fd_waiter ||
		    s->p.ops->armed(s->p.qp))
			return;
		s->p.ops->arm(s->p.qp);
		s->st.arms++;
		if (!eng_progress(s))
			return;
	}
}

void eng_fd_set_nonblock(int fd, int nb)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0 && !!(fl & O_NONBLOCK) != !!nb)
		fcntl(fd, F_SETFL, nb ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/*
 * A poller's registration of fileno() across a change of its file.  A
 * kernel socket keeps one file from socket() to close(), so a program may
 * add its fd to an epoll before listen() (asyncore's way: pyftpdlib's loop
 * registers at socket creation) and expect events on it after.  fileno()'s
 * file changes at listen() (a socketpair's end becomes the listener's epoll
 * fd) and after a refused connect (a new socketpair): the kernel drops the
 * old file's registrations with it.  So before the change the process's
 * epoll instances are searched (/proc/self/fdinfo: each watched fd's number,
 * events, data and inode) for fa's current file, and each registration is
 * made again, same events and data, on the new file.  Only when fa was made
 * before (a rare order); an epoll fd closed and its number reused between
 * the two steps is told by its inode.
 */
#define EPOLL_CARRY_MAX 16

struct epoll_carry {
	int epfd;
	ino_t epino;
	struct epoll_event ev;
};

static int carry_scan(int epfd, int fd, ino_t ino, struct epoll_carry *c)
{
	char path[48], line[256];
	FILE *f;
	int found = 0;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", epfd);
	if (!(f = fopen(path, "re")))
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		int tfd;
		unsigned int events;
		unsigned long long data;
		unsigned long tino;

		if (sscanf(line, "tfd: %d events: %x data: %llx pos:%*[-0-9] ino:%lx",
			   &tfd, &events, &data, &tino) == 4 &&
		    tfd == fd && (ino_t)tino == ino) {
			c->ev.events = events;
			c->ev.data.u64 = data;
			found = 1;
		}
	}
	fclose(f);
	return found;
}

static int carry_find(int fd, struct epoll_carry *c, int max)
{
	struct stat st, est;
	struct dirent *e;
	DIR *d;
	int n = 0;

	if (fstat(fd, &st) < 0 || !(d = opendir("/proc/self/fd")))
		return 0;
	while (n < max && (e = readdir(d))) {
		char link[32];
		char *end;
		long ep = strtol(e->d_name, &end, 10);
		ssize_t l;

		if (*end || end == e->d_name || ep == fd || ep == dirfd(d))
			continue;
		l = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
		if (l <= 0)
			continue;
		link[l] = '\0';
		if (strcmp(link, "anon_inode:[eventpoll]") ||
		    fstat((int)ep, &est) < 0)
			continue;
		c[n].epfd = (int)ep;
		c[n].epino = est.st_ino;
		if (carry_scan((int)ep, fd, st.st_ino, &c[n]))
			n++;
	}
	closedir(d);
	return n;
}

static void carry_put(int fd, const struct epoll_carry *c, int n)
{
	struct stat est;
	int i;

	for (i = 0; i < n; i++) {
		struct epoll_event ev = c[i].ev;

		if (fstat(c[i].epfd, &est) == 0 && est.st_ino == c[i].epino)
			epoll_ctl(c[i].epfd, EPOLL_CTL_ADD, fd, &ev);
	}
}

static int fd_dup_onto(int from, int fa, int carry_over)
{
	struct epoll_carry carry[EPOLL_CARRY_MAX];
	int fl = fcntl(fa, F_GETFL);
	int n = carry_over ? carry_find(fa, carry, EPOLL_CARRY_MAX) : 0;

	if (dup3(from, fa, O_CLOEXEC) < 0)
		return -errno;
	eng_fd_set_nonblock(fa, fl >= 0 && (fl & O_NONBLOCK));
	carry_put(fa, carry, n);
	return 0;
}

int eng_fd_dup_onto(int from, int fa)
{
	return fd_dup_onto(from, fa, 1);
}

int eng_fd_dup_onto_unpolled(int from, int fa)
{
	return fd_dup_onto(from, fa, 0);
}

/* A new socketpair for fileno(): its second end becomes fb, set up as
 * eng_fd_init does; its first end (to become fa), or -errno. */
static int eng_fd_pair(rsk_sock *s)
{
	int fab[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
		       fab) < 0)
		return -errno;
	s->fb = fab[1];
	s->tok = 0;
	s->filled = 0;
	s->fa = fab[0]; /* (eng_fd_init sets fa's buffer) */
	eng_fd_init(s);
	return fab[0];
}

/* fileno(), made on first use (s->lock held): a listener's is a dup of
 * its epoll fd; anything else's one end of a new socketpair, showing what
 * it must (a refused connect's pending error and hang-up; a connection's
 * state once eng_leave syncs it).  The fd, or -errno. */
int eng_fd_make(rsk_sock *s)
{
	int rc;

	if (s->fa >= 0)
		return s->fa;
	if (s->kind == K_LISTEN) {
		s->fa = fcntl(s->epfd, F_DUPFD_CLOEXEC, 0);
		if (s->fa < 0)
			return -errno;
		/* (the flag of epfd's file: epoll_wait does not read it) */
		eng_fd_set_nonblock(s->fa, 1);
		return s->fa;
	}
	if (s->kind == K_CONN && !(s->watch & RSK_WATCH_FD) && !s->closed) {
		/* nobody asks for it exact (yet): a stand-in, one fd and one
		 * call instead of a socketpair set up in four (eng_fd_exact).
		 * An unconnected Unix stream socket: read(fd, 0) gives 0, other
		 * reads and writes fail at once (no bytes lost, no wait: a dup
		 * adopted as a socket fails its calls), epoll takes it, and a
		 * poller rsock never heard of (C code) finds it always ready
		 * (POLLOUT | POLLHUP), so it calls the socket's methods and gets
		 * their answers, where a never-ready fd would leave it asleep */
		s->fa = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
			       0);
		if (s->fa < 0)
			return -errno;
		s->stand_in = 1;
		return s->fa;
	}
	if ((rc = eng_fd_pair(s)) < 0)
		return rc;
	if (s->refused) {
		/* as rsk_set_refused does to a pair made before */
		close(s->fb);
		s->fb = -1;
	}
	return s->fa;
}

/* A new socketpair whose first end takes fa's number (with any poller's
 * registration of it) and whose second becomes fb; 0, or -errno with fa as
 * it was and no fb. */
static int eng_fd_pair_onto(rsk_sock *s)
{
	int fa = s->fa, a, rc;

	if ((a = eng_fd_pair(s)) < 0) {
		s->fa = fa;
		s->fb = -1;
		return a;
	}
	rc = s->unpolled ? eng_fd_dup_onto_unpolled(a, fa) :
			   eng_fd_dup_onto(a, fa);
	close(a);
	if (rc < 0) {
		close(s->fb);
		s->fb = -1;
	}
	s->fa = fa;
	return rc;
}

/* RSK_WATCH_FD came on while fa is a stand-in (eng_fd_make): a socketpair
 * on its number.  0 or -errno (fa stays the stand-in). */
static int eng_fd_exact(rsk_sock *s)
{
	int rc = eng_fd_pair_onto(s);

	s->unpolled = 0;
	if (!rc)
		s->stand_in = 0;
	return rc;
}

/* After rsk_set_refused, the next connect or listen needs a live fa: a new
 * socketpair, its first end moved onto fa's number.  (Pollers that
 * registered the old fa lose it, as its file is gone.)  With no fa made
 * yet, there is nothing to renew. */
int eng_fd_renew(rsk_sock *s)
{
	int rc;

	if (!s->refused)
		return 0;
	s->refused = 0;
	if (s->fa < 0)
		return 0;
	if ((rc = eng_fd_pair_onto(s)) < 0)
		s->refused = 1;
	return rc;
}

/* ------------------------------------------------------- polling mode */

/*
 * An event loop in polling mode (rsock.asyncio, RSOCK_LOOP_POLL_US) looks
 * at its connections' rings itself for a while after their last activity
 * instead of sleeping on their notify fds: no eventfd write by the peer,
 * no wake-up, no read of it here, per message.  While s->polled the notify
 * fd is left as it is and nothing arms for it (eng_want_wake, eng_sync_fd;
 * RSK_WATCH_FD and blocking calls arm as always); turning it off brings
 * the fd up to date and arms, in eng_leave, before the loop sleeps on it.
 */
int rsk_set_polled(rsk_sock *s, int on)
{
	int rc;

	if ((rc = eng_enter(s)))
		return rc;
	if (s->kind != K_CONN) {
		rc = -ENOTCONN;
	} else if (on && !s->polled) {
		s->polled = 1;
		/* an arm of before would cost the peer one notify (and us its
		 * read when polling ends) for nothing */
		if (!s->fd_waiter && !(s->watch & RSK_WATCH_FD) &&
		    s->p.ops->armed(s->p.qp))
			s->p.ops->disarm(s->p.qp);
	} else if (!on) {
		s->polled = 0;
	}
	eng_leave(s); /* off: the notify fd exact, armed if need be */
	return rc;
}

/* Is s ready for its interest, after taking in its completions? (s->lock) */
static int eng_spin_look(rsk_sock *s)
{
	if (s->closed || s->released || s->kind != K_CONN ||
	    (eng_forked(s) && !eng_owned(s)))
		return 0;
	if (s->p.ops->cq_pending(s->p.qp) && eng_progress(s))
		eng_sync_fd(s);
	return eng_fd_ready(s);
}

int rsk_spin_ready(rsk_sock *const *v, int n, int budget_us, int *ready)
{
	int64_t end;
	int i, k;

	if (n < 0 || budget_us < 0 || (n && (!v || !ready)))
		return -EINVAL;
	end = eng_now_ns() + (int64_t)budget_us * 1000;
	for (;;) {
		for (i = k = 0; i < n; i++) {
			rsk_sock *s = v[i];
			int r;

			if (!s)
				continue;
			eng_lock(s);
			r = eng_spin_look(s);
			pthread_mutex_unlock(&s->lock);
			if (r)
				ready[k++] = i;
		}
		if (k || eng_now_ns() >= end)
			return k;
		sched_yield();
	}
}
