// SPDX-License-Identifier: MIT
/*
 * prov_shm.c - a software RC queue pair between two processes on one host.
 *
 * Each side owns one sealed memfd segment:
 *
 *   +--------------------+  0
 *   | struct shm_hdr     |  counters, each on its own cache line
 *   +--------------------+  SHM_CQ_OFF
 *   | cqe[qdepth]        |  receive completions, written by the PEER
 *   +--------------------+  area_off (page aligned)
 *   | recv area          |  ctrl slots + data ring, written by the PEER
 *   +--------------------+
 *
 * The owner posts receives (rq_prod) and consumes completions (cq_cons);
 * the peer, acting as the "HCA" of a write, copies the payload into the
 * area, consumes one posted receive, appends a completion (cq_prod) and,
 * only if the owner armed notification, clears `armed` and writes the
 * owner's eventfd.  Arming is a Dekker pair: the owner stores armed=1 then
 * re-reads cq_prod; the writer stores cq_prod then reads armed; both with
 * seq_cst, so one of them always sees the other.
 *
 * The peer is untrusted: every index read from its side is range-checked,
 * wr_ids of receives are kept privately, and a write that does not fit the
 * peer's area puts the QP in the error state.  Seals (no shrink/grow) make
 * a mapped segment safe against truncation (no SIGBUS).
 *
 * Fault injection (RSOCK_FAULT, see the section below and README.md):
 * off by default; when off, each hook is one predictable branch on a
 * static flag.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "prov.h"
#include "ring.h"

#define SHM_MAGIC 0x4b53525348534d31ull /* "1MSHSRSK" */
#define SHM_CQ_OFF 512
#define CL 64

struct shm_hdr {
	uint64_t magic;
	uint32_t ring_size;
	uint32_t qdepth;
	_Alignas(CL) uint32_t rq_prod; /* owner */
	_Alignas(CL) uint32_t cq_cons; /* owner */
	_Alignas(CL) uint32_t cq_prod; /* peer */
	_Alignas(CL) uint32_t armed;   /* owner sets, peer clears */
	_Alignas(CL) uint32_t owner_pid; /* the process using our half (fork) */
};

_Static_assert(sizeof(struct shm_hdr) <= SHM_CQ_OFF, "header too large");

struct shm_cqe {
	uint32_t imm;
	uint32_t len;
};

struct shm_seg {
	uint8_t *base;
	size_t size;
	struct shm_hdr *hdr;
	struct shm_cqe *cq;
	uint8_t *area;
	size_t area_len;
	uint32_t qdepth;
};

/* ------------------------------------------------------ fault injection
 *
 * RSOCK_FAULT="kind:N[:arg],..." is parsed once per process, at the first
 * QP creation.  Counters are per QP; N is how many operations of that kind
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
 */
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
	int bad;               /* RSOCK_FAULT did not parse */
};

struct qp_fault {
	uint64_t writes;  /* write posts attempted */
	uint64_t written; /* write posts that succeeded */
	uint64_t reposts; /* receive posts once connected */
	uint64_t scqes;   /* signaled send completions produced */
	int corrupted;
	int err_pending;  /* an error completion is owed to the poller */
	/* delay: completions up to dl_prod become visible at dl_due */
	uint32_t dl_prod;
	int64_t dl_due;
	int64_t timer_at; /* what the timerfd is set to (0: disarmed) */
	int epfd; /* delay only: notify fd = epoll(evfd, tfd) */
	int tfd;
};

static int fault_on; /* the one flag the fast path tests */
static struct fault_cfg fault;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

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
	fault_on = !fault.bad;
}

/* Does counter c (post-incremented) hit the trigger of kind k? */
static int fault_hit(int k, uint64_t *c)
{
	return fault.at[k] >= 0 && (*c)++ == (uint64_t)fault.at[k];
}

#define SCQ_MAX 64

