// SPDX-License-Identifier: MIT
/*
 * fuzz_handshake.c - what a local client can hand a listener (cm_local.c).
 *
 * Each input becomes one message on a SOCK_SEQPACKET socket pair (any
 * length and bytes: a REQ, a REJ or garbage) with up to six fds attached
 * (SCM_RIGHTS), each a fuzzed kind: a memfd of a fuzzed size, seals and
 * header (magic, geometry), or one sized for the geometry the message
 * claims; an eventfd; a pipe end; a socket; /dev/null.  The listener's
 * side parses it exactly as accept() does (cm_accept_req, which checks
 * the request, adopts the server's half and maps the client's), or as a
 * connected client reads its liveness channel (eng_live_read: the bells,
 * then a REJ or anything else), with up to three bells before it.
 *
 * Checks, besides the sanitizers: the call returns 0 or -errno; on
 * success the result is sane (geometry in range, a recv area); and no fd
 * is leaked, whatever was passed (every fd is closed or owned by the
 * result, which is then released).
 */
#include "prov_shm.c"

#include <signal.h>
#include <sys/socket.h>

#include "engine.h"

#define FUZZ_NAME "fuzz_handshake"
#include "fuzz_input.h"

/* what cm_local.c puts on the wire (PROTOCOL.md, section 6) */
struct req {
	uint32_t magic;
	uint8_t version;
	uint8_t kind;
	uint16_t reason;
	uint32_t ring_size;
	uint32_t qdepth;
	uint32_t srv_ring_size;
	uint32_t srv_qdepth;
	struct rsk_addr src;
	struct rsk_addr dst;
};
_Static_assert(sizeof(struct req) == 80, "cm_msg is 80 bytes");

/* A geometry: mostly valid (powers of two in range), sometimes raw. */
static void in_geom(struct input *in, uint32_t *ring, uint32_t *q)
{
	uint8_t m = in_u8(in);

	if (m & 0x80) {
		*ring = in_u32(in);
		*q = in_u32(in);
		return;
	}
	*ring = 4096u << (m & 7); /* up to 512 KiB: keep the maps small */
	*q = 16u << ((m >> 3) & 3);
}

