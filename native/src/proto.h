/*
 * proto.h - private to native/src: the stream protocol of one connection,
 * sans I/O (proto.c, proto_rsockets.c).
 *
 * The rule (as h11's _state.py states its own): the protocol is a state
 * machine fed from outside.  In: completions the provider polled
 * (proto_complete), the application's sends and consumption
 * (proto_send_room/proto_send, proto_consume), shutdown and close
 * requests.  Out: the three queue-pair verbs of the connection's provider
 * (post a write with immediate data, post a write to an address, repost a
 * receive: struct prov_ops, bound to one qp) and state the caller reads
 * (flags, the ring's bytes, err, wake).  Nothing here owns a file
 * descriptor, takes a lock, makes a system call, sleeps or reads a clock:
 * the caller (conn.c) holds the socket's lock around every call, and a
 * test (native/tests/test_proto.c) drives two instances joined by memcpy
 * with no fd and no thread.
 *
 * Everything the peer sends is untrusted: proto_complete checks each
 * immediate, length and control slot against our rings and windows, and a
 * violation ends the connection (F_DEAD, err ECONNRESET, a sentence in
 * detail) without touching memory outside our rings.
 */
#ifndef RSK_PROTO_H
#define RSK_PROTO_H

#include <stddef.h>
#include <stdint.h>

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
	OP_WRITTEN = 5,   /* arg = bytes our plain writes put in the ring
			   * since the last message (no payload) */
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

/* Largest single data message (the receiver can consume the head of a
 * large send while its tail is still being written).  64 KiB: a 256 KiB
 * round trip takes 63-73 µs instead of 113-126 µs with 256 KiB messages
 * (the peer starts copying out after the first 64 KiB, not after all of
 * it), and streams of 1 MiB sends lose nothing. */
#define ENG_MAX_MSG (64u * 1024)

/* connection flags (struct proto.flags) */
#define F_CONN 0x01      /* handshake done, rings attached */
#define F_WR_SHUT 0x02   /* we will send no more data (FIN queued/sent) */
#define F_RD_SHUT 0x04   /* local shutdown(SHUT_RD) */
#define F_PEER_FIN 0x08  /* the peer sent FIN */
#define F_PEER_GONE 0x10 /* the peer's liveness channel closed */
#define F_DEAD 0x20      /* QP unusable: error or reset */
#define F_SENT_LATE 0x40 /* a send went to a peer already closed (dropped) */

/* pending control messages (struct proto.pending) */
#define P_CREDIT 0x1
#define P_FIN 0x2
#define P_RESET 0x4

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

struct proto;
struct proto_geom;

/*
 * A wire personality: rsock's own (proto.c, PROTOCOL.md sections 1-8) or
 * librdmacm's rsockets (proto_rsockets.c, section 9).  Both keep the same
 * ring bookkeeping (r_head, r_tail, s_tail) and flags; they differ in how
 * data is addressed, how credits travel and what a control message is.
 */
struct proto_pers {
	const char *name;
	/* Set up what the personality keeps (0 or -ENOMEM). */
	int (*init)(struct proto *p, const struct proto_geom *g);
	/* A receive completed (status 0): repost, check, take it in. */
	void (*on_recv)(struct proto *p, const struct prov_wc *wc);
	/* Send one control message (OP_CREDIT, OP_FIN or OP_RESET). */
	int (*post_ctrl)(struct proto *p, enum eng_op op);
	/* Is a credit update due? */
	int (*credit_due)(const struct proto *p);
	/* May a control message go out, keeping `need` credits beyond it? */
	int (*ctrl_room)(const struct proto *p, uint32_t need);
	/* Bytes one data message may take now (0: wait); *credit_stall set
	 * when what stops it is message credits rather than ring space. */
	uint32_t (*send_room)(const struct proto *p, int *credit_stall);
	/* Post n bytes at p as one data message (n <= send_room). */
	int (*post_data)(struct proto *p, const void *buf, uint32_t n);
	/* The application consumed up to r_head: is a credit update due
	 * now? */
	int (*consumed)(struct proto *p);
};

extern const struct proto_pers proto_rsock;
extern const struct proto_pers proto_rsockets;

/* The other side's geometry and, for an rsockets peer, its addresses: what
 * a connection manager learnt in the handshake. */
struct proto_geom {
	const struct proto_pers *pers; /* the peer's wire personality */
	uint8_t *area;  /* our receive area (ctrl slots, then the ring) */
	uint32_t ring;  /* our ring's size (a power of two) */
	uint32_t q;     /* our receive queue depth (= ctrl slots) */
	uint32_t peer_ring;
	uint32_t peer_q;
	uint32_t inline_max;
	/* rsockets peer (verbs): area is the bare ring (no ctrl slots) */
	struct rs_sge *rs_tsgl; /* entry 0 holds the peer's first buffer */
	uint64_t rs_rbuf_addr;
	uint32_t rs_rbuf_key;
	uint64_t rs_sgl_addr;
	uint32_t rs_sgl_key, rs_sgl_len;
};

