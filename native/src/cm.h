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
 * Listening is the managers' too: a socket holds at most one listener
 * (struct cm_listener, each manager's own) per manager, in s->ls[] at the
 * manager's place in cm_managers[], and listener.c, sock.c and conn.c
 * reach them only through the ops.  A manager keeps its listener's state
 * (the local manager: its rendezvous fds, up to CM_MAX_NAMES names, and
 * the clients parked until their REQ comes; rdma_cm: a service thread)
 * and puts the fds that turn readable when accept has something to do
 * into the socket's epoll fd (struct cm_host).  The socket's lock (held
 * by every caller) guards a listener; a manager may take its own leaf
 * locks after it.
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
	const char *bound; /* local connect: the client's own name (or NULL) */
	size_t bound_len;
	const struct rsk_addr *src, *dst; /* listen: dst is the address */
	int flags;      /* rdma: RSK_VF_* */
	int timeout_ms; /* connect: -1 waits forever */
};

/* A manager's listener (opaque: each manager defines its own). */
struct cm_listener;

/* At most this many listening fds (rendezvous names) per listener. */
#define CM_MAX_NAMES 4

/* What a listener needs of the socket that holds it (listener.c fills
 * one in for every listen, adopt and accept call). */
struct cm_host {
	int epfd; /* the socket's epoll fd: the listener's fds go in there */
	const struct rsk_opts *o; /* the socket's options */
	int nb; /* accept: the caller will not wait (a timeout of 0) */
	/* listen, adopt: called once the name is bound, before the listener
	 * takes it (the engine makes fileno() live again after a refused
	 * connect); a -errno undoes the bind and is returned.
	 * accept: called before a client is taken (the engine makes the
	 * socket that will hold it); a -errno (our shortage of fds or
	 * memory) leaves the client waiting and is returned.
	 * cm_local.c calls it; cm_rdma.c never does (its listen never
	 * renewed fileno(), its accept takes first). */
	int (*prepare)(void *arg);
	void *arg;
	/* accept: other processes of our uid may join the listener
	 * (SO_REUSEPORT: rsk_listen_reuseport); it is shared once one did */
	int reuseport;
	int *lshared;
	char *detail; /* why a call (or a client) failed */
	size_t dlen;
};

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

	/* --- listening (listener.c; close: sock.c; poll: conn.c) --- */
	/* Listens on d (up to backlog connections waiting, our side sized by
	 * o): *l NULL makes a listener, else d is one more name of *l (the
	 * local manager: -ENOSPC past CM_MAX_NAMES; rdma_cm: -EBUSY).  0, or
	 * -errno with *l as it was. */
	int (*listen)(const struct cm_dial *d, const struct rsk_opts *o,
		      int backlog, const struct cm_host *h,
		      struct cm_listener **l);
	/* Only a manager that dials names (NULL otherwise): a rendezvous fd
	 * bound to name, not listening (rsk_rendezvous_bind), which a
	 * listener of this or another process adopts; is fd one (0, or
	 * -errno)?; and listen on it as listen does on a name (fd is the
	 * listener's on success only). */
	int (*bind)(const char *name, size_t namelen);
	/* name is taken: the rendezvous socket bound to it, from the listener
	 * of our uid that holds it, if that listener allows joining
	 * (SO_REUSEPORT); waits up to timeout_ms for it.  -EADDRINUSE if not,
	 * -EAGAIN if nobody holds the name any more. */
	int (*join)(const char *name, size_t namelen, int timeout_ms);
	int (*adoptable)(int fd);
	int (*adopt)(int fd, int backlog, const struct cm_host *h,
		     struct cm_listener **l);
	/* The listening fds another process may accept from too (up to n
	 * into fds): how many there are. */
	int (*listen_fds)(struct cm_listener *l, int *fds, int n);
	/* Never blocks (but the local manager gives a new client's REQ 1 ms
	 * when h->nb): 0 with *res, -EAGAIN if none is ready, or our
	 * shortage (-EMFILE, -ENFILE, -ENOMEM, h->prepare's included): then
	 * every client waits for a later accept, as TCP keeps them queued. */
	int (*accept)(struct cm_listener *l, const struct cm_host *h,
		      struct cm_result *res);
	/* When accept has something to do though no fd turned readable (a
	 * parked client's time runs out; eng_now_ns), or -1. */
	int64_t (*listen_due)(const struct cm_listener *l);
	/* Wakes a blocked accept (the listening fds turn readable); the
	 * caller never does this to fds other processes accept from. */
	void (*listen_shutdown)(struct cm_listener *l);
	void (*listen_close)(struct cm_listener *l);
};

extern const struct cm_ops cm_local_ops;
extern const struct cm_ops cm_rdma_ops;

/* Every manager, in the order a path is preferred (and accept asks a
 * socket's listeners); NULL-terminated. */
#define CM_NMANAGERS 2
extern const struct cm_ops *const cm_managers[CM_NMANAGERS + 1];

/* The manager that dials rendezvous names (by_name 1) or addresses (0). */
const struct cm_ops *cm_kind(int by_name);
/* The manager that dials d (by name or by address): never NULL. */
const struct cm_ops *cm_for(const struct cm_dial *d);

/* --- the local manager's calls outside its ops (cm_local.c) ----------- */

/* Handshake of an accepted client whose REQ arrived (its accept, and the
 * handshake fuzzer); takes fd (0 with *res filled, or -errno and fd
 * closed), except on our own shortage (-EMFILE, -ENFILE, -ENOMEM): then
 * fd stays open with the REQ still queued, for a later try. */
int cm_accept_req(int fd, const struct rsk_opts *o, struct cm_result *res,
		  char *detail, size_t dlen);
/* A record of len bytes read from the liveness channel that is not a
 * bell: a REJ (0, detail filled) or -EPROTO (progress.c). */
int cm_parse_reject(const void *buf, size_t len, char *detail, size_t dlen);
/* The size of a handshake message (a REJ's record). */
#define CM_MSG_LEN 80
/* The local handshake's version (PROTOCOL.md, section 6): 2 since the
 * liveness socket carries the bells (no eventfds in the REQ). */
#define CM_LOCAL_VERSION 3

/* --- the rdma manager (cm_rdma.c) ------------------------------------- */

/* cm_rdma_ops.listen_close (cm_rdma.c's own teardown calls it by name). */
void cm_verbs_listen_close(struct cm_listener *l);

#endif
