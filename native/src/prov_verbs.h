// SPDX-License-Identifier: MIT
/*
 * prov_verbs.h - what prov_verbs.c (the queue pair over libibverbs) and
 * cm_rdma.c (its connection manager over librdmacm) share: the table of
 * run-time loaded entry points, the CM private data, struct prov_qp.
 * Only with the rdma-core headers (RSK_HAVE_VERBS).
 */
#ifndef RSOCK_PROV_VERBS_H
#define RSOCK_PROV_VERBS_H

#if defined(__has_include)
#if __has_include(<infiniband/verbs.h>) && __has_include(<rdma/rdma_cma.h>)
#define RSK_HAVE_VERBS 1
#endif
#endif

#ifdef RSK_HAVE_VERBS

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

#include "engine.h"

/* The entry points we use that are real symbols (post/poll/notify are
 * inline functions of verbs.h that call through the device's ops). */
struct v_table {
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
};
extern struct v_table V;

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

/* prov_verbs.c, for cm_rdma.c */
/* 0 when the libraries are loaded, else -errno with one sentence. */
int v_ready(char *detail, size_t dlen);
int v_channel(struct rdma_event_channel **out, char *detail, size_t dlen);
/* Monotonic milliseconds. */
int64_t v_now_ms(void);
/* Tears a queue pair down (with its id and channel): the reaper thread's. */
void vq_destroy(struct prov_qp *q);
int vq_create(struct rdma_cm_id *id, const struct rsk_opts *o,
	      uint32_t peer_q, uint32_t peer_ring, int rs,
	      struct prov_qp **out, char *detail, size_t dlen);

#endif /* RSK_HAVE_VERBS */
#endif