struct proto {
	const struct proto_pers *pers;
	const struct prov_ops *ops; /* the action sink: bound to qp */
	struct prov_qp *qp;
	struct rsk_stats *st; /* counters the protocol keeps (the caller's) */
	char *detail;         /* why the connection failed (the caller's) */
	size_t dlen;

	unsigned flags;   /* F_* */
	unsigned pending; /* P_*: control messages owed */
	int err;          /* sticky connection error (positive errno) */
	int so_error;     /* reported once (SO_ERROR, or the next call) */
	int wake;         /* something changed that waiters must see: the
			   * caller wakes them and clears it */
	uint32_t inline_max;

	uint8_t *lctrl; /* our ctrl slots (rsock personality) */
	uint8_t *ring;
	uint32_t rsize;
	uint32_t lq;
	uint32_t peer_rsize;
	uint32_t peer_q;
	uint64_t peer_ring_off;

	/* receive side */
	uint64_t r_head;     /* consumed by the app */
	uint64_t r_tail;     /* written by the peer (completed) */
	uint64_t r_msg_tail; /* the end of what the peer's messages announced
			      * (r_tail may be ahead: its plain writes) */
	uint64_t r_credited; /* r_head last told to the peer */
	uint32_t r_msgs;     /* messages received (ctrl slot index) */
	uint32_t r_reposted; /* receives posted in total */
	uint32_t r_limit_sent;

	/* send side */
	uint64_t s_tail;  /* bytes written into the peer's ring */
	uint64_t s_announced; /* ... of them announced by messages (the rest:
			       * plain writes, its message credits spent) */
	uint64_t s_acked; /* bytes the peer's app consumed */
	uint32_t s_msgs;  /* messages sent (any op) */
	uint32_t s_limit; /* may send seq < s_limit */
	uint32_t s_unsignaled;
	uint32_t sq_out;

	/* rsockets personality (PROTOCOL.md section 9) */
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

/* Set p up for a connection in g's personality (0 or -ENOMEM); receives
 * are already posted (g->q of them).  Control messages due at once go
 * out (the rsockets personality publishes its second half). */
int proto_init(struct proto *p, const struct prov_ops *ops,
	       struct prov_qp *qp, const struct proto_geom *g,
	       struct rsk_stats *st, char *detail, size_t dlen);
/* What proto_init allocated. */
void proto_free(struct proto *p);

/* The connection is unusable from now on; tell the peer if asked and we
 * can (a RESET).  The first failure wins. */
void proto_fail(struct proto *p, int err, int tell_peer, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * One completion.  hup: the connection manager already saw the peer hang
 * up (a flushed receive then ends the stream, with no FIN: a reset).
 * Returns 1 when the completion says the peer is gone (F_PEER_GONE is set:
 * the caller stops watching its liveness channel), else 0.
 */
int proto_complete(struct proto *p, const struct prov_wc *wc, int hup);
/*
 * The peer is gone with no FIN (its process died, or exited without
 * closing: the liveness channel hung up).  TCP's kernel closes a dead
 * process's socket for it, with a FIN if it had nothing unread, else a
 * reset: the same here when the provider can tell (shm: the peer published
 * what its application consumed), else a reset.  Sets F_PEER_GONE.
 */
void proto_vanished(struct proto *p);
/* Take in the bytes the peer's plain writes put in our ring (the position
 * it published), if any: 1 if r_tail moved or the connection failed. */
int proto_take_written(struct proto *p);
/* Send what control traffic is due and the credit reserve allows. */
void proto_flush(struct proto *p);

/* Message credits we hold. */
uint32_t proto_credits(const struct proto *p);
/* Bytes one data message may take now (at most ENG_MAX_MSG); 0 when the
 * sender must wait (*credit_stall: for credits, not ring space). */
uint32_t proto_send_room(const struct proto *p, int *credit_stall);
/* Post n (<= proto_send_room) bytes of buf as one data message; 0 or the
 * provider's -errno (the connection is then dead). */
int proto_send(struct proto *p, const void *buf, uint32_t n);
/* The application consumed n bytes at the head: credits go back as due. */
void proto_consume(struct proto *p, size_t n);

/* shutdown(SHUT_WR): a FIN follows the data sent (now or when credits
 * allow). */
void proto_shutdown_wr(struct proto *p);
/* close(): unread data makes it abortive (a RESET), as with TCP; else a
 * FIN, as shutdown. */
void proto_close(struct proto *p);

/* Readiness as the protocol sees it (what a recv or send would do). */
int proto_readable(const struct proto *p);
int proto_writable(const struct proto *p);

#endif
