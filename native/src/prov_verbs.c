// SPDX-License-Identifier: MIT
/*
 * prov_verbs.c - the provider on real RC queue pairs (libibverbs), and the
 * connection manager for it (librdmacm).
 *
 * Both libraries are loaded at run time (dlopen), so rsock imports and
 * works over shm/TCP on hosts without rdma-core; this file is compiled
 * whenever the rdma-core headers are there (else cm_verbs_* say so).
 *
 * Per connection, in the order the RDMA guides give (and torn down in the
 * reverse order):
 *
 *   event channel + cm_id (rdma_cm: address, route, connect/accept)
 *   PD on the id's device
 *   recv area  (ctrl slots + ring), registered LOCAL_WRITE|REMOTE_WRITE
 *   staging    registered LOCAL_WRITE: sends that are not inline are
 *              copied here first (the engine hands us the caller's buffers)
 *   recv CQ    with a completion channel; send CQ polled only
 *   RC QP      (rdma_create_qp: rdma_cm drives INIT/RTR/RTS)
 *
 * The engine's notify fd is an epoll fd over the completion channel and a
 * kick eventfd (the engine must be able to make its own fd readable).
 * The peer's area address, rkey and geometry come in the CM private data
 * (native/PROTOCOL.md, section 8); every remote offset is checked against
 * it before posting.  Error completions become a connection error; a
 * flushed receive after the peer's orderly close is reported as
 * -ESHUTDOWN so the engine can tell the two apart.
 *
 * Locking: none here; the engine serialises every call on a connection
 * with its socket lock.  Listener calls come under the listener's lock.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

#if defined(__has_include)
#if __has_include(<infiniband/verbs.h>) && __has_include(<rdma/rdma_cma.h>)
#define RSK_HAVE_VERBS 1
#endif
#endif

#ifndef RSK_HAVE_VERBS

static int no_verbs(char *detail, size_t dlen)
{
	snprintf(detail, dlen,
		 "verbs provider: this build has no rdma-core headers "
		 "(install libibverbs-dev and librdmacm-dev and rebuild)");
	return -ENOSYS;
}

int cm_verbs_probe(char *detail, size_t dlen)
{
	return no_verbs(detail, dlen);
}

int cm_verbs_listen(const struct rsk_addr *a, const struct rsk_opts *o,
		    int backlog, struct cmv_listener **out, char *detail,
		    size_t dlen)
{
	(void)a;
	(void)o;
	(void)backlog;
	*out = NULL;
	return no_verbs(detail, dlen);
}

int cm_verbs_listen_fd(struct cmv_listener *l)
{
	(void)l;
	return -EBADF;
}

int cm_verbs_accept(struct cmv_listener *l, struct cm_result *res)
{
	(void)l;
	(void)res;
	return -EAGAIN;
}

void cm_verbs_listen_close(struct cmv_listener *l)
{
	(void)l;
}

int cm_verbs_connect(const struct rsk_opts *o, const struct rsk_addr *src,
		     const struct rsk_addr *dst, int flags, int timeout_ms,
		     struct cm_result *res, char *detail, size_t dlen)
{
	(void)flags;
	(void)o;
	(void)src;
	(void)dst;
	(void)timeout_ms;
	(void)res;
	return no_verbs(detail, dlen);
}

#else /* RSK_HAVE_VERBS */

#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------ run-time loading */

/* The entry points we use that are real symbols (post/poll/notify are
 * inline functions of verbs.h that call through the device's ops). */
static struct {
	int loaded; /* 1 ok, -errno failed */
	char why[160];
	__typeof__(&ibv_alloc_pd) alloc_pd;
	__typeof__(&ibv_dealloc_pd) dealloc_pd;
	__typeof__(&ibv_reg_mr) reg_mr;
	__typeof__(&ibv_dereg_mr) dereg_mr;
	__typeof__(&ibv_create_comp_channel) create_comp_channel;
	__typeof__(&ibv_destroy_comp_channel) destroy_comp_channel;
	__typeof__(&ibv_create_cq) create_cq;
	__typeof__(&ibv_destroy_cq) destroy_cq;
	__typeof__(&ibv_get_cq_event) get_cq_event;
	__typeof__(&ibv_ack_cq_events) ack_cq_events;
	__typeof__(&ibv_get_device_list) get_device_list;
	__typeof__(&ibv_free_device_list) free_device_list;
	__typeof__(&ibv_wc_status_str) wc_status_str;
	__typeof__(&ibv_modify_qp) modify_qp;
	__typeof__(&rdma_create_event_channel) create_event_channel;
	__typeof__(&rdma_destroy_event_channel) destroy_event_channel;
	__typeof__(&rdma_create_id) create_id;
	__typeof__(&rdma_destroy_id) destroy_id;
	__typeof__(&rdma_bind_addr) bind_addr;
	__typeof__(&rdma_listen) listen;
	__typeof__(&rdma_resolve_addr) resolve_addr;
	__typeof__(&rdma_resolve_route) resolve_route;
	__typeof__(&rdma_create_qp) create_qp;
	__typeof__(&rdma_destroy_qp) destroy_qp;
	__typeof__(&rdma_connect) connect;
	__typeof__(&rdma_accept) accept;
	__typeof__(&rdma_reject) reject;
	__typeof__(&rdma_disconnect) disconnect;
	__typeof__(&rdma_get_cm_event) get_cm_event;
	__typeof__(&rdma_ack_cm_event) ack_cm_event;
	__typeof__(&rdma_migrate_id) migrate_id;
	__typeof__(&rdma_event_str) event_str;
} V;

static pthread_once_t v_once = PTHREAD_ONCE_INIT;

static void *v_sym(void *h, const char *name, int *bad)
{
	void *p = h ? dlsym(h, name) : NULL;

	if (!p && !*bad) {
		*bad = 1;
		snprintf(V.why, sizeof(V.why),
			 "verbs provider: rdma-core lacks %s", name);
	}
	return p;
}

#define LOAD(h, field, name) \
	(*(void **)&V.field = v_sym((h), (name), &bad))

static void v_load(void)
{
	void *ib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	void *cm = ib ? dlopen("librdmacm.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
	int bad = 0;

	if (!ib || !cm) {
		snprintf(V.why, sizeof(V.why),
			 "verbs provider: rdma-core is not installed (%s)",
			 dlerror());
		V.loaded = -ENOSYS;
		return;
	}
	LOAD(ib, alloc_pd, "ibv_alloc_pd");
	LOAD(ib, dealloc_pd, "ibv_dealloc_pd");
	LOAD(ib, reg_mr, "ibv_reg_mr");
	LOAD(ib, dereg_mr, "ibv_dereg_mr");
	LOAD(ib, create_comp_channel, "ibv_create_comp_channel");
	LOAD(ib, destroy_comp_channel, "ibv_destroy_comp_channel");
	LOAD(ib, create_cq, "ibv_create_cq");
	LOAD(ib, destroy_cq, "ibv_destroy_cq");
	LOAD(ib, get_cq_event, "ibv_get_cq_event");
	LOAD(ib, ack_cq_events, "ibv_ack_cq_events");
	LOAD(ib, get_device_list, "ibv_get_device_list");
	LOAD(ib, free_device_list, "ibv_free_device_list");
	LOAD(ib, wc_status_str, "ibv_wc_status_str");
	LOAD(ib, modify_qp, "ibv_modify_qp");
	LOAD(cm, create_event_channel, "rdma_create_event_channel");
	LOAD(cm, destroy_event_channel, "rdma_destroy_event_channel");
	LOAD(cm, create_id, "rdma_create_id");
	LOAD(cm, destroy_id, "rdma_destroy_id");
	LOAD(cm, bind_addr, "rdma_bind_addr");
	LOAD(cm, listen, "rdma_listen");
	LOAD(cm, resolve_addr, "rdma_resolve_addr");
	LOAD(cm, resolve_route, "rdma_resolve_route");
	LOAD(cm, create_qp, "rdma_create_qp");
	LOAD(cm, destroy_qp, "rdma_destroy_qp");
	LOAD(cm, connect, "rdma_connect");
	LOAD(cm, accept, "rdma_accept");
	LOAD(cm, reject, "rdma_reject");
	LOAD(cm, disconnect, "rdma_disconnect");
	LOAD(cm, get_cm_event, "rdma_get_cm_event");
	LOAD(cm, ack_cm_event, "rdma_ack_cm_event");
	LOAD(cm, migrate_id, "rdma_migrate_id");
	LOAD(cm, event_str, "rdma_event_str");
	V.loaded = bad ? -ENOSYS : 1;
}

/* 0 when the libraries are there; else -errno with the reason. */
static int v_ready(char *detail, size_t dlen)
{
	pthread_once(&v_once, v_load);
	if (V.loaded > 0)
		return 0;
	snprintf(detail, dlen, "%s", V.why);
	return V.loaded;
}

/* An event channel, or -errno with one sentence saying why not. */
static int v_channel(struct rdma_event_channel **out, char *detail,
		     size_t dlen)
{
	struct rdma_event_channel *ch;
	int fl, e, n = 0;

	*out = NULL;
	if ((e = v_ready(detail, dlen)))
		return e;
	ch = V.create_event_channel();
	if (!ch) {
		struct ibv_device **l;

		e = errno ? errno : ENODEV;
		l = V.get_device_list(&n);
		if (l)
			V.free_device_list(l);
		if (e == ENOENT || e == ENODEV || e == ENXIO || n == 0)
			snprintf(detail, dlen,
				 "verbs provider: no RDMA device on this host "
				 "(%d devices; rdma_cm: %s)", n, strerror(e));
		else
			snprintf(detail, dlen,
				 "verbs provider: cannot open rdma_cm (%s)",
				 strerror(e));
		return e == ENOENT || e == ENXIO ? -ENODEV : -e;
	}
	fl = fcntl(ch->fd, F_GETFL);
	if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    fcntl(ch->fd, F_SETFD, FD_CLOEXEC) < 0) {
		e = errno;
		V.destroy_event_channel(ch);
		snprintf(detail, dlen, "verbs provider: fcntl: %s", strerror(e));
		return -e;
	}
	*out = ch;
	return 0;
}

