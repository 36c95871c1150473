/*
 * prov.h - the RC-queue-pair shape every provider implements.
 *
 * A provider connects two "recv areas" (one per side, registered for
 * remote write) and offers the few verbs the engine needs: post a
 * zero-length receive, post an RDMA WRITE WITH IMMEDIATE into the peer's
 * area, poll a completion queue, and arm a notification fd.  Completion
 * semantics follow RC: writes land in order, each write-with-imm consumes
 * one posted receive at the peer and produces one receive completion there
 * (carrying imm and byte_len); a send completion is produced only for
 * signaled writes.  A write outside the peer's area, or with no receive
 * posted, puts the QP in the error state (as an HCA would).
 */
#ifndef RSK_PROV_H
#define RSK_PROV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define PROV_SIGNALED 1
#define PROV_INLINE 2

/* wr_id tag for receive completions (high bit), as rsockets does */
#define PROV_WRID_RECV (1ull << 63)

struct prov_wc {
	uint64_t wr_id;
	uint32_t imm;
	uint32_t byte_len;
	int status; /* 0 or -errno (the QP is then in error); -ESHUTDOWN:
		     * flushed (the QP was already in error) */
	int is_recv;
};

struct prov_qp;

/* A long-lived fd (a client's arena, the engine's watcher epoll) moved out
 * of the low numbers a program uses and counts on (a range it closes,
 * CPython's test_os looking for free consecutive numbers): to the lowest
 * free one at or above PROV_FD_HIGH (half the fd limit if that is lower),
 * the old number closed; fd as it was if there is none (prov_shm.c). */
#define PROV_FD_HIGH 256
int prov_fd_high(int fd);

