// SPDX-License-Identifier: MIT
/*
 * signals.c - what lets a Python signal handler run while a thread waits in
 * C: which thread is the main one, Python's wakeup fd, and the signals the
 * watcher thread blocks.  A leaf: it calls nothing of rsock's.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine.h"

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

static int eng_sigfd = -1; /* read end of Python's wakeup fd, or -1 */
static int eng_sigw = -1; /* its write end when known (rsk_set_signal_pipe) */
static __thread int eng_main_tls = -1; /* is this the main thread? */

/*
 * In a fork child (one thread, inside fork()): the parent's pipe is shared,
 * so a signal of either process could wake the other's wait or be taken by
 * it.  With both ends known, the child gets a pipe of its own on the same
 * numbers (dup3 replaces each end at once), which Python keeps writing to
 * and the engine keeps watching: no Python code runs for it (each page a
 * fork child's Python code touches costs it a copy-on-write fault: a
 * Python hook that made the pipe costs an accept-then-fork server's child
 * ~150 us).  Otherwise, or if that fails, the child watches none.
 */
void eng_signals_child(void)
{
	int p[2];

	eng_main_tls = -1; /* the forking thread is the child's main thread */
	if (eng_sigfd >= 0 && eng_sigw >= 0 && pipe2(p, O_NONBLOCK | O_CLOEXEC) == 0) {
		int ok = dup3(p[0], eng_sigfd, O_CLOEXEC) >= 0 &&
			 dup3(p[1], eng_sigw, O_CLOEXEC) >= 0;

		close(p[0]);
		close(p[1]);
		if (ok)
			return;
	}
	__atomic_store_n(&eng_sigfd, -1, __ATOMIC_RELEASE); /* the parent's */
	eng_sigw = -1;
}

int rsk_set_signal_fd(int fd)
{
	if (fd < -1)
		return -EINVAL;
	eng_sigw = -1;
	__atomic_store_n(&eng_sigfd, fd, __ATOMIC_RELEASE);
	return 0;
}

int rsk_set_signal_pipe(int rfd, int wfd)
{
	if (rfd < -1 || wfd < -1 || (rfd < 0) != (wfd < 0) || (rfd >= 0 && rfd == wfd))
		return -EINVAL;
	eng_sigw = wfd;
	__atomic_store_n(&eng_sigfd, rfd, __ATOMIC_RELEASE);
	return 0;
}

static int eng_is_main(void)
{
	if (eng_main_tls < 0)
		eng_main_tls = syscall(SYS_gettid) == getpid();
	return eng_main_tls;
}

/* The wakeup fd of this (main) thread, or -1. */
int eng_my_sigfd(void)
{
	int fd = __atomic_load_n(&eng_sigfd, __ATOMIC_ACQUIRE);

	return fd >= 0 && eng_is_main() ? fd : -1;
}

/* Did a signal come (a byte in the wakeup fd)?  Drains it. */
int eng_sig_came(int sigfd)
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
