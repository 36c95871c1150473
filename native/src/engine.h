/*
 * engine.h - private to native/src: the connection object and the
 * engine's internals that listener.c, readiness.c and fork.c use (the
 * connection managers' interface is cm.h, included here).
 */
#ifndef RSK_ENGINE_H
#define RSK_ENGINE_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include "cm.h"
#include "proto.h"
#include "prov.h"
#include "rsock.h"

/* After the peer's liveness channel hangs up without a FIN seen, where a
 * FIN's completion may lag behind the hang-up (prov_ops.completions_lag),
 * the provider fences the stream's end (prov_ops.hup_fence: a flushed
 * receive follows whatever the peer delivered); this bounds the wait for
 * that flush.  Nobody sleeps it: the liveness fd turns readable again
 * when it ends. */
#define LIVE_GRACE_NS 100000000ll

/* A sender with room in the peer's ring looks at the liveness channel at
 * most this often (1 ms). */
#define LIVE_TICK_NS 1000000ll

enum rsk_kind { K_NEW = 0, K_LISTEN, K_CONN };

struct rsk_sock {
	/*
	 * Locking: `lock` protects every field below and every call into the
	 * provider or a listener (ls[]).  It is the only lock of a socket
	 * (there is no lock order to keep); it is never held while sleeping:
	 * exactly one thread (the fd_waiter) sleeps in poll on the
	 * connection's fds (a listener: epoll_wait on epfd),
	 * every other waiter sleeps on the futex `cseq` (eng_sleep), and
	 * whoever makes progress wakes them (eng_wake).
	 */
	pthread_mutex_t lock;
	unsigned lock_gen; /* eng_fork_gen when lock was made (eng_lock) */
	uint32_t cseq;  /* futex: bumped by eng_wake while cwaiters > 0 */
	int cwaiters;   /* threads in eng_sleep */
	int epfd; /* a listener's (its fds, parked clients): -1 until listen */
	enum rsk_kind kind;
	int users;    /* calls in flight (and a held zero-copy receive) */
	int closed;   /* rsk_close called: new calls get -EBADF */
	int released; /* rings and fds gone */
	int fd_waiter;
	int waiter_kfd; /* the fd_waiter's thread's kick eventfd (or -1) */
	int watch;    /* RSK_WATCH_NOTIFY | RSK_WATCH_FD */
	int interest; /* RSK_POLLIN/RSK_POLLOUT that make the fd readable */
	int kicked; /* we made our own notify fd readable */
	int polled; /* rsk_set_polled: a loop polls it; no arming and no
		     * notify fd upkeep for RSK_WATCH_NOTIFY */
	unsigned fork_gen;  /* eng_fork_gen/eng_fork_pgen when connected: a */
	unsigned fork_pgen; /* connection that crossed a fork is shared */
	uint32_t creator;   /* pid that connected/accepted it */
	struct rsk_opts opts;
	/* A blocking call's spin (eng_wait): this connection's budget in ns,
	 * at most opts.spin_us (-1: that; set again with the opts), adapted
	 * to how long its waits take (eng_spin_adapt); spin_long: waits in a
	 * row longer than opts.spin_us and a quarter (SPIN_LONG). */
	int64_t spin_ns;
	int spin_long;
	char detail[160];

	/* listener: at most one per connection manager, ls[i] cm_managers[i]'s
	 * (cm.h: the manager keeps its fds and waiting clients) */
	struct cm_listener *ls[CM_NMANAGERS];
	int lshared; /* the listeners' fds are shared with other processes
		      * (rsk_listen_fds, rsk_listen_adopt, a JOIN answered):
		      * never shut down on close */
	int reuseport; /* rsk_listen_reuseport: JOINs are answered */
	int xfd; /* rsk_listen_fd: not owned, -1 if none */

	/* connection: the protocol's state (proto.h), its provider (p.ops,
	 * p.qp) and what the engine adds around it */
	struct proto p;
	int live_fd;
	int bell; /* the peer rings live_fd (prov set_bell): it carries the
		   * peer's wake-ups as well as its hang-up */
	int live_drained; /* its bells read to the end since rsk_check_peer */
	int64_t live_next; /* next liveness look of a sender (eng_live_tick) */
	int64_t hup_at; /* the CM reported the peer's end with no FIN seen:
			 * a reset unless a FIN arrives by hup_at (0: no) */
	struct rsk_addr laddr; /* as the connection manager saw them */
	struct rsk_addr paddr;
	int rx_busy; /* a zero-copy receive holds the head */