struct prov_qp {
	struct shm_seg l; /* ours: peer writes into it */
	struct shm_seg r; /* the peer's: we write into it */
	int memfd;
	int evfd;      /* ours, the peer writes it */
	int peer_evfd; /* the peer's, we write it */
	int err;
	/* receive side (private mirror of our shared counters) */
	uint32_t rq_prod;
	uint32_t rq_cons;
	uint32_t cq_cons;
	uint64_t *rq_wrid; /* [l.qdepth] */
	/* send side: our view of the peer's queues (we are the only writer
	 * of its cq_prod) */
	uint32_t peer_rq_cons;
	uint32_t peer_cq_prod;
	/* local send CQ: completions of signaled writes */
	struct prov_wc scq[SCQ_MAX];
	unsigned scq_n;
	uint64_t notifies;
	struct qp_fault f; /* used only while fault_on */
};

/* --- fault injection: the QP side (fault_on only) --- */

/* delay: the notify fd becomes an epoll set of the eventfd and a timerfd
 * that fires when delayed completions are due */
static int fault_qp_init(struct prov_qp *qp)
{
	struct epoll_event ev = { .events = EPOLLIN };

	if (!fault.delay_ms)
		return 0;
	qp->f.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (qp->f.tfd < 0)
		return -errno;
	qp->f.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (qp->f.epfd < 0)
		return -errno;
	ev.data.fd = qp->evfd;
	if (epoll_ctl(qp->f.epfd, EPOLL_CTL_ADD, qp->evfd, &ev) < 0)
		return -errno;
	ev.data.fd = qp->f.tfd;
	if (epoll_ctl(qp->f.epfd, EPOLL_CTL_ADD, qp->f.tfd, &ev) < 0)
		return -errno;
	return 0;
}

/* The QP enters the error state; the poller gets one error completion. */
static void fault_qp_break(struct prov_qp *qp)
{
	if (qp->err)
		return;
	qp->err = -EIO;
	qp->f.err_pending = 1;
}

static int fault_before_write(struct prov_qp *qp)
{
	if (fault.at[FK_QP_ERROR] == 0) {
		fault_qp_break(qp);
		return qp->err;
	}
	if (fault_hit(FK_FAIL_WRITE, &qp->f.writes))
		return -fault.err_write;
	return 0;
}

/* A write went through: its send completion (unless dropped), and the
 * QP error after N writes. */
static int fault_after_write(struct prov_qp *qp, int flags, uint64_t wr_id)
{
	if ((flags & PROV_SIGNALED) && !fault_hit(FK_DROP_SEND, &qp->f.scqes))
		qp->scq[qp->scq_n++] = (struct prov_wc){ .wr_id = wr_id };
	if (fault.at[FK_QP_ERROR] > 0 &&
	    ++qp->f.written == (uint64_t)fault.at[FK_QP_ERROR])
		fault_qp_break(qp);
	return 0;
}

static size_t seg_area_off(uint32_t qdepth)
{
	size_t end = SHM_CQ_OFF + (size_t)qdepth * sizeof(struct shm_cqe);

	return (end + 4095) & ~(size_t)4095;
}

static size_t seg_size(uint32_t ring_size, uint32_t qdepth)
{
	return seg_area_off(qdepth) + prov_area_len(qdepth, ring_size);
}

static void seg_layout(struct shm_seg *s, uint8_t *base, uint32_t ring_size,
		       uint32_t qdepth)
{
	s->base = base;
	s->size = seg_size(ring_size, qdepth);
	s->hdr = (struct shm_hdr *)base;
	s->cq = (struct shm_cqe *)(base + SHM_CQ_OFF);
	s->area = base + seg_area_off(qdepth);
	s->area_len = prov_area_len(qdepth, ring_size);
	s->qdepth = qdepth;
}

/* A new sealed 0600 segment with its header written; returns the memfd
 * and leaves it mapped at *base. */
static int seg_new(uint32_t ring_size, uint32_t qdepth, uint8_t **base)
{
	size_t size = seg_size(ring_size, qdepth);
	struct shm_hdr *h;
	void *p;
	int fd, rc;

	fd = memfd_create("rsock", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, 0600) < 0 || ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		goto fail;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	h = p;
	h->magic = SHM_MAGIC;
	h->ring_size = ring_size;
	h->qdepth = qdepth;
	*base = p;
	return fd;
fail:
	rc = -errno;
	close(fd);
	return rc;
}