int cm_verbs_probe(char *detail, size_t dlen)
{
	struct rdma_event_channel *ch;
	struct ibv_device **l;
	int n = 0, rc;

	if ((rc = v_channel(&ch, detail, dlen)))
		return rc;
	V.destroy_event_channel(ch);
	l = V.get_device_list(&n);
	if (l)
		V.free_device_list(l);
	if (n <= 0) {
		snprintf(detail, dlen,
			 "verbs provider: no RDMA device on this host");
		return -ENODEV;
	}
	snprintf(detail, dlen, "%d RDMA device%s", n, n == 1 ? "" : "s");
	return n;
}

/* ----------------------------------------------------- the private data */

#define VD_MAGIC 0x52534b56u   /* "RSKV" */
#define VD_VERSION (0x80 | RSK_PROTO_VERSION) /* rsockets sends 1 */
#define VD_RSOCKETS 1
/* REJ reason "consumer defined" (IB CM): what rdma_reject() sends */
#define V_REJ_CONSUMER 28

/* CM private data of REQ and REP (network byte order). */
struct vconn_data {
	uint8_t version;
	uint8_t flags;    /* REQ: RSK_VF_LOOPBACK4/6 (the client dialed
			   * 127.0.0.1/::1, see rsk_connect_verbs); REP: 0 */
	uint16_t qdepth;  /* receives we posted = the peer's message credits */
	uint32_t ring_size;
	uint64_t addr;    /* our recv area */
	uint32_t rkey;
	uint32_t len;     /* prov_area_len(qdepth, ring_size) */
	uint32_t magic;
	uint32_t reserved; /* 0 */
};
_Static_assert(sizeof(struct vconn_data) == 32, "vconn_data is 32 bytes");

/* ------------------------------------------------------------ the QP */

#define VQ_RECV_BATCH 32
/* staging: at least two of the engine's largest messages */
#define VQ_STAGE_MIN (2 * ENG_MAX_MSG)
#define VQ_STAGE_MAX (16u << 20)

struct prov_qp {
	struct rdma_event_channel *ch; /* this connection's CM events */
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *rcq, *scq;
	struct ibv_mr *amr, *smr;
	/* rsockets peer: the area is the bare ring, and the peer writes its
	 * SGEs into our target SGL (its own registered page) */
	int rs;
	struct rs_sge *tsgl;
	struct ibv_mr *tmr;
	uint64_t rs_sgl_addr; /* the peer's target SGL */
	uint32_t rs_sgl_key, rs_sgl_len;
	uint8_t *area;
	size_t area_len;
	uint8_t *stg; /* staging for sends that are not inline */
	size_t stg_len;
	uint64_t stg_head, stg_tail; /* retired / used (monotonic) */
	uint64_t stg_mark;           /* stg_tail at the last forced signal */
	uint32_t *owner;             /* a shared page (fork) */
	int epfd, kfd;               /* notify fd; kick eventfd */
	int lfd; /* the liveness fd: an epoll of ch->fd (and tfd); the
		  * engine's (it closes it) */
	int tfd; /* timer that makes lfd readable again (vq_hup_fence);
		  * -1 until a hang-up needs one */
	int fenced; /* vq_hup_fence moved the QP to the error state */
	struct prov_qp *next; /* in the reaper's queue (vq_release) */
	int armed, qp_made, connected, peer_gone;
	unsigned unacked; /* CQ events not yet acked */
	uint32_t q, ring; /* our geometry */
	uint32_t max_inline;
	uint32_t sq_max;
	/* send queue: wr_id = post counter; per slot what to do on retire */
	uint64_t posted, retired;
	uint64_t *wr_eng;  /* the engine's wr_id */
	uint64_t *wr_end;  /* stg_tail after this WR */
	uint8_t *wr_sig;   /* the engine asked for a completion */
	uint32_t unsig;    /* WRs since the last signaled one */
	/* the peer's area */
	uint64_t raddr;
	uint32_t rkey;
	uint64_t rlen;
	struct ibv_wc stash[VQ_RECV_BATCH];
	int nstash, istash;
};

static void vq_free_mem(struct prov_qp *q)
{
	if (q->area)
		munmap(q->area, q->area_len);
	if (q->stg)
		munmap(q->stg, q->stg_len);
	if (q->owner)
		munmap(q->owner, 4096);
	if (q->tsgl)
		munmap(q->tsgl, 4096);
	free(q->wr_eng);
	free(q->wr_end);
	free(q->wr_sig);
	if (q->epfd >= 0)
		close(q->epfd);
	if (q->kfd >= 0)
		close(q->kfd);
	if (q->tfd >= 0)
		close(q->tfd);
	free(q);
}

static int64_t v_now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Retire send WRs up to and including wr_id `seq`. */
static void vq_retire(struct prov_qp *q, uint64_t seq)
{
	if (seq < q->retired || seq >= q->posted)
		return;
	q->stg_head = q->wr_end[seq % q->sq_max];
	q->retired = seq + 1;
}

/* Poll the send CQ; engine-visible completions go to wc (up to n). */
static int vq_poll_send(struct prov_qp *q, struct prov_wc *wc, int n,
			int *bad)
{
	struct ibv_wc w[16];
	int got, i, out = 0;

	do {
		got = ibv_poll_cq(q->scq, 16, w);
		if (got < 0) {
			*bad = -EIO;
			return out;
		}
		for (i = 0; i < got; i++) {
			uint64_t seq = w[i].wr_id;
			int mine = seq < q->posted &&
				   q->wr_sig[seq % q->sq_max];

			if (w[i].status != IBV_WC_SUCCESS) {
				*bad = w[i].status == IBV_WC_WR_FLUSH_ERR ?
					       -ESHUTDOWN : -EIO;
				if (!wc || out == n)
					continue;
				wc[out++] = (struct prov_wc){
					.wr_id = 0,
					.status = *bad,
				};
				continue;
			}
			if (mine && wc && out < n)
				wc[out++] = (struct prov_wc){
					.wr_id = q->wr_eng[seq % q->sq_max],
				};
			vq_retire(q, seq);
		}
	} while (got == 16 && (!wc || out < n));
	return out;
}

/* Room for `bytes` of staging and one more WR, waiting (bounded) for
 * our own writes to complete if needed. */
