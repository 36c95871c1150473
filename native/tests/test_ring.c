// SPDX-License-Identifier: MIT
#include "ring.h"
#include "tharness.h"

static void t_basic(void)
{
	CHECK_EQ(ring_off(4097, 4096), 1);
	CHECK_EQ(ring_used(10, 30), 20);
	CHECK_EQ(ring_space(10, 30, 64), 44);
	CHECK(ring_is_pow2(4096));
	CHECK(!ring_is_pow2(4095));
	CHECK(!ring_is_pow2(0));
	CHECK_EQ(ring_roundup_pow2(5000), 8192);
	CHECK_EQ(ring_roundup_pow2(4096), 4096);
	CHECK_EQ(ring_roundup_pow2(0), 0);
	CHECK_EQ(ring_roundup_pow2(0x80000001u), 0);
}

static void t_contig(void)
{
	/* empty ring, tail in the middle: space runs to the end */
	CHECK_EQ(ring_contig_space(100, 100, 256), 156);
	/* full ring */
	CHECK_EQ(ring_contig_space(0, 256, 256), 0);
	/* wrapped: free space before head is not contiguous with the tail */
	CHECK_EQ(ring_contig_space(250, 300, 256), 206);
	CHECK_EQ(ring_contig_space(200, 250, 256), 6);
	CHECK_EQ(ring_contig_data(250, 300, 256), 6);
	CHECK_EQ(ring_contig_data(256, 300, 256), 44);
	CHECK_EQ(ring_contig_data(5, 5, 256), 0);
	/* positions past 2^32 behave the same */
	CHECK_EQ(ring_contig_data((1ull << 33) + 250, (1ull << 33) + 300, 256), 6);
}

static void t_fits(void)
{
	CHECK(ring_msg_fits(0, 0, 256, 256));
	CHECK(!ring_msg_fits(0, 0, 256, 257));
	CHECK(!ring_msg_fits(0, 0, 256, 0));
	CHECK(!ring_msg_fits(0, 100, 256, 157)); /* space 156 */
	CHECK(ring_msg_fits(0, 100, 256, 156));
	CHECK(!ring_msg_fits(200, 250, 256, 7));  /* would wrap */
	CHECK(ring_msg_fits(200, 250, 256, 6));
	CHECK(!ring_msg_fits(300, 200, 256, 1));  /* tail behind head */
	CHECK(!ring_msg_fits(0, 257, 256, 1));    /* more used than size */
	CHECK(!ring_msg_fits(0, 0, 256, 1ull << 40));
}

/* exhaustive walk: contig pieces always add up to used/space */
static void t_walk(void)
{
	const uint32_t size = 64;
	uint64_t head, tail;

	for (head = 0; head < 3 * size; head++)
		for (tail = head; tail <= head + size; tail++) {
			uint32_t d = ring_contig_data(head, tail, size);
			uint32_t s = ring_contig_space(head, tail, size);
			uint64_t d2 = ring_contig_data(head + d, tail, size);
			uint64_t s2 = ring_contig_space(head, tail + s, size);

			CHECK_EQ(d + d2, tail - head);
			CHECK_EQ(s + s2, size - (tail - head));
			CHECK(ring_off(head, size) + d <= size);
			CHECK(ring_off(tail, size) + s <= size);
		}
}

int main(void)
{
	RUN(t_basic);
	RUN(t_contig);
	RUN(t_fits);
	RUN(t_walk);
	return th_summary();
}
