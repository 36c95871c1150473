/*
 * test_verbs.c - the verbs provider end to end, through the public API.
 *
 * Without an RDMA device (this host: the kernel has no RDMA) it checks
 * the "no device" path: every entry point answers -ENODEV/-ENOSYS with one
 * clear sentence, nothing leaks.  With a device (the rxe guest, see
 * rdma/run-tests.sh) it runs a client and a server over rdma_cm on
 * RSOCK_VERBS_ADDR (default 10.77.0.1): bytes and checksums both ways,
 * EOF, a refused connection, and a peer that dies (fork + SIGKILL).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "rsock.h"
#include "tharness.h"

static struct rsk_addr addr;
static int have_dev;

static uint16_t next_port(void)
{
	static uint16_t p;

	if (!p)
		p = (uint16_t)(20000 + getpid() % 20000);
	return p++;
}

static void set_addr(uint16_t port)
{
	const char *a = getenv("RSOCK_VERBS_ADDR");

	memset(&addr, 0, sizeof(addr));
	addr.family = AF_INET;
	addr.port = port;
	inet_pton(AF_INET, a && *a ? a : "10.77.0.1", addr.addr);
}

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
	while (n--)
		h = (h ^ *p++) * 0x100000001b3ull;
	return h;
}

static void fill(uint8_t *b, size_t n, uint64_t off)
{
	size_t i;

	for (i = 0; i < n; i++)
		b[i] = (uint8_t)((off + i) * 2654435761u >> 13);
}

static void test_no_device(void)
{
	char why[200] = "";
	rsk_sock *s;
	int rc = rsk_verbs_probe(why, sizeof(why));

	CHECK(rc == -ENODEV || rc == -ENOSYS);
	CHECK(strstr(why, "verbs provider:") == why);
	printf("# probe: %s\n", why);
	CHECK_EQ(rsk_socket(&s), 0);
	set_addr(next_port());
	CHECK_EQ(rsk_listen_verbs(s, &addr, 8), rc);
	CHECK(strstr(rsk_detail(s), "verbs provider:") != NULL);
	CHECK_EQ(rsk_connect_verbs(s, NULL, &addr, 0, 1000), rc);
	rsk_free(s);
}

struct srv {
	rsk_sock *l;
	size_t total;
	uint64_t sum;
	int rc;
};

/* Accepts one connection, reads to EOF (checksum), echoes the sum back. */
static void *srv_main(void *arg)
{
	struct srv *v = arg;
	static uint8_t buf[1 << 20];
	rsk_sock *c;
	ssize_t n;

	v->rc = rsk_accept(v->l, 20000, &c, NULL, NULL);
	if (v->rc)
		return NULL;
	v->sum = 0xcbf29ce484222325ull;
	while ((n = rsk_recv(c, buf, sizeof(buf), 0, 20000)) > 0) {
		v->sum = fnv(v->sum, buf, (size_t)n);
		v->total += (size_t)n;
	}
	if (n < 0)
		v->rc = (int)n;
	else if (rsk_send(c, &v->sum, sizeof(v->sum), 0, 20000) != 8)
		v->rc = -EIO;
	rsk_close(c);
	rsk_free(c);
	return NULL;
}

static void test_stream(void)
{
	static uint8_t buf[300000];
	struct srv v = { 0 };
	pthread_t t;
	rsk_sock *c;
	uint64_t sum = 0xcbf29ce484222325ull, echo = 0;
	size_t sent = 0, total = 32u << 20;

	CHECK_EQ(rsk_socket(&v.l), 0);
	set_addr(next_port());
	CHECK_EQ(rsk_listen_verbs(v.l, &addr, 8), 0);
	CHECK_EQ(pthread_create(&t, NULL, srv_main, &v), 0);
	CHECK_EQ(rsk_socket(&c), 0);
	CHECK_EQ(rsk_connect_verbs(c, NULL, &addr, 0, 10000), 0);
	CHECK(strcmp(rsk_provider(c), "verbs") == 0);
	while (sent < total) {
		/* odd sizes: inline, staged, wrapping the staging area */
		size_t n = 1 + (sent * 7919) % sizeof(buf);
		ssize_t w;

		if (n > total - sent)
			n = total - sent;
		fill(buf, n, sent);
		w = rsk_send(c, buf, n, 0, 20000);
		CHECK_EQ(w, (ssize_t)n);
		sum = fnv(sum, buf, n);
		sent += n;
	}
	CHECK_EQ(rsk_shutdown(c, RSK_SHUT_WR), 0);
	CHECK_EQ(rsk_recv(c, &echo, sizeof(echo), RSK_F_WAITALL, 20000), 8);
	CHECK_EQ(rsk_recv(c, buf, 1, 0, 20000), 0); /* EOF */
	pthread_join(t, NULL);
	CHECK_EQ(v.rc, 0);
	CHECK_EQ(v.total, total);
	CHECK(v.sum == sum && echo == sum);
	rsk_free(c);
	rsk_free(v.l);
}

