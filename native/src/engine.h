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
#include "prov.h"
#include "rsock.h"

/* imm data: 3-bit opcode, 29-bit argument (rsockets' rs_msg layout) */
#define IMM_OP_SHIFT 29
#define IMM_ARG_MASK ((1u << IMM_OP_SHIFT) - 1)
#define IMM(op, arg) (((uint32_t)(op) << IMM_OP_SHIFT) | ((arg) & IMM_ARG_MASK))

enum eng_op {
	OP_DATA = 0,      /* arg = length; payload in the ring at the tail */
	OP_CREDIT = 1,    /* ctrl slot: credits */
	OP_FIN = 2,       /* ctrl slot: credits; no more data follows */
	OP_RESET = 3,     /* ctrl slot: credits; abortive close */
	OP_KEEPALIVE = 4, /* ctrl slot: credits; nothing else */
};

/* What a control message writes into the peer's ctrl slot. */
struct eng_ctrl {
	uint64_t consumed; /* total ring bytes the app has consumed */
	uint32_t limit;    /* the peer may send messages with seq < limit */
	uint32_t op;       /* copy of the opcode (checked against imm) */
};
_Static_assert(sizeof(struct eng_ctrl) == 16, "ctrl slot is 16 bytes");

/* Message credits kept back from data: one for CREDIT, one for FIN/RESET,
 * so a credit update or a close can always be sent. */
#define CREDIT_RESERVE 2

/* Return byte credits after ring_size >> CREDIT_BYTES_SHIFT consumed bytes
 * (a half, as rsockets does: a quarter woke a sender that waits in an event
 * loop twice as often, and each such wake-up costs it more than the copy
 * it then has room for; measured: asyncio 64 KiB stream 6.7-6.9 GB/s with a
 * quarter, 7.4-8.5 with a half, sync the same either way) */
#define CREDIT_BYTES_SHIFT 1

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

/* Largest single data message (the receiver can consume the head of a
 * large send while its tail is still being written).  64 KiB: a 256 KiB
 * round trip takes 63-73 µs instead of 113-126 µs with 256 KiB messages
 * (the peer starts copying out after the first 64 KiB, not after all of
 * it), and streams of 1 MiB sends lose nothing. */
#define ENG_MAX_MSG (64u * 1024)

/* connection flags */
#define F_CONN 0x01      /* handshake done, rings attached */
#define F_WR_SHUT 0x02   /* we will send no more data (FIN queued/sent) */
#define F_RD_SHUT 0x04   /* local shutdown(SHUT_RD) */
#define F_PEER_FIN 0x08  /* the peer sent FIN */
#define F_PEER_GONE 0x10 /* the peer's liveness channel closed */
#define F_DEAD 0x20      /* QP unusable: error or reset */
#define F_SENT_LATE 0x40 /* a send went to a peer already closed (dropped) */

/* pending control messages */
#define P_CREDIT 0x1
#define P_FIN 0x2
#define P_RESET 0x4

enum rsk_kind { K_NEW = 0, K_LISTEN, K_CONN };

#define RSK_MAX_NAMES 4
/* Clients that connected to a listener but have not sent their REQ yet
 * wait here (not in accept()), at most CM_REQ_WAIT_NS each, all at once;
 * when RSK_MAX_PEND wait, the one that waited longest makes room (a real
 * client sends its REQ right after connecting: only a silent one waits). */
#define RSK_MAX_PEND 128
#define CM_REQ_WAIT_NS 1000000000ll

struct eng_pend {
	int fd;
	int short_of; /* its handshake met our shortage of fds or memory */
	int64_t until;
};

/* A client whose handshake met our shortage waits this long for fds or
 * memory to come back (TCP keeps it queued for as long). */
#define CM_SHORT_WAIT_NS 60000000000ll

struct rsk_sock {
	/*
	 * Locking: `lock` protects every field below and every call into the
	 * provider.  It is the only lock of a socket (there is no lock order
	 * to keep); it is never held while sleeping: exactly one thread (the
	 * fd_waiter) sleeps in epoll_wait on epfd, every other waiter sleeps
	 * on the futex `cseq` (eng_sleep), and whoever makes progress wakes
	 * them (eng_wake).
	 */
	pthread_mutex_t lock;
	unsigned lock_gen; /* eng_fork_gen when lock was made (eng_lock) */
	uint32_t cseq;  /* futex: bumped by eng_wake while cwaiters > 0 */
	int cwaiters;   /* threads in eng_sleep */
	int epfd;
	enum rsk_kind kind;
	int users;    /* calls in flight (and a held zero-copy receive) */
	int closed;   /* rsk_close called: new calls get -EBADF */
	int released; /* rings and fds gone */
	int fd_waiter;
	int watch;    /* RSK_WATCH_NOTIFY | RSK_WATCH_FD */
	int interest; /* RSK_POLLIN/RSK_POLLOUT that make the fd readable */
	int kicked; /* we made our own notify fd readable */
	unsigned fork_gen;  /* eng_fork_gen/eng_fork_pgen when connected: a */
	unsigned fork_pgen; /* connection that crossed a fork is shared */
	uint32_t creator;   /* pid that connected/accepted it */
	int err;    /* sticky connection error (positive errno) */
	int so_error;
	struct rsk_opts opts;
	char detail[160];