	struct rsk_stats st;

	/* fileno(): -1 until first asked for (eng_fd_make); then fa, one end
	 * of a socketpair whose other end (fb) only this struct holds.  fa
	 * polls readable while a token byte sits in it, writable while its send buffer has room (shrunk while a send
	 * would block; RSK_WATCH_FD, see "fd readiness" in conn.c).  A
	 * listener's fa is a second fd of epfd and fb is -1.  A connection
	 * whose fileno() is made while nobody asks for it exact (no
	 * RSK_WATCH_FD: an event loop watches its notify fd) gets a stand-in
	 * first, an unconnected Unix stream socket (always ready to a poller:
	 * POLLOUT | POLLHUP; reads and writes fail), which becomes
	 * a socketpair's end, on the same number, when RSK_WATCH_FD comes on
	 * (eng_sync_fd). */
	int fa, fb;
	int stand_in; /* fa is that stand-in (fb -1) */
	int unpolled; /* RSK_WATCH_UNPOLLED: nobody polls the stand-in, so
		       * its exact pair needs no registrations carried over */
	int fd_mode;  /* fa's O_NONBLOCK is the socket's mode (rsk_fd_blocking):
		       * a wait with no timeout honours it */
	int tok;    /* a token sits in fa */
	int filled; /* fa's send buffer is shrunk: not writable */
	int dialing; /* K_NEW: rsk_set_dialing (fa not writable) */
	int refused; /* K_NEW: rsk_set_refused (fb closed; eng_fd_renew) */
	int wslot;  /* our slot in the watcher thread's table, -1 if none
		     * (taken and dropped under s->lock; the table's own lock
		     * comes after it) */

};

/* sock.c and progress.c, for the API files and readiness.c (s->lock: see
 * struct rsk_sock) */
/* The fd besides the liveness fd that tells of s's completions (prov.h:
 * wait_fd), or -1. */
static inline int eng_wait_fd(const rsk_sock *s)
{
	return s->p.ops->wait_fd ? s->p.ops->wait_fd(s->p.qp)
				 : s->p.ops->notify_fd(s->p.qp);
}

