// SPDX-License-Identifier: MIT
/*
 * prov_fault.c - fault injection as a provider that wraps another.
 *
 * When RSOCK_FAULT is set, the connection manager wraps each connected
 * queue pair in one of these (fault_wrap): every operation goes to the
 * inner provider, and the faults are made on the way.  When it is unset
 * there is no wrapper at all (fault_config() returns 0): the provider runs
 * as it ships, at no cost.
 *
 * RSOCK_FAULT="kind:N[:arg],..." is parsed once per process, at the first
 * connection.  Counters are per QP; N is how many operations of that kind
 * go through normally before the fault hits (0 = the first one).
 *
 *   drop_recv:N        the receive completion of message N is lost and the
 *                      provider reports it as an HCA reports a CQ error:
 *                      the QP enters the error state and the next poll
 *                      returns an error completion (-EIO); never silent
 *   lose_recv:N        the same completion vanishes silently (its receive
 *                      is consumed, no CQE): a buggy provider, for checking
 *                      what the engine itself detects
 *   drop_send:N        the signaled send completion N is lost (silently)
 *   delay:MS           every receive completion becomes visible MS ms after
 *                      the provider first saw it (a timerfd wakes sleepers)
 *   fail_write:N[:E]   write post N fails with -E (EIO default, or ENOMEM,
 *                      EAGAIN, ENOSPC, or a number); the QP stays usable
 *   fail_recv:N[:E]    receive post N (once connected) fails likewise
 *   qp_error:N         after N successful writes the QP enters the error
 *                      state: posts fail (-EIO), the next poll returns an
 *                      error completion
 *   req_late:MS[:sleep] a client sends its handshake (REQ) MS ms after its
 *                      rendezvous connect(), spinning meanwhile (a client
 *                      preempted between the two), or asleep with "sleep"
 *   corrupt:N:WHAT     the header of the first received message >= N that
 *                      WHAT applies to is corrupted before the engine sees
 *                      it, as if the peer wrote it: opcode (imm op = 7),
 *                      len (DATA length 2^29-1, beyond any ring), consumed
 *                      (ctrl slot: credit for 2^62 bytes), limit (ctrl
 *                      slot: message limit + 2^30), ctrlop (ctrl slot op
 *                      differs from the imm's)
 *
 * A malformed RSOCK_FAULT makes every QP creation fail with -EINVAL (and
 * says why on stderr once): a typo must not silently test nothing.
 *
 * How: the wrapper takes every completion the inner QP has (receive
 * completions are held here, in order, numbered as the inner CQ numbers
 * them) and hands them to the engine as the faults allow: held back until
 * due (delay), dropped, or rewritten (corrupt: the imm, and the ctrl slot
 * in our own recv area, which the engine reads only after the completion).
 * Nothing here needs the inner provider's internals.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "prov.h"

enum {
	FK_DROP_RECV,
	FK_LOSE_RECV,
	FK_DROP_SEND,
	FK_FAIL_WRITE,
	FK_FAIL_RECV,
	FK_QP_ERROR,
	FK_CORRUPT,
	FK_NKINDS,
};

enum { FC_OPCODE = 1, FC_LEN, FC_CONSUMED, FC_LIMIT, FC_CTRLOP };

/* what engine.h defines for the wire (PROTOCOL.md, section 3) */
#define FAULT_IMM_OP_SHIFT 29
#define FAULT_IMM_ARG_MASK ((1u << FAULT_IMM_OP_SHIFT) - 1)

struct fault_cfg {
	int64_t at[FK_NKINDS]; /* trigger count, -1 = off */
	int err_write;         /* positive errno */
	int err_recv;
	int corrupt;           /* FC_* */
	uint32_t delay_ms;
	uint32_t req_late_ms;  /* req_late */
	int req_late_sleeps;
	int bad;               /* RSOCK_FAULT did not parse */
	int on;                /* RSOCK_FAULT is set (and parsed) */
};

static struct fault_cfg fault;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

/* A receive completion taken from the inner QP, not delivered yet. */
struct fault_held {
	struct prov_wc wc;
	uint32_t seq; /* its index in the inner CQ's receive completions */
};

