// SPDX-License-Identifier: MIT
/*
 * clock.c - monotonic time and deadlines (a leaf: no other rsock file).
 */
#include <stdint.h>
#include <time.h>

#include "engine.h"

int64_t eng_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t eng_deadline(int timeout_ms)
{
	if (timeout_ms < 0)
		return -1;
	return eng_now_ns() + (int64_t)timeout_ms * 1000000;
}

/* Milliseconds until deadline for epoll_wait (-1 = forever, rounded up). */
int eng_ms_left(int64_t deadline)
{
	int64_t left;

	if (deadline < 0)
		return -1;
	left = deadline - eng_now_ns();
	if (left <= 0)
		return 0;
	left = (left + 999999) / 1000000;
	return left > 1000000000 ? 1000000000 : (int)left;
}