struct prov_ops {
	const char *name;
	int (*post_recv)(struct prov_qp *qp, uint64_t wr_id);
	int (*post_write_imm)(struct prov_qp *qp, const struct iovec *iov,
			      int iovcnt, uint64_t remote_off, uint32_t imm,
			      int flags, uint64_t wr_id);
	/* Write-with-imm to an address and rkey the peer published (the
	 * rsockets protocol places data by SGEs, not by offsets); iovcnt may
	 * be 0.  NULL for providers without it (shm). */
	int (*post_write_at)(struct prov_qp *qp, const struct iovec *iov,
			     int iovcnt, uint64_t raddr, uint32_t rkey,
			     uint32_t imm, int flags, uint64_t wr_id);
	/* Non-blocking; returns the number of completions stored in wc. */
	int (*poll_cq)(struct prov_qp *qp, struct prov_wc *wc, int n);
	/* Cheap check: may poll_cq return something? (no side effects) */
	int (*cq_pending)(struct prov_qp *qp);
	/* Ask for the notify fd to become readable at the next completion. */
	void (*arm)(struct prov_qp *qp);
	/* Withdraw a request made by arm (best effort). */
	void (*disarm)(struct prov_qp *qp);
	/* Is a notification request still outstanding? */
	int (*armed)(struct prov_qp *qp);
	/* Consume notifications (make the notify fd unreadable). */
	void (*ack)(struct prov_qp *qp);
	/* Make the notify fd readable ourselves (RSK_WATCH_NOTIFY: an event
	 * loop's reader runs). */
	void (*kick)(struct prov_qp *qp);
	/* The fd an event loop watches (with the liveness fd), or -errno: a
	 * provider may make it at the first call. */
	int (*notify_fd)(struct prov_qp *qp);
	/* The fd, besides the liveness fd, that a thread waiting for a
	 * completion polls, or -1 for none (shm: the peer rings the liveness
	 * socket).  NULL: notify_fd. */
	int (*wait_fd)(struct prov_qp *qp);
	/* The liveness socket fd (the engine's), where we ring a peer that
	 * asks for bells (a record of one byte, SHM_BELL).  1: the peer wakes
	 * us that way too (bell mode: the engine reads the bells with the
	 * hang-up); 0: it writes our notify fd.  NULL: no bells. */
	int (*set_bell)(struct prov_qp *qp, int fd);
	/* A shared word that both processes of a fork see (our own segment):
	 * the pid of the process that uses the connection. */
	uint32_t *(*owner_word)(struct prov_qp *qp);
	/* Wake-ups sent to the peer (bells, or eventfd writes). */
	uint64_t (*notifies_sent)(struct prov_qp *qp);
	/* The connection's liveness fd (from the CM) fired: 1 if the peer
	 * is gone, 0 if not.  NULL: the liveness fd is the local CM's Unix
	 * socket (the engine reads it itself). */
	int (*live_event)(struct prov_qp *qp);
	/* The liveness fd reported the peer's end, no FIN was seen, and
	 * completions may lag: end our side of the queue pair, so that our
	 * posted receives flush (-ESHUTDOWN) after whatever the peer
	 * delivered, and make the liveness fd readable again in ns
	 * nanoseconds should no flush show (0, or -errno).  NULL: the engine
	 * waits a bounded time instead. */
	int (*hup_fence)(struct prov_qp *qp, int64_t ns);
	/* May a completion the peer caused show up after the liveness fd
	 * reported its end?  (An HCA's may: the CM is another path.  shm's
	 * cannot: the peer wrote it into our CQ ring before its socket
	 * closed.)  NULL: never. */
	int (*completions_lag)(struct prov_qp *qp);
	/* Publish how many data bytes our application has consumed (after
	 * every receive) where the peer can read it should we vanish without
	 * closing.  NULL: the provider cannot (verbs: the peer's memory is
	 * gone with it). */
	void (*publish_consumed)(struct prov_qp *qp, uint64_t consumed);
	/* What the peer published (0), untrusted; -ENOENT if it never took
	 * its half (a server that died before accept()).  NULL: cannot. */
	int (*peer_consumed)(struct prov_qp *qp, uint64_t *consumed);
	/* A write into the peer's area at remote_off that consumes no receive
	 * and makes no completion there, for when the message credits are
	 * spent: copies, then publishes `written` (the stream position after
	 * these bytes) where the peer reads it, then wakes the peer if it
	 * armed.  NULL: the provider cannot (message credits then bound how
	 * many messages may wait unread). */
	int (*post_write_plain)(struct prov_qp *qp, const struct iovec *iov,
				int iovcnt, uint64_t remote_off,
				uint64_t written);
	/* What the peer's last plain write published (untrusted); NULL if
	 * it cannot make them. */
	uint64_t (*peer_written)(struct prov_qp *qp);
	/* Publish that our application shut down both directions
	 * (shutdown(SHUT_RDWR)), where the peer reads it without a call of
	 * ours: its next data is answered with a reset as TCP's kernel
	 * answers for an idle process.  NULL: the provider cannot. */
	void (*publish_shut)(struct prov_qp *qp);
	/* Did the peer publish it?  (Untrusted: it only ends the peer's own
	 * connection.)  NULL: cannot. */
	int (*peer_shut)(struct prov_qp *qp);
	void (*destroy)(struct prov_qp *qp);
};

/* Layout of a recv area: control slots (one per receive slot, 16 bytes
 * each, 64-byte aligned as a block) followed by the data ring. */
static inline size_t prov_ctrl_len(uint32_t qdepth)
{
	return ((size_t)qdepth * 16 + 63) & ~(size_t)63;
}

static inline size_t prov_area_len(uint32_t qdepth, uint32_t ring_size)
{
	return prov_ctrl_len(qdepth) + ring_size;
}

/* --- verbs provider (prov_verbs.c) ------------------------------------ */

extern const struct prov_ops verbs_ops;

/* --- shm provider ------------------------------------------------------ */

extern const struct prov_ops shm_ops;

/* A bell: the one byte of a wake-up record on the liveness socket
 * (PROTOCOL.md, section 7). */
#define SHM_BELL 0

/* Creates our half: a sealed 0600 memfd holding our header, our receive
 * CQ and our recv area.  Posts nothing. */
int shm_qp_create(uint32_t ring_size, uint32_t qdepth, struct prov_qp **out);
/* The fd to hand to the peer (still owned by the qp). */
int shm_qp_memfd(struct prov_qp *qp);
/* Our recv area (ctrl slots + ring). */
uint8_t *shm_qp_area(struct prov_qp *qp);
/* Maps the peer's half from the memfd it sent (consumed: closed either
 * way).  Checks the memfd's seals and size against the peer's announced
 * geometry. */