static int vq_room(struct prov_qp *q, size_t bytes)
{
	int64_t until = 0;
	int bad = 0;

	for (;;) {
		if (q->posted - q->retired < q->sq_max - 1 &&
		    q->stg_tail + bytes - q->stg_head <= q->stg_len)
			return 0;
		vq_poll_send(q, NULL, 0, &bad);
		if (bad)
			return bad;
		if (q->posted - q->retired < q->sq_max - 1 &&
		    q->stg_tail + bytes - q->stg_head <= q->stg_len)
			return 0;
		if (!until)
			until = v_now_ms() + 10000;
		else if (v_now_ms() > until)
			return -ETIMEDOUT;
		/* the HCA (in rxe: the kernel) needs the CPU to finish them */
		nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);
	}
}

static int vq_post_recv(struct prov_qp *q, uint64_t wr_id)
{
	struct ibv_recv_wr wr = { .wr_id = wr_id }, *badwr;

	return -ibv_post_recv(q->id->qp, &wr, &badwr);
}

static int vq_post(struct prov_qp *q, const struct iovec *iov, int iovcnt,
		   uint64_t raddr, uint32_t rkey, uint32_t imm, int flags,
		   uint64_t wr_id);

/* rsock's protocol: an offset in the peer's recv area (bounds-checked) */
static int vq_post_write_imm(struct prov_qp *q, const struct iovec *iov,
			     int iovcnt, uint64_t roff, uint32_t imm,
			     int flags, uint64_t wr_id)
{
	size_t len = 0;
	int i;

	for (i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	if (roff > q->rlen || len > q->rlen - roff)
		return -EFAULT;
	return vq_post(q, iov, iovcnt, q->raddr + roff, q->rkey, imm, flags,
		       wr_id);
}

/* rsockets: where the peer's SGE says (its HCA checks the rkey) */
static int vq_post_write_at(struct prov_qp *q, const struct iovec *iov,
			    int iovcnt, uint64_t raddr, uint32_t rkey,
			    uint32_t imm, int flags, uint64_t wr_id)
{
	return vq_post(q, iov, iovcnt, raddr, rkey, imm, flags, wr_id);
}

static int vq_post(struct prov_qp *q, const struct iovec *iov, int iovcnt,
		   uint64_t raddr, uint32_t rkey, uint32_t imm, int flags,
		   uint64_t wr_id)
{
	struct ibv_sge sge[4];
	struct ibv_send_wr wr, *badwr;
	size_t len = 0;
	uint64_t seq = q->posted;
	int i, nsge = 0, rc, sig;

	for (i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	if (len > UINT32_MAX)
		return -EMSGSIZE;
	memset(&wr, 0, sizeof(wr));
	if (len <= q->max_inline && iovcnt <= 4) {
		if ((rc = vq_room(q, 0)))
			return rc;
		for (i = 0; i < iovcnt; i++)
			if (iov[i].iov_len)
				sge[nsge++] = (struct ibv_sge){
					.addr = (uintptr_t)iov[i].iov_base,
					.length = (uint32_t)iov[i].iov_len,
				};
		wr.send_flags = IBV_SEND_INLINE;
	} else {
		size_t pos, first;
		uint8_t *dst;

		if (len > q->stg_len)
			return -EMSGSIZE;
		if ((rc = vq_room(q, len)))
			return rc;
		pos = q->stg_tail % q->stg_len;
		first = len < q->stg_len - pos ? len : q->stg_len - pos;
		dst = q->stg + pos;
		for (i = 0; i < iovcnt; i++) {
			const uint8_t *src = iov[i].iov_base;
			size_t n = iov[i].iov_len;

			while (n) {
				size_t room = (size_t)(q->stg + q->stg_len - dst);
				size_t c = n < room ? n : room;

				memcpy(dst, src, c);
				src += c;
				n -= c;
				dst += c;
				if (dst == q->stg + q->stg_len)
					dst = q->stg;
			}
		}
		sge[nsge++] = (struct ibv_sge){
			.addr = (uintptr_t)(q->stg + pos),
			.length = (uint32_t)first,
			.lkey = q->smr->lkey,
		};
		if (first < len)
			sge[nsge++] = (struct ibv_sge){
				.addr = (uintptr_t)q->stg,
				.length = (uint32_t)(len - first),
				.lkey = q->smr->lkey,
			};
		q->stg_tail += len;
	}
	/* Signal when the engine asks, and on our own when staging or the
	 * send queue fill up (unsignaled WRs are retired by a later
	 * signaled one: RC completes in order). */
	sig = (flags & PROV_SIGNALED) != 0;
	if (++q->unsig >= q->sq_max / 4 ||
	    q->stg_tail - q->stg_mark >= q->stg_len / 4)
		sig = 1;
	wr.wr_id = seq;
	wr.sg_list = nsge ? sge : NULL;
	wr.num_sge = nsge;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htobe32(imm);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (sig) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		q->unsig = 0;
		q->stg_mark = q->stg_tail;
	}
	q->wr_eng[seq % q->sq_max] = wr_id;
	q->wr_end[seq % q->sq_max] = q->stg_tail;
	q->wr_sig[seq % q->sq_max] = (flags & PROV_SIGNALED) != 0;
	rc = ibv_post_send(q->id->qp, &wr, &badwr);
	if (rc)
		return -rc;
	q->posted++;
	return 0;
}

static int vq_wc_status(const struct ibv_wc *w)
{
	if (w->status == IBV_WC_SUCCESS)
		return 0;
	return w->status == IBV_WC_WR_FLUSH_ERR ? -ESHUTDOWN : -EIO;
}

static int vq_poll_cq(struct prov_qp *q, struct prov_wc *wc, int n)
{
	int out, bad = 0;

	out = vq_poll_send(q, wc, n, &bad);
	while (out < n) {
		struct ibv_wc *w;

		if (q->istash == q->nstash) {
			int got = ibv_poll_cq(q->rcq, VQ_RECV_BATCH, q->stash);

			q->istash = 0;
			q->nstash = got > 0 ? got : 0;
			if (got < 0) {
				wc[out++] = (struct prov_wc){ .status = -EIO,
							      .is_recv = 1 };
				break;
			}
			if (!got)
				break;
		}
		w = &q->stash[q->istash++];
		wc[out] = (struct prov_wc){
			.wr_id = w->wr_id,
			.byte_len = w->byte_len,
			.status = vq_wc_status(w),
			.is_recv = 1,
		};
		/* a write without immediate (or a send) is not our protocol:
		 * an opcode the engine refuses */
		wc[out].imm = (w->status == IBV_WC_SUCCESS &&
			       (w->wc_flags & IBV_WC_WITH_IMM)) ?
				      be32toh(w->imm_data) :
				      0xffffffffu;
		out++;
	}
	return out;
}

static int vq_cq_pending(struct prov_qp *q)
{
	int got;

	if (q->istash < q->nstash)
		return 1;
	got = ibv_poll_cq(q->rcq, VQ_RECV_BATCH, q->stash);
	q->istash = 0;
	q->nstash = got > 0 ? got : 0;
	return got != 0;
}

static void vq_arm(struct prov_qp *q)
{
	if (!q->armed && ibv_req_notify_cq(q->rcq, 0) == 0)
		q->armed = 1;
}

static void vq_disarm(struct prov_qp *q)
{
	(void)q; /* a CQ request cannot be withdrawn; it stays outstanding */
}

static int vq_armed(struct prov_qp *q)
{
	return q->armed;
}

static void vq_ack(struct prov_qp *q)
{
	struct ibv_cq *cq;
	void *ctx;
	uint64_t v;

	while (read(q->kfd, &v, sizeof(v)) > 0)
		;
	while (V.get_cq_event(q->cc, &cq, &ctx) == 0) {
		q->armed = 0;
		if (++q->unacked >= 64) {
			V.ack_cq_events(q->rcq, q->unacked);
			q->unacked = 0;
		}
	}
}

static void vq_kick(struct prov_qp *q)
{
	uint64_t one = 1;

	if (write(q->kfd, &one, sizeof(one)) < 0) {
		/* the counter is saturated: it is readable anyway */
	}
}

static int vq_notify_fd(struct prov_qp *q)
{
	return q->epfd;
}

static uint32_t *vq_owner_word(struct prov_qp *q)
{
	return q->owner;
}

static uint64_t vq_notifies_sent(struct prov_qp *q)
{
	(void)q;
	return 0;
}

/* The CM channel of the connection fired: 1 when the peer is gone. */
static int vq_completions_lag(struct prov_qp *q)
{
	(void)q;
	return 1;
}

static int vq_live_event(struct prov_qp *q)
{
	struct rdma_cm_event *ev;
	uint64_t x;

	if (q->tfd >= 0 && read(q->tfd, &x, sizeof(x)) < 0)
		x = 0; /* not expired (EAGAIN): nothing to consume */

	while (V.get_cm_event(q->ch, &ev) == 0) {
		enum rdma_cm_event_type t = ev->event;

		V.ack_cm_event(ev);
		if (t == RDMA_CM_EVENT_DISCONNECTED ||
		    t == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		    t == RDMA_CM_EVENT_TIMEWAIT_EXIT ||
		    t == RDMA_CM_EVENT_CONNECT_ERROR ||
		    t == RDMA_CM_EVENT_UNREACHABLE)
			q->peer_gone = 1;
	}
	return q->peer_gone;
}

/* The peer is gone with no FIN seen (prov_ops.hup_fence).  A FIN that the
 * peer's HCA had sent can still be on its way to our CQ (the hang-up came
 * by another path, the CM's), so the end of the stream is fenced as
 * ib_drain_qp does: our QP goes to the error state, which flushes our
 * posted receives after every receive that completed before, and the
 * engine reads a flushed receive as the end.  A timerfd in the liveness
 * fd's epoll bounds the wait should no flush show. */
static int vq_hup_fence(struct prov_qp *q, int64_t ns)
{
	struct itimerspec t = { .it_value = { .tv_sec = ns / 1000000000,
					      .tv_nsec = ns % 1000000000 } };

	if (q->lfd < 0)
		return -EBADF;
	if (q->qp_made && !q->fenced) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		if (V.modify_qp(q->id->qp, &a, IBV_QP_STATE) == 0)
			q->fenced = 1;
	}
	if (q->tfd < 0) {
		struct epoll_event ev = { .events = EPOLLIN };
		int fd = timerfd_create(CLOCK_MONOTONIC,
					TFD_CLOEXEC | TFD_NONBLOCK);

		if (fd < 0)
			return -errno;
		if (epoll_ctl(q->lfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			int e = errno;

			close(fd);
			return -e;
		}
		q->tfd = fd;
	}
	if (!t.it_value.tv_sec && !t.it_value.tv_nsec)
		t.it_value.tv_nsec = 1; /* zero would disarm it */
	return timerfd_settime(q->tfd, 0, &t, NULL) < 0 ? -errno : 0;
}

/* Make sure what we posted has left (a final signaled zero-length RDMA
 * WRITE completes after every earlier WR), bounded by one second. */
static void vq_drain(struct prov_qp *q)
{
	struct ibv_send_wr wr, *badwr;
	int64_t until = v_now_ms() + 1000;
	uint64_t seq = q->posted;
	int bad = 0;

	/* a peer whose hang-up is already in our CM channel (nobody looked:
	 * an idle connection) will never complete the marker: no wait */
	if (q->connected && !q->peer_gone && q->ch)
		vq_live_event(q);
	if (!q->connected || q->peer_gone || q->retired == q->posted ||
	    q->posted - q->retired >= q->sq_max)
		return;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = seq;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = q->raddr;
	wr.wr.rdma.rkey = q->rkey;
	q->wr_sig[seq % q->sq_max] = 0;
	q->wr_end[seq % q->sq_max] = q->stg_tail;
	if (ibv_post_send(q->id->qp, &wr, &badwr))
		return;
	q->posted++;
	while (q->retired != q->posted && !bad && v_now_ms() < until) {
		vq_poll_send(q, NULL, 0, &bad);
		if (q->retired != q->posted) {
			if (vq_live_event(q))
				break; /* the peer went meanwhile */
			nanosleep(&(struct timespec){ .tv_nsec = 50000 }, NULL);
		}
	}
}

static void vq_destroy(struct prov_qp *q)
{
	if (!q)
		return;
	if (q->qp_made) {
		vq_drain(q);
		if (q->connected)
			V.disconnect(q->id);
		V.destroy_qp(q->id);
	}
	if (q->rcq && q->unacked)
		V.ack_cq_events(q->rcq, q->unacked);
	if (q->rcq)
		V.destroy_cq(q->rcq);
	if (q->scq)
		V.destroy_cq(q->scq);
	if (q->cc)
		V.destroy_comp_channel(q->cc);
	if (q->amr)
		V.dereg_mr(q->amr);
	if (q->smr)
		V.dereg_mr(q->smr);
	if (q->tmr)
		V.dereg_mr(q->tmr);
	if (q->pd)
		V.dealloc_pd(q->pd);
	if (q->id) {
		struct rdma_cm_event *ev;

		if (q->ch) /* events not yet read must be acked first */
			while (V.get_cm_event(q->ch, &ev) == 0)
				V.ack_cm_event(ev);
		V.destroy_id(q->id);
	}
	if (q->ch)
		V.destroy_event_channel(q->ch);
	vq_free_mem(q);
}

/* The reaper: tearing a connection's verbs objects down takes several
 * kernel (and, on an HCA, firmware) commands per connection, which a
 * close() or an event loop that ends many connections at once (a peer
 * died) should not wait for; what must happen before close() returns
 * (our last writes leaving, vq_drain) stays on the caller.  One thread per
 * process, started with the first release; a fork child forgets the
 * parent's queue (the parent's reaper empties it) and starts its own.
 *
 * Lock order: vr.lock is a leaf (taken under a socket's lock, never the
 * other way round). */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct prov_qp *head;
	pid_t pid; /* the process whose reaper runs; 0: none */
} vr = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0 };

