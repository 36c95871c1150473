/* tharness.h - a tiny test harness for the C tests (TAP-like output). */
#ifndef THARNESS_H
#define THARNESS_H
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int th_failed, th_run;

#define CHECK(cond)                                                          \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #cond);                            \
			th_failed++;                                         \
			return;                                              \
		}                                                            \
	} while (0)

#define CHECK_EQ(a, b)                                                       \
	do {                                                                 \
		long long _a = (long long)(a), _b = (long long)(b);          \
		if (_a != _b) {                                              \
			fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", \
				__FILE__, __LINE__, #a, _a, #b, _b);         \
			th_failed++;                                         \
			return;                                              \
		}                                                            \
	} while (0)

#define RUN(fn)                                                              \
	do {                                                                 \
		int _f = th_failed;                                          \
		th_run++;                                                    \
		alarm(60); /* hang guard */                                  \
		fn();                                                        \
		alarm(0);                                                    \
		printf("%s %s\n", _f == th_failed ? "ok  " : "FAIL", #fn);   \
		fflush(stdout);                                              \
	} while (0)

static inline int th_summary(void)
{
	printf("%d passed, %d failed\n", th_run - th_failed, th_failed);
	return th_failed ? 1 : 0;
}
#endif