struct prov_qp {
	const struct prov_ops *io; /* the wrapped provider and its QP */
	struct prov_qp *iq;
	uint8_t *area;   /* our recv area (ctrl slots first): corrupt */
	uint32_t qdepth; /* our receive queue's depth */
	int err;         /* the QP is in error (a fault): posts fail with it */
	int err_pending; /* an error completion is owed to the poller */
	int dead;        /* no receive completion is delivered any more */
	uint64_t writes;  /* write posts attempted */
	uint64_t written; /* write posts that succeeded */
	uint64_t reposts; /* receive posts */
	uint64_t scqes;   /* signaled send completions produced */
	int corrupted;
	uint32_t rseq;    /* receive completions taken from the inner QP */
	struct fault_held *held; /* [qdepth], a ring from h_head */
	uint32_t h_head, h_n;
	/* delay: the first dl_n held completions become visible at dl_due */
	uint32_t dl_n;
	int64_t dl_due;
	int64_t timer_at; /* what the timerfd is set to (0: disarmed) */
	int epfd; /* delay only: notify fd = epoll(inner notify fd, tfd) */
	int tfd;
};

/* ------------------------------------------------------------ parsing */

static int fault_errno(const char *s, int *out)
{
	static const struct {
		const char *name;
		int err;
	} names[] = { { "EIO", EIO }, { "ENOMEM", ENOMEM }, { "EAGAIN", EAGAIN },
		      { "ENOSPC", ENOSPC }, { "EFAULT", EFAULT }, { "EPROTO", EPROTO } };
	char *end;
	long v;
	size_t i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(s, names[i].name)) {
			*out = names[i].err;
			return 0;
		}
	v = strtol(s, &end, 10);
	if (*s == 0 || *end != 0 || v <= 0 || v > 4095)
		return -1;
	*out = (int)v;
	return 0;
}

static int fault_parse_one(char *e)
{
	static const char *const kinds[FK_NKINDS] = {
		"drop_recv", "lose_recv", "drop_send", "fail_write",
		"fail_recv", "qp_error",  "corrupt",
	};
	static const char *const what[] = { "", "opcode", "len", "consumed",
					    "limit", "ctrlop" };
	char *kind = e, *num, *arg, *end;
	long long v;
	int k;

	num = strchr(kind, ':');
	if (!num)
		return -1;
	*num++ = 0;
	arg = strchr(num, ':');
	if (arg)
		*arg++ = 0;
	v = strtoll(num, &end, 10);
	if (*num == 0 || *end != 0 || v < 0)
		return -1;
	if (!strcmp(kind, "delay")) {
		if (arg || v > 60000)
			return -1;
		fault.delay_ms = (uint32_t)v;
		return 0;
	}
	if (!strcmp(kind, "req_late")) {
		if ((arg && strcmp(arg, "sleep")) || v > 60000)
			return -1;
		fault.req_late_ms = (uint32_t)v;
		fault.req_late_sleeps = arg != NULL;
		return 0;
	}
	for (k = 0; k < FK_NKINDS; k++)
		if (!strcmp(kind, kinds[k]))
			break;
	if (k == FK_NKINDS)
		return -1;
	fault.at[k] = v;
	if (k == FK_FAIL_WRITE || k == FK_FAIL_RECV) {
		int err = EIO;

		if (arg && fault_errno(arg, &err))
			return -1;
		*(k == FK_FAIL_WRITE ? &fault.err_write : &fault.err_recv) = err;
		return 0;
	}
	if (k == FK_CORRUPT) {
		size_t i;

		for (i = 1; arg && i < sizeof(what) / sizeof(what[0]); i++)
			if (!strcmp(arg, what[i]))
				break;
		if (!arg || i == sizeof(what) / sizeof(what[0]))
			return -1;
		fault.corrupt = (int)i;
		return 0;
	}
	return arg ? -1 : 0;
}