static int open_fds(void)
{
	int fd, n = 0;

	for (fd = 0; fd < 256; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			n++;
	return n;
}

/* A memfd the way a client makes one, or subtly not. */
static int make_memfd(struct input *in, uint32_t ring, uint32_t q)
{
	uint8_t m = in_u8(in);
	uint64_t size = ring_is_pow2(ring) && q && q <= 8192 && ring <= (1u << 20)
				? seg_size(ring, q)
				: 8192;
	int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int seals = 0;

	if (fd < 0)
		return -1;
	if (m & 1)
		size = m & 2 ? size - 1 - in_u8(in) : (uint64_t)in_u32(in) % (1u << 21);
	if (ftruncate(fd, (off_t)size) < 0) {
		close(fd);
		return -1;
	}
	if (!(m & 4)) {
		struct shm_hdr h = { .magic = SHM_MAGIC, .ring_size = ring, .qdepth = q };

		if (m & 8)
			h.magic ^= 1ull << (in_u8(in) & 63);
		if (m & 16) { /* the creator's leftovers in the owner's fields */
			h.rq_prod = in_u32(in);
			h.cq_cons = in_u32(in);
			h.cq_prod = in_u32(in);
			h.armed = in_u8(in);
		}
		if (pwrite(fd, &h, sizeof(h) < size ? sizeof(h) : size, 0) < 0) {
			close(fd);
			return -1;
		}
	}
	if (!(m & 32))
		seals |= F_SEAL_SHRINK;
	if (!(m & 64))
		seals |= F_SEAL_GROW;
	if (m & 128)
		seals |= F_SEAL_WRITE;
	if (seals)
		(void)fcntl(fd, F_ADD_SEALS, seals);
	return fd;
}

/* An arena the way a client makes one (REQ_SLOT), or subtly not: its
 * header, size, seals, the named slot's state word and its halves'
 * headers all fuzzed. */
static int make_arena(struct input *in, const struct req *r)
{
	uint8_t m = in_u8(in), m2 = in_u8(in);
	struct arena_hdr h = { .magic = ARENA_MAGIC, .ring_size = r->ring_size,
			       .qdepth = r->qdepth };
	int ok = ring_is_pow2(r->ring_size) && r->ring_size <= (1u << 19) &&
		 r->qdepth && r->qdepth <= 8192;
	uint64_t half = ok ? ar_half(r->ring_size, r->qdepth) : 4096, size;
	uint64_t chunk = (uint64_t)ARENA_CHUNK * 2 * half;
	struct shm_hdr sh = { .magic = SHM_MAGIC, .ring_size = r->ring_size,
			      .qdepth = r->qdepth };
	uint32_t slot = r->srv_ring_size, k;
	uint32_t w = r->srv_qdepth | (m & 16 ? ARENA_P : ARENA_C);
	int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int seals = 0;

	if (fd < 0)
		return -1;
	h.half = m & 1 ? in_u32(in) : half;
	h.nslots = ARENA_CHUNK * (1u + (m2 & 1));
	if (m & 4)
		h.magic ^= 1ull << (in_u8(in) & 63);
	if (m & 8)
		w = in_u32(in);
	size = ARENA_HDR + (1u + (m2 & 1)) * chunk;
	if (m & 2)
		size = in_u32(in) % (ARENA_HDR + 2 * chunk + 1);
	if (m & 32)
		size = size - 1 - in_u8(in);
	if (ftruncate(fd, (off_t)size) < 0 ||
	    pwrite(fd, &h, offsetof(struct arena_hdr, word), 0) < 0 ||
	    (slot < ARENA_MAX_SLOTS &&
	     pwrite(fd, &w, sizeof(w),
		    (off_t)offsetof(struct arena_hdr, word[slot])) < 0)) {
		close(fd);
		return -1;
	}
	/* the named slot's two halves (m2 & 8: the server's without one) */
	for (k = 0; ok && slot < 2 * ARENA_CHUNK && k < 2; k++)
		if (!(m2 & 8) || k == 0)
			(void)pwrite(fd, &sh, sizeof(sh),
				     (off_t)(ARENA_HDR + (2 * slot + k) * half));
	if (!(m & 64))
		seals |= F_SEAL_SHRINK;
	if (m & 128)
		seals |= F_SEAL_WRITE;
	if (seals)
		(void)fcntl(fd, F_ADD_SEALS, seals);
	return fd;
}

static int make_fd(struct input *in, const struct req *r, int slot)
{
	int p[2], fd;

	switch (in_u8(in) % 6) {
	case 0: /* the fd the slot wants: client's half (0) or server's (1),
		 * or (REQ_SLOT) the arena (0); then the eventfds (eventfd mode) */
		if (r->kind == 4)
			return slot == 0 ? make_arena(in, r) : eventfd(0, EFD_CLOEXEC);
		if (slot >= 2)
			return eventfd(0, EFD_CLOEXEC);
		return make_memfd(in, slot >= 1 ? r->srv_ring_size : r->ring_size,
				  slot >= 1 ? r->srv_qdepth : r->qdepth);
	case 1: { /* a memfd for another geometry */
		uint32_t ring, q;

		in_geom(in, &ring, &q);
		return make_memfd(in, ring, q);
	}
	case 2:
		return eventfd(0, EFD_CLOEXEC | (in_u8(in) & 1 ? EFD_NONBLOCK : 0));
	case 3: /* either end of a pipe */
		if (pipe2(p, O_CLOEXEC) < 0)
			return -1;
		fd = in_u8(in) & 1;
		close(p[!fd]);
		return p[fd];
	case 4:
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) < 0)
			return -1;
		close(p[1]);
		return p[0];
	default:
		fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		return fd;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int once;
	struct input in = { data, size };
	union {
		char buf[CMSG_SPACE(6 * sizeof(int))];
		struct cmsghdr align;
	} u;
	uint8_t msg[256];
	struct req r;
	struct msghdr mh = { 0 };
	struct iovec iov;
	struct cmsghdr *cm;
	struct cm_result res;
	struct rsk_opts o;
	char detail[160];
	int sp[2], fds[6], nfds, nbells, i, rc, mode, baseline;
	size_t len;

	if (!once) {
		signal(SIGPIPE, SIG_IGN);
		unsetenv("RSOCK_FAULT"); /* the provider as it ships */
		once = 1;
	}
	baseline = open_fds();
	mode = in_u8(&in);
	/* the message: a REQ built from fuzzed fields, or raw bytes */
	memset(&r, 0, sizeof(r));
	r.magic = 0x434b5352u;
	r.version = CM_LOCAL_VERSION;
	r.kind = mode & 2 ? 3 : mode & 128 ? 4 : 1;
	in_geom(&in, &r.ring_size, &r.qdepth);
	in_geom(&in, &r.srv_ring_size, &r.srv_qdepth);
	if (r.kind == 4) { /* REQ_SLOT: slot (mostly in range) and gen */
		uint8_t sm = in_u8(&in);

		r.srv_ring_size = sm & 0x80 ? in_u32(&in) : sm & 7u;
		r.srv_qdepth = sm & 0x40 ? in_u32(&in) : (uint32_t)(sm & 0x38) << 3;
	}
	r.src.family = mode & 4 ? (uint16_t)in_u32(&in) : AF_INET;
	r.dst.family = mode & 8 ? (uint16_t)in_u32(&in) : AF_INET6;
	r.reason = (uint16_t)in_u32(&in);
	if (mode & 16) {
		r.magic ^= in_u32(&in);
		r.version ^= in_u8(&in);
		r.kind ^= in_u8(&in);
	}
	memcpy(msg, &r, sizeof(r));
	len = sizeof(r);
	if (mode & 32) { /* any length, any bytes */
		len = in_u8(&in);
		for (i = 0; i < (int)len; i++)
			msg[i] ^= in_u8(&in);
	}
	nfds = in_u8(&in) % 7;
	if (nfds == 5) /* mostly what a REQ carries: two (bells) or four */
		nfds = 2;
	for (i = 0; i < nfds && i < 6; i++)
		fds[i] = make_fd(&in, &r, i);
	nbells = in_u8(&in) & 3;

	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) == 0,
		   "socketpair");
	iov = (struct iovec){ .iov_base = msg, .iov_len = len };
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	for (i = 0; i < nfds; i++)
		if (fds[i] < 0) /* a failed make: send the rest */
			fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (nfds) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	}
	for (i = 0; (mode & 1) && i < nbells; i++)
		(void)send(sp[0], "", 1, MSG_NOSIGNAL); /* SHM_BELL */
	if (len || nfds)
		(void)sendmsg(sp[0], &mh, MSG_NOSIGNAL);
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	if (mode & 64)
		close(sp[0]); /* the client hangs up too */

	rsk_opts_default(&o);
	detail[0] = 0;
	if (mode & 1) {
		/* a connected client reading its liveness channel */
		/* one record a call, as the engine reads them: the bells, then
		 * what follows */
		for (i = 0; i <= nbells; i++) {
			rc = eng_live_read(sp[1], detail, sizeof(detail));
			FUZZ_CHECK(rc >= LIVE_QUIET && rc <= LIVE_BAD,
				   "eng_live_read: %d", rc);
			if (rc != LIVE_QUIET)
				break;
		}
		FUZZ_CHECK(rc != LIVE_REJ || detail[0], "REJ without a reason");
		close(sp[1]);
	} else {
		/* accept(): takes sp[1] */
		rc = cm_accept_req(sp[1], &o, &res, detail, sizeof(detail));
		FUZZ_CHECK(rc <= 0 && rc > -4096, "cm_accept_req: %d", rc);
		if (rc == 0) {
			FUZZ_CHECK(res.qp && res.area && res.live_fd == sp[1],
				   "cm_accept_req: result");
			FUZZ_CHECK(ring_is_pow2(res.ring) && res.ring >= RSK_RING_MIN &&
					   res.ring <= RSK_RING_MAX &&
					   res.q >= RSK_QDEPTH_MIN &&
					   res.q <= RSK_QDEPTH_MAX &&
					   ring_is_pow2(res.peer_ring) &&
					   res.peer_q >= RSK_QDEPTH_MIN,
				   "geometry %u/%u peer %u/%u", res.ring, res.q,
				   res.peer_ring, res.peer_q);
			/* the adopted half is ours: touch all of it */
			memset(res.area, 0xa5, prov_area_len(res.q, res.ring));
			cm_result_release(&res);
		} else {
			FUZZ_CHECK(detail[0] != 0, "refused without a reason (%d)", rc);
		}
	}
	if (getenv("FUZZ_VERBOSE")) /* for seed maintenance */
		fprintf(stderr, "fuzz_handshake: %s: %d %s\n",
			mode & 1 ? "live_read" : "accept_req", rc, detail);
	if (!(mode & 64))
		close(sp[0]);
	shm_arena_trim(); /* no arena kept from one input to the next */
	rc = open_fds();
	FUZZ_CHECK(rc == baseline, "fd leak: %d open, %d before", rc, baseline);
	return 0;
}
