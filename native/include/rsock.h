/*
 * rsock.h - the one contract between rsock's C engine and its users
 * (the cffi extension, the C tests and the C benchmark).
 *
 * Conventions:
 *   - every function returns >= 0 on success or -errno on failure
 *     (never -1 + errno);
 *   - handles are opaque; an rsk_sock is a listening or a connected stream
 *     endpoint and owns one pollable fd (rsk_fileno) for its whole life;
 *   - timeouts are in milliseconds: -1 blocks forever, 0 never blocks
 *     (returns -EAGAIN), > 0 returns -ETIMEDOUT when it expires;
 *   - calls may come from several threads at once (cffi drops the GIL);
 *     rsk_close() may race with a blocked call, which then returns -EBADF;
 *     the memory of the handle itself is released by rsk_free() only,
 *     when no thread can still use it.
 *
 * The region between RSK_CDEF_BEGIN and RSK_CDEF_END is fed verbatim to
 * cffi's cdef(), so it holds only plain declarations and integer #defines.
 */
#ifndef RSOCK_H
#define RSOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* RSK_CDEF_BEGIN */

#define RSK_PROTO_VERSION 1

/* rsk_send / rsk_recv flags (values are rsock's own, not MSG_*) */
#define RSK_F_PEEK 1
#define RSK_F_WAITALL 2
#define RSK_F_DONTWAIT 4
/* rsk_send: once some bytes went and the ring is full, return their count
 * instead of waiting for room for the rest (send() on a socket with a
 * timeout, as a kernel socket's: it waits only while nothing fits) */
#define RSK_F_PARTIAL 8

/* rsk_shutdown how (same values as SHUT_RD/SHUT_WR/SHUT_RDWR) */
#define RSK_SHUT_RD 0
#define RSK_SHUT_WR 1
#define RSK_SHUT_RDWR 2

/* rsk_poll event bits (same values as POLLIN/POLLOUT/POLLERR/POLLHUP and
 * Linux's POLLRDHUP): as a TCP socket's, POLLRDHUP once the peer's FIN (or
 * a reset) came, POLLHUP once both directions are shut or the connection
 * died (reset, the peer gone), POLLERR while it has an error */
#define RSK_POLLIN 1
#define RSK_POLLOUT 4
#define RSK_POLLERR 8
#define RSK_POLLHUP 16
#define RSK_POLLRDHUP 0x2000

/* limits of the tunables (struct rsk_opts) */
#define RSK_RING_MIN 4096
#define RSK_RING_MAX 268435456
#define RSK_QDEPTH_MIN 16
#define RSK_QDEPTH_MAX 4096
#define RSK_SPIN_MAX_US 1000000

/* Per-connection tunables; both peers' values travel in the handshake. */
struct rsk_opts {
	uint32_t ring_size;  /* receive ring bytes, power of two */
	uint32_t qdepth;     /* receive slots (message credits) and send queue */
	uint32_t inline_max; /* sends up to this size go inline */
	uint32_t spin_us;    /* busy-poll at most this long before sleeping
			      * (less for a connection whose waits are long) */
};

/* An IPv4/IPv6 endpoint as carried in the handshake (network byte order
 * for addr, host byte order for the rest). family is AF_INET or AF_INET6. */
struct rsk_addr {
	uint16_t family;
	uint16_t port;
	uint32_t flowinfo;
	uint32_t scope_id;
	uint8_t addr[16];
};

/* Per-connection counters (monotonic). */
struct rsk_stats {
	uint64_t tx_bytes;
	uint64_t rx_bytes;
	uint64_t tx_msgs;          /* data messages written to the peer */
	uint64_t rx_msgs;          /* data messages received */
	uint64_t tx_ctrl;          /* control messages (credits, shutdown...) */
	uint64_t rx_ctrl;
	uint64_t credit_stalls;    /* send waited for message credits */
	uint64_t space_stalls;     /* send waited for remote ring space */
	uint64_t arms;             /* notification armed */
	uint64_t notifies_sent;    /* wake-ups sent to the peer */
	uint64_t spins;            /* waits satisfied while spinning */
	uint64_t sleeps;           /* waits that slept in poll() */
	uint64_t cq_polls;         /* provider poll_cq calls */
	uint64_t completions;      /* completions reaped */
};

typedef struct rsk_sock rsk_sock;

void rsk_opts_default(struct rsk_opts *o);
/* Checks and normalises *o (rounds ring_size up to a power of two). */
int rsk_opts_check(struct rsk_opts *o);

