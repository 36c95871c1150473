// SPDX-License-Identifier: MIT
/*
 * fork.c - ownership of connections across fork(): generations that tell
 * whether a socket crossed a fork, the owner word in shared memory that
 * lets exactly one process drive a connection, and the lock a child must
 * renew for a socket whose lock a vanished thread may hold.
 *
 * Rule: nothing here sleeps or makes a call into a provider but reading and
 * swapping the owner word; the atfork handlers only bump counters and hand
 * over to signals.c (signal state); readiness.c keeps its watcher thread's
 * table across a fork with atfork handlers of its own.
 */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "engine.h"

/*
 * fork(): a connection then lives in two processes, as a kernel socket
 * would, but its engine state (counters) is private to each.  Exactly one
 * process may use it: the owner, a pid kept in shared memory (eng_claim).
 * Accept-then-fork servers work: the child serves, the parent closes its
 * copy without using it; whoever loses the claim gets EBADF.  A connection
 * that crossed a fork ends (FIN, or RESET over unread data) on the close()
 * of the process that owns it, the only one that may use it; a copy nobody
 * used since the fork closes quietly (the peer learns from the liveness
 * channel when the last holder is gone); an explicit shutdown() always
 * ends it.
 */
static unsigned eng_fork_gen;  /* bumped in a child */
static unsigned eng_fork_pgen; /* bumped in a parent */
static uint32_t eng_pid;
static pthread_mutex_t eng_fix_lock = PTHREAD_MUTEX_INITIALIZER; /* eng_lock */
static pthread_once_t eng_once = PTHREAD_ONCE_INIT;


/* (readiness.c keeps its watcher's table across a fork with handlers of
 * its own, registered after these: its prepare runs first, its parent and
 * child handlers after these.) */
static void eng_atfork_parent(void)
{
	eng_fork_pgen++;
}

static void eng_atfork_child(void)
{
	pthread_mutex_init(&eng_fix_lock, NULL);
	eng_fork_gen++;
	eng_pid = (uint32_t)getpid();
	eng_signals_child();
}

static void eng_init_once(void)
{
	eng_pid = (uint32_t)getpid();
	pthread_atfork(NULL, eng_atfork_parent, eng_atfork_child);
}

/*
 * A fork copies a socket's lock as it was: held, if another thread of the
 * parent was inside a call, by a thread the child does not have.  So the
 * first call a child makes on a socket older than the fork starts it a
 * new lock, and forgets the calls that were in flight (their threads are
 * not in the child).  eng_fix_lock makes that first time happen once.
 */
void eng_lock(rsk_sock *s)
{
	if (__atomic_load_n(&s->lock_gen, __ATOMIC_ACQUIRE) != eng_fork_gen) {
		pthread_mutex_lock(&eng_fix_lock);
		if (s->lock_gen != eng_fork_gen) {
			pthread_mutex_init(&s->lock, NULL);
			s->users = 0;
			s->fd_waiter = 0;
			s->cwaiters = 0;
			s->rx_busy = 0;
			__atomic_store_n(&s->lock_gen, eng_fork_gen,
					 __ATOMIC_RELEASE);
		}
		pthread_mutex_unlock(&eng_fix_lock);
	}
	pthread_mutex_lock(&s->lock);
}

/* Was s made (or connected) before a fork, in this process's view? */
int eng_crossed_fork(const rsk_sock *s)
{
	return s->fork_gen != eng_fork_gen || s->fork_pgen != eng_fork_pgen;
}

/* Has this connection crossed a fork (in this process's view)? */
int eng_forked(const rsk_sock *s)
{
	return s->kind == K_CONN && !s->released &&
	       (s->fork_gen != eng_fork_gen || s->fork_pgen != eng_fork_pgen);
}

/* owner word: a pid, with OWNER_USED set once the creator has used the
 * connection after a fork (pids are below 2^22) */
#define OWNER_USED 0x80000000u

/* Has this process already claimed a connection that crossed a fork? */
int eng_owned(rsk_sock *s)
{
	uint32_t o = __atomic_load_n(s->p.ops->owner_word(s->p.qp),
				     __ATOMIC_ACQUIRE);

	return o == (eng_pid == s->creator ? (s->creator | OWNER_USED)
					   : eng_pid);
}

/* Has nobody used a connection that crossed a fork since the fork? */
int eng_unclaimed(rsk_sock *s)
{
	return __atomic_load_n(s->p.ops->owner_word(s->p.qp), __ATOMIC_ACQUIRE) ==
	       s->creator;
}

/*
 * May this process use a connection that crossed a fork?  The creator may
 * as long as nobody claimed it (and marks it used); another process may
 * claim it only while the creator has not touched it since the fork, so
 * two processes' engine states never both drive one connection.  A claim
 * is final: an owner that exits leaves the connection to nobody.
 */
int eng_claim(rsk_sock *s)
{
	uint32_t *w = s->p.ops->owner_word(s->p.qp);
	uint32_t o = __atomic_load_n(w, __ATOMIC_ACQUIRE);
	uint32_t want;

	if (eng_pid == s->creator) {
		if (o == (s->creator | OWNER_USED))
			return 1;
		want = s->creator | OWNER_USED; /* first use since the fork */
	} else {
		if (o == eng_pid)
			return 1;
		want = eng_pid;
	}
	if (o != s->creator)
		return 0; /* claimed by another process, or used by the creator */
	if (__atomic_compare_exchange_n(w, &o, want, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE))
		return 1;
	return o == want;
}

void eng_fork_init(void)
{
	pthread_once(&eng_once, eng_init_once);
}

void eng_fork_stamp(rsk_sock *s, int lock_too)
{
	s->fork_gen = eng_fork_gen;
	s->fork_pgen = eng_fork_pgen;
	if (lock_too)
		s->lock_gen = eng_fork_gen;
}

void eng_fork_own(rsk_sock *s)
{
	s->creator = eng_pid;
	__atomic_store_n(s->p.ops->owner_word(s->p.qp), eng_pid, __ATOMIC_RELEASE);
}