/* Enter an API call on s: its lock, -EBADF if closed, counted as a user. */
int eng_enter(rsk_sock *s);
/* Leave it: fileno() brought up to date, the lock released. */
void eng_leave(rsk_sock *s);
void eng_set_detail(rsk_sock *s, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* A call with no timeout is about to wait: does fileno()'s O_NONBLOCK flag,
 * which someone turned on through the fd, say it must not (s->lock)? */
int eng_fd_nonblock(const rsk_sock *s);
/* The connection's error was reported: fileno()'s POLLERR goes, as a TCP
 * socket's does (s->lock held). */
void eng_fd_error_taken(rsk_sock *s);
/* After a refused connect: a live fileno() again (0 or -errno). */
int eng_fd_renew(rsk_sock *s);
/* fileno(), made on first use (O_NONBLOCK, whatever its kind): the fd or
 * -errno. */
int eng_fd_make(rsk_sock *s);
/* Another file (from) takes fileno()'s number fa (dup3), with fa's
 * O_NONBLOCK flag kept: that flag is the socket's mode, which rsock.socket
 * sets (eng_fd_renew, a listener's epfd).  0 or -errno. */
int eng_fd_dup_onto(int from, int fa);
/* The same without looking for pollers' registrations of fa (nobody polls
 * it: RSK_WATCH_UNPOLLED). */
int eng_fd_dup_onto_unpolled(int from, int fa);
/* Sets or clears fd's O_NONBLOCK flag (no call if it is so already). */
void eng_fd_set_nonblock(int fd, int nb);
/* The epoll fd of a listener, made on first use: 0 or -errno. */
int eng_epfd(rsk_sock *s);
/* s (fresh) takes over the connection in *res. */
int eng_attach(rsk_sock *s, struct cm_result *res);
/* Was s made (or connected) before a fork, in this process's view? */
int eng_crossed_fork(const rsk_sock *s);

/* Signals blocked in the calling thread (*old: the mask before). */
void eng_sig_block_all(sigset_t *old);
/* Has this connection crossed a fork?  Is it this process's (claimed)?
 * Has nobody used it since the fork? */
int eng_forked(const rsk_sock *s);
int eng_owned(rsk_sock *s);
int eng_unclaimed(rsk_sock *s);
/* Take in completions and control messages (s->lock held). */
int eng_progress(rsk_sock *s);
/* The liveness fd fired: look whether the peer is gone. */
int eng_poll_live(rsk_sock *s);
/* Wake the threads that sleep on s. */
void eng_wake(rsk_sock *s);

/* fork.c */
/* Once per process: the atfork handlers. */
void eng_fork_init(void);
/* s belongs to this side of any fork from now on (lock_too: its lock
 * too, for a new socket). */
void eng_fork_stamp(rsk_sock *s, int lock_too);
/* This process made the connection s: the creator, and the owner word. */
void eng_fork_own(rsk_sock *s);
/* s's lock, renewed first if s crossed a fork (its holder may be gone). */
void eng_lock(rsk_sock *s);
/* May this process use s, which crossed a fork (1), or not (0)? */
int eng_claim(rsk_sock *s);
/* signals.c: Python's wakeup fd and the main thread */
/* In a child: forget the parent's signal state. */
void eng_signals_child(void);
/* The wakeup fd of this (main) thread, or -1. */
int eng_my_sigfd(void);
/* Did a signal come (a byte in the wakeup fd)?  Drains it. */
int eng_sig_came(int sigfd);

/* sock.c: the socket object (enter/leave, attach, close: see above) */
/* Frees rings and fds; s->lock held, no user left. */
void eng_release(rsk_sock *s);
/* Do other processes accept from s's listening fds?  (close cannot shut
 * them down then) */
int eng_listen_shared(const rsk_sock *s);

/* progress.c (s->lock held) */
/* Wake waiters if the protocol said something changed (proto.wake). */
void eng_wake_due(rsk_sock *s);
/* The liveness channel fired: the peer's bells taken off it (s->bell),
 * and closed (peer gone) or a protocol error handled. */
void eng_check_live(rsk_sock *s);
/* What the next record on the liveness socket fd says: nothing, or a
 * bell (a record of one byte), taken off (LIVE_QUIET), the end
 * (LIVE_HUP), a REJ (LIVE_REJ, why filled) or anything else (LIVE_BAD)
 * (progress.c). */
enum { LIVE_QUIET, LIVE_HUP, LIVE_REJ, LIVE_BAD };
int eng_live_read(int fd, char *why, size_t wlen);
/* Consume the notifications that woke us: the provider's, and the bells
 * on the liveness channel (s->bell). */
void eng_ack(rsk_sock *s);
/* Wake the thread that sleeps in poll on s's fds (the fd_waiter). */
void eng_kick_waiter(rsk_sock *s);
/* A sender's look at the liveness channel, at most every LIVE_TICK_NS. */
void eng_live_tick(rsk_sock *s);
/* The connection is unusable from now on; tell the peer if we can. */
#define eng_fail(s, ...)                          \
	do {                                      \
		proto_fail(&(s)->p, __VA_ARGS__); \
		eng_wake_due(s);                  \
	} while (0)

/* readiness.c: fileno() and the watcher thread (s->lock held, except the
 * fork hooks) */
int eng_readable(const rsk_sock *s);
int eng_writable(const rsk_sock *s);
int eng_fd_ready(const rsk_sock *s);
void eng_fd_init(rsk_sock *s);
void eng_fd_token(rsk_sock *s);
void eng_sync_pair(rsk_sock *s);
void eng_sync_fd(rsk_sock *s);
int eng_want_wake(const rsk_sock *s);
int eng_watch_add(rsk_sock *s);
/* A crossed, unclaimed connection polled here: see readiness.c. */
void eng_watch_unowned(rsk_sock *s);
void eng_watch_del(rsk_sock *s);
/* A thread sleeps on s's fds itself (on) or woke (off): see readiness.c. */
int eng_watch_mute(rsk_sock *s, int on);
void eng_watch_forget(rsk_sock *s);

/* clock.c: time helpers */
int64_t eng_now_ns(void);
int64_t eng_deadline(int timeout_ms);
int eng_ms_left(int64_t deadline);

#endif