static void vr_atfork(void);

static void *vr_main(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		struct prov_qp *q;

		pthread_mutex_lock(&vr.lock);
		while (!vr.head)
			pthread_cond_wait(&vr.cond, &vr.lock);
		q = vr.head;
		vr.head = q->next;
		pthread_mutex_unlock(&vr.lock);
		vq_destroy(q);
	}
	return NULL;
}

static void vr_prepare(void)
{
	pthread_mutex_lock(&vr.lock);
}

static void vr_parent(void)
{
	pthread_mutex_unlock(&vr.lock);
}

static void vr_child(void)
{
	pthread_mutex_init(&vr.lock, NULL);
	pthread_cond_init(&vr.cond, NULL);
	vr.head = NULL;
	vr.pid = 0;
}

static void vr_atfork(void)
{
	pthread_atfork(vr_prepare, vr_parent, vr_child);
}

/* Start this process's reaper (vr.lock held); 0 or -errno. */
static int vr_start(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_attr_t a;
	pthread_t t;
	sigset_t all, old;
	int rc;

	pthread_once(&once, vr_atfork);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 * 1024);
	sigfillset(&all); /* no signal may land on it before it blocks them */
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = pthread_create(&t, &a, vr_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&a);
	if (rc)
		return -rc;
	pthread_setname_np(t, "rsock-reap");
	vr.pid = getpid();
	return 0;
}

/* prov_ops.destroy: let our last writes leave, then hand the rest to the
 * reaper (or do it here if there can be none). */
static void vq_release(struct prov_qp *q)
{
	if (!q)
		return;
	if (q->qp_made)
		vq_drain(q);
	pthread_mutex_lock(&vr.lock);
	if (vr.pid == getpid() || vr_start() == 0) {
		q->next = vr.head;
		vr.head = q;
		pthread_cond_signal(&vr.cond);
		q = NULL;
	}
	pthread_mutex_unlock(&vr.lock);
	vq_destroy(q);
}

const struct prov_ops verbs_ops = {
	.name = "verbs",
	.post_recv = vq_post_recv,
	.post_write_imm = vq_post_write_imm,
	.post_write_at = vq_post_write_at,
	.poll_cq = vq_poll_cq,
	.cq_pending = vq_cq_pending,
	.arm = vq_arm,
	.disarm = vq_disarm,
	.armed = vq_armed,
	.ack = vq_ack,
	.kick = vq_kick,
	.notify_fd = vq_notify_fd,
	.owner_word = vq_owner_word,
	.notifies_sent = vq_notifies_sent,
	.live_event = vq_live_event,
	.hup_fence = vq_hup_fence,
	.completions_lag = vq_completions_lag,
	.destroy = vq_release,
};