/* Like TCP, connect() completes before the server calls accept(). */
static void test_connect_before_accept(void)
{
	rsk_sock *l, *c[3], *a;
	char b[4];
	int i;

	CHECK_EQ(rsk_socket(&l), 0);
	set_addr(next_port());
	CHECK_EQ(rsk_listen_verbs(l, &addr, 8), 0);
	for (i = 0; i < 3; i++) {
		CHECK_EQ(rsk_socket(&c[i]), 0);
		CHECK_EQ(rsk_connect_verbs(c[i], NULL, &addr, 0, 10000), 0);
		CHECK_EQ(rsk_send(c[i], "ab", 2, 0, 5000), 2);
	}
	for (i = 0; i < 3; i++) {
		CHECK_EQ(rsk_accept(l, 10000, &a, NULL, NULL), 0);
		CHECK_EQ(rsk_recv(a, b, 2, RSK_F_WAITALL, 10000), 2);
		CHECK(memcmp(b, "ab", 2) == 0);
		rsk_free(a);
	}
	CHECK_EQ(rsk_accept(l, 0, &a, NULL, NULL), -EAGAIN);
	for (i = 0; i < 3; i++)
		rsk_free(c[i]);
	rsk_free(l);
}

static void test_refused(void)
{
	rsk_sock *c;

	CHECK_EQ(rsk_socket(&c), 0);
	set_addr(next_port()); /* nobody listens there */
	CHECK_EQ(rsk_connect_verbs(c, NULL, &addr, 0, 5000), -ECONNREFUSED);
	printf("# refused: %s\n", rsk_detail(c));
	rsk_free(c);
}

/* The peer process dies while we wait in recv: we learn it promptly. */
static void test_peer_death(void)
{
	rsk_sock *l, *c;
	char b;
	pid_t pid;
	struct timespec t0, t1;
	ssize_t n;
	double dt;

	CHECK_EQ(rsk_socket(&l), 0);
	set_addr(next_port());
	CHECK_EQ(rsk_listen_verbs(l, &addr, 8), 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* rdma-core's device state does not survive fork(): a fresh
		 * process (exec) plays the peer */
		char port[16];

		snprintf(port, sizeof(port), "%u", addr.port);
		execl("/proc/self/exe", "test_verbs", "child", port, (char *)NULL);
		_exit(127);
	}
	CHECK_EQ(rsk_accept(l, 20000, &c, NULL, NULL), 0);
	n = rsk_recv(c, &b, 1, 0, 20000);
	if (n != 1) {
		struct rsk_stats st;

		rsk_stats(c, &st);
		printf("# recv %zd: rx_msgs %llu rx_ctrl %llu completions %llu arms %llu sleeps %llu (%s)\n",
		       n, (unsigned long long)st.rx_msgs, (unsigned long long)st.rx_ctrl,
		       (unsigned long long)st.completions, (unsigned long long)st.arms,
		       (unsigned long long)st.sleeps, rsk_detail(c));
	}
	CHECK_EQ(n, 1);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kill(pid, SIGKILL);
	n = rsk_recv(c, &b, 1, 0, 30000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	dt = (double)(t1.tv_sec - t0.tv_sec) +
	     (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("# peer death seen after %.3f s: %zd\n", dt, n);
	waitpid(pid, NULL, 0);
	CHECK_EQ(n, -ECONNRESET);
	CHECK(dt < 10.0); /* software RDMA in an emulated guest: generous */
	rsk_free(c);
	rsk_free(l);
}

/* The peer of test_peer_death: connect, send one byte, wait to die. */
static int child_main(const char *port)
{
	rsk_sock *k;

	ssize_t n;
	int rc;

	set_addr((uint16_t)atoi(port));
	if (rsk_socket(&k))
		return 1;
	if ((rc = rsk_connect_verbs(k, NULL, &addr, 0, 10000))) {
		fprintf(stderr, "# child: connect: %s (%s)\n", strerror(-rc),
			rsk_detail(k));
		return 1;
	}
	if ((n = rsk_send(k, "x", 1, 0, 1000)) != 1)
		fprintf(stderr, "# child: send: %zd\n", n);
	pause();
	return 0;
}

int main(int argc, char **argv)
{
	char why[200] = "";

	if (argc == 3 && strcmp(argv[1], "child") == 0)
		return child_main(argv[2]);
	have_dev = rsk_verbs_probe(why, sizeof(why)) > 0;
	printf("# verbs: %s\n", why);
	if (!have_dev) {
		RUN(test_no_device);
		return th_summary();
	}
	if (getenv("ONLY_DEATH")) {
		RUN(test_peer_death);
		return th_summary();
	}
	RUN(test_stream);
	RUN(test_connect_before_accept);
	RUN(test_refused);
	RUN(test_peer_death);
	return th_summary();
}
