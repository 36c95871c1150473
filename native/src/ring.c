// SPDX-License-Identifier: MIT
#include "ring.h"

uint32_t ring_contig_space(uint64_t head, uint64_t tail, uint32_t size)
{
	uint64_t space = ring_space(head, tail, size);
	uint64_t to_end = size - ring_off(tail, size);

	return (uint32_t)(space < to_end ? space : to_end);
}

uint32_t ring_contig_data(uint64_t head, uint64_t tail, uint32_t size)
{
	uint64_t used = ring_used(head, tail);
	uint64_t to_end = size - ring_off(head, size);

	return (uint32_t)(used < to_end ? used : to_end);
}

int ring_msg_fits(uint64_t head, uint64_t tail, uint32_t size, uint64_t len)
{
	if (tail < head || tail - head > size)
		return 0;
	if (len == 0 || len > ring_space(head, tail, size))
		return 0;
	return len <= (uint64_t)size - ring_off(tail, size);
}

uint32_t ring_roundup_pow2(uint32_t x)
{
	uint32_t p = 1;

	if (x == 0 || x > (1u << 31))
		return 0;
	while (p < x)
		p <<= 1;
	return p;
}
