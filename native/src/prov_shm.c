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
 * only if the owner armed notification, clears `armed` and rings the
 * owner's bell: a 1-byte record on the connection's liveness socket (the
 * engine's fd, handed over by set_bell), so that a connection holds no fd
 * of its own for notifications.  Arming is a Dekker pair: the owner stores armed=1 then
 * re-reads cq_prod; the writer stores cq_prod then reads armed; both with
 * seq_cst, so one of them always sees the other.
 *
 * The peer is untrusted: every index read from its side is range-checked,
 * wr_ids of receives are kept privately, and a write that does not fit the
 * peer's area puts the QP in the error state.  Seals (no shrink/grow) make
 * a mapped segment safe against truncation (no SIGBUS).
 *
 * Fault injection (RSOCK_FAULT) is not here: prov_fault.c wraps this
 * provider's QP when it is set, and nothing does when it is not.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "prov.h"
#include "ring.h"
#include "rsock.h"

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
	_Alignas(CL) uint32_t bell; /* owner: wake me by a bell, not my eventfd */
	/* owner: data bytes its application consumed, stored at every receive,
	 * and 1 in `owned` once it has the half: what the peer reads if the
	 * owner vanishes (nothing of ours unread: an orderly end, as TCP's
	 * kernel closes a dead process's socket with a FIN) */
	_Alignas(CL) uint64_t consumed;
	uint32_t owned;
	/* owner: 1 once its application shut down both directions (a peer
	 * that sends data then is answered with a reset, as TCP's kernel
	 * answers for a process that does not look at its socket) */
	uint32_t shut;
	/* peer: the stream position after its last plain write (bytes it
	 * wrote into our ring without a completion, its message credits
	 * spent): they are ours to read, in order, up to there */
	uint64_t written;
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

#define SCQ_MAX 64

struct shm_arena;

struct prov_qp {
	struct shm_seg l; /* ours: peer writes into it */
	struct shm_seg r; /* the peer's: we write into it */
	int memfd;
	int bell; /* the liveness socket (the engine's): we ring the peer there */
	int kfd;  /* bell mode: an eventfd made at first need (notify fd) */
	int evfd;      /* eventfd mode: ours (notify fd), the peer writes it */
	int peer_evfd; /* the peer's, we write it (unless it asks for bells) */
	int err;
	/* receive side (private mirror of our shared counters) */
	uint32_t rq_prod;
	uint32_t rq_cons;
	uint32_t cq_cons;
	uint64_t *rq_wrid; /* [l.qdepth] */
	uint64_t written_seen; /* l.hdr->written as shm_peer_written read it */
	/* send side: our view of the peer's queues (we are the only writer
	 * of its cq_prod) */
	uint32_t peer_rq_cons;
	uint32_t peer_cq_prod;
	/* local send CQ: completions of signaled writes */
	struct prov_wc scq[SCQ_MAX];
	unsigned scq_n;
	uint64_t notifies;
	/* halves carved out of an arena (NULL: segments of their own) */
	struct shm_arena *arena;
	uint32_t slot;
	uint32_t slot_bit; /* ARENA_C (the client's QP) or ARENA_S */
	int slot_sent;     /* the client's: its REQ_SLOT went out */
	unsigned fork_ctr; /* ar_forks when made: a fork since keeps the slot */
};

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
	h->owned = 1; /* (a half made for the peer: shm_half_create clears it) */
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
	qp->memfd = qp->bell = qp->kfd = qp->evfd = qp->peer_evfd = -1;
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
	qp = qp_alloc(qdepth);
	if (!qp)
		return -ENOMEM;
	rc = seg_new(ring_size, qdepth, &base);
	if (rc < 0)
		goto fail;
	qp->memfd = rc;
	seg_layout(&qp->l, base, ring_size, qdepth);
	*out = qp;
	return 0;
fail:
	shm_ops.destroy(qp);
	return rc;
}

int shm_half_create(uint32_t ring_size, uint32_t qdepth, int *memfd)
{
	uint8_t *base;
	int fd;

	if (!ring_is_pow2(ring_size) || qdepth == 0)
		return -EINVAL;
	fd = seg_new(ring_size, qdepth, &base);
	if (fd < 0)
		return fd;
	/* every receive of the future owner is posted from the start; it
	 * owns the half once it adopts it */
	((struct shm_hdr *)base)->rq_prod = qdepth;
	((struct shm_hdr *)base)->owned = 0;
	munmap(base, seg_size(ring_size, qdepth));
	*memfd = fd;
	return 0;
}