	/* listener */
	int lfd[RSK_MAX_NAMES];
	int nlfd;
	int lshared; /* lfd shared with other processes (rsk_listen_fds,
		      * rsk_listen_adopt): never shut down on close */
	int xfd; /* rsk_listen_fd: not owned, -1 if none */
	struct cm_listener *vl; /* a manager's own listener (rdma_cm's: */
	const struct cm_ops *vl_cm; /* rsk_listen_verbs) and that manager */
	struct eng_pend *pend; /* RSK_MAX_PEND, allocated by rsk_listen */
	int npend;

	/* connection */
	const struct prov_ops *ops;
	struct prov_qp *qp;
	int live_fd;
	int64_t live_next; /* next liveness look of a sender (eng_live_tick) */
	int64_t hup_at; /* the CM reported the peer's end with no FIN seen:
			 * a reset unless a FIN arrives by hup_at (0: no) */
	unsigned flags;
	unsigned pending;
	uint8_t *lctrl;
	uint8_t *ring;
	uint32_t rsize;
	uint32_t lq;
	uint32_t peer_rsize;
	uint32_t peer_q;
	uint64_t peer_ring_off;
	struct rsk_addr laddr; /* as the connection manager saw them */
	struct rsk_addr paddr;

	/* receive side */
	uint64_t r_head;     /* consumed by the app */
	uint64_t r_tail;     /* written by the peer (completed) */
	uint64_t r_credited; /* r_head last told to the peer */
	uint32_t r_msgs;     /* messages received (ctrl slot index) */
	uint32_t r_reposted; /* receives posted in total */
	uint32_t r_limit_sent;
	int rx_busy; /* a zero-copy receive holds the head */

	/* send side */
	uint64_t s_tail;  /* bytes written into the peer's ring */
	uint64_t s_acked; /* bytes the peer's app consumed */
	uint32_t s_msgs;  /* messages sent (any op) */
	uint32_t s_limit; /* may send seq < s_limit */
	uint32_t s_unsignaled;
	uint32_t sq_out;

	struct rsk_stats st;

	/* fileno(): fa, one end of a socketpair whose other end (fb) only
	 * this struct holds.  fa polls readable while a token byte sits in
	 * it, writable while its send buffer has room (shrunk while a send
	 * would block; RSK_WATCH_FD, see "fd readiness" in engine.c).  A
	 * listener's fa is a second fd of epfd and fb is -1. */
	int fa, fb;
	int tok;    /* a token sits in fa */
	int filled; /* fa's send buffer is shrunk: not writable */
	int dialing; /* K_NEW: rsk_set_dialing (fa not writable) */
	int refused; /* K_NEW: rsk_set_refused (fb closed; eng_fd_renew) */
	int wslot;  /* our slot in the watcher thread's table, -1 if none
		     * (taken and dropped under s->lock; the table's own lock
		     * comes after it) */

	/* rsockets personality (librdmacm's stream protocol, verbs only; see
	 * PROTOCOL.md section 9): set when the peer speaks it */
	int rs;
	struct rs_sge *rs_tsgl;   /* ours, registered: the peer writes SGEs */
	int rs_tsge;              /* the entry we send into */
	uint64_t rs_rbuf_addr;    /* our ring as the peer addresses it */
	uint32_t rs_rbuf_key;
	uint64_t rs_pub;          /* the peer may write below this position */
	uint64_t rs_sgl_addr;     /* the peer's target SGL (we publish to) */
	uint32_t rs_sgl_key, rs_sgl_len, rs_rsge;
	uint16_t rs_sseq_no, rs_sseq_comp, rs_rseq_no, rs_rseq_comp;
	uint64_t *rs_mq;          /* ends of unconsumed data messages */
	uint32_t rs_mq_head, rs_mq_n;
};

/* librdmacm's struct rs_sge (host byte order) */
struct rs_sge {
	uint64_t addr;
	uint32_t key;
	uint32_t length;
};

/* rsockets opcodes (imm >> 29) and control arguments */
#define RS_OP_DATA 0
#define RS_OP_SGL 4
#define RS_OP_IOMAP_SGL 6
#define RS_OP_CTRL 7
#define RS_CTRL_DISCONNECT 0
#define RS_CTRL_KEEPALIVE 1
#define RS_CTRL_SHUTDOWN 2

/* engine.c, for listener.c and readiness.c (s->lock: see struct rsk_sock) */
/* Enter an API call on s: its lock, -EBADF if closed, counted as a user. */
int eng_enter(rsk_sock *s);
/* Leave it: fileno() brought up to date, the lock released. */
void eng_leave(rsk_sock *s);
void eng_set_detail(rsk_sock *s, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* After a refused connect: a live fileno() again (0 or -errno). */
int eng_fd_renew(rsk_sock *s);
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
/* Message credits we hold; rsockets: bytes the peer's ring can take. */
uint32_t eng_credits(const rsk_sock *s);
uint32_t rs_send_room(const rsk_sock *s);
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
/* engine.c, for fork.c's child handler: forget the parent's signal state. */
void eng_signals_child(void);

/* listener.c, for engine.c's close */
int eng_listen_shared(const rsk_sock *s);

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
void eng_watch_del(rsk_sock *s);
void eng_watch_forget(rsk_sock *s);
void eng_watch_prefork(void);
void eng_watch_parent(void);
void eng_watch_child(void);

/* clock.c: time helpers */
int64_t eng_now_ns(void);
int64_t eng_deadline(int timeout_ms);
int eng_ms_left(int64_t deadline);

#endif
