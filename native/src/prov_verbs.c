// SPDX-License-Identifier: MIT
/*
 * prov_verbs.c - the provider on real RC queue pairs (libibverbs); its
 * connection manager (librdmacm) is cm_rdma.c, what both share
 * prov_verbs.h.
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
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

#include "prov_verbs.h"

#ifdef RSK_HAVE_VERBS

/* ------------------------------------------------------ run-time loading */

struct v_table V;

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
int v_ready(char *detail, size_t dlen)
{
	pthread_once(&v_once, v_load);
	if (V.loaded > 0)
		return 0;
	snprintf(detail, dlen, "%s", V.why);
	return V.loaded;
}

/*
 * Does the kernel list an RDMA device (/sys/class/infiniband, where
 * rdma-core finds them too)?  Looked at on every call, before rdma-core is
 * loaded: a host without one never maps libibverbs, librdmacm and the
 * netlink libraries they pull in (about thirty mappings and their
 * relocated pages in every process that listens, which each fork() of it
 * copies), and a device added later is found by the next call.
 */
static int v_devices_listed(void)
{
	DIR *d = opendir("/sys/class/infiniband");
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while (!n && (e = readdir(d)))
		n = e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* An event channel, or -errno with one sentence saying why not. */
int v_channel(struct rdma_event_channel **out, char *detail,
	      size_t dlen)
{
	struct rdma_event_channel *ch;
	int fl, e, n = 0;

	*out = NULL;
	if (!v_devices_listed()) {
		snprintf(detail, dlen,
			 "verbs provider: no RDMA device on this host "
			 "(/sys/class/infiniband lists none)");
		return -ENODEV;
	}
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

/* ------------------------------------------------------------ the QP */


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

int64_t v_now_ms(void)
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

/*
 * Completions were found on an armed CQ: its event has fired (or will), and
 * sits in the completion channel until vq_ack takes it.  Not armed any
 * more, so that the engine acks it when it brings the notify fd up to date
 * (eng_sync_fd); else the channel stays readable and an event loop that
 * watches the notify fd is called again and again with nothing to do.  (A
 * completion that came before the arm fires nothing: the next arm and ack
 * cost a syscall each for nothing, and an event that comes after its ack
 * wakes once in vain.)
 */
static void vq_fired(struct prov_qp *q)
{
	q->armed = 0;
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
			vq_fired(q);
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
	if (got > 0)
		vq_fired(q);
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

void vq_destroy(struct prov_qp *q)
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
int vq_create(struct rdma_cm_id *id, const struct rsk_opts *o,
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

#endif /* RSK_HAVE_VERBS */