int shm_qp_memfd(struct prov_qp *qp)
{
	return qp->memfd;
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

/* Is fd an eventfd?  Every eventfd shares one anonymous inode with the
 * other plain anon-inode files (epoll, timerfd, signalfd: writing or
 * reading those fails, or wakes us spuriously, which a peer may do anyway),
 * so one fstat against an eventfd of ours says it, without the readlink of
 * /proc that names it (a path lookup per connection). */
static struct stat evfd_ref; /* st_ino 0: none could be made */
static pthread_once_t evfd_ref_once = PTHREAD_ONCE_INIT;

static void evfd_ref_init(void)
{
	int ref = eventfd(0, EFD_CLOEXEC);

	if (ref >= 0) {
		if (fstat(ref, &evfd_ref) < 0)
			evfd_ref.st_ino = 0;
		close(ref);
	}
}

static int is_eventfd(int fd)
{
	struct stat st;

	pthread_once(&evfd_ref_once, evfd_ref_init);
	return evfd_ref.st_ino && fstat(fd, &st) == 0 &&
	       st.st_dev == evfd_ref.st_dev && st.st_ino == evfd_ref.st_ino;
}
/* An eventfd we may write (or read) without ever blocking. */
static int evfd_checked(int evfd)
{
	int fl;

	if (!is_eventfd(evfd))
		return -EPROTO;
	fl = fcntl(evfd, F_GETFL);
	if (fl < 0)
		return -errno;
	/* (the peer made it non-blocking, as ours makes them: one call) */
	if (!(fl & O_NONBLOCK) && fcntl(evfd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/*
 * How a connection is woken (PROTOCOL.md, section 7): by eventfds (two
 * more fds per endpoint, the cheapest wake-up) while this process's
 * connections that hold them use at most a quarter of its fd limit, else
 * by bells on the liveness socket (no fd of their own).  RSOCK_WAKE=bell
 * or =eventfd decides for every connection.
 */
static int shm_evfd_conns; /* QPs of this process holding eventfds */

static int shm_want_evfds(void)
{
	const char *e = getenv("RSOCK_WAKE"); /* (read per connection) */
	struct rlimit rl;

	if (e && !strcmp(e, "bell"))
		return 0;
	if (e && !strcmp(e, "eventfd"))
		return 1;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	return rl.rlim_cur == RLIM_INFINITY ||
	       (uint64_t)(__atomic_load_n(&shm_evfd_conns, __ATOMIC_RELAXED) + 1) *
			       2 <=
		       (uint64_t)rl.rlim_cur / 4;
}

static void shm_hold_evfds(struct prov_qp *qp, int evfd, int peer_evfd)
{
	qp->evfd = evfd;
	qp->peer_evfd = peer_evfd;
	__atomic_fetch_add(&shm_evfd_conns, 1, __ATOMIC_RELAXED);
}

int shm_qp_wake_fds(struct prov_qp *qp, int *own, int *peer)
{
	int a, b;

	if (!shm_want_evfds())
		return -ENOENT;
	a = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	b = a < 0 ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (b < 0) {
		if (a >= 0)
			close(a);
		return -ENOENT; /* (bells then) */
	}
	shm_hold_evfds(qp, a, b);
	*own = a;
	*peer = b;
	return 0;
}

int shm_qp_take_wake_fds(struct prov_qp *qp, int own, int peer)
{
	int rc = -EPROTO;

	if (qp->evfd < 0 && !evfd_checked(own) && !evfd_checked(peer)) {
		if (shm_want_evfds()) {
			shm_hold_evfds(qp, own, peer);
			return 0;
		}
		rc = 0; /* short of fds: bells, the peer's eventfds closed */
	}
	close(own);
	close(peer);
	return rc;
}

int shm_qp_attach(struct prov_qp *qp, int memfd, uint32_t ring_size,
		  uint32_t qdepth)
{
	uint8_t *base;
	int rc = -EPROTO;

	if (!qp->r.base)
		rc = seg_map_checked(memfd, ring_size, qdepth, &base);
	if (!rc)
		seg_layout(&qp->r, base, ring_size, qdepth);
	close(memfd);
	return rc;
}

/* A half the peer created is ours now: the creator posted all our
 * receives; everything else in the header is ours to (re)set, whatever
 * the creator left there. */
static void qp_take_posted(struct prov_qp *qp, uint32_t qdepth)
{
	uint32_t i;

	for (i = 0; i < qdepth; i++)
		qp->rq_wrid[i] = PROV_WRID_RECV | i;
	qp->rq_prod = qdepth;
	__atomic_store_n(&qp->l.hdr->rq_prod, qdepth, __ATOMIC_RELEASE);
	__atomic_store_n(&qp->l.hdr->cq_cons, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&qp->l.hdr->armed, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&qp->l.hdr->consumed, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&qp->l.hdr->shut, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&qp->l.hdr->owned, 1, __ATOMIC_RELEASE);
}

int shm_qp_adopt(uint32_t ring_size, uint32_t qdepth, int memfd,
		 struct prov_qp **out)
{
	struct prov_qp *qp = NULL;
	uint8_t *base;
	int rc;

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
	qp_take_posted(qp, qdepth);
	*out = qp;
	return 0;
out:
	if (qp)
		shm_ops.destroy(qp); /* does not own memfd yet */
	close(memfd);
	return rc;
}

static int shm_post_recv(struct prov_qp *qp, uint64_t wr_id)
{
	if (qp->err)
		return qp->err;
	if (qp->rq_prod - qp->rq_cons >= qp->l.qdepth)
		return -ENOMEM;
	qp->rq_wrid[qp->rq_prod % qp->l.qdepth] = wr_id;
	qp->rq_prod++;
	__atomic_store_n(&qp->l.hdr->rq_prod, qp->rq_prod, __ATOMIC_RELEASE);
	return 0;
}

/* Wake the peer: one record of one byte on the liveness socket.  It never
 * blocks: a full socket (the peer has not read its earlier bells) or a
 * peer that is gone (its liveness side reports it) loses nothing. */
static void shm_ring(struct prov_qp *qp)
{
	static const char bell = SHM_BELL;

	if (qp->bell >= 0 &&
	    send(qp->bell, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1)
		qp->notifies++;
}

/* After a store the peer may sleep through (seq_cst): if it armed, wake
 * it the way its header asks (the Dekker pair of shm_arm). */
static void shm_wake_peer(struct prov_qp *qp)
{
	struct shm_hdr *rh = qp->r.hdr;

	if (__atomic_load_n(&rh->armed, __ATOMIC_SEQ_CST) &&
	    __atomic_exchange_n(&rh->armed, 0, __ATOMIC_SEQ_CST)) {
		if (qp->peer_evfd >= 0 &&
		    !__atomic_load_n(&rh->bell, __ATOMIC_ACQUIRE)) {
			eventfd_write(qp->peer_evfd, 1);
			qp->notifies++;
		} else {
			shm_ring(qp);
		}
	}
}

/* A write's checks before it touches the peer's area (the QP's state, the
 * remote access check of an HCA): 0 with *len the bytes, or -errno. */
static int shm_write_check(struct prov_qp *qp, const struct iovec *iov,
			   int iovcnt, uint64_t roff, uint64_t *len)
{
	int i;

	if (qp->err)
		return qp->err;
	if (!qp->r.base)
		return -ENOTCONN;
	*len = 0;
	for (i = 0; i < iovcnt; i++)
		*len += iov[i].iov_len;
	if (roff > qp->r.area_len || *len > qp->r.area_len - roff)
		return qp->err = -EFAULT;
	return 0;
}

static void shm_copy(struct prov_qp *qp, const struct iovec *iov, int iovcnt,
		     uint64_t roff)
{
	uint8_t *dst = qp->r.area + roff;
	int i;

	for (i = 0; i < iovcnt; i++) {
		memcpy(dst, iov[i].iov_base, iov[i].iov_len);
		dst += iov[i].iov_len;
	}
}

static int shm_post_write_plain(struct prov_qp *qp, const struct iovec *iov,
				int iovcnt, uint64_t roff, uint64_t written)
{
	uint64_t len;
	int rc = shm_write_check(qp, iov, iovcnt, roff, &len);

	if (rc)
		return rc;
	shm_copy(qp, iov, iovcnt, roff);
	__atomic_store_n(&qp->r.hdr->written, written, __ATOMIC_SEQ_CST);
	shm_wake_peer(qp);
	return 0;
}

static uint64_t shm_peer_written(struct prov_qp *qp)
{
	qp->written_seen = __atomic_load_n(&qp->l.hdr->written, __ATOMIC_ACQUIRE);
	return qp->written_seen;
}

static int shm_post_write_imm(struct prov_qp *qp, const struct iovec *iov,
			      int iovcnt, uint64_t roff, uint32_t imm,
			      int flags, uint64_t wr_id)
{
	struct shm_hdr *rh = qp->r.hdr;
	uint32_t posted, cons;
	uint64_t len;
	int rc;

	if (!qp->err && qp->r.base && flags & PROV_SIGNALED &&
	    qp->scq_n >= SCQ_MAX)
		return -ENOSPC; /* send CQ overrun: caller must reap */
	if ((rc = shm_write_check(qp, iov, iovcnt, roff, &len)))
		return rc;
	/* a posted receive must be there (no RNR retry: credits forbid it) */
	posted = __atomic_load_n(&rh->rq_prod, __ATOMIC_ACQUIRE);
	if (posted - qp->peer_rq_cons == 0 ||
	    posted - qp->peer_rq_cons > qp->r.qdepth)
		return qp->err = -EPROTO;
	cons = __atomic_load_n(&rh->cq_cons, __ATOMIC_ACQUIRE);
	if (qp->peer_cq_prod - cons >= qp->r.qdepth)
		return qp->err = -EPROTO;

	shm_copy(qp, iov, iovcnt, roff);
	qp->r.cq[qp->peer_cq_prod % qp->r.qdepth] =
		(struct shm_cqe){ .imm = imm, .len = (uint32_t)len };
	qp->peer_rq_cons++;
	qp->peer_cq_prod++;
	__atomic_store_n(&rh->cq_prod, qp->peer_cq_prod, __ATOMIC_SEQ_CST);
	shm_wake_peer(qp);
	if (flags & PROV_SIGNALED)
		qp->scq[qp->scq_n++] = (struct prov_wc){ .wr_id = wr_id };
	return 0;
}

static int shm_poll_cq(struct prov_qp *qp, struct prov_wc *wc, int n)
{
	struct shm_cqe cqe;
	uint32_t prod;
	int got = 0;

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

static int shm_cq_pending(struct prov_qp *qp)
{
	return qp->scq_n ||
	       __atomic_load_n(&qp->l.hdr->cq_prod, __ATOMIC_ACQUIRE) !=
		       qp->cq_cons ||
	       __atomic_load_n(&qp->l.hdr->written, __ATOMIC_ACQUIRE) !=
		       qp->written_seen;
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

/* Eventfd mode: our notify eventfd was made by the peer (or handed to
 * it), which shares its file flags: it could turn O_NONBLOCK off and drain
 * the count under us.  RWF_NOWAIT makes this read non-blocking whatever
 * the flags say (Linux 5.12 and later; before, the O_NONBLOCK evfd_checked
 * set).  Bell mode: the peer's bells are the engine's to read (they share
 * the liveness socket with its hang-up); ours is only the kick eventfd. */
static void shm_ack(struct prov_qp *qp)
{
	eventfd_t v;
	struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };

	if (qp->evfd >= 0) {
		if (preadv2(qp->evfd, &iov, 1, -1, RWF_NOWAIT) < 0 &&
		    (errno == EOPNOTSUPP || errno == EINVAL))
			(void)eventfd_read(qp->evfd, &v);
	} else if (qp->kfd >= 0) {
		(void)eventfd_read(qp->kfd, &v);
	}
}

/* The notify fd an event loop watches (RSK_WATCH_NOTIFY): an eventfd of
 * ours, made at the first need (a connection that no loop watches has
 * none), readable only when kicked; the peer's wake-ups come on the
 * liveness socket, which the loop watches too. */
static int shm_notify_fd(struct prov_qp *qp)
{
	if (qp->evfd >= 0)
		return qp->evfd;
	if (qp->kfd < 0) {
		qp->kfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (qp->kfd < 0)
			return -errno;
	}
	return qp->kfd;
}

static void shm_kick(struct prov_qp *qp)
{
	int fd = shm_notify_fd(qp);

	if (fd >= 0)
		(void)eventfd_write(fd, 1);
}

/* A thread that waits polls our eventfd, or in bell mode the liveness
 * socket only (the kick eventfd is an event loop's). */
static int shm_wait_fd(struct prov_qp *qp)
{
	return qp->evfd;
}

/* Publishes how we want to be woken (before we ever arm: the peer reads
 * it after it saw armed set), and keeps the socket to ring a peer that
 * asks for bells.  1: bell mode. */
static int shm_set_bell(struct prov_qp *qp, int fd)
{
	int bells = qp->evfd < 0;

	qp->bell = fd;
	__atomic_store_n(&qp->l.hdr->bell, (uint32_t)bells, __ATOMIC_RELEASE);
	return bells;
}

static uint32_t *shm_owner_word(struct prov_qp *qp)
{
	return &qp->l.hdr->owner_pid;
}

static uint64_t shm_notifies_sent(struct prov_qp *qp)
{
	return qp->notifies;
}

static void arena_release(struct prov_qp *qp);

static void shm_destroy(struct prov_qp *qp)
{
	if (!qp)
		return;
	if (qp->arena)
		arena_release(qp);
	else if (qp->l.base)
		munmap(qp->l.base, qp->l.size);
	if (!qp->arena && qp->r.base)
		munmap(qp->r.base, qp->r.size);
	if (qp->memfd >= 0)
		close(qp->memfd);
	if (qp->kfd >= 0)
		close(qp->kfd);
	if (qp->evfd >= 0) {
		close(qp->evfd);
		__atomic_fetch_sub(&shm_evfd_conns, 1, __ATOMIC_RELAXED);
	}
	if (qp->peer_evfd >= 0)
		close(qp->peer_evfd);
	free(qp->rq_wrid);
	free(qp);
}

static void shm_publish_consumed(struct prov_qp *qp, uint64_t consumed)
{
	__atomic_store_n(&qp->l.hdr->consumed, consumed, __ATOMIC_RELEASE);
}

static int shm_peer_consumed(struct prov_qp *qp, uint64_t *consumed)
{
	if (!qp->r.hdr ||
	    !__atomic_load_n(&qp->r.hdr->owned, __ATOMIC_ACQUIRE))
		return -ENOENT;
	*consumed = __atomic_load_n(&qp->r.hdr->consumed, __ATOMIC_ACQUIRE);
	return 0;
}

static void shm_publish_shut(struct prov_qp *qp)
{
	__atomic_store_n(&qp->l.hdr->shut, 1, __ATOMIC_RELEASE);
}

static int shm_peer_shut(struct prov_qp *qp)
{
	return qp->r.hdr &&
	       __atomic_load_n(&qp->r.hdr->shut, __ATOMIC_ACQUIRE) == 1;
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
	.wait_fd = shm_wait_fd,
	.set_bell = shm_set_bell,
	.owner_word = shm_owner_word,
	.notifies_sent = shm_notifies_sent,
	.publish_consumed = shm_publish_consumed,
	.peer_consumed = shm_peer_consumed,
	.post_write_plain = shm_post_write_plain,
	.peer_written = shm_peer_written,
	.publish_shut = shm_publish_shut,
	.peer_shut = shm_peer_shut,
	.destroy = shm_destroy,
};

/* ------------------------------------------------------------- arenas */

/*
 * An arena holds the halves of the connections between one client process
 * and one server process, so that a new connection maps nothing and
 * creates no segment: the client claims a free slot and sends the arena's
 * memfd (which the server has mapped already, if this is not the pair's
 * first connection: it knows it by inode) with the slot's number in its
 * REQ (PROTOCOL.md, section 6).  The client creates and owns the arena:
 * 0600, sealed against shrinking (it grows, a chunk of ARENA_CHUNK slots
 * at a time, up to ARENA_MAX_SLOTS), its first ARENA_HDR bytes the header
 * below, then the chunks, each slot [client's half][server's half]:
 *
 *   +------------------+  0
 *   | struct arena_hdr |  geometry, then one state word per slot
 *   +------------------+  ARENA_HDR
 *   | chunk 0: slots 0..63, each C | S
 *   | chunk 1: ...     |  (each half laid out as a segment: top of file)
 *
 * Each process maps the header, and each chunk apart when it first needs
 * it, so one arena (one fd kept by the client) serves up to 16,320
 * connections of the pair and growing costs no remap.
 *
 * A slot's state word: bit 0 (ARENA_C) while the client's end holds it,
 * bit 1 (ARENA_S) while the server's end does, bit 2 (ARENA_P) when the
 * client closed before the server took it (its data and FIN wait there for
 * the accept, as TCP's do), bit 3 (ARENA_D) when the server closed first
 * (so that the client's close frees the slot rather than leave it for an
 * accept), a generation above.  The client claims a free
 * slot (no bit set) with a compare-and-swap that bumps the generation; the
 * server takes it only if the word still reads (generation, C or P), so a
 * REQ can never be served on a slot in use again; each end clears its bit
 * when it is destroyed, after its last access.  An end that crossed a
 * fork never clears its bit (another process may still use the
 * connection): the slot is not reused, and an arena left with no free
 * slot is dropped once its connections are gone.
 *
 * The peer is untrusted here as everywhere: the server reads the geometry
 * once (pread, before mapping) and checks everything against that copy
 * and the memfd's size; a client that writes the words or the headers
 * harms only its own connections.  Idle arenas (no connection left in this
 * process) stay for ARENA_IDLE_NS for the next connection and are dropped
 * after, at the next connect or accept of an arena connection, or by
 * shm_arena_trim().  Locking: ar_lock, a leaf (taken under a socket's
 * lock, never the other way), guards both lists and every arena's private
 * fields; slot words are atomics in shared memory.
 */
#define ARENA_MAGIC 0x414e4552414b5352ull /* "RSKARENA" */
#define ARENA_HDR 65536
#define ARENA_CHUNK 64
#define ARENA_MAX_CHUNKS 255
#define ARENA_MAX_SLOTS (ARENA_CHUNK * ARENA_MAX_CHUNKS)
#define ARENA_C 1u
#define ARENA_S 2u
#define ARENA_P 4u /* the client closed before the server took it */
#define ARENA_D 8u /* the server is done with it, the client is not */
#define ARENA_BITS (ARENA_C | ARENA_S | ARENA_P | ARENA_D)
#define ARENA_GEN 16u
#define ARENA_IDLE_NS 2000000000ll
#define ARENA_IDLE_MAX 16 /* idle arenas a server keeps at most */

struct arena_hdr {
	uint64_t magic;
	uint32_t ring_size;
	uint32_t qdepth;
	uint32_t nslots; /* the client's count (the server reads the size) */
	uint32_t pad;
	uint64_t half; /* bytes per half (page multiple) */
	_Alignas(CL) uint32_t word[ARENA_MAX_SLOTS];
};
_Static_assert(sizeof(struct arena_hdr) <= ARENA_HDR, "arena header");

struct shm_arena {
	struct shm_arena *next;
	struct arena_hdr *hdr; /* mapped, ARENA_HDR bytes */
	uint8_t *chunk[ARENA_MAX_CHUNKS]; /* each mapped when first needed */
	uint32_t nchunks; /* the client's: how many it made */
	uint32_t ring_size, qdepth;
	size_t half;
	int fd;        /* the client's: sent with every REQ (server: -1) */
	uint32_t key;  /* the client's: the server's pid */
	uint64_t name; /* the client's: the rendezvous name it last served */
	dev_t dev;     /* the memfd's identity (the client's: what fd must be) */
	ino_t ino;
	int lost;      /* the client's: fd was closed underneath (closerange):
			* no new slot, and the number is not ours to close */
	unsigned refs; /* QPs in this process using it */
	uint32_t next_slot;
	int64_t idle_since;
};

static pthread_mutex_t ar_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shm_arena *ar_client, *ar_server;
static unsigned ar_forks;
static pthread_once_t ar_once = PTHREAD_ONCE_INIT;

static void ar_atfork_parent(void)
{
	ar_forks++;
}

static void ar_atfork_child(void)
{
	pthread_mutex_init(&ar_lock, NULL);
	ar_forks++;
}

static void ar_init(void)
{
	pthread_atfork(NULL, ar_atfork_parent, ar_atfork_child);
}

static int64_t ar_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static size_t ar_half(uint32_t ring_size, uint32_t qdepth)
{
	return (seg_size(ring_size, qdepth) + 4095) & ~(size_t)4095;
}

static size_t ar_chunk_bytes(const struct shm_arena *a)
{
	return (size_t)ARENA_CHUNK * 2 * a->half;
}

static off_t ar_chunk_off(const struct shm_arena *a, uint32_t c)
{
	return (off_t)(ARENA_HDR + (size_t)c * ar_chunk_bytes(a));
}

/* Slot i's client half (its server half follows, a->half further). */
static uint8_t *ar_slot(const struct shm_arena *a, uint32_t i)
{
	return a->chunk[i / ARENA_CHUNK] +
	       (size_t)(i % ARENA_CHUNK) * 2 * a->half;
}

/* Maps chunk c of the arena's memfd (once). */
static int ar_map_chunk(struct shm_arena *a, int fd, uint32_t c)
{
	void *p;

	if (a->chunk[c])
		return 0;
	p = mmap(NULL, ar_chunk_bytes(a), PROT_READ | PROT_WRITE, MAP_SHARED,
		 fd, ar_chunk_off(a, c));
	if (p == MAP_FAILED)
		return -errno;
	a->chunk[c] = p;
	return 0;
}

static void ar_free(struct shm_arena *a)
{
	uint32_t c;

	for (c = 0; c < ARENA_MAX_CHUNKS; c++)
		if (a->chunk[c])
			munmap(a->chunk[c], ar_chunk_bytes(a));
	munmap(a->hdr, ARENA_HDR);
	if (a->fd >= 0 && !a->lost)
		close(a->fd);
	free(a);
}

/* Does the client's arena fd still hold its memfd?  A program that closes
 * fds by number (os.closerange) takes it from under us; the number may
 * be another file by now, which must never be sent, grown or closed. */
static int ar_fd_ours(struct shm_arena *a)
{
	struct stat st;

	if (!a->lost && (fstat(a->fd, &st) < 0 || st.st_dev != a->dev ||
			 st.st_ino != a->ino))
		a->lost = 1;
	return !a->lost;
}

/* Has a client's arena no free slot left (all made, none free)? */
static int ar_full(const struct shm_arena *a)
{
	uint32_t i;

	if (a->nchunks < ARENA_MAX_CHUNKS)
		return 0;
	for (i = 0; i < a->nchunks * ARENA_CHUNK; i++)
		if (!(__atomic_load_n(&a->hdr->word[i], __ATOMIC_RELAXED) &
		      ARENA_BITS))
			return 0;
	return 1;
}

/* Drops the idle arenas of a list (all of them, or those idle too long,
 * or past the count kept, or with no free slot left); ar_lock held.  How
 * many went. */
static int ar_sweep(struct shm_arena **list, int all, int64_t now)
{
	struct shm_arena **pp = list, *a;
	int n = 0, idle = 0;

	while ((a = *pp)) {
		int go = !a->refs &&
			 (all || now - a->idle_since >= ARENA_IDLE_NS ||
			  ++idle > ARENA_IDLE_MAX || a->lost ||
			  (a->fd >= 0 && ar_full(a)));

		if (go) {
			*pp = a->next;
			ar_free(a);
			n++;
		} else {
			pp = &a->next;
		}
	}
	return n;
}

int shm_arena_trim(void)
{
	int n;

	pthread_mutex_lock(&ar_lock);
	n = ar_sweep(&ar_client, 1, 0) + ar_sweep(&ar_server, 1, 0);
	pthread_mutex_unlock(&ar_lock);
	return n;
}

/* A QP's reference to a given back (its idle time starts with the last);
 * ar_lock held. */
static void ar_put(struct shm_arena *a)
{
	if (!--a->refs)
		a->idle_since = ar_now();
}

/* One end of a connection is done with its slot; ar_lock not held. */
static void arena_release(struct prov_qp *qp)
{
	struct shm_arena *a = qp->arena;
	uint32_t *wp = &a->hdr->word[qp->slot], w, nw;

	if (qp->fork_ctr == __atomic_load_n(&ar_forks, __ATOMIC_RELAXED)) {
		w = __atomic_load_n(wp, __ATOMIC_ACQUIRE);
		do {
			if (qp->slot_bit == ARENA_S)
				/* the client's end still holds it: tell it */
				nw = (w & ~ARENA_S) | (w & ARENA_C ? ARENA_D : 0);
			else if (w & (ARENA_S | ARENA_D) || !qp->slot_sent)
				nw = w & ~(ARENA_C | ARENA_D);
			else
				/* our REQ is out and the server has not taken
				 * the slot: it waits for the accept (or the
				 * arena's end) */
				nw = (w & ~ARENA_C) | ARENA_P;
		} while (!__atomic_compare_exchange_n(wp, &w, nw, 0,
						      __ATOMIC_ACQ_REL,
						      __ATOMIC_ACQUIRE));
	}
	pthread_mutex_lock(&ar_lock);
	ar_put(a);
	pthread_mutex_unlock(&ar_lock);
	qp->arena = NULL;
	qp->l.base = qp->r.base = NULL; /* the arena's mapping */
}

static long prov_fd_base(void)
{
	struct rlimit rl;
	long base = PROV_FD_HIGH;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (long)(rl.rlim_cur / 2) < base)
		base = (long)(rl.rlim_cur / 2);
	return base;
}

int prov_fd_high(int fd)
{
	long base;
	int h;

	if (fd < 0)
		return fd;
	base = prov_fd_base();
	if (fd >= base || (h = fcntl(fd, F_DUPFD_CLOEXEC, (int)base)) < 0)
		return fd;
	close(fd);
	return h;
}

/*
 * The process's fd table grows to hold PROV_FD_HIGH's numbers when the
 * library loads (an import, usually before the program's threads): growing
 * it later, once threads share it, waits for an RCU grace period in the
 * kernel (expand_fdtable: ~5 ms here), which a process's first connection
 * then paid, between its connect() and its REQ, on both sides (a listener
 * polled readable had nothing to accept yet: a select() loop's non-blocking
 * accept raised BlockingIOError).  One dup and two closes, once.
 */
__attribute__((constructor)) static void prov_fd_table_early(void)
{
	int fd = eventfd(0, EFD_CLOEXEC), h;

	if (fd < 0)
		return;
	h = fcntl(fd, F_DUPFD_CLOEXEC, (int)prov_fd_base());
	if (h >= 0)
		close(h);
	close(fd);
}

/* A new client arena for key (header only: no chunk yet), on the list;
 * ar_lock held. */
static struct shm_arena *ar_create(uint32_t key, uint32_t ring_size,
				   uint32_t qdepth, int *err)
{
	struct shm_arena *a = calloc(1, sizeof(*a));
	struct stat st;
	void *p;

	*err = -ENOMEM;
	if (!a)
		return NULL;
	a->fd = prov_fd_high(memfd_create("rsock-arena",
					  MFD_CLOEXEC | MFD_ALLOW_SEALING));
	if (a->fd < 0)
		goto fail;
	if (fchmod(a->fd, 0600) < 0 || ftruncate(a->fd, ARENA_HDR) < 0 ||
	    fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0 ||
	    fstat(a->fd, &st) < 0)
		goto fail;
	a->dev = st.st_dev;
	a->ino = st.st_ino;
	p = mmap(NULL, ARENA_HDR, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	a->hdr = p;
	a->ring_size = a->hdr->ring_size = ring_size;
	a->qdepth = a->hdr->qdepth = qdepth;
	a->half = ar_half(ring_size, qdepth);
	a->hdr->half = a->half;
	a->hdr->magic = ARENA_MAGIC;
	a->key = key;
	a->next = ar_client;
	ar_client = a;
	return a;
fail:
	*err = -errno;
	if (a->fd >= 0)
		close(a->fd);
	free(a);
	return NULL;
}

/* One more chunk of slots (the file grows; nothing is remapped). */
static int ar_grow(struct shm_arena *a)
{
	uint32_t c = a->nchunks;
	int rc;

	if (c == ARENA_MAX_CHUNKS)
		return -ENOSPC;
	if (ftruncate(a->fd, ar_chunk_off(a, c + 1)) < 0)
		return -errno;
	rc = ar_map_chunk(a, a->fd, c);
	if (rc)
		return rc;
	a->nchunks = c + 1;
	__atomic_store_n(&a->hdr->nslots, a->nchunks * ARENA_CHUNK,
			 __ATOMIC_RELEASE);
	return 0;
}

/* Claims a free slot of a (its number, or -1); ar_lock held. */
static int ar_claim(struct shm_arena *a, uint32_t *gen)
{
	uint32_t i, k, w, n = a->nchunks * ARENA_CHUNK;

	for (k = 0; k < n; k++) {
		i = (a->next_slot + k) % n;
		w = __atomic_load_n(&a->hdr->word[i], __ATOMIC_ACQUIRE);
		if (w & ARENA_BITS)
			continue;
		*gen = (w & ~ARENA_BITS) + ARENA_GEN;
		if (__atomic_compare_exchange_n(&a->hdr->word[i], &w,
						*gen | ARENA_C, 0,
						__ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE)) {
			a->next_slot = i + 1;
			return (int)i;
		}
	}
	return -1;
}

/* A half's header as its creator writes it (a slot used before keeps
 * nothing of it), with every receive posted if posted. */
static void ar_half_init(uint8_t *base, uint32_t ring_size, uint32_t qdepth,
			 int posted)
{
	struct shm_hdr *h = (struct shm_hdr *)base;

	memset(h, 0, sizeof(*h));
	h->magic = SHM_MAGIC;
	h->ring_size = ring_size;
	h->qdepth = qdepth;
	h->rq_prod = posted ? qdepth : 0;
	h->owned = !posted; /* the client's own half; the server's once taken */
}

/* A slot for the client, in an arena of key's (grown, or made, if none
 * has a free slot); with key 0, only in an arena that served the name
 * last (-ENOENT if none has a free slot).  ar_lock held.  Its number, or
 * -errno. */
static int ar_take(uint32_t key, uint64_t name, uint32_t ring_size,
		   uint32_t qdepth, struct shm_arena **out, uint32_t *gen)
{
	struct shm_arena *a, *room = NULL;
	int i, rc;

	for (a = ar_client; a; a = a->next) {
		if ((key ? a->key != key : a->name != name) ||
		    a->ring_size != ring_size || a->qdepth != qdepth ||
		    !ar_fd_ours(a))
			continue;
		if ((i = ar_claim(a, gen)) >= 0)
			goto got;
		if (!room && a->nchunks < ARENA_MAX_CHUNKS)
			room = a;
	}
	if (!key)
		return -ENOENT;
	a = room;
	if (!a && !(a = ar_create(key, ring_size, qdepth, &rc)))
		return rc;
	if ((rc = ar_grow(a)))
		return rc;
	if ((i = ar_claim(a, gen)) < 0)
		return -EAGAIN; /* (another process took the whole chunk) */
got:
	a->refs++;
	a->name = name;
	*out = a;
	return i;
}

int shm_arena_key_ok(struct prov_qp *qp, uint32_t key)
{
	return qp->arena && qp->arena->key == key;
}

int shm_arena_connect(uint32_t key, uint64_t name, uint32_t ring_size,
		      uint32_t qdepth, struct prov_qp **out, int *memfd,
		      uint32_t *slot, uint32_t *gen)
{
	struct prov_qp *qp = NULL;
	struct shm_arena *a = NULL;
	uint8_t *base;
	int i;

	pthread_once(&ar_once, ar_init);
	if (!ring_is_pow2(ring_size) || qdepth == 0)
		return -EINVAL;
	qp = qp_alloc(qdepth);
	if (!qp)
		return -ENOMEM;
	pthread_mutex_lock(&ar_lock);
	ar_sweep(&ar_client, 0, ar_now());
	i = ar_take(key, name, ring_size, qdepth, &a, gen);
	pthread_mutex_unlock(&ar_lock);
	if (i < 0) {
		shm_destroy(qp);
		return i;
	}
	base = ar_slot(a, (uint32_t)i);
	ar_half_init(base, ring_size, qdepth, 0);
	ar_half_init(base + a->half, ring_size, qdepth, 1);
	seg_layout(&qp->l, base, ring_size, qdepth);
	seg_layout(&qp->r, base + a->half, ring_size, qdepth);
	qp->arena = a;
	qp->slot = (uint32_t)i;
	qp->slot_bit = ARENA_C;
	qp->fork_ctr = __atomic_load_n(&ar_forks, __ATOMIC_RELAXED);
	*out = qp;
	*memfd = a->fd;
	*slot = (uint32_t)i;
	return 0;
}

void shm_arena_sent(struct prov_qp *qp)
{
	qp->slot_sent = 1;
}

/* The server's arena for memfd, found by the memfd's inode, or checked
 * and its header mapped (then on the list), with slot's chunk mapped and
 * its refs taken; ar_lock held. */
static int ar_find(int memfd, uint32_t slot, struct shm_arena **out)
{
	struct arena_hdr h;
	struct shm_arena *a;
	struct stat st;
	uint32_t c = slot / ARENA_CHUNK;
	void *p;
	int seals, rc;

	if (slot >= ARENA_MAX_SLOTS || fstat(memfd, &st) < 0 ||
	    !S_ISREG(st.st_mode))
		return -EPROTO;
	for (a = ar_server; a; a = a->next)
		if (a->dev == st.st_dev && a->ino == st.st_ino)
			goto found;
	seals = fcntl(memfd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return -EPROTO;
	if (pread(memfd, &h, offsetof(struct arena_hdr, word), 0) !=
		    (ssize_t)offsetof(struct arena_hdr, word) ||
	    h.magic != ARENA_MAGIC || !ring_is_pow2(h.ring_size) ||
	    h.ring_size < RSK_RING_MIN || h.ring_size > RSK_RING_MAX ||
	    h.qdepth < RSK_QDEPTH_MIN || h.qdepth > RSK_QDEPTH_MAX ||
	    h.half != ar_half(h.ring_size, h.qdepth) ||
	    (uint64_t)st.st_size < ARENA_HDR)
		return -EPROTO;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	p = mmap(NULL, ARENA_HDR, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		free(a);
		return rc;
	}
	a->hdr = p;
	a->ring_size = h.ring_size;
	a->qdepth = h.qdepth;
	a->half = h.half;
	a->fd = -1;
	a->dev = st.st_dev;
	a->ino = st.st_ino;
	a->next = ar_server;
	ar_server = a;
found:
	/* the slot's chunk is in the file (sealed: it stays there) */
	if (!a->chunk[c]) {
		if ((uint64_t)st.st_size < (uint64_t)ar_chunk_off(a, c + 1))
			return -EPROTO;
		if ((rc = ar_map_chunk(a, memfd, c)))
			return rc;
	}
	a->refs++;
	*out = a;
	return 0;
}

int shm_arena_accept(int memfd, uint32_t ring_size, uint32_t qdepth,
		     uint32_t slot, uint32_t gen, struct prov_qp **out)
{
	struct prov_qp *qp = NULL;
	struct shm_arena *a = NULL;
	uint32_t w = gen | ARENA_C;
	uint8_t *base;
	int rc = 0;

	pthread_once(&ar_once, ar_init);
	if (gen & ARENA_BITS)
		rc = -EPROTO;
	if (!rc && !(qp = qp_alloc(qdepth ? qdepth : 1)))
		rc = -ENOMEM;
	if (rc)
		goto out;
	pthread_mutex_lock(&ar_lock);
	ar_sweep(&ar_server, 0, ar_now());
	rc = ar_find(memfd, slot, &a);
	if (!rc && (a->ring_size != ring_size || a->qdepth != qdepth))
		rc = -EPROTO;
	/* the slot is still the one the client claimed for this REQ (held,
	 * or closed since and waiting for us) */
	if (!rc && !__atomic_compare_exchange_n(&a->hdr->word[slot], &w,
						w | ARENA_S, 0,
						__ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE) &&
	    (w != (gen | ARENA_P) ||
	     !__atomic_compare_exchange_n(&a->hdr->word[slot], &w,
					  gen | ARENA_S, 0, __ATOMIC_ACQ_REL,
					  __ATOMIC_ACQUIRE)))
		rc = -ECONNRESET;
	if (rc && a)
		ar_put(a);
	pthread_mutex_unlock(&ar_lock);
	if (rc)
		goto out;
	base = ar_slot(a, slot);
	seg_layout(&qp->r, base, ring_size, qdepth);
	seg_layout(&qp->l, base + a->half, ring_size, qdepth);
	qp->arena = a;
	qp->slot = slot;
	qp->slot_bit = ARENA_S;
	qp->fork_ctr = __atomic_load_n(&ar_forks, __ATOMIC_RELAXED);
	close(memfd);
	memfd = -1;
	if (__atomic_load_n(&qp->l.hdr->magic, __ATOMIC_RELAXED) != SHM_MAGIC ||
	    __atomic_load_n(&qp->r.hdr->magic, __ATOMIC_RELAXED) != SHM_MAGIC) {
		shm_destroy(qp);
		return -EPROTO;
	}
	qp_take_posted(qp, qdepth); /* as shm_qp_adopt */
	*out = qp;
	return 0;
out:
	if (qp)
		shm_destroy(qp);
	close(memfd);
	return rc;
}
