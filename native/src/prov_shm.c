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
 * Fault injection (RSOCK_FAULT) is not here: prov_fault.c wraps this
 * provider's QP when it is set, and nothing does when it is not.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
	qp->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (qp->evfd < 0) {
		rc = -errno;
		goto fail;
	}
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

	rc = evfd_checked(evfd);
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
	int i;

	if (qp->err)
		return qp->err;
	if (!qp->r.base)
		return -ENOTCONN;
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
}

static void shm_kick(struct prov_qp *qp)
{
	(void)eventfd_write(qp->evfd, 1);
}

static int shm_notify_fd(struct prov_qp *qp)
{
	return qp->evfd;
}

static uint32_t *shm_owner_word(struct prov_qp *qp)
{
	return &qp->l.hdr->owner_pid;
}

static uint64_t shm_notifies_sent(struct prov_qp *qp)
{
	return qp->notifies;
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
	free(qp->rq_wrid);
	free(qp);
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
	.destroy = shm_destroy,
};
