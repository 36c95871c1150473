// SPDX-License-Identifier: MIT
/*
 * cm_rdma.c - the connection manager of the verbs provider (librdmacm):
 * probe, connect (address, route, REQ with our private data, REP), and a
 * listener whose service thread accepts at the CM level so that clients
 * need not wait for accept().  The queue pairs are prov_verbs.c's.  Its
 * interface is cm.h's struct cm_ops (cm_rdma_ops, at the end).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "prov_verbs.h"

#ifndef RSK_HAVE_VERBS

static int no_verbs(char *detail, size_t dlen)
{
	snprintf(detail, dlen,
		 "verbs provider: this build has no rdma-core headers "
		 "(install libibverbs-dev and librdmacm-dev and rebuild)");
	return -ENOSYS;
}

static int cm_verbs_probe(char *detail, size_t dlen)
{
	return no_verbs(detail, dlen);
}

static int cm_verbs_listen(const struct cm_dial *d, const struct rsk_opts *o,
			   int backlog, const struct cm_host *h,
			   struct cm_listener **lp)
{
	(void)d;
	(void)o;
	(void)backlog;
	if (*lp)
		return -EBUSY;
	return no_verbs(h->detail, h->dlen);
}

static int cm_verbs_accept(struct cm_listener *l, const struct cm_host *h,
			   struct cm_result *res)
{
	(void)l;
	(void)h;
	(void)res;
	return -EAGAIN;
}

void cm_verbs_listen_close(struct cm_listener *l)
{
	(void)l;
}

static int cm_verbs_connect(const struct cm_dial *d, const struct rsk_opts *o,
			    struct cm_result *res, char *detail, size_t dlen)
{
	(void)d;
	(void)o;
	(void)res;
	return no_verbs(detail, dlen);
}

#else /* RSK_HAVE_VERBS */

static int cm_verbs_probe(char *detail, size_t dlen)
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

/* A librdmacm call failed: -errno, with one sentence in detail. */
static int v_failed(char *detail, size_t dlen, const char *what)
{
	int e = errno;

	snprintf(detail, dlen, "verbs: %s: %s", what, strerror(e));
	return -e;
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
		rc = v_failed(detail, dlen, "rdma_create_id");
		goto fail;
	}
	if (V.resolve_addr(id, src ? (struct sockaddr *)&ss : NULL,
			   (struct sockaddr *)&sd, step)) {
		rc = v_failed(detail, dlen, "rdma_resolve_addr");
		goto fail;
	}
	rc = v_expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, until, NULL, detail,
		      dlen);
	if (rc)
		goto fail;
	if (V.resolve_route(id, step)) {
		rc = v_failed(detail, dlen, "rdma_resolve_route");
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
		rc = v_failed(detail, dlen, "rdma_connect");
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

static int cm_verbs_connect(const struct cm_dial *d, const struct rsk_opts *o,
			    struct cm_result *res, char *detail, size_t dlen)
{
	int64_t until = d->timeout_ms < 0 ? -1 : v_now_ms() + d->timeout_ms;
	int other = 0, rc;

	memset(res, 0, sizeof(*res));
	res->live_fd = -1;
	rc = v_connect(o, d->src, d->dst, d->flags, until, 0, res, &other,
		       detail, dlen);
	if (rc == -ECONNREFUSED && other) {
		/* refused by a listener that is not rsock: librdmacm's
		 * rsockets accepts only its own connection data; speak it */
		rc = v_connect(o, d->src, d->dst, d->flags, until, 1, res,
			       &other, detail, dlen);
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

struct cm_listener {
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

static void vl_drop_pend(struct cm_listener *l, int i)
{
	vq_destroy(l->pend[i].q);
	l->pend[i] = l->pend[--l->npend];
}

static int vl_find(struct cm_listener *l, struct rdma_cm_id *id)
{
	int i;

	for (i = 0; i < l->npend; i++)
		if (l->pend[i].q->id == id)
			return i;
	return -1;
}

static void vl_request(struct cm_listener *l, struct rdma_cm_event *ev)
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

static void vl_established(struct cm_listener *l, int i)
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
	struct cm_listener *l = arg;

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

static int cm_verbs_listen(const struct cm_dial *d, const struct rsk_opts *o,
			   int backlog, const struct cm_host *h,
			   struct cm_listener **lp)
{
	struct epoll_event ev = { .events = EPOLLIN };
	const struct rsk_addr *a = d->dst;
	char *detail = h->detail;
	size_t dlen = h->dlen;
	struct cm_listener *l;
	struct sockaddr_storage ss;
	int rc;

	if (*lp)
		return -EBUSY; /* one per socket */
	detail[0] = 0;
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
	ev.data.fd = l->ready_fd; /* readable while a connection waits */
	if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) < 0) {
		rc = -errno;
		goto fail;
	}
	*lp = l;
	return 0;
fail:
	cm_verbs_listen_close(l);
	return rc;
}

void cm_verbs_listen_close(struct cm_listener *l)
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
static int cm_verbs_accept(struct cm_listener *l, const struct cm_host *h,
			   struct cm_result *res)
{
	uint64_t v;
	int rc = -EAGAIN;

	(void)h; /* (takes first: the engine makes the socket after) */
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

/* No listening fd another process could share, no parked client: the
 * service thread holds them. */
static int cm_verbs_listen_fds(struct cm_listener *l, int *fds, int n)
{
	(void)l;
	(void)fds;
	(void)n;
	return 0;
}

static int64_t cm_verbs_listen_due(const struct cm_listener *l)
{
	(void)l;
	return -1;
}

/* (the ready queue's eventfd does not wake a blocked accept) */
static void cm_verbs_listen_shutdown(struct cm_listener *l)
{
	(void)l;
}

const struct cm_ops cm_rdma_ops = {
	.name = "rdma",
	.by_name = 0,
	.probe = cm_verbs_probe,
	.connect = cm_verbs_connect,
	.listen = cm_verbs_listen,
	.listen_fds = cm_verbs_listen_fds,
	.accept = cm_verbs_accept,
	.listen_due = cm_verbs_listen_due,
	.listen_shutdown = cm_verbs_listen_shutdown,
	.listen_close = cm_verbs_listen_close,
};
