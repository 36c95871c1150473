/*
 * rs_peer.c - a small peer that uses librdmacm's rsocket API, for the
 * interop tests of `make test-rdma` (rdma/tests/).
 *
 *   rs_peer server PORT        accept one connection, read to EOF, answer
 *                              with the byte count and an FNV-1a checksum
 *   rs_peer client HOST PORT N send N bytes of a known pattern, shut down,
 *                              print the server's answer
 *
 * Prints one line "ok ..." or "error <where>: <strerror>" and exits 0/1.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
	while (n--)
		h = (h ^ *p++) * 0x100000001b3ull;
	return h;
}

static int fail(const char *where)
{
	printf("error %s: %s\n", where, strerror(errno));
	return 1;
}

static int server(int port, const char *dump)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	static uint8_t buf[65536];
	uint64_t sum = 0xcbf29ce484222325ull, total = 0, ans[2];
	int l, c, one = 1;
	ssize_t n;
	FILE *df = NULL;

	if ((l = rsocket(AF_INET, SOCK_STREAM, 0)) < 0)
		return fail("rsocket");
	rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (rbind(l, (struct sockaddr *)&a, sizeof(a)) || rlisten(l, 4))
		return fail("rbind/rlisten");
	printf("listening %d\n", port);
	fflush(stdout);
	if ((c = raccept(l, NULL, NULL)) < 0)
		return fail("raccept");
	if (dump && !(df = fopen(dump, "wb")))
		return fail("fopen");
	while ((n = rrecv(c, buf, sizeof(buf), 0)) > 0) {
		sum = fnv(sum, buf, (size_t)n);
		total += (uint64_t)n;
		if (df && fwrite(buf, 1, (size_t)n, df) != (size_t)n)
			return fail("fwrite");
	}
	if (df)
		fclose(df);
	if (n < 0)
		return fail("rrecv");
	ans[0] = total;
	ans[1] = sum;
	if (rsend(c, ans, sizeof(ans), 0) != sizeof(ans))
		return fail("rsend");
	rshutdown(c, SHUT_RDWR);
	rclose(c);
	rclose(l);
	printf("ok %llu bytes sum %016llx\n", (unsigned long long)total,
	       (unsigned long long)sum);
	return 0;
}

static int client(const char *host, int port, size_t total)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	static uint8_t buf[65536];
	uint64_t sum = 0xcbf29ce484222325ull, ans[2] = { 0, 0 };
	size_t sent = 0, got = 0, i;
	int c;
	ssize_t n;

	inet_pton(AF_INET, host, &a.sin_addr);
	if ((c = rsocket(AF_INET, SOCK_STREAM, 0)) < 0)
		return fail("rsocket");
	if (rconnect(c, (struct sockaddr *)&a, sizeof(a)))
		return fail("rconnect");
	while (sent < total) {
		size_t k = total - sent < sizeof(buf) ? total - sent : sizeof(buf);

		for (i = 0; i < k; i++)
			buf[i] = (uint8_t)((sent + i) * 131u);
		sum = fnv(sum, buf, k);
		if (rsend(c, buf, k, 0) != (ssize_t)k)
			return fail("rsend");
		sent += k;
	}
	rshutdown(c, SHUT_WR);
	while (got < sizeof(ans) &&
	       (n = rrecv(c, (uint8_t *)ans + got, sizeof(ans) - got, 0)) > 0)
		got += (size_t)n;
	rclose(c);
	if (got != sizeof(ans))
		return fail("rrecv");
	printf("ok sent %zu sum %016llx; peer got %llu sum %016llx\n", total,
	       (unsigned long long)sum, (unsigned long long)ans[0],
	       (unsigned long long)ans[1]);
	return ans[0] == total && ans[1] == sum ? 0 : 1;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((argc == 3 || argc == 4) && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]), argc == 4 ? argv[3] : NULL);
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), (size_t)atoll(argv[4]));
	fprintf(stderr, "usage: rs_peer server PORT [DUMPFILE] | client HOST PORT N\n");
	return 2;
}