/* A new, unconnected endpoint with its pollable fd. */
int rsk_socket(rsk_sock **out);
/* The endpoint's pollable fd, the same number for its whole life: a
 * listener's is readable while a connection is pending; a connection's
 * is exact as poll() of a TCP socket would be (readable: data, EOF or an
 * error; writable: a send would not block) once RSK_WATCH_FD is on. */
int rsk_fileno(rsk_sock *s);
/* The pollable fd moves onto fd's number (made first if need be; what fd
 * was is closed, as dup2 does; its O_NONBLOCK flag is the pollable fd's):
 * socket(fileno=fd) adopting what fd stood for.  Before anyone polls it
 * (a poller of the old number loses it).  fd, or -errno. */
int rsk_fileno_onto(rsk_sock *s, int fd);
/* fileno()'s O_NONBLOCK flag off (blocking) or on, as the socket's own mode
 * (a kernel socket's file flag: rsock.socket keeps it off only while the
 * socket blocks with no timeout).  From then on a call with no timeout that
 * would wait honours the flag as a kernel socket's does: one that someone
 * turned on through the fd (fcntl) makes it return -EAGAIN instead (read
 * only on the way to waiting).  0 or -errno (EBADF: no fileno() yet). */
int rsk_fd_blocking(rsk_sock *s, int blocking);
/* A connection's engine fds: the notify fd (see RSK_WATCH_NOTIFY; on shm
 * an eventfd made by this call) and the liveness fd (readable when the
 * peer is gone; on shm also when the peer rang: its wake-ups come there).
 * An event loop watches these two directly, calling rsk_check_peer when
 * the liveness fd fires: no thread, no nested epoll. */
int rsk_notify_fds(rsk_sock *s, int *notify_fd, int *live_fd);
/* The liveness fd fired: take its wake-ups off, and note the peer's
 * death (or its REJ): 1 if the peer is gone.  After it the notify fd is
 * up to date. */
int rsk_check_peer(rsk_sock *s);
/* What stays exact between calls (a mask; 0 turns watching off):
 * RSK_WATCH_FD: rsk_fileno of a connection polls readable while data, EOF
 *   or an error is there and writable while a send would not block (a
 *   process-wide thread follows the engine's notifications for it);
 * RSK_WATCH_NOTIFY: the notify fd of rsk_notify_fds is readable exactly
 *   while the socket is ready for the events of rsk_set_interest
 *   (RSK_POLLIN, RSK_POLLOUT), as of the last call (rsk_check_peer when
 *   the liveness fd fired), so an event loop can watch the two fds with
 *   readers, no thread involved.
 * Each costs a syscall or two on readiness changes. */
#define RSK_WATCH_NOTIFY 1
#define RSK_WATCH_FD 2
/* With RSK_WATCH_FD, not kept in the mask: the caller knows that nobody
 * polls rsk_fileno yet (rsock.patch() hears of every poller first), so a
 * stand-in fd becomes exact without the search for other pollers'
 * registrations to carry over (a read of /proc/self/fd and fdinfo). */
#define RSK_WATCH_UNPOLLED 4
int rsk_set_watch(rsk_sock *s, int mask);
int rsk_set_interest(rsk_sock *s, int events);
/* Polling mode of an event loop (rsock.asyncio: RSOCK_LOOP_POLL_US).  While
 * on, RSK_WATCH_NOTIFY neither arms the connection's notification (the
 * peer writes no eventfd and rings no bell for it) nor keeps the notify fd
 * exact: the caller finds readiness with rsk_spin_ready instead, and must
 * not sleep on the notify fd.  Turning it off arms again and makes the
 * notify fd exact (readable now if the socket is ready), so a loop may
 * sleep on it again.  -ENOTCONN if not a connection. */
int rsk_set_polled(rsk_sock *s, int on);
/* Busy-polls the connections v[0..n) for up to budget_us microseconds
 * (yielding the CPU between rounds) until one or more is ready for the
 * events of its rsk_set_interest, or its peer is gone; writes their
 * indexes to ready[] (room for n) and returns how many, 0 if none became
 * ready in time.  Closed sockets and NULL entries are skipped.  Never
 * sleeps; takes each socket's lock for its look only. */
int rsk_spin_ready(rsk_sock *const *v, int n, int budget_us, int *ready);
/* An unconnected endpoint whose connect goes on elsewhere (a thread of the
 * caller's waits for a full backlog): while on, rsk_fileno does not poll
 * writable, as a TCP socket's whose SYN is unanswered; off again, it polls
 * writable (the connect's outcome is then read as SO_ERROR). */
