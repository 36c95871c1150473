// SPDX-License-Identifier: MIT
/*
 * cm_local.c - connection manager for peers on the same host.
 *
 * A listener binds a SOCK_SEQPACKET Unix socket in the abstract namespace
 * (so it is scoped like the network namespace and never left behind on
 * disk).  The client connects (which completes as soon as the kernel
 * queues it, as TCP's connect does), checks that the listener runs under
 * its own uid, creates BOTH halves of the connection (its own, and the
 * server's with every receive posted) and sends one REQ carrying their
 * memfds (SCM_RIGHTS; one arena memfd for a slot of an arena).  It can send data at once: it lands in the server's
 * ring like data queued on a TCP connection not yet accepted.  accept()
 * checks the client's uid and the REQ, adopts its half and maps the
 * client's; a refusal is a REJ message followed by hang-up.  The socket
 * stays open for the life of the connection as the liveness channel: when
 * a process dies the kernel closes it and the survivor's pollable fd
 * reports it.  It is also the connection's doorbell: each side wakes the
 * other with a record of one byte there (prov_shm.c), so that a
 * connection holds one fd on each side.  See native/PROTOCOL.md.  Its interface is cm.h's (struct
 * cm_ops: cm_local_ops, at the end); its listener (the rendezvous fds and
 * the clients parked until their REQ) is the last part of this file.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "ring.h"

#define CM_MAGIC 0x434b5352u /* "RSKC" little-endian */
#define CM_REQ 1
#define CM_REJ 3
#define CM_REQ_SLOT 4 /* a slot of an arena (prov_shm.c) */
#define CM_JOIN 5     /* SO_REUSEPORT: hand me your rendezvous socket */
#define CM_JOIN_OK 6  /* ... here it is (one fd) */

struct cm_msg {
	uint32_t magic;
	uint8_t version;
	uint8_t kind;
	uint16_t reason;       /* CM_REJ: errno */
	uint32_t ring_size;    /* the client's half (REQ_SLOT: both) */
	uint32_t qdepth;
	union {
		struct { /* CM_REQ */
			uint32_t srv_ring_size; /* the server's half (created
						 * by the client) */
			uint32_t srv_qdepth;
		};
		struct { /* CM_REQ_SLOT */
			uint32_t slot; /* in the arena */
			uint32_t gen;  /* its state word's generation */
		};
	};
	struct rsk_addr src;
	struct rsk_addr dst;
};
_Static_assert(sizeof(struct cm_msg) == CM_MSG_LEN, "cm_msg is 80 bytes");

#define CM_REQ_FDS 2  /* REQ: the client's memfd, the server's memfd */
#define CM_SLOT_FDS 1 /* REQ_SLOT: the arena's memfd */
#define CM_WAKE_FDS 2 /* then, in eventfd mode: the client's, the server's */
#define CM_MAX_FDS (CM_REQ_FDS + CM_WAKE_FDS)

static int cm_addr(const char *name, size_t namelen, struct sockaddr_un *sa,
		   socklen_t *len)
{
	if (namelen == 0 || namelen > sizeof(sa->sun_path) - 1)
		return -EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path + 1, name, namelen); /* abstract: leading NUL */
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + namelen);
	return 0;
}

/* Does the peer run under our uid?  Its pid in *pid (if pid). */
static int cm_peer_uid_ok(int fd, uint32_t *pid)
{
	struct ucred cr;
	socklen_t l = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) < 0)
		return 0;
	if (pid)
		*pid = (uint32_t)cr.pid;
	return cr.uid == geteuid();
}

/* fd bound to the abstract name: 0 or -errno. */
static int cm_bind_name(int fd, const char *name, size_t namelen)
{
	struct sockaddr_un sa;
	socklen_t len;
	int rc = cm_addr(name, namelen, &sa, &len);

	if (!rc && bind(fd, (struct sockaddr *)&sa, len) < 0)
		rc = -errno;
	return rc;
}

/* A rendezvous socket bound to name (not listening yet): its fd. */
static int cm_bind_fd(const char *name, size_t namelen)
{
	int fd, rc;

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if ((rc = cm_bind_name(fd, name, namelen))) {
		close(fd);
		return rc;
	}
	return fd;
}

/* ... bound and listening. */
static int cm_listen_fd(const char *name, size_t namelen, int backlog)
{
	int fd = cm_bind_fd(name, namelen), rc;

	if (fd < 0)
		return fd;
	if (listen(fd, backlog < 0 ? 0 : backlog) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

/* Is fd a rendezvous socket (as cm_bind_fd makes): 0, or -errno? */
static int cm_is_rendezvous(int fd)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);
	int type = 0;
	socklen_t tl = sizeof(type);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0)
		return -errno;
	if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
		return -errno;
	/* a bound abstract SEQPACKET Unix socket, as cm_bind_fd makes */
	if (sa.sun_family != AF_UNIX || type != SOCK_SEQPACKET ||
	    len <= offsetof(struct sockaddr_un, sun_path) + 1 || sa.sun_path[0] != 0)
		return -EINVAL;
	return 0;
}