static void fault_parse(void)
{
	const char *env = getenv("RSOCK_FAULT");
	char *copy, *e, *save = NULL;
	int k;

	for (k = 0; k < FK_NKINDS; k++)
		fault.at[k] = -1;
	if (!env || !*env)
		return;
	copy = strdup(env);
	if (!copy) {
		fault.bad = 1;
		return;
	}
	for (e = strtok_r(copy, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
		char entry[64];

		snprintf(entry, sizeof(entry), "%s", e); /* parsing cuts e */
		if (*e && fault_parse_one(e)) {
			fprintf(stderr,
				"rsock: RSOCK_FAULT: bad entry '%s' (kind:N[:arg])\n",
				entry);
			fault.bad = 1;
			break;
		}
	}
	free(copy);
	fault.on = !fault.bad;
}

int fault_config(void)
{
	pthread_once(&fault_once, fault_parse);
	return fault.bad ? -EINVAL : fault.on;
}

uint32_t fault_req_late(int *sleeps)
{
	*sleeps = fault.req_late_sleeps;
	return fault.on ? fault.req_late_ms : 0;
}

/* Does counter c (post-incremented) hit the trigger of kind k? */
static int fault_hit(int k, uint64_t *c)
{
	return fault.at[k] >= 0 && (*c)++ == (uint64_t)fault.at[k];
}

static int64_t fault_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------- the QP */

/* The QP enters the error state; the poller gets one error completion. */
static void fault_qp_break(struct prov_qp *q)
{
	if (q->err)
		return;
	q->err = -EIO;
	q->err_pending = 1;
}

static int fault_post_recv(struct prov_qp *q, uint64_t wr_id)
{
	if (q->err)
		return q->err;
	if (fault_hit(FK_FAIL_RECV, &q->reposts))
		return -fault.err_recv;
	return q->io->post_recv(q->iq, wr_id);
}

static int fault_post_write_imm(struct prov_qp *q, const struct iovec *iov,
				int iovcnt, uint64_t roff, uint32_t imm,
				int flags, uint64_t wr_id)
{
	int rc;

	if (q->err)
		return q->err;
	if (fault.at[FK_QP_ERROR] == 0) {
		fault_qp_break(q);
		return q->err;
	}
	if (fault_hit(FK_FAIL_WRITE, &q->writes))
		return -fault.err_write;
	rc = q->io->post_write_imm(q->iq, iov, iovcnt, roff, imm, flags, wr_id);
	if (rc)
		return rc;
	/* the QP error after N writes */
	if (fault.at[FK_QP_ERROR] > 0 &&
	    ++q->written == (uint64_t)fault.at[FK_QP_ERROR])
		fault_qp_break(q);
	return 0;
}

/* Sorts what the inner QP returned in wc[0..k): send completions stay
 * (in order, at the front; drop_send loses one), receive completions are
 * held (or discarded once nothing more is delivered), an error completion
 * of the inner QP stays and ends delivery.  Returns how many stayed. */
static int fault_take(struct prov_qp *q, struct prov_wc *wc, int k)
{
	int i, out = 0;

	for (i = 0; i < k; i++) {
		if (wc[i].status) {
			q->dead = 1;
		} else if (!wc[i].is_recv) {
			if (fault_hit(FK_DROP_SEND, &q->scqes))
				continue;
		} else if (q->dead) {
			continue;
		} else if (q->h_n == q->qdepth) {
			/* more completions than receives posted: cannot be
			 * from a sound provider; an error, as an HCA's */
			q->dead = 1;
			wc[i] = (struct prov_wc){ .status = -EPROTO, .is_recv = 1 };
		} else {
			q->held[(q->h_head + q->h_n++) % q->qdepth] =
				(struct fault_held){ .wc = wc[i], .seq = q->rseq++ };
			continue;
		}
		wc[out++] = wc[i];
	}
	return out;
}

/* delay: how many held completions the owner may see now */
static uint32_t fault_visible(struct prov_qp *q)
{
	int64_t now;

	if (!fault.delay_ms)
		return q->h_n;
	now = fault_now_ns();
	if (q->dl_n == 0 && q->h_n) {
		/* new completions: their clock starts now */
		q->dl_n = q->h_n;
		q->dl_due = now + (int64_t)fault.delay_ms * 1000000;
	}
	return now < q->dl_due ? 0 : q->dl_n;
}

/* delay: keep the timerfd readable exactly while delayed completions are
 * waiting (armed for their due time), so a sleeper wakes for them and an
 * event loop never sees a stale wake-up. */
static void fault_sync_timer(struct prov_qp *q)
{
	struct itimerspec its = { 0 };
	int64_t at = q->dl_n ? q->dl_due : 0;

	if (q->tfd < 0 || at == q->timer_at)
		return;
	q->timer_at = at;
	its.it_value.tv_sec = at / 1000000000;
	its.it_value.tv_nsec = at % 1000000000;
	/* disarming (at == 0) also resets the expiry count: the fd turns
	 * unreadable */
	(void)timerfd_settime(q->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* corrupt: rewrite what the peer wrote for message seq, once */
static void fault_corrupt(struct prov_qp *q, uint32_t seq, struct prov_wc *wc)
{
	uint8_t *slot = q->area + (size_t)(seq % q->qdepth) * 16;
	uint32_t op = wc->imm >> FAULT_IMM_OP_SHIFT, v;
	uint64_t consumed = 1ull << 62;

	if (fault.corrupt == FC_OPCODE) {
		wc->imm = (7u << FAULT_IMM_OP_SHIFT) | (wc->imm & FAULT_IMM_ARG_MASK);
	} else if (fault.corrupt == FC_LEN) {
		if (op != 0)
			return; /* DATA only */
		wc->imm = FAULT_IMM_ARG_MASK;
		wc->byte_len = FAULT_IMM_ARG_MASK;
	} else {
		if (op == 0 || wc->byte_len != 16)
			return; /* control messages only */
		if (fault.corrupt == FC_CONSUMED) {
			memcpy(slot, &consumed, sizeof(consumed));
		} else if (fault.corrupt == FC_LIMIT) {
			memcpy(&v, slot + 8, sizeof(v));
			v += 1u << 30;
			memcpy(slot + 8, &v, sizeof(v));
		} else {
			memcpy(&v, slot + 12, sizeof(v));
			v ^= 1;
			memcpy(slot + 12, &v, sizeof(v));
		}
	}
	q->corrupted = 1;
}

/* The error completion owed since the QP broke (it is in error now). */
static void fault_err_wc(struct prov_qp *q, struct prov_wc *wc)
{
	q->err_pending = 0;
	if (!q->err)
		q->err = -EIO;
	*wc = (struct prov_wc){ .status = q->err, .is_recv = 1 };
}

/*
 * Send completions first, then an error completion owed, then the held
 * receive completions that are visible (delay), through drop_recv,
 * lose_recv and corrupt.  Everything the inner QP has is taken first (a
 * receive completion the engine has not seen keeps its receive posted in
 * the engine's view: at most qdepth are ever held).
 */
static int fault_poll_cq(struct prov_qp *q, struct prov_wc *wc, int n)
{
	struct fault_held h;
	uint32_t upto;
	int got = 0, ask, k;

	do {
		ask = n - got;
		k = q->io->poll_cq(q->iq, wc + got, ask);
		if (k < 0)
			return k;
		got += fault_take(q, wc + got, k);
	} while (k == ask && got < n);
	if (got < n && q->err_pending)
		fault_err_wc(q, &wc[got++]);
	if (got == n || q->err || q->dead)
		goto out;
	upto = fault_visible(q);
	while (upto && got < n) {
		h = q->held[q->h_head];
		q->h_head = (q->h_head + 1) % q->qdepth;
		q->h_n--;
		upto--;
		if (q->dl_n)
			q->dl_n--;
		if (fault.at[FK_DROP_RECV] == (int64_t)h.seq) {
			/* the CQE is lost, and that is noticed (a CQ error):
			 * the completions before it are handled first (their
			 * receives reposted), then the error completion */
			q->err_pending = 1;
			if (!got)
				fault_err_wc(q, &wc[got++]);
			break;
		}
		if (fault.at[FK_LOSE_RECV] == (int64_t)h.seq)
			continue; /* lost without a trace */
		if (fault.corrupt && !q->corrupted &&
		    (int64_t)h.seq >= fault.at[FK_CORRUPT])
			fault_corrupt(q, h.seq, &h.wc);
		wc[got++] = h.wc;
	}
out:
	if (q->err_pending || q->err || q->dead) {
		q->dead = 1; /* nothing more to deliver */
		q->h_n = q->dl_n = 0;
	}
	fault_sync_timer(q);
	return got;
}

static int fault_cq_pending(struct prov_qp *q)
{
	if (q->err_pending)
		return 1;
	/* the inner QP's: send completions (or, dead or while a delayed batch
	 * waits, receive completions that will be held: one poll takes them) */
	if (q->dead || !q->h_n || (fault.delay_ms && q->dl_n &&
				   fault_now_ns() < q->dl_due))
		return q->io->cq_pending(q->iq);
	return 1; /* held and visible, or polling starts the delay clock */
}

static void fault_arm(struct prov_qp *q)
{
	q->io->arm(q->iq);
}

static void fault_disarm(struct prov_qp *q)
{
	q->io->disarm(q->iq);
}

static int fault_armed(struct prov_qp *q)
{
	return q->io->armed(q->iq);
}

static void fault_ack(struct prov_qp *q)
{
	q->io->ack(q->iq);
	if (q->tfd >= 0) {
		uint64_t ticks;

		(void)!read(q->tfd, &ticks, sizeof(ticks));
	}
}

static void fault_kick(struct prov_qp *q)
{
	q->io->kick(q->iq);
}

static int fault_notify_fd(struct prov_qp *q)
{
	return q->epfd >= 0 ? q->epfd : q->io->notify_fd(q->iq);
}

/* The delay's timer must wake a waiter too: the epoll set then. */
static int fault_wait_fd(struct prov_qp *q)
{
	if (q->epfd >= 0)
		return q->epfd;
	return q->io->wait_fd ? q->io->wait_fd(q->iq)
			      : q->io->notify_fd(q->iq);
}

static int fault_set_bell(struct prov_qp *q, int fd)
{
	return q->io->set_bell ? q->io->set_bell(q->iq, fd) : 0;
}

static uint32_t *fault_owner_word(struct prov_qp *q)
{
	return q->io->owner_word(q->iq);
}

static uint64_t fault_notifies_sent(struct prov_qp *q)
{
	return q->io->notifies_sent(q->iq);
}

static void fault_publish_consumed(struct prov_qp *q, uint64_t consumed)
{
	if (q->io->publish_consumed)
		q->io->publish_consumed(q->iq, consumed);
}

static int fault_peer_consumed(struct prov_qp *q, uint64_t *consumed)
{
	return q->io->peer_consumed ? q->io->peer_consumed(q->iq, consumed)
				    : -ENOENT;
}

/* (plain writes pass untouched: the faults act on messages) */
static int fault_post_write_plain(struct prov_qp *q, const struct iovec *iov,
				  int iovcnt, uint64_t roff, uint64_t written)
{
	return q->io->post_write_plain(q->iq, iov, iovcnt, roff, written);
}

static void fault_publish_shut(struct prov_qp *q)
{
	if (q->io->publish_shut)
		q->io->publish_shut(q->iq);
}

static int fault_peer_shut(struct prov_qp *q)
{
	return q->io->peer_shut ? q->io->peer_shut(q->iq) : 0;
}

static uint64_t fault_peer_written(struct prov_qp *q)
{
	return q->io->peer_written(q->iq);
}

/* Only the delay fault makes completions lag behind the peer's end. */
static int fault_completions_lag(struct prov_qp *q)
{
	return fault.delay_ms != 0 ||
	       (q->io->completions_lag && q->io->completions_lag(q->iq));
}

static void fault_destroy(struct prov_qp *q)
{
	if (!q)
		return;
	if (q->iq)
		q->io->destroy(q->iq);
	if (q->epfd >= 0)
		close(q->epfd);
	if (q->tfd >= 0)
		close(q->tfd);
	free(q->held);
	free(q);
}

/* The wrapper's ops; name is the inner provider's (fault_ops_for). */
static const struct prov_ops fault_ops_tmpl = {
	.post_recv = fault_post_recv,
	.post_write_imm = fault_post_write_imm,
	.poll_cq = fault_poll_cq,
	.cq_pending = fault_cq_pending,
	.arm = fault_arm,
	.disarm = fault_disarm,
	.armed = fault_armed,
	.ack = fault_ack,
	.kick = fault_kick,
	.notify_fd = fault_notify_fd,
	.wait_fd = fault_wait_fd,
	.set_bell = fault_set_bell,
	.owner_word = fault_owner_word,
	.notifies_sent = fault_notifies_sent,
	.completions_lag = fault_completions_lag,
	.publish_consumed = fault_publish_consumed,
	.peer_consumed = fault_peer_consumed,
	.post_write_plain = fault_post_write_plain,
	.peer_written = fault_peer_written,
	.publish_shut = fault_publish_shut,
	.peer_shut = fault_peer_shut,
	.destroy = fault_destroy,
};

/* One ops table per wrapped provider, made once and never freed (a
 * connection's ops outlive its QP: rsk_provider reads the name).
 * fault_tab_lock protects both arrays; it is a leaf (taken with a
 * listener's socket lock held by accept, never takes another lock). */
#define FAULT_MAX_INNER 4
static struct prov_ops fault_tabs[FAULT_MAX_INNER];
static const struct prov_ops *fault_inner[FAULT_MAX_INNER];
static pthread_mutex_t fault_tab_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct prov_ops *fault_ops_for(const struct prov_ops *inner)
{
	const struct prov_ops *t = NULL;
	int i;

	pthread_mutex_lock(&fault_tab_lock);
	for (i = 0; i < FAULT_MAX_INNER && fault_inner[i]; i++)
		if (fault_inner[i] == inner)
			break;
	if (i < FAULT_MAX_INNER) {
		if (!fault_inner[i]) {
			fault_tabs[i] = fault_ops_tmpl;
			fault_tabs[i].name = inner->name;
			if (!inner->post_write_plain) {
				fault_tabs[i].post_write_plain = NULL;
				fault_tabs[i].peer_written = NULL;
			}
			fault_inner[i] = inner;
		}
		t = &fault_tabs[i];
	}
	pthread_mutex_unlock(&fault_tab_lock);
	return t;
}

/* delay: the notify fd becomes an epoll set of the inner notify fd and a
 * timerfd that fires when delayed completions are due */
static int fault_delay_init(struct prov_qp *q)
{
	struct epoll_event ev = { .events = EPOLLIN };

	q->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (q->tfd < 0)
		return -errno;
	q->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (q->epfd < 0)
		return -errno;
	ev.data.fd = q->io->notify_fd(q->iq);
	if (ev.data.fd < 0)
		return ev.data.fd;
	if (epoll_ctl(q->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) < 0)
		return -errno;
	ev.data.fd = q->tfd;
	if (epoll_ctl(q->epfd, EPOLL_CTL_ADD, q->tfd, &ev) < 0)
		return -errno;
	return 0;
}

int fault_wrap(const struct prov_ops **ops, struct prov_qp **qp,
	       uint8_t *area, uint32_t qdepth)
{
	const struct prov_ops *in = *ops, *t;
	struct prov_qp *q;
	int rc;

	if (in->live_event || in->hup_fence || in->post_write_at || !qdepth)
		return -EOPNOTSUPP;
	t = fault_ops_for(in);
	if (!t)
		return -EOPNOTSUPP;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->io = in;
	q->area = area;
	q->qdepth = qdepth;
	q->epfd = q->tfd = -1;
	q->held = calloc(qdepth, sizeof(*q->held));
	if (!q->held) {
		free(q);
		return -ENOMEM;
	}
	q->iq = *qp;
	if (fault.delay_ms && (rc = fault_delay_init(q))) {
		q->iq = NULL; /* still the caller's */
		fault_destroy(q);
		return rc;
	}
	*ops = t;
	*qp = q;
	return 0;
}