int rsk_set_dialing(rsk_sock *s, int on);
/* A non-blocking connect of this unconnected endpoint failed (its outcome is
 * read as SO_ERROR): rsk_fileno polls as a refused TCP socket's fd does,
 * readable, writable, error and hang-up, until the next connect or listen
 * (which give it a fresh fd under the same number).  -EISCONN if it is
 * connected or listening. */
int rsk_set_refused(rsk_sock *s);
/* The read end of the process's signal wakeup fd (Python's
 * signal.set_wakeup_fd writes a byte into the other end when a signal
 * arrives), -1 for none: a blocking call in the main thread returns
 * -EINTR when a byte comes, even while it busy-polls.  Process-wide; a
 * forked child starts with none. */
int rsk_set_signal_fd(int fd);
/* Both ends of that wakeup fd, a pipe of the caller's (-1, -1: none): as
 * rsk_set_signal_fd(rfd), and a forked child gets a pipe of its own on
 * the same two fd numbers (made in the fork, before any Python code runs
 * in the child), so that Python's wakeup fd and the engine's stay one pipe
 * and the parent's is no longer shared.  -EINVAL for a bad pair. */
int rsk_set_signal_pipe(int rfd, int wfd);
int rsk_get_opts(rsk_sock *s, struct rsk_opts *o);
int rsk_set_opts(rsk_sock *s, const struct rsk_opts *o);

/* Listening: each call adds one rendezvous name (an abstract Unix-domain
 * name, without the leading NUL) to the endpoint; -EADDRINUSE if taken. */
int rsk_listen(rsk_sock *s, const char *name, size_t namelen, int backlog);
/* Sharing a listener between processes (multiprocessing hands sockets to
 * its children this way): rsk_rendezvous_bind returns a new fd bound to the
 * name, not listening yet (-EADDRINUSE if taken); rsk_listen_adopt makes
 * such an fd (inherited, or one of rsk_listen_fds) listen and join s,
 * which owns it on success (-ENOTSOCK, -EINVAL for any other kind of
 * fd); the
 * processes holding it share its queue, as with a kernel listener.  shared:
 * other processes hold the fd too, so closing s must not shut it down (a
 * close then wakes an accept blocked in another thread within its bounded
 * wait, not at once).  rsk_listen_fds copies up to n of a listener's
 * rendezvous fds (still s's, and shared from then on) and returns how many
 * it has. */
int rsk_rendezvous_bind(const char *name, size_t namelen);
/* SO_REUSEPORT across processes (PROTOCOL.md section 6, JOIN): with
 * rsk_listen_reuseport on, a listener answers the JOINs that come to its
 * accept with its rendezvous socket, and is shared from then on;
 * rsk_rendezvous_join, where rsk_rendezvous_bind found the name taken,
 * asks the listener of our uid that holds it and returns that socket's fd
 * (for rsk_listen_adopt, shared), waiting up to timeout_ms (-1: 1 s) for
 * its process to accept: -EADDRINUSE if it does not allow it, is another
 * uid's or does not answer; -EAGAIN if nobody holds the name any more. */
int rsk_listen_reuseport(rsk_sock *s, int on);
int rsk_rendezvous_join(const char *name, size_t namelen, int timeout_ms);
int rsk_listen_adopt(rsk_sock *s, int fd, int backlog, int shared);
int rsk_listen_fds(rsk_sock *s, int *fds, int n);
/* Also listen on fd (not owned; e.g. a kernel TCP listener on the same
 * port): it joins the pollable fd, and rsk_accept returns -EXDEV when a
 * connection waits there (and none on the rendezvous), for the caller to
 * accept it itself. */
int rsk_listen_fd(rsk_sock *s, int fd);
/* Accepts one connection; *out is a new connected endpoint (rsk_free it).
 * src/dst receive the addresses the client announced. */
int rsk_accept(rsk_sock *s, int timeout_ms, rsk_sock **out,
	       struct rsk_addr *src, struct rsk_addr *dst);

/* Connects through the rendezvous name; -ECONNREFUSED if nobody listens,
 * -EACCES if the listener runs under another uid. */
int rsk_connect(rsk_sock *s, const char *name, size_t namelen,
		const struct rsk_addr *src, const struct rsk_addr *dst,
		int timeout_ms);
/* rsk_connect whose client end first binds the rendezvous name bound
 * (bound_len bytes): the name that holds src's port for as long as the
 * connection lives (no kernel socket needed to reserve it).  -EADDRINUSE
 * if another connection holds it (the caller picks another port). */