static struct prov_qp *qp_alloc(uint32_t qdepth)
{
	struct prov_qp *qp = calloc(1, sizeof(*qp));

	if (!qp)
		return NULL;
	qp->memfd = qp->evfd = qp->peer_evfd = -1;
	qp->f.epfd = qp->f.tfd = -1;
	qp->rq_wrid = calloc(qdepth, sizeof(uint64_t));
	if (!qp->rq_wrid) {
		free(qp);
		return NULL;
	}
	return qp;
}

int shm_qp_create(uint32_t ring_size, uint32_t qdepth, struct prov_qp **out)
{
	struct prov_qp *qp;
	uint8_t *base;
	int rc;

	if (!ring_is_pow2(ring_size) || qdepth == 0)
		return -EINVAL;
	pthread_once(&fault_once, fault_parse);
	if (fault.bad)
		return -EINVAL;
	qp = qp_alloc(qdepth);
	if (!qp)
		return -ENOMEM;
	rc = seg_new(ring_size, qdepth, &base);
	if (rc < 0)
		goto fail;
	qp->memfd = rc;
	seg_layout(&qp->l, base, ring_size, qdepth);
	qp->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (qp->evfd < 0) {
		rc = -errno;
		goto fail;
	}
	if (__builtin_expect(fault_on, 0) && (rc = fault_qp_init(qp)))
		goto fail;
	*out = qp;
	return 0;
fail:
	shm_ops.destroy(qp);
	return rc;
}

int shm_half_create(uint32_t ring_size, uint32_t qdepth, int *memfd, int *evfd)
{
	uint8_t *base;
	int fd;

	if (!ring_is_pow2(ring_size) || qdepth == 0)
		return -EINVAL;
	fd = seg_new(ring_size, qdepth, &base);
	if (fd < 0)
		return fd;
	/* every receive of the future owner is posted from the start */
	((struct shm_hdr *)base)->rq_prod = qdepth;
	munmap(base, seg_size(ring_size, qdepth));
	*evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (*evfd < 0) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	*memfd = fd;
	return 0;
}

int shm_qp_memfd(struct prov_qp *qp)
{
	return qp->memfd;
}

int shm_qp_evfd(struct prov_qp *qp)
{
	return qp->evfd;
}

uint8_t *shm_qp_area(struct prov_qp *qp)
{
	return qp->l.area;
}

void shm_qp_drop_memfd(struct prov_qp *qp)
{
	if (qp->memfd >= 0)
		close(qp->memfd);
	qp->memfd = -1;
}

static int is_eventfd(int fd)
{
	static const char want[] = "anon_inode:[eventfd]";
	char path[64], link[sizeof(want) + 1];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link));
	return n == (ssize_t)sizeof(want) - 1 && !memcmp(link, want, (size_t)n);
}

/* Maps a segment the peer created after checking it cannot hurt us: a
 * regular memfd sealed against shrinking and growing, large enough for
 * the announced geometry, with our magic.  Consumes nothing. */
static int seg_map_checked(int memfd, uint32_t ring_size, uint32_t qdepth,
			   uint8_t **base)
{
	const int need = F_SEAL_SHRINK | F_SEAL_GROW;
	size_t size = seg_size(ring_size, qdepth);
	struct stat st;
	void *p;
	int seals;

	if (!ring_is_pow2(ring_size) || qdepth == 0)
		return -EPROTO;
	seals = fcntl(memfd, F_GET_SEALS);
	if (seals < 0 || (seals & need) != need)
		return -EPROTO;
	if (fstat(memfd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size < size)
		return -EPROTO;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED)
		return -errno;
	if (__atomic_load_n(&((struct shm_hdr *)p)->magic, __ATOMIC_RELAXED) !=
	    SHM_MAGIC) {
		munmap(p, size);
		return -EPROTO;
	}
	*base = p;
	return 0;
}