static void *v_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* Everything of our side on the id's device; the QP is ready for
 * rdma_connect/rdma_accept with every receive posted.  The peer's
 * geometry is needed for the send queue and staging sizes. */
static int vq_create(struct rdma_cm_id *id, const struct rsk_opts *o,
		     uint32_t peer_q, uint32_t peer_ring, int rs,
		     struct prov_qp **out, char *detail, size_t dlen)
{
	struct ibv_qp_init_attr qa;
	struct epoll_event ev = { .events = EPOLLIN };
	struct prov_qp *q;
	uint32_t i;
	int rc, fl;
	const char *what = "";

	*out = NULL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->epfd = q->kfd = q->lfd = q->tfd = -1;
	q->id = id;
	q->q = o->qdepth;
	q->ring = o->ring_size;
	/* a full send queue or staging area only makes a send wait for our
	 * own writes to complete (vq_room), so these are sizes, not limits */
	q->sq_max = 2 * peer_q + 8;
	q->rs = rs;
	q->area_len = rs ? o->ring_size : prov_area_len(o->qdepth, o->ring_size);
	q->stg_len = peer_ring < VQ_STAGE_MIN ? VQ_STAGE_MIN : peer_ring;
	if (q->stg_len > VQ_STAGE_MAX)
		q->stg_len = VQ_STAGE_MAX;
	q->wr_eng = calloc(q->sq_max, sizeof(*q->wr_eng));
	q->wr_end = calloc(q->sq_max, sizeof(*q->wr_end));
	q->wr_sig = calloc(q->sq_max, 1);
	q->area = v_map(q->area_len);
	q->stg = v_map(q->stg_len);
	q->owner = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (q->owner == MAP_FAILED)
		q->owner = NULL;
	q->epfd = epoll_create1(EPOLL_CLOEXEC);
	q->kfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (rs)
		q->tsgl = v_map(4096);
	if ((rs && !q->tsgl) || !q->wr_eng || !q->wr_end || !q->wr_sig || !q->area || !q->stg ||
	    !q->owner || q->epfd < 0 || q->kfd < 0) {
		q->id = NULL;
		vq_free_mem(q);
		return -ENOMEM;
	}
	rc = -EIO;
	if (!(q->pd = V.alloc_pd(id->verbs))) {
		what = "ibv_alloc_pd";
		goto fail;
	}
	q->amr = V.reg_mr(q->pd, q->area, q->area_len,
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	q->smr = q->amr ? V.reg_mr(q->pd, q->stg, q->stg_len,
				   IBV_ACCESS_LOCAL_WRITE) :
			  NULL;
	if (q->amr && q->smr && rs)
		q->tmr = V.reg_mr(q->pd, q->tsgl, 4096,
				  IBV_ACCESS_LOCAL_WRITE |
					  IBV_ACCESS_REMOTE_WRITE);
	if (!q->amr || !q->smr || (rs && !q->tmr)) {
		what = "ibv_reg_mr";
		goto fail;
	}
	if (!(q->cc = V.create_comp_channel(id->verbs))) {
		what = "ibv_create_comp_channel";
		goto fail;
	}
	fl = fcntl(q->cc->fd, F_GETFL);
	if (fl < 0 || fcntl(q->cc->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		what = "fcntl";
		goto fail;
	}
	q->rcq = V.create_cq(id->verbs, (int)q->q + 1, q, q->cc, 0);
	q->scq = q->rcq ? V.create_cq(id->verbs, (int)q->sq_max + 1, q, NULL,
				      0) :
			  NULL;
	if (!q->rcq || !q->scq) {
		what = "ibv_create_cq";
		goto fail;
	}
	memset(&qa, 0, sizeof(qa));
	qa.qp_context = q;
	qa.send_cq = q->scq;
	qa.recv_cq = q->rcq;
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 0;
	qa.cap.max_send_wr = q->sq_max;
	qa.cap.max_recv_wr = q->q;
	qa.cap.max_send_sge = 4;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = o->inline_max;
	if (V.create_qp(id, q->pd, &qa)) {
		/* the device may not do that much inline data */
		qa.cap.max_inline_data = 64;
		if (V.create_qp(id, q->pd, &qa)) {
			what = "rdma_create_qp";
			goto fail;
		}
	}
	q->qp_made = 1;
	q->max_inline = qa.cap.max_inline_data < o->inline_max ?
				qa.cap.max_inline_data :
				o->inline_max;
	for (i = 0; i < q->q; i++)
		if ((rc = vq_post_recv(q, PROV_WRID_RECV | i))) {
			what = "ibv_post_recv";
			errno = -rc;
			goto fail;
		}
	ev.data.fd = q->cc->fd;
	if (epoll_ctl(q->epfd, EPOLL_CTL_ADD, q->cc->fd, &ev) < 0) {
		what = "epoll_ctl";
		goto fail;
	}
	ev.data.fd = q->kfd;
	if (epoll_ctl(q->epfd, EPOLL_CTL_ADD, q->kfd, &ev) < 0) {
		what = "epoll_ctl";
		goto fail;
	}
	*out = q;
	return 0;
fail:
	rc = errno ? -errno : -EIO;
	snprintf(detail, dlen, "verbs provider: %s failed (%s)", what,
		 strerror(-rc));
	q->id = NULL; /* the caller owns the id */
	if (q->qp_made) {
		V.destroy_qp(id);
		q->qp_made = 0;
	}
	vq_destroy(q);
	return rc;
}

static void vd_fill(const struct prov_qp *q, struct vconn_data *d)
{
	memset(d, 0, sizeof(*d));
	d->version = VD_VERSION;
	d->qdepth = htobe16((uint16_t)q->q);
	d->ring_size = htobe32(q->ring);
	d->addr = htobe64((uintptr_t)q->area);
	d->rkey = htobe32(q->amr->rkey);
	d->len = htobe32((uint32_t)q->area_len);
	d->magic = htobe32(VD_MAGIC);
}

/* Checks the peer's private data; fills the host-order copy. */
static int vd_parse(const void *pd, size_t len, struct vconn_data *d,
		    char *detail, size_t dlen)
{
	uint32_t q, ring;

	if (!pd || len < 1) {
		snprintf(detail, dlen, "verbs: the peer sent no connection data");
		return -EPROTO;
	}
	if (((const uint8_t *)pd)[0] == VD_RSOCKETS) {
		snprintf(detail, dlen,
			 "verbs: rsockets connection data (version 1) where "
			 "rsock's was expected");
		return -EPROTONOSUPPORT;
	}
	if (len < sizeof(*d)) {
		snprintf(detail, dlen, "verbs: short connection data (%zu bytes)",
			 len);
		return -EPROTO;
	}
	memcpy(d, pd, sizeof(*d));
	d->qdepth = be16toh(d->qdepth);
	d->ring_size = be32toh(d->ring_size);
	d->addr = be64toh(d->addr);
	d->rkey = be32toh(d->rkey);
	d->len = be32toh(d->len);
	d->magic = be32toh(d->magic);
	q = d->qdepth;
	ring = d->ring_size;
	if (d->magic != VD_MAGIC || d->version != VD_VERSION) {
		snprintf(detail, dlen,
			 "verbs: connection data version %u (magic %#x), "
			 "rsock speaks %u",
			 d->version, d->magic, VD_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (q < RSK_QDEPTH_MIN || q > RSK_QDEPTH_MAX || ring < RSK_RING_MIN ||
	    ring > RSK_RING_MAX || (ring & (ring - 1)) ||
	    d->len != prov_area_len(q, ring)) {
		snprintf(detail, dlen,
			 "verbs: bad geometry from the peer (ring %u, qdepth %u, "
			 "area %u)", ring, q, d->len);
		return -EPROTO;
	}
	return 0;
}

/* librdmacm's struct rs_conn_data (network byte order), 40 bytes */
struct rs_conn {
	uint8_t version; /* 1 */
	uint8_t flags;   /* 1: big-endian host (SGEs in its order); 2: iomap */
	uint16_t credits;
	uint8_t reserved[3];
	uint8_t target_iomap_size;
	struct rs_sge target_sgl; /* addr, key, length = number of entries */
	struct rs_sge data_buf;   /* the first receive buffer */
};
_Static_assert(sizeof(struct rs_conn) == 40, "rs_conn_data is 40 bytes");
#define RS_CONN_FLAG_NET 1

static void rs_fill(const struct prov_qp *q, struct rs_conn *d)
{
	memset(d, 0, sizeof(*d));
	d->version = VD_RSOCKETS;
	d->credits = htobe16((uint16_t)q->q);
	d->target_sgl.addr = htobe64((uintptr_t)q->tsgl);
	d->target_sgl.key = htobe32(q->tmr->rkey);
	d->target_sgl.length = htobe32(2);
	d->data_buf.addr = htobe64((uintptr_t)q->area);
	d->data_buf.key = htobe32(q->amr->rkey);
	d->data_buf.length = htobe32(q->ring >> 1);
}

/* Checks an rsockets peer's connection data; host-order copy in *d. */
static int rs_parse(const void *pd, size_t len, struct rs_conn *d,
		    char *detail, size_t dlen)
{
	if (!pd || len < sizeof(*d)) {
		snprintf(detail, dlen, "verbs: short rsockets connection data "
			 "(%zu bytes)", len);
		return -EPROTO;
	}
	memcpy(d, pd, sizeof(*d));
	d->credits = be16toh(d->credits);
	d->target_sgl.addr = be64toh(d->target_sgl.addr);
	d->target_sgl.key = be32toh(d->target_sgl.key);
	d->target_sgl.length = be32toh(d->target_sgl.length);
	d->data_buf.addr = be64toh(d->data_buf.addr);
	d->data_buf.key = be32toh(d->data_buf.key);
	d->data_buf.length = be32toh(d->data_buf.length);
	if (d->version != VD_RSOCKETS || (d->flags & RS_CONN_FLAG_NET)) {
		snprintf(detail, dlen, "verbs: rsockets peer of version %u "
			 "flags %#x (rsock speaks version 1, little-endian)",
			 d->version, d->flags);
		return -EPROTONOSUPPORT;
	}
	if (d->credits < 1 || d->target_sgl.length < 1 ||
	    d->target_sgl.length > 64 || d->data_buf.length < 1) {
		snprintf(detail, dlen, "verbs: bad rsockets connection data "
			 "(credits %u, %u SGL entries, buffer %u)", d->credits,
			 d->target_sgl.length, d->data_buf.length);
		return -EPROTO;
	}
	return 0;
}

static void rs_set_peer(struct prov_qp *q, const struct rs_conn *d)
{
	q->rs_sgl_addr = d->target_sgl.addr;
	q->rs_sgl_key = d->target_sgl.key;
	q->rs_sgl_len = d->target_sgl.length;
	q->tsgl[0] = d->data_buf; /* where our first data goes */
}

static void vq_set_peer(struct prov_qp *q, const struct vconn_data *d)
{
	q->raddr = d->addr;
	q->rkey = d->rkey;
	q->rlen = d->len;
}

static void v_addr_out(const struct sockaddr *sa, struct rsk_addr *a)
{
	memset(a, 0, sizeof(*a));
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const void *)sa;

		a->family = AF_INET;
		a->port = ntohs(s4->sin_port);
		memcpy(a->addr, &s4->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)sa;

		a->family = AF_INET6;
		a->port = ntohs(s6->sin6_port);
		a->flowinfo = ntohl(s6->sin6_flowinfo);
		a->scope_id = s6->sin6_scope_id;
		memcpy(a->addr, &s6->sin6_addr, 16);
	}
}

static int v_addr_in(const struct rsk_addr *a, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (a->family == AF_INET) {
		struct sockaddr_in *s4 = (void *)ss;

		s4->sin_family = AF_INET;
		s4->sin_port = htons(a->port);
		memcpy(&s4->sin_addr, a->addr, 4);
		return 0;
	}
	if (a->family == AF_INET6) {
		struct sockaddr_in6 *s6 = (void *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(a->port);
		s6->sin6_flowinfo = htonl(a->flowinfo);
		s6->sin6_scope_id = a->scope_id;
		memcpy(&s6->sin6_addr, a->addr, 16);
		return 0;
	}
	return -EAFNOSUPPORT;
}

/* Waits for the next CM event on ch (deadline in ms, -1 forever). */
static int v_wait_event(struct rdma_event_channel *ch, int64_t until,
			struct rdma_cm_event **ev)
{
	for (;;) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		int ms = -1;

		if (V.get_cm_event(ch, ev) == 0)
			return 0;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		if (until >= 0) {
			int64_t left = until - v_now_ms();

			if (left <= 0)
				return -ETIMEDOUT;
			ms = left > 1000000 ? 1000000 : (int)left;
		}
		if (poll(&p, 1, ms) < 0 && errno != EINTR)
			return -errno;
	}
}

static int v_cm_errno(enum rdma_cm_event_type t, int status)
{
	switch (t) {
	case RDMA_CM_EVENT_REJECTED:
		return -ECONNREFUSED;
	case RDMA_CM_EVENT_ADDR_ERROR:
		return status == -ENODEV || status == -EADDRNOTAVAIL ?
			       -ECONNREFUSED :
			       -EHOSTUNREACH;
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		return -EHOSTUNREACH;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return -ECONNREFUSED;
	default:
		return -EPROTO;
	}
}

/* Waits for event `want` on the connecting id; -errno otherwise.  On
 * ESTABLISHED the peer's private data is parsed into *d. */
/* The private data of the event awaited (at most this much is kept). */
struct v_pd {
	uint8_t b[64];
	size_t len;
	int other_stack; /* REJECTED by a consumer that is not rsock */
};

static int v_expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		    int64_t until, struct v_pd *pd, char *detail, size_t dlen)
{
	struct rdma_cm_event *ev;
	int rc = v_wait_event(ch, until, &ev);
	size_t n;

	if (rc) {
		snprintf(detail, dlen, "verbs: waiting for %s: %s",
			 V.event_str(want), strerror(-rc));
		return rc;
	}
	n = ev->param.conn.private_data ? ev->param.conn.private_data_len : 0;
	if (ev->event != want) {
		const uint8_t *b = ev->param.conn.private_data;

		rc = v_cm_errno(ev->event, ev->status);
		snprintf(detail, dlen, "verbs: %s (status %d) while waiting "
			 "for %s", V.event_str(ev->event), ev->status,
			 V.event_str(want));
		if (ev->event == RDMA_CM_EVENT_REJECTED && n >= 1 &&
		    b[0] == VD_VERSION)
			snprintf(detail, dlen, "verbs: the rsock listener "
				 "refused the connection");
		else if (pd && ev->event == RDMA_CM_EVENT_REJECTED &&
			 ev->status == V_REJ_CONSUMER)
			pd->other_stack = 1; /* e.g. rsockets: version 1 only */
		V.ack_cm_event(ev);
		return rc;
	}
	if (pd) {
		pd->len = n < sizeof(pd->b) ? n : sizeof(pd->b);
		if (pd->len)
			memcpy(pd->b, ev->param.conn.private_data, pd->len);
	}
	V.ack_cm_event(ev);
	return rc;
}

static void v_result(struct prov_qp *q, struct cm_result *res,
		     uint32_t peer_q, uint32_t peer_ring)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int live = epoll_create1(EPOLL_CLOEXEC);