static int cm_send(int fd, const struct cm_msg *m, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(CM_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;
	ssize_t n;

	if (nfds) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
	}
	do
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == sizeof(*m) ? 0 : -EPROTO;
}

/*
 * Receives one message and exactly the fds it should carry (CM_REQ_FDS
 * for REQ, CM_SLOT_FDS for REQ_SLOT, each with CM_WAKE_FDS more in
 * eventfd mode, 0 for REJ; *nfds says how many), waiting up to timeout_ms.  Anything else is closed and
 * rejected: the peer is untrusted.
 */
static int cm_recv(int fd, struct cm_msg *m, int fds[CM_MAX_FDS],
		   int *nfds, int timeout_ms, int peek)
{
	union {
		char buf[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	int64_t deadline = eng_deadline(timeout_ms);
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	struct cmsghdr *c;
	int got[8], ngot = 0, i, rc, want;
	ssize_t n;

	for (i = 0; i < CM_MAX_FDS; i++)
		fds[i] = -1;
	*nfds = 0;
	/* (no wait: recvmsg says at once whether a message is there) */
	while (timeout_ms) {
		rc = poll(&pfd, 1, eng_ms_left(deadline));
		if (rc > 0)
			break;
		if (rc == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
	mh.msg_control = u.buf;
	mh.msg_controllen = sizeof(u.buf);
	do
		n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC |
					     (peek ? MSG_PEEK : 0));
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN ? -ETIMEDOUT : -errno;
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		size_t k;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (i = 0; i < (int)k && ngot < 8; i++)
			memcpy(&got[ngot++], CMSG_DATA(c) + i * sizeof(int),
			       sizeof(int));
	}
	rc = 0;
	if (n == 0)
		rc = -ECONNRESET;
	else if ((mh.msg_flags & MSG_CTRUNC) && n == sizeof(*m) &&
		 ((m->kind == CM_REQ && ngot < CM_REQ_FDS + CM_WAKE_FDS) ||
		  (m->kind == CM_REQ_SLOT && ngot < CM_SLOT_FDS + CM_WAKE_FDS) ||
		  (m->kind == CM_JOIN_OK && ngot < 1)))
		/* the kernel could not give us the fds (our fd table is
		 * full: it cannot say which limit), not the client's doing */
		rc = -EMFILE;
	else if (n != sizeof(*m) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
		 m->magic != CM_MAGIC)
		rc = -EPROTO;
	want = rc == 0 && (m->kind == CM_REJ || m->kind == CM_JOIN) ? 0
	       : rc == 0 && (m->kind == CM_REQ_SLOT || m->kind == CM_JOIN_OK)
		       ? CM_SLOT_FDS
		       : CM_REQ_FDS;
	if (rc == 0 && ngot != want &&
	    (want == 0 || m->kind == CM_JOIN_OK || ngot != want + CM_WAKE_FDS) &&
	    m->version == CM_LOCAL_VERSION)
		rc = -EPROTO;
	if (rc || m->version != CM_LOCAL_VERSION) {
		/* (another version's REQ: cm_check says which, fds unused) */
		for (i = 0; i < ngot; i++)
			close(got[i]);
		return rc;
	}
	for (i = 0; i < ngot; i++)
		fds[i] = got[i];
	*nfds = ngot;
	return 0;
}

static int cm_addr_ok(const struct rsk_addr *a)
{
	return a->family == AF_INET || a->family == AF_INET6;
}

static int cm_geom_ok(uint32_t ring, uint32_t q)
{
	return ring_is_pow2(ring) && ring >= RSK_RING_MIN && ring <= RSK_RING_MAX &&
	       q >= RSK_QDEPTH_MIN && q <= RSK_QDEPTH_MAX;
}

/* Validates a REQ (or REQ_SLOT) from the peer; on failure explains in
 * detail. */
static int cm_check(const struct cm_msg *m, char *detail, size_t dlen)
{
	if (m->kind != CM_REQ && m->kind != CM_REQ_SLOT && m->kind != CM_JOIN) {
		snprintf(detail, dlen, "handshake: unexpected message kind %u",
			 m->kind);
		return -EPROTO;
	}
	if (m->version != CM_LOCAL_VERSION) {
		snprintf(detail, dlen,
			 "handshake: peer speaks protocol version %u, we speak %u",
			 m->version, CM_LOCAL_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (m->kind == CM_JOIN)
		return 0; /* (nothing more in it) */
	if (!cm_geom_ok(m->ring_size, m->qdepth) ||
	    (m->kind == CM_REQ &&
	     !cm_geom_ok(m->srv_ring_size, m->srv_qdepth)) ||
	    !cm_addr_ok(&m->src) || !cm_addr_ok(&m->dst)) {
		snprintf(detail, dlen, "handshake: bad parameters");
		return -EPROTO;
	}
	return 0;
}

/* Fault injection (RSOCK_FAULT): the connected QP in res wrapped in
 * prov_fault.c's; nothing at all when it is unset. */
static int cm_fault_wrap(struct cm_result *res)
{
	if (fault_config() <= 0)
		return 0; /* (malformed: refused before the QP was made) */
	return fault_wrap(&res->ops, &res->qp, res->area, res->q);
}

/* Our half of a connection: a QP with every receive posted. */
/* Our half of a connection: a QP with every receive posted, on a slot of
 * the arena we share with the server key (its pid) if key, else on a
 * segment of its own (then *memfd is -1).  On the arena, *slot and *gen
 * name the slot, and *memfd is the arena's (kept by the arena). */
static int cm_make_qp(const struct rsk_opts *o, uint32_t key, uint64_t name,
		      struct cm_result *res, int *memfd, uint32_t *slot,
		      uint32_t *gen)
{
	uint32_t i;
	int rc;

	if (res->qp) /* (claimed before the connect: see cm_local_connect) */
		goto post;
	memset(res, 0, sizeof(*res));
	res->live_fd = -1;
	res->ops = &shm_ops;
	*memfd = -1;
	rc = fault_config(); /* a malformed RSOCK_FAULT: -EINVAL */
	if (rc < 0)
		return rc;
	rc = key ? shm_arena_connect(key, name, o->ring_size, o->qdepth,
				     &res->qp, memfd, slot, gen)
		 : -ENOENT;
	if (rc) /* no arena (whatever the reason): a segment of its own */
		rc = shm_qp_create(o->ring_size, o->qdepth, &res->qp);
	if (rc < 0)
		return rc;
post:
	for (i = 0; i < o->qdepth; i++) {
		rc = shm_ops.post_recv(res->qp, PROV_WRID_RECV | i);
		if (rc) {
			shm_ops.destroy(res->qp);
			res->qp = NULL;
			return rc;
		}
	}
	res->area = shm_qp_area(res->qp);
	return 0;
}

/* FNV-1a of a rendezvous name: which arena served it last. */
static uint64_t cm_name_hash(const char *name, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	while (len--)
		h = (h ^ (uint8_t)*name++) * 0x100000001b3ull;
	return h;
}

static void cm_fill(struct cm_msg *m, int kind, const struct rsk_opts *o)
{
	memset(m, 0, sizeof(*m));
	m->magic = CM_MAGIC;
	m->version = CM_LOCAL_VERSION;
	m->kind = (uint8_t)kind;
	if (o) {
		m->ring_size = o->ring_size;
		m->qdepth = o->qdepth;
	}
}

static void cm_reject(int fd, int err)
{
	struct cm_msg m;

	cm_fill(&m, CM_REJ, NULL);
	m.reason = (uint16_t)err;
	(void)cm_send(fd, &m, NULL, 0);
}

/* Takes a client off a listening fd: its fd (non-blocking), -EAGAIN if
 * none, another -errno if that client was refused (uid) or failed. */
static int cm_accept_conn(int lfd, char *detail, size_t dlen)
{
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

	if (fd < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	if (!cm_peer_uid_ok(fd, NULL)) {
		snprintf(detail, dlen, "refused a client of another uid");
		cm_reject(fd, EACCES);
		close(fd);
		return -EACCES;
	}
	return fd;
}

/* Has an accepted client's REQ arrived (is its fd readable)? */
static int cm_req_ready(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) > 0;
}

/* Takes the peeked REQ (one record, whatever its length) off the queue. */
static void cm_dequeue(int fd)
{
	struct cm_msg m;

	while (recv(fd, &m, sizeof(m), MSG_DONTWAIT) < 0 && errno == EINTR)
		;
}

/* cm_accept_req_early's answer to a JOIN (cm_join_answer's to give) */
#define CM_JOINING 1

/* cm_accept_req; early: the REQ may not be there yet, and then the
 * result is -EINPROGRESS with fd left as it was (one recvmsg says so: no
 * poll of its own before it). */
static int cm_accept_req_early(int fd, const struct rsk_opts *o,
			       struct cm_result *res, char *detail,
			       size_t dlen, int early)
{
	struct cm_msg req;
	int fds[CM_MAX_FDS], nfds, rc, i;

	(void)o; /* the client sized our half (README: differences) */
	memset(res, 0, sizeof(*res));
	res->live_fd = -1;
	/* Peeked: the REQ (and its fds) stay queued until the connection is
	 * ours, so that a shortage of fds or memory leaves the client waiting
	 * for a later accept(), as TCP leaves it queued. */
	rc = cm_recv(fd, &req, fds, &nfds, 0, 1);
	if (rc == -EMFILE)
		return rc; /* client kept */
	if (rc == -ETIMEDOUT && early)
		return -EINPROGRESS; /* nothing queued yet: client kept */
	if (rc) {
		snprintf(detail, dlen, "handshake: bad or missing request");
		cm_dequeue(fd); /* closed with nothing unread: a hang-up */
		close(fd);
		return rc == -ETIMEDOUT ? -EPROTO : rc;
	}
	rc = cm_check(&req, detail, dlen);
	if (rc)
		goto reject;
	if (req.kind == CM_JOIN)
		return CM_JOINING; /* (no fds came; the JOIN stays queued) */
	res->ops = &shm_ops;
	rc = fault_config(); /* a malformed RSOCK_FAULT: -EINVAL */
	if (rc >= 0 && req.kind == CM_REQ_SLOT) {
		rc = shm_arena_accept(fds[0], req.ring_size, req.qdepth,
				      req.slot, req.gen, &res->qp);
		fds[0] = -1; /* consumed */
		if (rc) {
			snprintf(detail, dlen, rc == -ECONNRESET
				 ? "handshake: the client gave up its slot"
				 : "handshake: bad arena or slot");
			goto reject;
		}
		req.srv_ring_size = req.ring_size;
		req.srv_qdepth = req.qdepth;
		goto adopted;
	}
	if (rc >= 0) {
		rc = shm_qp_adopt(req.srv_ring_size, req.srv_qdepth, fds[1],
				  &res->qp);
		fds[1] = -1; /* consumed */
	}
	if (rc) {
		snprintf(detail, dlen, "handshake: cannot take our half");
		goto reject;
	}
	rc = shm_qp_attach(res->qp, fds[0], req.ring_size, req.qdepth);
	fds[0] = -1; /* consumed */
	if (rc) {
		snprintf(detail, dlen, "handshake: cannot map the client's ring");
		goto reject;
	}
adopted:
	i = req.kind == CM_REQ_SLOT ? CM_SLOT_FDS : CM_REQ_FDS;
	if (nfds > i) { /* eventfd mode: the client's, then ours */
		rc = shm_qp_take_wake_fds(res->qp, fds[i + 1], fds[i]);
		fds[i] = fds[i + 1] = -1; /* consumed */
		if (rc) {
			snprintf(detail, dlen, "handshake: bad eventfds");
			goto reject;
		}
	}
	res->area = shm_qp_area(res->qp);
	res->ring = req.srv_ring_size;
	res->q = req.srv_qdepth;
	rc = cm_fault_wrap(res);
	if (rc) {
		snprintf(detail, dlen, "handshake: cannot inject faults");
		goto reject;
	}
	cm_dequeue(fd); /* ours now (the kernel drops its copies of the fds) */
	res->live_fd = fd;
	res->peer_ring = req.ring_size;
	res->peer_q = req.qdepth;
	res->src = req.src;
	res->dst = req.dst;
	return 0;
reject:
	for (i = 0; i < CM_MAX_FDS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (rc == -ENOMEM || rc == -EMFILE || rc == -ENFILE) {
		/* our shortage: the client waits (REQ still queued) */
		cm_result_release(res);
		return rc;
	}
	cm_dequeue(fd);
	cm_reject(fd, -rc);
	close(fd);
	cm_result_release(res);
	return rc;
}

int cm_accept_req(int fd, const struct rsk_opts *o, struct cm_result *res,
		  char *detail, size_t dlen)
{
	int rc = cm_accept_req_early(fd, o, res, detail, dlen, 0);

	if (rc == CM_JOINING) { /* not a connection: refused here */
		snprintf(detail, dlen, "handshake: a JOIN where a REQ was due");
		cm_dequeue(fd);
		cm_reject(fd, EPROTO);
		close(fd);
		rc = -EPROTO;
	}
	return rc;
}

int cm_parse_reject(const void *buf, size_t len, char *detail, size_t dlen)
{
	struct cm_msg m;

	if (len != sizeof(m))
		return -EPROTO;
	memcpy(&m, buf, sizeof(m));
	if (m.magic != CM_MAGIC || m.kind != CM_REJ)
		return -EPROTO;
	snprintf(detail, dlen, "the listener refused the connection: %s",
		 strerror(m.reason));
	return 0;
}

static int cm_local_connect(const struct cm_dial *d, const struct rsk_opts *o,
			    struct cm_result *res, char *detail, size_t dlen)
{
	const struct rsk_addr *src = d->src, *dst = d->dst;
	int timeout_ms = d->timeout_ms;
	int64_t deadline = eng_deadline(timeout_ms);
	struct sockaddr_un sa;
	struct cm_msg req;
	socklen_t len;
	int fd, rc, srv_memfd = -1, fds[CM_MAX_FDS], wake[2];
	int blocking = 0, nfds, kind, woke = 0;
	uint32_t pid = 0, slot = 0, gen = 0;
	uint64_t name;

	memset(res, 0, sizeof(*res));
	res->live_fd = -1;
	if (!cm_addr_ok(src) || !cm_addr_ok(dst))
		return -EINVAL;
	rc = cm_addr(d->name, d->namelen, &sa, &len);
	if (rc)
		return rc;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	/* the name that holds our port (PROTOCOL.md, section 6) */
	if (d->bound && (rc = cm_bind_name(fd, d->bound, d->bound_len))) {
		close(fd);
		return rc;
	}
	/* A slot of the arena that served this name last, claimed before
	 * the connect so that the REQ follows it at once (a listener that
	 * wakes for the connection then finds it ready to accept, as a TCP
	 * listener's readiness means); checked against the server's pid
	 * after.  (None yet, or RSOCK_FAULT malformed: made after.) */
	name = cm_name_hash(d->name, d->namelen);
	fds[0] = -1;
	if (fault_config() >= 0 &&
	    shm_arena_connect(0, name, o->ring_size, o->qdepth, &res->qp,
			      &fds[0], &slot, &gen) == 0) {
		res->ops = &shm_ops;
		/* its eventfds too (eventfd mode if this process can afford
		 * it; the QP keeps both): two system calls fewer between the
		 * connect and the REQ */
		woke = shm_qp_wake_fds(res->qp, &wake[0], &wake[1]) == 0;
	}
	/* Non-blocking first (the usual case: the backlog has room, and it
	 * costs nothing more).  If the backlog is full and we may wait, the
	 * socket turns blocking: the kernel sleeps in connect() until accept()
	 * makes room (no polling), bounded by SO_SNDTIMEO, and a signal ends
	 * the wait with -EINTR, so that the caller runs its handlers and
	 * tries again.  It is non-blocking again once connected. */
	for (;;) {
		if (connect(fd, (struct sockaddr *)&sa, len) == 0)
			break;
		rc = errno;
		if (rc == ENOENT || rc == ECONNREFUSED) {
			snprintf(detail, dlen, "no rsock listener");
			rc = -ECONNREFUSED;
			goto out;
		}
		if (rc == EINTR) {
			rc = -EINTR;
			goto out;
		}
		if (rc != EAGAIN) {
			rc = -rc;
			goto out;
		}
		/* backlog full (or SO_SNDTIMEO ran out) */
		if (timeout_ms == 0) {
			rc = -EAGAIN;
			goto out;
		}
		if (deadline >= 0 && eng_now_ns() >= deadline) {
			snprintf(detail, dlen, "the listener's backlog stayed full");
			rc = -ETIMEDOUT;
			goto out;
		}
		if (!blocking && fcntl(fd, F_SETFL, 0) < 0) {
			rc = -errno;
			goto out;
		}
		blocking = 1;
		if (deadline >= 0) {
			int64_t left = deadline - eng_now_ns();
			struct timeval tv;

			if (left < 1000)
				left = 1000; /* 0 would mean forever */
			tv.tv_sec = left / 1000000000;
			tv.tv_usec = (left % 1000000000) / 1000;
			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		}
	}
	if (blocking && fcntl(fd, F_SETFL, O_NONBLOCK) < 0) {
		rc = -errno;
		goto out;
	}
	if (!cm_peer_uid_ok(fd, &pid)) {
		snprintf(detail, dlen, "the listener runs under another uid");
		rc = -ECONNREFUSED;
		goto out;
	}
	if (fault_config() > 0) {
		int sleeps;
		uint32_t late = fault_req_late(&sleeps);
		int64_t until = eng_now_ns() + (int64_t)late * 1000000;

		if (late && sleeps)
			nanosleep(&(struct timespec){ .tv_sec = late / 1000,
					.tv_nsec = (long)(late % 1000) * 1000000 },
				  NULL);
		while (late && !sleeps && eng_now_ns() < until)
			; /* (RSOCK_FAULT req_late: a client preempted here) */
	}
	/* Our half (and the server's) on a slot of the arena we share with
	 * that process, or else segments of their own: made right after the
	 * connect, so that the REQ follows at once (a listener that wakes
	 * for the connection gives it a moment: cm_req_soon). */
	if (res->qp && !shm_arena_key_ok(res->qp, pid)) {
		/* another process serves the name now */
		shm_ops.destroy(res->qp); /* (its eventfds with it) */
		res->qp = NULL;
		woke = 0;
	}
	rc = cm_make_qp(o, pid, name, res, &fds[0], &slot, &gen);
	if (rc)
		goto out;
	nfds = CM_SLOT_FDS;
	kind = CM_REQ_SLOT;
	if (fds[0] < 0) {
		rc = shm_half_create(o->ring_size, o->qdepth, &srv_memfd);
		if (rc)
			goto out;
		fds[0] = shm_qp_memfd(res->qp);
		fds[1] = srv_memfd;
		nfds = CM_REQ_FDS;
		kind = CM_REQ;
	}
	/* eventfd mode if this process can afford it (the QP keeps both) */
	if (woke) {
		fds[nfds] = wake[0];
		fds[nfds + 1] = wake[1];
		nfds += CM_WAKE_FDS;
	} else if (shm_qp_wake_fds(res->qp, &fds[nfds], &fds[nfds + 1]) == 0) {
		nfds += CM_WAKE_FDS;
	}
	cm_fill(&req, kind, o);
	if (kind == CM_REQ) {
		req.srv_ring_size = o->ring_size;
		req.srv_qdepth = o->qdepth;
	} else {
		req.slot = slot;
		req.gen = gen;
	}
	req.src = *src;
	req.dst = *dst;
	rc = cm_send(fd, &req, fds, nfds);
	if (rc == -EPIPE || rc == -ECONNRESET) {
		snprintf(detail, dlen, "the listener went away");
		rc = -ECONNREFUSED;
	}
	if (rc)
		goto out;
	if (kind == CM_REQ_SLOT)
		shm_arena_sent(res->qp);
	if (kind == CM_REQ) {
		/* map the server's half (created here, its fds just went out) */
		rc = shm_qp_attach(res->qp, srv_memfd, o->ring_size, o->qdepth);
		srv_memfd = -1; /* consumed */
		if (rc)
			goto out;
		shm_qp_drop_memfd(res->qp);
		res->area = shm_qp_area(res->qp);
	}
	res->ring = o->ring_size;
	res->q = o->qdepth;
	rc = cm_fault_wrap(res);
	if (rc)
		goto out;
	res->live_fd = fd;
	res->peer_ring = o->ring_size;
	res->peer_q = o->qdepth;
	res->src = *src;
	res->dst = *dst;
	return 0;
out:
	if (srv_memfd >= 0)
		close(srv_memfd);
	close(fd);
	cm_result_release(res);
	return rc;
}

/* The rendezvous needs nothing of the host: always usable. */
static int cm_local_probe(char *detail, size_t dlen)
{
	snprintf(detail, dlen, "local rendezvous");
	return 1;
}

/* ------------------------------------------------------------ listening */

/*
 * A listener: up to CM_MAX_NAMES rendezvous sockets, all in the socket's
 * epoll fd (cm_host.epfd), and the clients that connected to them but have
 * not sent their REQ yet.  Those wait here (not in accept()), at most
 * CM_REQ_WAIT_NS each, all at once, in epfd too (so the socket's fd turns
 * readable when a REQ comes); when CM_MAX_PEND wait, the one that waited
 * longest makes room (a real client sends its REQ right after connecting:
 * only a silent one waits).  The fds may be shared with other processes
 * (fork, multiprocessing), which accept from the same kernel queue.
 * Locking: the lock of the socket that holds the listener (listener.c).
 */
#define CM_MAX_PEND 128
#define CM_REQ_WAIT_NS 1000000000ll
/* A client whose handshake met our shortage waits this long for fds or
 * memory to come back (TCP keeps it queued for as long). */
#define CM_SHORT_WAIT_NS 60000000000ll

struct cm_pend {
	int fd;
	int short_of; /* its handshake met our shortage of fds or memory */
	int64_t until;
};

struct cm_listener {
	int epfd; /* the socket's (not ours) */
	int fd[CM_MAX_NAMES];
	int nfd;
	struct cm_pend pend[CM_MAX_PEND];
	int npend;
};

/* The rendezvous socket fd (bound, listening) joins *lp (made here the
 * first time), which owns it from then on (on success only). */
static int cm_listen_join(int fd, const struct cm_host *h,
			  struct cm_listener **lp)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	struct cm_listener *l = *lp, *made = NULL;
	int rc;

	if (l && l->nfd == CM_MAX_NAMES)
		return -ENOSPC;
	if (h->prepare && (rc = h->prepare(h->arg)))
		return rc;
	if (!l && !(l = made = calloc(1, sizeof(*l))))
		return -ENOMEM;
	/* EEXIST: a process that shares this epoll instance with us (a
	 * socket bound before a fork) made the same socket listen first */
	if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && errno != EEXIST) {
		rc = -errno;
		free(made);
		return rc;
	}
	l->epfd = h->epfd;
	l->fd[l->nfd++] = fd;
	*lp = l;
	return 0;
}

static int cm_local_listen(const struct cm_dial *d, const struct rsk_opts *o,
			   int backlog, const struct cm_host *h,
			   struct cm_listener **lp)
{
	int fd, rc;

	(void)o; /* (each client sizes both halves) */
	if (*lp && (*lp)->nfd == CM_MAX_NAMES)
		return -ENOSPC;
	if ((fd = cm_listen_fd(d->name, d->namelen, backlog)) < 0)
		return fd;
	if ((rc = cm_listen_join(fd, h, lp)))
		close(fd);
	return rc;
}

static int cm_local_adopt(int fd, int backlog, const struct cm_host *h,
			  struct cm_listener **lp)
{
	if (listen(fd, backlog < 0 ? 0 : backlog) < 0)
		return -errno;
	if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		return -errno;
	return cm_listen_join(fd, h, lp);
}

static int cm_local_listen_fds(struct cm_listener *l, int *fds, int n)
{
	int i;

	for (i = 0; i < l->nfd && i < n; i++)
		fds[i] = l->fd[i];
	return l->nfd;
}

static void cm_pend_drop(struct cm_listener *l, int i, int close_it)
{
	/* (a short_of client is not in epfd: the DEL fails, harmlessly) */
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, l->pend[i].fd, NULL);
	if (close_it)
		close(l->pend[i].fd);
	l->pend[i] = l->pend[--l->npend];
}

/* The parked client that waited longest (its deadline is the earliest). */
static int cm_pend_oldest(const struct cm_listener *l)
{
	int i, o = 0;

	for (i = 1; i < l->npend; i++)
		if (l->pend[i].until < l->pend[o].until)
			o = i;
	return o;
}

/* Our own shortage of fds or memory (not the client's doing). */
static int cm_short(int rc)
{
	return rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM;
}

/* Handshake of a client whose REQ arrived, the caller's preparation first
 * (so that a shortage there leaves the client as it was: see
 * cm_accept_req). */
static int cm_take(const struct cm_host *h, int fd, struct cm_result *res,
		   int early)
{
	int rc;

	if (h->prepare && (rc = h->prepare(h->arg)))
		return rc;
	return cm_accept_req_early(fd, h->o, res, h->detail, h->dlen, early);
}

static void cm_park(struct cm_listener *l, int fd, int short_of, int64_t now)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

	if (l->npend == CM_MAX_PEND) /* the longest silent goes */
		cm_pend_drop(l, cm_pend_oldest(l), 1);
	if (!short_of && epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		close(fd);
		return;
	}
	l->pend[l->npend++] = (struct cm_pend){
		.fd = fd, .short_of = short_of,
		.until = now + (short_of ? CM_SHORT_WAIT_NS : CM_REQ_WAIT_NS)
	};
}

/* Is a thread of process pid running or runnable (or in an uninterruptible
 * wait: a page fault; or stopped by its tracer between system calls, as
 * under strace: "t"), as /proc shows it?  The calling thread does not
 * count (a client in our own process).  0 if none is, or if the process
 * cannot be seen (another pid namespace: pid 0). */
static int cm_proc_running(uint32_t pid)
{
	char path[64], buf[512];
	struct dirent *e;
	long self = (long)gettid();
	DIR *d;
	int on = 0;

	if (!pid)
		return 0;
	snprintf(path, sizeof(path), "/proc/%u/task", pid);
	d = opendir(path);
	if (!d)
		return 0;
	while (!on && (e = readdir(d))) {
		ssize_t n;
		char *state;
		int fd;

		if (e->d_name[0] < '0' || e->d_name[0] > '9' ||
		    strtol(e->d_name, NULL, 10) == self)
			continue;
		snprintf(path, sizeof(path), "/proc/%u/task/%.20s/stat", pid,
			 e->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = 0;
		/* "tid (comm) S ...": comm may hold anything, ')' included */
		state = strrchr(buf, ')');
		if (state && state[1] == ' ' &&
		    (state[2] == 'R' || state[2] == 'D' || state[2] == 't'))
			on = 1;
	}
	closedir(d);
	return on;
}

/* A client's REQ follows its connect() at once (it made its segments
 * before connecting): a non-blocking accept that woke for the connection
 * gives the REQ a moment rather than fail with EAGAIN on a listener that
 * polled readable, which TCP's never does.  1 ms, and longer while the
 * client's process runs (a client preempted between its connect and its
 * send: seen for up to 14 ms on a loaded VM), at most CM_REQ_RUN_WAIT_MS
 * once per client; a client whose threads all sleep is parked after the
 * first millisecond. */
#define CM_REQ_RUN_WAIT_MS 50
static int cm_req_soon(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	uint32_t pid = 0;
	int ms;

	for (ms = 0; ms < CM_REQ_RUN_WAIT_MS; ms++) {
		if (poll(&p, 1, 1) > 0)
			return cm_req_ready(fd);
		if (ms == 0 && (!cm_peer_uid_ok(fd, &pid) || !pid))
			return 0; /* (another uid's: refused anyway) */
		if (!cm_proc_running(pid))
			return 0;
	}
	return 0;
}

/* A JOIN (SO_REUSEPORT; PROTOCOL.md section 6) came to l through fd (its
 * uid checked at accept): the rendezvous socket it came to, if l allows
 * joining, and l is shared from then on; else REJ EADDRINUSE.  fd goes. */
static void cm_join_answer(struct cm_listener *l, const struct cm_host *h,
			   int fd)
{
	struct sockaddr_un a, b;
	socklen_t al = sizeof(a), bl;
	struct cm_msg m;
	int i, k = -1;

	cm_dequeue(fd);
	if (h->reuseport && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
		for (i = 0; i < l->nfd && k < 0; i++) {
			bl = sizeof(b);
			if (getsockname(l->fd[i], (struct sockaddr *)&b, &bl) == 0 &&
			    bl == al && !memcmp(&a, &b, al))
				k = i;
		}
	if (k < 0) {
		cm_reject(fd, EADDRINUSE);
	} else {
		cm_fill(&m, CM_JOIN_OK, NULL);
		if (cm_send(fd, &m, &l->fd[k], 1) == 0 && h->lshared)
			*h->lshared = 1; /* another process may accept now */
	}
	close(fd);
}

/*
 * One step of accepting, never blocking (but cm_req_soon): a parked
 * client whose REQ has arrived is handshaken; new clients are taken off the
 * listening fds and either handshaken at once or parked until their REQ
 * comes.  Returns 0 with *res, -EAGAIN if nothing is ready, or -ENOMEM/
 * -EMFILE/-ENFILE: then every client stays (parked, or in the kernel's
 * queue) for a later accept, as TCP keeps them queued.
 */
static int cm_local_accept(struct cm_listener *l, const struct cm_host *h,
			   struct cm_result *res)
{
	int64_t now = eng_now_ns();
	int i, fd, rc, short_rc = 0;

	for (i = 0; i < l->npend;) {
		struct cm_pend *p = &l->pend[i];

		fd = p->fd;
		if (p->short_of || cm_req_ready(fd)) {
			rc = cm_take(h, fd, res, 0);
			if (rc == 0) {
				cm_pend_drop(l, i, 0);
				return 0;
			}
			if (rc == CM_JOINING) {
				cm_pend_drop(l, i, 0);
				cm_join_answer(l, h, fd);
				continue;
			}
			if (!cm_short(rc)) {
				cm_pend_drop(l, i, 0); /* a bad client costs only
							* itself (fd closed) */
				continue;
			}
			short_rc = rc;
			if (!p->short_of) {
				/* waits for fds or memory now, not for its REQ:
				 * out of epfd, whose level would not drop */
				epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
				p->short_of = 1;
				p->until = now + CM_SHORT_WAIT_NS;
			}
		}
		if (now >= p->until) {
			cm_pend_drop(l, i, 1); /* silent (or short) too long */
			continue;
		}
		i++;
	}
	if (short_rc)
		return short_rc; /* short of fds or memory: take no one new */
	for (i = 0; i < l->nfd; i++) {
		for (;;) {
			fd = cm_accept_conn(l->fd[i], h->detail, h->dlen);
			if (fd == -EAGAIN)
				break;
			if (cm_short(fd))
				return fd;
			if (fd < 0)
				continue;
			/* usually there already: taken without a poll first */
			rc = cm_take(h, fd, res, 1);
			if (rc == -EINPROGRESS) {
				if (!h->nb || !cm_req_soon(fd)) {
					cm_park(l, fd, 0, now);
					continue;
				}
				rc = cm_take(h, fd, res, 0);
			}
			if (rc == 0)
				return 0;
			if (rc == CM_JOINING) {
				cm_join_answer(l, h, fd);
				continue;
			}
			if (cm_short(rc)) {
				cm_park(l, fd, 1, now);
				return rc;
			}
		}
	}
	return -EAGAIN;
}

/* The first parked client's expiry. */
static int64_t cm_local_listen_due(const struct cm_listener *l)
{
	int64_t due = -1;
	int i;

	for (i = 0; i < l->npend; i++)
		if (due < 0 || l->pend[i].until < due)
			due = l->pend[i].until;
	return due;
}

/* Shut down, the listening fds poll readable (and accept finds nothing). */
static void cm_local_listen_shutdown(struct cm_listener *l)
{
	int i;

	for (i = 0; i < l->nfd; i++)
		shutdown(l->fd[i], SHUT_RDWR);
}

static void cm_local_listen_close(struct cm_listener *l)
{
	int i;

	for (i = 0; i < l->nfd; i++)
		close(l->fd[i]);
	for (i = 0; i < l->npend; i++)
		close(l->pend[i].fd);
	free(l);
}

/* rsk_rendezvous_join: the rendezvous socket bound to name, from the
 * listener of our uid that holds it (PROTOCOL.md section 6: JOIN). */
static int cm_join(const char *name, size_t namelen, int timeout_ms)
{
	struct sockaddr_un sa;
	socklen_t len;
	struct cm_msg m;
	int fd, rc, fds[CM_MAX_FDS], nfds;

	if ((rc = cm_addr(name, namelen, &sa, &len)))
		return rc;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, len) < 0) {
		/* gone since our bind failed: the caller binds again */
		rc = errno == ECONNREFUSED ? -EAGAIN : -EADDRINUSE;
		goto out;
	}
	rc = -EADDRINUSE;
	if (!cm_peer_uid_ok(fd, NULL))
		goto out; /* another uid's: never */
	cm_fill(&m, CM_JOIN, NULL);
	if (cm_send(fd, &m, NULL, 0))
		goto out;
	rc = cm_recv(fd, &m, fds, &nfds, timeout_ms < 0 ? 1000 : timeout_ms, 0);
	if (rc) {
		rc = rc == -EMFILE ? rc : -EADDRINUSE;
		goto out;
	}
	if (m.kind != CM_JOIN_OK) {
		rc = m.kind == CM_REJ && m.reason == EADDRINUSE ? -EADDRINUSE
								 : -EPROTO;
		while (nfds > 0)
			close(fds[--nfds]);
		goto out;
	}
	/* untrusted: a listening rendezvous socket bound to that very name */
	rc = fds[0];
	len = sizeof(sa);
	if (cm_is_rendezvous(rc) || getsockname(rc, (struct sockaddr *)&sa, &len) ||
	    len != offsetof(struct sockaddr_un, sun_path) + 1 + namelen ||
	    memcmp(sa.sun_path + 1, name, namelen)) {
		close(rc);
		rc = -EPROTO;
	}
out:
	close(fd);
	return rc;
}

const struct cm_ops cm_local_ops = {
	.name = "local",
	.by_name = 1,
	.probe = cm_local_probe,
	.connect = cm_local_connect,
	.listen = cm_local_listen,
	.bind = cm_bind_fd,
	.join = cm_join,
	.adoptable = cm_is_rendezvous,
	.adopt = cm_local_adopt,
	.listen_fds = cm_local_listen_fds,
	.accept = cm_local_accept,
	.listen_due = cm_local_listen_due,
	.listen_shutdown = cm_local_listen_shutdown,
	.listen_close = cm_local_listen_close,
};