/* An eventfd we may write (or read) without ever blocking. */
static int evfd_checked(int evfd)
{
	int fl;

	if (!is_eventfd(evfd))
		return -EPROTO;
	fl = fcntl(evfd, F_GETFL);
	if (fl < 0 || fcntl(evfd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int shm_qp_attach(struct prov_qp *qp, int memfd, int evfd, uint32_t ring_size,
		  uint32_t qdepth)
{
	uint8_t *base;
	int rc = -EPROTO;

	if (qp->r.base)
		goto out;
	rc = evfd_checked(evfd);
	if (!rc)
		rc = seg_map_checked(memfd, ring_size, qdepth, &base);
	if (rc)
		goto out;
	seg_layout(&qp->r, base, ring_size, qdepth);
	close(memfd);
	qp->peer_evfd = evfd;
	return 0;
out:
	close(memfd);
	close(evfd);
	return rc;
}

int shm_qp_adopt(uint32_t ring_size, uint32_t qdepth, int memfd, int evfd,
		 struct prov_qp **out)
{
	struct prov_qp *qp = NULL;
	uint8_t *base;
	uint32_t i;
	int rc;

	pthread_once(&fault_once, fault_parse);
	rc = fault.bad ? -EINVAL : evfd_checked(evfd);
	if (rc)
		goto out;
	qp = qp_alloc(qdepth);
	if (!qp) {
		rc = -ENOMEM;
		goto out;
	}
	rc = seg_map_checked(memfd, ring_size, qdepth, &base);
	if (rc)
		goto out;
	seg_layout(&qp->l, base, ring_size, qdepth);
	close(memfd);
	qp->evfd = evfd;
	/* the creator posted all our receives; everything else in the
	 * header is ours to (re)set, whatever the creator left there */
	for (i = 0; i < qdepth; i++)
		qp->rq_wrid[i] = PROV_WRID_RECV | i;
	qp->rq_prod = qdepth;
	__atomic_store_n(&qp->l.hdr->rq_prod, qdepth, __ATOMIC_RELEASE);
	__atomic_store_n(&qp->l.hdr->cq_cons, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&qp->l.hdr->armed, 0, __ATOMIC_RELEASE);
	if (__builtin_expect(fault_on, 0) && (rc = fault_qp_init(qp))) {
		shm_ops.destroy(qp); /* owns both fds now */
		return rc;
	}
	*out = qp;
	return 0;
out:
	if (qp)
		shm_ops.destroy(qp); /* owns neither fd yet */
	close(memfd);
	close(evfd);
	return rc;
}

static int shm_post_recv(struct prov_qp *qp, uint64_t wr_id)
{
	if (qp->err)
		return qp->err;
	if (__builtin_expect(fault_on, 0) && qp->r.base &&
	    fault_hit(FK_FAIL_RECV, &qp->f.reposts))
		return -fault.err_recv;
	if (qp->rq_prod - qp->rq_cons >= qp->l.qdepth)
		return -ENOMEM;
	qp->rq_wrid[qp->rq_prod % qp->l.qdepth] = wr_id;
	qp->rq_prod++;
	__atomic_store_n(&qp->l.hdr->rq_prod, qp->rq_prod, __ATOMIC_RELEASE);
	return 0;
}

static int shm_post_write_imm(struct prov_qp *qp, const struct iovec *iov,
			      int iovcnt, uint64_t roff, uint32_t imm,
			      int flags, uint64_t wr_id)
{
	struct shm_hdr *rh = qp->r.hdr;
	uint32_t posted, cons;
	uint64_t len = 0;
	uint8_t *dst;
	int i, rc;

	if (qp->err)
		return qp->err;
	if (!qp->r.base)
		return -ENOTCONN;
	if (__builtin_expect(fault_on, 0) && (rc = fault_before_write(qp)))
		return rc;
	if (flags & PROV_SIGNALED && qp->scq_n >= SCQ_MAX)
		return -ENOSPC; /* send CQ overrun: caller must reap */
	for (i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	/* remote access check (the rkey/length check of an HCA) */
	if (roff > qp->r.area_len || len > qp->r.area_len - roff)
		return qp->err = -EFAULT;
	/* a posted receive must be there (no RNR retry: credits forbid it) */
	posted = __atomic_load_n(&rh->rq_prod, __ATOMIC_ACQUIRE);
	if (posted - qp->peer_rq_cons == 0 ||
	    posted - qp->peer_rq_cons > qp->r.qdepth)
		return qp->err = -EPROTO;
	cons = __atomic_load_n(&rh->cq_cons, __ATOMIC_ACQUIRE);
	if (qp->peer_cq_prod - cons >= qp->r.qdepth)
		return qp->err = -EPROTO;

	dst = qp->r.area + roff;
	for (i = 0; i < iovcnt; i++) {
		memcpy(dst, iov[i].iov_base, iov[i].iov_len);
		dst += iov[i].iov_len;
	}
	qp->r.cq[qp->peer_cq_prod % qp->r.qdepth] =
		(struct shm_cqe){ .imm = imm, .len = (uint32_t)len };
	qp->peer_rq_cons++;
	qp->peer_cq_prod++;
	__atomic_store_n(&rh->cq_prod, qp->peer_cq_prod, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&rh->armed, __ATOMIC_SEQ_CST) &&
	    __atomic_exchange_n(&rh->armed, 0, __ATOMIC_SEQ_CST)) {
		eventfd_write(qp->peer_evfd, 1);
		qp->notifies++;
	}
	if (__builtin_expect(fault_on, 0))
		return fault_after_write(qp, flags, wr_id);
	if (flags & PROV_SIGNALED)
		qp->scq[qp->scq_n++] = (struct prov_wc){ .wr_id = wr_id };
	return 0;
}

static int fault_poll_cq(struct prov_qp *qp, struct prov_wc *wc, int n);

static int shm_poll_cq(struct prov_qp *qp, struct prov_wc *wc, int n)
{
	struct shm_cqe cqe;
	uint32_t prod;
	int got = 0;

	if (__builtin_expect(fault_on, 0))
		return fault_poll_cq(qp, wc, n);
	while (qp->scq_n && got < n) {
		wc[got++] = qp->scq[0];
		qp->scq_n--;
		memmove(qp->scq, qp->scq + 1, qp->scq_n * sizeof(qp->scq[0]));
	}
	if (got == n || qp->err)
		return got;
	prod = __atomic_load_n(&qp->l.hdr->cq_prod, __ATOMIC_ACQUIRE);
	if (prod - qp->cq_cons > qp->l.qdepth ||
	    prod - qp->cq_cons > qp->rq_prod - qp->rq_cons) {
		/* the peer claims completions for receives never posted */
		qp->err = -EPROTO;
		wc[got++] = (struct prov_wc){ .status = -EPROTO, .is_recv = 1 };
		return got;
	}
	while (qp->cq_cons != prod && got < n) {
		cqe = qp->l.cq[qp->cq_cons % qp->l.qdepth];
		wc[got++] = (struct prov_wc){
			.wr_id = qp->rq_wrid[qp->rq_cons % qp->l.qdepth],
			.imm = cqe.imm,
			.byte_len = cqe.len,
			.is_recv = 1,
		};
		qp->rq_cons++;
		qp->cq_cons++;
	}
	__atomic_store_n(&qp->l.hdr->cq_cons, qp->cq_cons, __ATOMIC_RELEASE);
	return got;
}

static int fault_cq_pending(struct prov_qp *qp);

static int shm_cq_pending(struct prov_qp *qp)
{
	if (__builtin_expect(fault_on, 0))
		return fault_cq_pending(qp);
	return qp->scq_n ||
	       __atomic_load_n(&qp->l.hdr->cq_prod, __ATOMIC_ACQUIRE) !=
		       qp->cq_cons;
}

static void shm_arm(struct prov_qp *qp)
{
	__atomic_store_n(&qp->l.hdr->armed, 1, __ATOMIC_SEQ_CST);
}

static void shm_disarm(struct prov_qp *qp)
{
	__atomic_store_n(&qp->l.hdr->armed, 0, __ATOMIC_RELAXED);
}

static int shm_armed(struct prov_qp *qp)
{
	return __atomic_load_n(&qp->l.hdr->armed, __ATOMIC_ACQUIRE) != 0;
}

static void shm_ack(struct prov_qp *qp)
{
	eventfd_t v;

	(void)eventfd_read(qp->evfd, &v);
	if (__builtin_expect(fault_on, 0) && qp->f.tfd >= 0) {
		uint64_t ticks;

		(void)!read(qp->f.tfd, &ticks, sizeof(ticks));
	}
}

static void shm_kick(struct prov_qp *qp)
{
	(void)eventfd_write(qp->evfd, 1);
}

static int shm_notify_fd(struct prov_qp *qp)
{
	return qp->f.epfd >= 0 ? qp->f.epfd : qp->evfd;
}

static uint32_t *shm_owner_word(struct prov_qp *qp)
{
	return &qp->l.hdr->owner_pid;
}

static uint64_t shm_notifies_sent(struct prov_qp *qp)
{
	return qp->notifies;
}

/* --- fault injection: completions (fault_on only) --- */

static int64_t fault_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* delay: receive completions up to which index the owner may see now */
static uint32_t fault_visible(struct prov_qp *qp, uint32_t prod)
{
	int64_t now;

	if (!fault.delay_ms)
		return prod;
	now = fault_now_ns();
	if (qp->f.dl_prod == qp->cq_cons && prod != qp->cq_cons) {
		/* new completions: their clock starts now */
		qp->f.dl_prod = prod;
		qp->f.dl_due = now + (int64_t)fault.delay_ms * 1000000;
	}
	if (qp->f.dl_prod != qp->cq_cons && now < qp->f.dl_due)
		return qp->cq_cons;
	return qp->f.dl_prod;
}

/* delay: keep the timerfd readable exactly while delayed completions are
 * waiting (armed for their due time), so a sleeper wakes for them and an
 * event loop never sees a stale wake-up. */
static void fault_sync_timer(struct prov_qp *qp)
{
	struct itimerspec its = { 0 };
	int64_t at = qp->f.dl_prod != qp->cq_cons ? qp->f.dl_due : 0;

	if (qp->f.tfd < 0 || at == qp->f.timer_at)
		return;
	qp->f.timer_at = at;
	its.it_value.tv_sec = at / 1000000000;
	its.it_value.tv_nsec = at % 1000000000;
	/* disarming (at == 0) also resets the expiry count: the fd turns
	 * unreadable */
	(void)timerfd_settime(qp->f.tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* corrupt: rewrite what the peer wrote for message seq, once */
static void fault_corrupt(struct prov_qp *qp, uint32_t seq, struct shm_cqe *cqe)
{
	uint8_t *slot = qp->l.area + (size_t)(seq % qp->l.qdepth) * 16;
	uint32_t op = cqe->imm >> FAULT_IMM_OP_SHIFT, v;
	uint64_t consumed = 1ull << 62;

	if (fault.corrupt == FC_OPCODE) {
		cqe->imm = (7u << FAULT_IMM_OP_SHIFT) | (cqe->imm & FAULT_IMM_ARG_MASK);
	} else if (fault.corrupt == FC_LEN) {
		if (op != 0)
			return; /* DATA only */
		cqe->imm = FAULT_IMM_ARG_MASK;
		cqe->len = FAULT_IMM_ARG_MASK;
	} else {
		if (op == 0 || cqe->len != 16)
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
	qp->f.corrupted = 1;
}

/* The error completion owed since the QP broke (it is in error now). */
static void fault_err_wc(struct prov_qp *qp, struct prov_wc *wc)
{
	qp->f.err_pending = 0;
	if (!qp->err)
		qp->err = -EIO;
	*wc = (struct prov_wc){ .status = qp->err, .is_recv = 1 };
}

/* shm_poll_cq with the fault hooks */
static int fault_poll_cq(struct prov_qp *qp, struct prov_wc *wc, int n)
{
	struct shm_cqe cqe;
	uint32_t prod, upto, seq;
	uint64_t wr_id;
	int got = 0;

	while (qp->scq_n && got < n) {
		wc[got++] = qp->scq[0];
		qp->scq_n--;
		memmove(qp->scq, qp->scq + 1, qp->scq_n * sizeof(qp->scq[0]));
	}
	if (got < n && qp->f.err_pending)
		fault_err_wc(qp, &wc[got++]);
	if (got == n || qp->err)
		return got;
	prod = __atomic_load_n(&qp->l.hdr->cq_prod, __ATOMIC_ACQUIRE);
	if (prod - qp->cq_cons > qp->l.qdepth ||
	    prod - qp->cq_cons > qp->rq_prod - qp->rq_cons) {
		qp->err = -EPROTO;
		wc[got++] = (struct prov_wc){ .status = -EPROTO, .is_recv = 1 };
		return got;
	}
	upto = fault_visible(qp, prod);
	while (qp->cq_cons != upto && got < n) {
		seq = qp->cq_cons;
		cqe = qp->l.cq[seq % qp->l.qdepth];
		wr_id = qp->rq_wrid[qp->rq_cons % qp->l.qdepth];
		qp->rq_cons++;
		qp->cq_cons++;
		if (fault.at[FK_DROP_RECV] == (int64_t)seq) {
			/* the CQE is lost, and that is noticed (a CQ error):
			 * the completions before it are handled first (their
			 * receives reposted), then the error completion */
			qp->f.err_pending = 1;
			if (!got)
				fault_err_wc(qp, &wc[got++]);
			break;
		}
		if (fault.at[FK_LOSE_RECV] == (int64_t)seq)
			continue; /* lost without a trace */
		if (fault.corrupt && !qp->f.corrupted &&
		    (int64_t)seq >= fault.at[FK_CORRUPT])
			fault_corrupt(qp, seq, &cqe);
		wc[got++] = (struct prov_wc){
			.wr_id = wr_id,
			.imm = cqe.imm,
			.byte_len = cqe.len,
			.is_recv = 1,
		};
	}
	__atomic_store_n(&qp->l.hdr->cq_cons, qp->cq_cons, __ATOMIC_RELEASE);
	if (qp->f.err_pending || qp->err)
		qp->f.dl_prod = qp->cq_cons; /* nothing more to deliver */
	fault_sync_timer(qp);
	return got;
}

static int fault_cq_pending(struct prov_qp *qp)
{
	uint32_t prod;

	if (qp->scq_n || qp->f.err_pending)
		return 1;
	if (qp->err)
		return 0;
	prod = __atomic_load_n(&qp->l.hdr->cq_prod, __ATOMIC_ACQUIRE);
	if (prod == qp->cq_cons)
		return 0;
	if (!fault.delay_ms || qp->f.dl_prod == qp->cq_cons)
		return 1; /* polling starts the delay clock */
	return fault_now_ns() >= qp->f.dl_due;
}

static void shm_destroy(struct prov_qp *qp)
{
	if (!qp)
		return;
	if (qp->l.base)
		munmap(qp->l.base, qp->l.size);
	if (qp->r.base)
		munmap(qp->r.base, qp->r.size);
	if (qp->memfd >= 0)
		close(qp->memfd);
	if (qp->evfd >= 0)
		close(qp->evfd);
	if (qp->peer_evfd >= 0)
		close(qp->peer_evfd);
	if (qp->f.epfd >= 0)
		close(qp->f.epfd);
	if (qp->f.tfd >= 0)
		close(qp->f.tfd);
	free(qp->rq_wrid);
	free(qp);
}

/* Only the delay fault makes completions lag behind the peer's end. */
static int shm_completions_lag(struct prov_qp *qp)
{
	(void)qp;
	return fault.delay_ms != 0;
}

const struct prov_ops shm_ops = {
	.name = "shm",
	.post_recv = shm_post_recv,
	.post_write_imm = shm_post_write_imm,
	.poll_cq = shm_poll_cq,
	.cq_pending = shm_cq_pending,
	.arm = shm_arm,
	.disarm = shm_disarm,
	.armed = shm_armed,
	.ack = shm_ack,
	.kick = shm_kick,
	.notify_fd = shm_notify_fd,
	.owner_word = shm_owner_word,
	.notifies_sent = shm_notifies_sent,
	.completions_lag = shm_completions_lag,
	.destroy = shm_destroy,
};