int shm_qp_attach(struct prov_qp *qp, int memfd, uint32_t ring_size,
		  uint32_t qdepth);
/* Creates the peer's half for it (a client does this for the server, so
 * that connect() needs no answer): a sealed segment whose receives are
 * all posted.  Nothing stays mapped. */
int shm_half_create(uint32_t ring_size, uint32_t qdepth, int *memfd);
/* Takes a half the peer created as our own (memfd consumed). */
int shm_qp_adopt(uint32_t ring_size, uint32_t qdepth, int memfd,
		 struct prov_qp **out);
/* Eventfd mode (a choice of the process: fd budget, RSOCK_WAKE): the
 * client makes both eventfds, *own (its notify fd) and *peer (the
 * server's), kept by the qp and sent in the REQ; -ENOENT: bell mode. */
int shm_qp_wake_fds(struct prov_qp *qp, int *own, int *peer);
/* The server's side of it (both fds consumed): checked, then kept, or
 * closed when this process wants bells (0 either way); -EPROTO if they
 * are not eventfds. */
int shm_qp_take_wake_fds(struct prov_qp *qp, int own, int peer);
/* Close the memfd once the peer has it (mappings stay). */
void shm_qp_drop_memfd(struct prov_qp *qp);

/* Arenas (a process pair's connections carved out of one memfd; see
 * prov_shm.c).  The client's QP on a free slot of its arena for the
 * server key (its pid) and geometry, made if needed, with both halves
 * initialised (the server's receives posted, ours not): *memfd (the
 * arena's, still ours), *slot and *gen go in the REQ.  name (a hash of the rendezvous name) is recorded;
 * with key 0 (before the connect tells the server's pid) the slot comes
 * only from the arena that served that name last, else -ENOENT; then
 * shm_arena_key_ok says whether it is the server's after all.  0 or
 * -errno. */
int shm_arena_connect(uint32_t key, uint64_t name, uint32_t ring_size,
		      uint32_t qdepth, struct prov_qp **out, int *memfd,
		      uint32_t *slot, uint32_t *gen);
int shm_arena_key_ok(struct prov_qp *qp, uint32_t key);
/* The client's REQ_SLOT for qp went out: from now on, closing before the
 * server took the slot leaves it to the server (ARENA_P), not free. */
void shm_arena_sent(struct prov_qp *qp);
/* The server's QP on the slot of the arena memfd that a REQ named (memfd
 * consumed): -EPROTO for anything that does not check out,
 * -ECONNRESET if the client gave the slot up before this accept. */
int shm_arena_accept(int memfd, uint32_t ring_size, uint32_t qdepth,
		     uint32_t slot, uint32_t gen, struct prov_qp **out);
/* Drops every arena no connection of this process uses: how many. */
int shm_arena_trim(void);

/* --- fault injection (prov_fault.c): a provider that wraps another ------ */

/* RSOCK_FAULT, parsed once per process (at the first call): 0 when unset
 * (then no QP is wrapped: the providers run as they ship, at no cost), 1
 * when set, -EINVAL when malformed (said once on stderr): the caller then
 * fails the connection, so that a typo never silently tests nothing. */
int fault_config(void);
/* Wraps a connected QP (*ops, *qp) in one that injects the faults of
 * RSOCK_FAULT (call only when fault_config() returned 1).  area and qdepth
 * are our recv area and receive queue depth as the engine gets them (the
 * corrupt fault rewrites a ctrl slot there).  On success *ops and *qp are
 * the wrapper's, which owns the inner QP from then on, and the ops' name
 * is the inner provider's; on failure (-errno) both are left as they were.
 * -EOPNOTSUPP for a provider with live_event, hup_fence or post_write_at
 * (the wrapper has none: today it wraps shm only). */
int fault_wrap(const struct prov_ops **ops, struct prov_qp **qp,
	       uint8_t *area, uint32_t qdepth);
/* req_late: how long (ms, 0: no such fault) a client holds its handshake
 * back after its rendezvous connect(), spinning (*sleeps 0: as a client
 * preempted between the two) or asleep; call after fault_config(). */
uint32_t fault_req_late(int *sleeps);

#endif