int rsk_connect_bound(rsk_sock *s, const char *name, size_t namelen,
		      const char *bound, size_t bound_len,
		      const struct rsk_addr *src, const struct rsk_addr *dst,
		      int timeout_ms);

/* Frees what the engine keeps between connections for the next ones:
 * the shared-memory arenas no connection of this process uses any more
 * (each is dropped 2 s after its last connection anyway, at the next
 * connect or accept).  Returns how many went. */
int rsk_trim(void);

/* The verbs provider (RDMA RC queue pairs through rdma_cm; libibverbs
 * and librdmacm are loaded at run time).  rsk_verbs_probe returns the
 * number of RDMA devices (> 0) when verbs can be used, else -ENOSYS (no
 * rdma-core) or -ENODEV (no device), with one sentence in detail. */
int rsk_verbs_probe(char *detail, size_t dlen);
/* Also listen for RDMA (rdma_cm) connections on addr (its port space is
 * not the kernel's TCP ports: the same port number is fine). */
int rsk_listen_verbs(rsk_sock *s, const struct rsk_addr *addr, int backlog);
/* Connects over rdma_cm to dst (src may be NULL); -ECONNREFUSED if no
 * rsock listener is there.  flags: RSK_VF_LOOPBACK4/6 when dst stands in
 * for the loopback address the application dialed (rdma_cm cannot route
 * loopback); the server then shows the connection as a loopback one. */
#define RSK_VF_LOOPBACK4 1
#define RSK_VF_LOOPBACK6 2
int rsk_connect_verbs(rsk_sock *s, const struct rsk_addr *src,
		      const struct rsk_addr *dst, int flags, int timeout_ms);
/* A connection's addresses as its connection manager saw them (for
 * verbs: the RDMA addresses and rdma_cm ports). */
int rsk_addrs(rsk_sock *s, struct rsk_addr *local, struct rsk_addr *peer);
/* "shm" or "verbs" for a connection, "" otherwise. */
const char *rsk_provider(rsk_sock *s);

/* Stream I/O. rsk_send copies straight from buf into the peer's ring and
 * returns the bytes taken (all of them unless timeout/nonblocking).
 * rsk_recv copies out of the local ring; 0 means EOF. */
ssize_t rsk_send(rsk_sock *s, const void *buf, size_t len, int flags,
		 int timeout_ms);
ssize_t rsk_recv(rsk_sock *s, void *buf, size_t len, int flags,
		 int timeout_ms);
/* Zero-copy receive: waits like rsk_recv, then points *ptr at up to len
 * contiguous readable bytes in the ring and returns their count, holding
 * the receive side; rsk_recv_done(s, n) consumes n of them and releases
 * it. 0 means EOF (nothing held, no rsk_recv_done needed); *ptr is
 * written only when the call returns > 0. */
ssize_t rsk_recv_zc(rsk_sock *s, size_t len, int flags, int timeout_ms,
		    const void **ptr);
int rsk_recv_done(rsk_sock *s, size_t n);

int rsk_shutdown(rsk_sock *s, int how);
/* Current readiness, RSK_POLL* bits; never blocks. */
int rsk_poll(rsk_sock *s);
/* Blocks until one of events is ready or the timeout; returns revents. */
int rsk_wait(rsk_sock *s, int events, int timeout_ms);
/* Pending error (like SO_ERROR): returns and clears it, 0 if none (after
 * rsk_set_refused it clears the pending error of rsk_fileno too). */
int rsk_take_error(rsk_sock *s);
/* Human-readable cause of the last connection failure ("" if none). */
const char *rsk_detail(rsk_sock *s);
int rsk_stats(rsk_sock *s, struct rsk_stats *st);
/* Bounded: tells the peer, releases rings and fds, wakes blocked callers. */
int rsk_close(rsk_sock *s);
/* An abortive close's first step, as close() of a TCP socket with
 * SO_LINGER {1, 0} sends a reset: the connection is reset now (the peer
 * reads what had arrived, then ECONNRESET), whatever it had not taken is
 * dropped; rsk_close follows.  A copy of a forked connection that another
 * process owns is left alone (its close is quiet).  0, -EBADF once closed,
 * -ENOTCONN if not a connection. */
int rsk_abort(rsk_sock *s);
/* Releases the handle itself (after rsk_close; closes first if needed). */
void rsk_free(rsk_sock *s);

/* RSK_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* RSOCK_H */