	if (live >= 0 && epoll_ctl(live, EPOLL_CTL_ADD, q->ch->fd, &ev) < 0) {
		close(live);
		live = -1;
	}
	q->lfd = live;

	memset(res, 0, sizeof(*res));
	res->ops = &verbs_ops;
	res->qp = q;
	res->area = q->area;
	res->live_fd = live;
	res->ring = q->ring;
	res->q = q->q;
	res->peer_ring = peer_ring;
	res->peer_q = peer_q;
	/* (as cm_local's accept fills them: src = the peer, dst = ours) */
	v_addr_out(&q->id->route.addr.src_addr, &res->dst);
	v_addr_out(&q->id->route.addr.dst_addr, &res->src);
	if (q->rs) {
		res->rs = 1;
		res->rs_tsgl = q->tsgl;
		res->rs_rbuf_addr = (uintptr_t)q->area;
		res->rs_rbuf_key = q->amr->rkey;
		res->rs_sgl_addr = q->rs_sgl_addr;
		res->rs_sgl_key = q->rs_sgl_key;
		res->rs_sgl_len = q->rs_sgl_len;
	}
}

/* One connection attempt, speaking rsock's protocol or (rs) rsockets'. */
static int v_connect(const struct rsk_opts *o, const struct rsk_addr *src,
		     const struct rsk_addr *dst, int flags, int64_t until,
		     int rs, struct cm_result *res, int *other_stack,
		     char *detail, size_t dlen)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id = NULL;
	struct sockaddr_storage ss, sd;
	struct rdma_conn_param cp;
	struct vconn_data mine, peer;
	struct rs_conn rmine, rpeer;
	struct v_pd pd = { .len = 0 };
	struct prov_qp *q = NULL;
	int64_t left = until < 0 ? 2000 : until - v_now_ms();
	int step = left > 2000 ? 2000 : left < 1 ? 1 : (int)left;
	int rc;

	if ((rc = v_addr_in(dst, &sd)))
		return rc;
	if (src && (rc = v_addr_in(src, &ss)))
		return rc;
	if ((rc = v_channel(&ch, detail, dlen)))
		return rc;
	if (V.create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		rc = -errno;
		snprintf(detail, dlen, "verbs: rdma_create_id: %s",
			 strerror(errno));
		goto fail;
	}
	if (V.resolve_addr(id, src ? (struct sockaddr *)&ss : NULL,
			   (struct sockaddr *)&sd, step)) {
		rc = -errno;
		snprintf(detail, dlen, "verbs: rdma_resolve_addr: %s",
			 strerror(errno));
		goto fail;
	}
	rc = v_expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, until, NULL, detail,
		      dlen);
	if (rc)
		goto fail;
	if (V.resolve_route(id, step)) {
		rc = -errno;
		snprintf(detail, dlen, "verbs: rdma_resolve_route: %s",
			 strerror(errno));
		goto fail;
	}
	rc = v_expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, until, NULL, detail,
		      dlen);
	if (rc)
		goto fail;
	/* the peer's geometry is not known yet: size the send side by ours */
	rc = vq_create(id, o, o->qdepth, o->ring_size, rs, &q, detail, dlen);
	if (rc)
		goto fail;
	q->ch = ch;
	memset(&cp, 0, sizeof(cp));
	if (rs) {
		rs_fill(q, &rmine);
		cp.private_data = &rmine;
		cp.private_data_len = sizeof(rmine);
	} else {
		vd_fill(q, &mine);
		mine.flags = (uint8_t)(flags &
				       (RSK_VF_LOOPBACK4 | RSK_VF_LOOPBACK6));
		cp.private_data = &mine;
		cp.private_data_len = sizeof(mine);
	}
	cp.flow_control = 1;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (V.connect(id, &cp)) {
		rc = -errno;
		snprintf(detail, dlen, "verbs: rdma_connect: %s",
			 strerror(errno));
		goto fail;
	}
	rc = v_expect(ch, RDMA_CM_EVENT_ESTABLISHED, until, &pd, detail,
		      dlen);
	*other_stack = pd.other_stack;
	if (rc)
		goto fail;
	q->connected = 1;
	if (rs) {
		if ((rc = rs_parse(pd.b, pd.len, &rpeer, detail, dlen)))
			goto fail;
		rs_set_peer(q, &rpeer);
		v_result(q, res, rpeer.credits, rpeer.data_buf.length);
	} else {
		if ((rc = vd_parse(pd.len ? pd.b : NULL, pd.len, &peer, detail,
				   dlen)))
			goto fail;
		vq_set_peer(q, &peer);
		v_result(q, res, peer.qdepth, peer.ring_size);
	}
	if (res->live_fd < 0) {
		rc = -errno;
		goto fail;
	}
	return 0;
