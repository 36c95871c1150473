/*
 * cm.h - the connection-manager interface.
 *
 * A connection manager makes connections: it dials a peer, or listens and
 * accepts, and hands the engine a connected queue pair of its provider
 * plus a liveness fd (struct cm_result).  Two implement struct cm_ops:
 * cm_local.c (the local rendezvous: shm queue pairs between processes of
 * one host) and cm_rdma.c (rdma_cm: verbs queue pairs).  The connect path
 * (conn.c) and listener.c find the manager for an address in
 * cm_managers[] (cm_for) and call it through its ops.
 *
 * What only the local manager has is declared below the table: its
 * listening sockets are rendezvous fds that listener.c multiplexes itself
 * (several names per listener, fds shared across fork, clients parked
 * until their REQ comes), so its listen entries in cm_ops are NULL.
 *
 * Every call returns >= 0 or -errno; on failure, one sentence in detail
 * (dlen bytes) says why.
 */
#ifndef RSK_CM_H
#define RSK_CM_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "prov.h"
#include "rsock.h"

struct rs_sge;

/* What a connection manager hands the engine. */
struct cm_result {
	const struct prov_ops *ops;
	struct prov_qp *qp;
	uint8_t *area; /* our recv area */
	int live_fd;
	uint32_t ring; /* geometry of our half */
	uint32_t q;
	uint32_t peer_ring;
	uint32_t peer_q;
	struct rsk_addr src; /* the client's address (accept: the peer) */
	struct rsk_addr dst; /* the address dialed (accept: ours) */
	/* rsockets peer (verbs): area is the bare ring (no ctrl slots) */
	int rs;
	struct rs_sge *rs_tsgl; /* entry 0 holds the peer's first buffer */
	uint64_t rs_rbuf_addr;
	uint32_t rs_rbuf_key;
	uint64_t rs_sgl_addr;
	uint32_t rs_sgl_key, rs_sgl_len;
};

/* Frees what a result holds (its QP, its liveness fd); idempotent. */
static inline void cm_result_release(struct cm_result *res)
{
	if (res->qp)
		res->ops->destroy(res->qp);
	res->qp = NULL;
	if (res->live_fd >= 0)
		close(res->live_fd);
	res->live_fd = -1;
}

/* Where to connect (or listen): a rendezvous name (the local manager), or
 * with name NULL the IP addresses themselves (rdma_cm). */
struct cm_dial {
	const char *name;
	size_t namelen;
	const struct rsk_addr *src, *dst; /* listen: dst is the address */
	int flags;      /* rdma: RSK_VF_* */
	int timeout_ms; /* connect: -1 waits forever */
};

/* A manager's own listener (opaque; cm_rdma.c's runs a service thread). */
struct cm_listener;

struct cm_ops {
	const char *name; /* "local", "rdma" */
	int by_name;      /* dials rendezvous names (1) or IP addresses (0) */
	/* > 0 when the manager can be used on this host (rdma: the number
	 * of RDMA devices), else -ENOSYS/-ENODEV with the reason in detail. */
	int (*probe)(char *detail, size_t dlen);
	/* Dials d with our half sized by o: 0 with *res filled, or -errno
	 * (*res then holds nothing).  Blocks up to d->timeout_ms; a signal
	 * ends the wait with -EINTR. */
	int (*connect)(const struct cm_dial *d, const struct rsk_opts *o,
		       struct cm_result *res, char *detail, size_t dlen);
	/* A listener of the manager's own on d (up to backlog connections
	 * established before accept, our side sized by o); NULL for the
	 * local manager (see the top of this file). */
	int (*listen)(const struct cm_dial *d, const struct rsk_opts *o,
		      int backlog, struct cm_listener **out, char *detail,
		      size_t dlen);
	/* Readable while an established connection waits. */
	int (*listen_fd)(struct cm_listener *l);
	/* Never blocks: 0 with *res, -EAGAIN if none is ready. */
	int (*accept)(struct cm_listener *l, struct cm_result *res);
	void (*listen_close)(struct cm_listener *l);
};

extern const struct cm_ops cm_local_ops;
extern const struct cm_ops cm_rdma_ops;

/* Every manager, in the order a path is preferred; NULL-terminated. */
extern const struct cm_ops *const cm_managers[];

/* The manager that dials d (by name or by address): never NULL. */
const struct cm_ops *cm_for(const struct cm_dial *d);

/* --- the local manager's rendezvous (cm_local.c), for listener.c -------- */

int cm_listen_fd(const char *name, size_t namelen, int backlog);
int cm_bind_fd(const char *name, size_t namelen);
int cm_is_rendezvous(int fd);
/* Takes a client off a listening fd: its fd (non-blocking), -EAGAIN if
 * none, another -errno if that client was refused (uid) or failed. */
int cm_accept_conn(int lfd, char *detail, size_t dlen);
/* Has an accepted client's REQ arrived (is its fd readable)? */
int cm_req_ready(int fd);
/* Handshake of an accepted client whose REQ arrived; takes fd (0 with
 * *res filled, or -errno and fd closed), except on our own shortage
 * (-EMFILE, -ENFILE, -ENOMEM): then fd stays open with the REQ still
 * queued, for a later try. */
int cm_accept_req(int fd, const struct rsk_opts *o, struct cm_result *res,
		  char *detail, size_t dlen);
/* The liveness channel has data: a REJ (0, detail filled) or -EPROTO. */
int cm_read_reject(int fd, char *detail, size_t dlen);

/* --- the rdma manager (cm_rdma.c) ------------------------------------- */

/* cm_rdma_ops.listen_close (cm_rdma.c's own teardown calls it by name). */
void cm_verbs_listen_close(struct cm_listener *l);

#endif
