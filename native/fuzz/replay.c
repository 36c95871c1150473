// SPDX-License-Identifier: MIT
/*
 * replay.c - a main() for the fuzz harnesses without libFuzzer (gcc).
 *
 *   harness [-seconds=S] [-runs=N] [-seed=X] [-artifact_prefix=P] FILE|DIR...
 *
 * Runs every input once (the seed corpus: a regression test), then, while
 * the time (default 0 s) and run budgets last, random mutations of them:
 * bit flips, interesting bytes, inserts, erases, copies and splices.  Not
 * coverage-guided (use libFuzzer for that: `make fuzz`), but it needs only
 * gcc with ASan/UBSan, so `make check` can run it.  On a sanitizer error or
 * a failed check the input being run is written to P crash-<pid>.bin first.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sanitizer/common_interface_defs.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_LEN 4096

struct blob {
	uint8_t *d;
	size_t n;
};

static struct blob *inputs;
static size_t ninputs, cap;
static uint8_t cur[MAX_LEN];
static size_t cur_n;
static const char *artifact_prefix = "";

static void add_input(uint8_t *d, size_t n)
{
	if (ninputs == cap) {
		cap = cap ? cap * 2 : 64;
		inputs = realloc(inputs, cap * sizeof(*inputs));
		if (!inputs)
			abort();
	}
	inputs[ninputs++] = (struct blob){ d, n };
}

static void load_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *d;
	size_t n;

	if (!f) {
		perror(path);
		exit(2);
	}
	d = malloc(MAX_LEN);
	if (!d)
		abort();
	n = fread(d, 1, MAX_LEN, f);
	fclose(f);
	add_input(d, n);
}

static void load(const char *path)
{
	struct stat st;
	struct dirent *e;
	char sub[4096];
	DIR *dir;

	if (stat(path, &st) < 0) {
		perror(path);
		exit(2);
	}
	if (!S_ISDIR(st.st_mode)) {
		load_file(path);
		return;
	}
	dir = opendir(path);
	if (!dir) {
		perror(path);
		exit(2);
	}
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.') {
			snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
			load(sub);
		}
	closedir(dir);
}

/* A sanitizer error or an abort() (a harness check): keep the input. */
static void on_death(void)
{
	static int saved;
	char name[4096];
	int fd;

	if (saved++)
		return;
	snprintf(name, sizeof(name), "%scrash-%d.bin", artifact_prefix, (int)getpid());
	fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd >= 0) {
		(void)!write(fd, cur, cur_n);
		close(fd);
		fprintf(stderr, "replay: the failing input is in %s\n", name);
	}
}

static void on_abort(int sig)
{
	on_death();
	signal(sig, SIG_DFL);
	raise(sig);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return n ? (uint32_t)(rng % n) : 0;
}

static void mutate(void)
{
	static const uint8_t interesting[] = { 0, 1, 2, 7, 15, 16, 17, 31, 32,
					       63, 64, 127, 128, 255 };
	int k, rounds = 1 + (int)rnd(8);
	size_t at, n;

	for (k = 0; k < rounds; k++) {
		at = cur_n ? rnd((uint32_t)cur_n) : 0;
		switch (rnd(7)) {
		case 0: /* flip a bit */
			if (cur_n)
				cur[at] ^= (uint8_t)(1u << rnd(8));
			break;
		case 1: /* an interesting byte */
			if (cur_n)
				cur[at] = interesting[rnd(sizeof(interesting))];
			break;
		case 2: /* a random byte */
			if (cur_n)
				cur[at] = (uint8_t)rnd(256);
			break;
		case 3: /* insert */
			n = 1 + rnd(8);
			if (cur_n + n <= MAX_LEN) {
				memmove(cur + at + n, cur + at, cur_n - at);
				for (size_t i = 0; i < n; i++)
					cur[at + i] = (uint8_t)rnd(256);
				cur_n += n;
			}
			break;
		case 4: /* erase */
			n = 1 + rnd(8);
			if (at + n <= cur_n) {
				memmove(cur + at, cur + at + n, cur_n - at - n);
				cur_n -= n;
			}
			break;
		case 5: { /* copy a chunk within */
			size_t from = cur_n ? rnd((uint32_t)cur_n) : 0;

			n = 1 + rnd(16);
			if (from + n <= cur_n && at + n <= cur_n)
				memmove(cur + at, cur + from, n);
			break;
		}
		default: { /* splice: the tail of another input */
			struct blob *o = &inputs[rnd((uint32_t)ninputs)];
			size_t from = o->n ? rnd((uint32_t)o->n) : 0;

			n = o->n - from;
			if (at + n > MAX_LEN)
				n = MAX_LEN - at;
			memcpy(cur + at, o->d + from, n);
			cur_n = at + n;
			break;
		}
		}
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double seconds = 0, t0, el;
	long long runs = -1, done = 0;
	size_t i;
	int a;

	for (a = 1; a < argc; a++) {
		if (!strncmp(argv[a], "-seconds=", 9))
			seconds = atof(argv[a] + 9);
		else if (!strncmp(argv[a], "-runs=", 6))
			runs = atoll(argv[a] + 6);
		else if (!strncmp(argv[a], "-artifact_prefix=", 17))
			artifact_prefix = argv[a] + 17;
		else if (!strncmp(argv[a], "-seed=", 6))
			rng = strtoull(argv[a] + 6, NULL, 0) | 1;
		else if (argv[a][0] == '-')
			fprintf(stderr, "replay: ignoring %s\n", argv[a]);
		else
			load(argv[a]);
	}
	if (!ninputs) {
		fprintf(stderr,
			"usage: %s [-seconds=S] [-runs=N] [-seed=X] [-artifact_prefix=P] "
			"FILE|DIR...\n",
			argv[0]);
		return 2;
	}
	__sanitizer_set_death_callback(on_death);
	signal(SIGABRT, on_abort);
	t0 = now_s();
	for (i = 0; i < ninputs; i++) {
		memcpy(cur, inputs[i].d, inputs[i].n);
		cur_n = inputs[i].n;
		LLVMFuzzerTestOneInput(cur, cur_n);
	}
	el = now_s() - t0;
	printf("replay: %zu corpus inputs in %.2f s\n", ninputs, el);
	t0 = now_s();
	/* mutations: for -runs=N runs and/or -seconds=S, whichever ends first */
	while ((runs >= 0 || seconds > 0) && (runs < 0 || done < runs) &&
	       (seconds <= 0 || now_s() - t0 < seconds)) {
		struct blob *b = &inputs[rnd((uint32_t)ninputs)];

		memcpy(cur, b->d, b->n);
		cur_n = b->n;
		mutate();
		LLVMFuzzerTestOneInput(cur, cur_n);
		done++;
	}
	el = now_s() - t0;
	if (done)
		printf("replay: %lld mutated runs in %.1f s (%.0f exec/s)\n", done, el,
		       el > 0 ? (double)done / el : 0.0);
	return 0;
}