fail:
	if (q) {
		vq_destroy(q); /* owns id and ch now */
	} else {
		if (id)
			V.destroy_id(id);
		V.destroy_event_channel(ch);
	}
	memset(res, 0, sizeof(*res));
	res->live_fd = -1;
	return rc;
}

int cm_verbs_connect(const struct rsk_opts *o, const struct rsk_addr *src,
		     const struct rsk_addr *dst, int flags, int timeout_ms,
		     struct cm_result *res, char *detail, size_t dlen)
{
	int64_t until = timeout_ms < 0 ? -1 : v_now_ms() + timeout_ms;
	int other = 0, rc;

	memset(res, 0, sizeof(*res));
	res->live_fd = -1;
	rc = v_connect(o, src, dst, flags, until, 0, res, &other, detail, dlen);
	if (rc == -ECONNREFUSED && other) {
		/* refused by a listener that is not rsock: librdmacm's
		 * rsockets accepts only its own connection data; speak it */
		rc = v_connect(o, src, dst, flags, until, 1, res, &other,
			       detail, dlen);
	}
	return rc;
}

/* --------------------------------------------------------------- listen */

/*
 * A listener runs a service thread (as rsockets does): connection requests
 * are accepted at the CM level as they come, up to the backlog, the way a
 * kernel TCP listener completes handshakes before accept().  So connect()
 * does not wait for the server's accept(), and accept() hands out only
 * established connections, each already moved to its own event channel
 * (its liveness fd shows nothing but the peer's departure).
 *
 * Locking: `mu` protects the ready queue and `npend`; the engine calls
 * cm_verbs_accept under its socket lock (order: socket lock -> mu).  The
 * thread owns the listening id, its channel and the pending list.
 */
struct vpend {
	struct prov_qp *q;
	uint32_t peer_q, peer_ring;
	int flags; /* the client's RSK_VF_* */
	int64_t until; /* ms: drop if not established by then */
};

struct cmv_listener {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct rsk_opts o;
	int backlog;
	int stop_fd;  /* eventfd: stop the thread */
	int ready_fd; /* eventfd (semaphore): readable while a connection waits */
	pthread_t thread;
	int started;
	pthread_mutex_t mu;
	struct cm_result *ready; /* [backlog], a ring */
	int r_head, r_count;
	struct vpend *pend; /* [backlog] */
	int npend;
};

#define VL_ESTABLISH_MS 10000
#define VL_MIN_BACKLOG 64

static void vl_drop_pend(struct cmv_listener *l, int i)
{
	vq_destroy(l->pend[i].q);
	l->pend[i] = l->pend[--l->npend];
}

static int vl_find(struct cmv_listener *l, struct rdma_cm_id *id)
{
	int i;

	for (i = 0; i < l->npend; i++)
		if (l->pend[i].q->id == id)
			return i;
	return -1;
}

static void vl_request(struct cmv_listener *l, struct rdma_cm_event *ev)
{
	struct rdma_cm_id *id = ev->id;
	struct rdma_conn_param cp;
	struct vconn_data peer, mine;
	struct rs_conn rpeer, rmine;
	struct prov_qp *q = NULL;
	struct rsk_opts o;
	char why[160];
	uint8_t refuse = VD_VERSION;
	const uint8_t *pd = ev->param.conn.private_data;
	size_t pdlen = pd ? ev->param.conn.private_data_len : 0;
	int rc, full, rs = pdlen >= 1 && pd[0] == VD_RSOCKETS;
	uint32_t peer_q = 0, peer_ring = 0;

	pthread_mutex_lock(&l->mu);
	full = l->r_count + l->npend >= l->backlog;
	pthread_mutex_unlock(&l->mu);
	if (full)
		rc = -ECONNREFUSED;
	else if (rs)
		rc = rs_parse(pd, pdlen, &rpeer, why, sizeof(why));
	else
		rc = vd_parse(pd, pdlen, &peer, why, sizeof(why));
	V.ack_cm_event(ev);
	o = l->o;
	if (!rc && rs) {
		/* an rsockets client: our ring is the listener's */
		peer_q = rpeer.credits;
		peer_ring = rpeer.data_buf.length;
		rc = vq_create(id, &o, o.qdepth, o.ring_size, 1, &q, why,
			       sizeof(why));
	} else if (!rc) {
		/* as with cm_local, the client decides the geometry of both
		 * sides; inline size and spin time are the listener's */
		o.ring_size = peer.ring_size;
		o.qdepth = peer.qdepth;
		peer_q = peer.qdepth;
		peer_ring = peer.ring_size;
		rc = vq_create(id, &o, peer.qdepth, peer.ring_size, 0, &q, why,
			       sizeof(why));
	}
	if (rc) {
		V.reject(id, &refuse, sizeof(refuse));
		V.destroy_id(id);
		return;
	}
	memset(&cp, 0, sizeof(cp));
	if (rs) {
		rs_set_peer(q, &rpeer);
		rs_fill(q, &rmine);
		cp.private_data = &rmine;
		cp.private_data_len = sizeof(rmine);
	} else {
		vq_set_peer(q, &peer);
		vd_fill(q, &mine);
		cp.private_data = &mine;
		cp.private_data_len = sizeof(mine);
	}
	cp.flow_control = 1;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (V.accept(id, &cp)) {
		vq_destroy(q);
		return;
	}
	q->connected = 1;
	pthread_mutex_lock(&l->mu);
	l->pend[l->npend++] = (struct vpend){
		.q = q,
		.peer_q = peer_q,
		.peer_ring = peer_ring,
		.flags = rs ? 0 : peer.flags,
		.until = v_now_ms() + VL_ESTABLISH_MS,
	};
	pthread_mutex_unlock(&l->mu);
}

