/*
 * fuzz_input.h - what the fuzz harnesses share: reading an input as little-
 * endian integers and bytes (zeros once it runs out), and the check that
 * aborts with a sentence (so that libFuzzer and replay.c keep the input).
 * FUZZ_NAME names the harness in the message.
 */
#ifndef FUZZ_INPUT_H
#define FUZZ_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond, ...)                                            \
	do {                                                             \
		if (!(cond)) {                                           \
			fprintf(stderr, "%s: check failed: %s: ",        \
				FUZZ_NAME, #cond);                       \
			fprintf(stderr, __VA_ARGS__);                    \
			fputc('\n', stderr);                             \
			abort();                                         \
		}                                                        \
	} while (0)

struct input {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t in_u8(struct input *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

/* one read per statement (the order of the reads in one expression is
 * unspecified) */
static inline uint16_t in_u16(struct input *in)
{
	uint16_t lo = in_u8(in);

	return (uint16_t)(lo | in_u8(in) << 8);
}

static inline uint32_t in_u32(struct input *in)
{
	uint32_t lo = in_u16(in);

	return lo | (uint32_t)in_u16(in) << 16;
}

static inline uint64_t in_u64(struct input *in)
{
	uint64_t lo = in_u32(in);

	return lo | (uint64_t)in_u32(in) << 32;
}

/* n bytes of input (zeros once it runs out) */
static inline void in_bytes(struct input *in, uint8_t *dst, size_t n)
{
	size_t k = n < in->n ? n : in->n;

	memcpy(dst, in->p, k);
	memset(dst + k, 0, n - k);
	in->p += k;
	in->n -= k;
}

#endif