static void vl_established(struct cmv_listener *l, int i)
{
	struct vpend p = l->pend[i];
	struct rdma_event_channel *ch;
	struct cm_result res;
	char why[160];
	uint64_t one = 1;

	pthread_mutex_lock(&l->mu);
	l->pend[i] = l->pend[--l->npend];
	pthread_mutex_unlock(&l->mu);
	if (v_channel(&ch, why, sizeof(why))) {
		vq_destroy(p.q);
		return;
	}
	if (V.migrate_id(p.q->id, ch)) {
		V.destroy_event_channel(ch);
		vq_destroy(p.q);
		return;
	}
	p.q->ch = ch;
	v_result(p.q, &res, p.peer_q, p.peer_ring);
	if (res.live_fd < 0) {
		vq_destroy(p.q);
		return;
	}
	if (p.flags & (RSK_VF_LOOPBACK4 | RSK_VF_LOOPBACK6)) {
		/* show it as the loopback connection it stands for */
		static const uint8_t lo6[16] = { [15] = 1 };
		struct rsk_addr *e[2] = { &res.src, &res.dst };
		int i;

		for (i = 0; i < 2; i++) {
			uint16_t port = e[i]->port;

			memset(e[i], 0, sizeof(*e[i]));
			e[i]->port = port;
			if (p.flags & RSK_VF_LOOPBACK6) {
				e[i]->family = AF_INET6;
				memcpy(e[i]->addr, lo6, 16);
			} else {
				e[i]->family = AF_INET;
				e[i]->addr[0] = 127;
				e[i]->addr[3] = 1;
			}
		}
	}
	pthread_mutex_lock(&l->mu);
	l->ready[(l->r_head + l->r_count++) % l->backlog] = res;
	pthread_mutex_unlock(&l->mu);
	if (write(l->ready_fd, &one, sizeof(one)) < 0) {
		/* cannot overflow: at most backlog */
	}
}

static void *vl_main(void *arg)
{
	struct cmv_listener *l = arg;

	for (;;) {
		struct pollfd p[2] = {
			{ .fd = l->ch->fd, .events = POLLIN },
			{ .fd = l->stop_fd, .events = POLLIN },
		};
		struct rdma_cm_event *ev;
		int64_t now;
		int i;

		if (poll(p, 2, 1000) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		while (V.get_cm_event(l->ch, &ev) == 0) {
			if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
				vl_request(l, ev);
				continue;
			}
			i = ev->id == l->id ? -1 : vl_find(l, ev->id);
			if (i >= 0 && ev->event == RDMA_CM_EVENT_ESTABLISHED) {
				V.ack_cm_event(ev);
				vl_established(l, i);
				continue;
			}
			V.ack_cm_event(ev);
			if (i >= 0) { /* rejected, unreachable, disconnected */
				pthread_mutex_lock(&l->mu);
				vl_drop_pend(l, i);
				pthread_mutex_unlock(&l->mu);
			}
		}
		now = v_now_ms();
		pthread_mutex_lock(&l->mu);
		for (i = 0; i < l->npend;)
			if (now > l->pend[i].until)
				vl_drop_pend(l, i);
			else
				i++;
		pthread_mutex_unlock(&l->mu);
	}
	return NULL;
}

int cm_verbs_listen(const struct rsk_addr *a, const struct rsk_opts *o,
		    int backlog, struct cmv_listener **out, char *detail,
		    size_t dlen)
{
	struct cmv_listener *l;
	struct sockaddr_storage ss;
	int rc;

	*out = NULL;
	if ((rc = v_addr_in(a, &ss)))
		return rc;
	/* A kernel TCP listener keeps SYNs waiting when its backlog is full;
	 * rdma_cm cannot leave a connect half-done for long, so hold at least
	 * VL_MIN_BACKLOG established connections rather than refuse. */
	if (backlog < VL_MIN_BACKLOG)
		backlog = VL_MIN_BACKLOG;
	if (backlog > 4096)
		backlog = 4096;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->o = *o;
	l->backlog = backlog;
	l->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	l->ready_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
	l->ready = calloc((size_t)backlog, sizeof(*l->ready));
	l->pend = calloc((size_t)backlog, sizeof(*l->pend));
	pthread_mutex_init(&l->mu, NULL);
	if (l->stop_fd < 0 || l->ready_fd < 0 || !l->ready || !l->pend) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = v_channel(&l->ch, detail, dlen)))
		goto fail;
	if (V.create_id(l->ch, &l->id, NULL, RDMA_PS_TCP)) {
		rc = -errno;
		goto fail;
	}
	if (V.bind_addr(l->id, (struct sockaddr *)&ss) ||
	    V.listen(l->id, backlog)) {
		rc = -errno;
		snprintf(detail, dlen, "verbs: cannot listen on port %u: %s",
			 a->port, strerror(errno));
		goto fail;
	}
	if ((rc = -pthread_create(&l->thread, NULL, vl_main, l)))
		goto fail;
	l->started = 1;
	*out = l;
	return 0;
fail:
	cm_verbs_listen_close(l);
	return rc;
}

int cm_verbs_listen_fd(struct cmv_listener *l)
{
	return l->ready_fd;
}

void cm_verbs_listen_close(struct cmv_listener *l)
{
	struct rdma_cm_event *ev;
	uint64_t one = 1;

	if (!l)
		return;
	if (l->started) {
		if (write(l->stop_fd, &one, sizeof(one)) < 0) {
			/* cannot fail: the counter is far from full */
		}
		pthread_join(l->thread, NULL);
	}
	while (l->r_count) {
		cm_result_release(&l->ready[l->r_head]);
		l->r_head = (l->r_head + 1) % l->backlog;
		l->r_count--;
	}
	while (l->npend)
		vl_drop_pend(l, 0);
	if (l->ch) {
		/* refuse whoever is still queued */
		while (V.get_cm_event(l->ch, &ev) == 0) {
			if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
				struct rdma_cm_id *id = ev->id;

				V.reject(id, NULL, 0);
				V.ack_cm_event(ev);
				V.destroy_id(id);
				continue;
			}
			V.ack_cm_event(ev);
		}
	}
	if (l->id)
		V.destroy_id(l->id);
	if (l->ch)
		V.destroy_event_channel(l->ch);
	if (l->stop_fd >= 0)
		close(l->stop_fd);
	if (l->ready_fd >= 0)
		close(l->ready_fd);
	pthread_mutex_destroy(&l->mu);
	free(l->ready);
	free(l->pend);
	free(l);
}

/* An established connection off the ready queue (never blocks): 0 with
 * *res, -EAGAIN if none is there. */
int cm_verbs_accept(struct cmv_listener *l, struct cm_result *res)
{
	uint64_t v;
	int rc = -EAGAIN;

	pthread_mutex_lock(&l->mu);
	if (l->r_count) {
		*res = l->ready[l->r_head];
		l->r_head = (l->r_head + 1) % l->backlog;
		l->r_count--;
		if (read(l->ready_fd, &v, sizeof(v)) < 0) {
			/* counted one per queued connection: cannot be empty */
		}
		rc = 0;
	}
	pthread_mutex_unlock(&l->mu);
	return rc;
}

#endif /* RSK_HAVE_VERBS */
