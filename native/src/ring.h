/*
 * ring.h - byte-ring arithmetic shared by the engine and its tests.
 *
 * Positions are free-running 64-bit byte counters (never wrapped); the
 * offset inside a ring of power-of-two size is pos & (size - 1).  With
 * head <= tail and tail - head <= size, everything below is exact.
 */
#ifndef RSK_RING_H
#define RSK_RING_H

#include <stdint.h>

static inline int ring_is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

static inline uint32_t ring_off(uint64_t pos, uint32_t size)
{
	return (uint32_t)(pos & (uint64_t)(size - 1));
}

/* Bytes between head and tail, i.e. written and not yet consumed. */
static inline uint64_t ring_used(uint64_t head, uint64_t tail)
{
	return tail - head;
}

/* Free bytes a writer at tail may still fill. */
static inline uint64_t ring_space(uint64_t head, uint64_t tail, uint32_t size)
{
	return (uint64_t)size - (tail - head);
}

/* Longest run a writer can place at tail without wrapping, capped by the
 * free space. */
uint32_t ring_contig_space(uint64_t head, uint64_t tail, uint32_t size);
/* Longest contiguous readable run starting at head. */
uint32_t ring_contig_data(uint64_t head, uint64_t tail, uint32_t size);
/* Does a message of len bytes placed at tail stay inside the ring without
 * wrapping and without overrunning unconsumed data?  Used to check what the
 * peer claims to have written. */
int ring_msg_fits(uint64_t head, uint64_t tail, uint32_t size, uint64_t len);
/* Smallest power of two >= x (x <= 2^31), 0 if x is 0 or too large. */
uint32_t ring_roundup_pow2(uint32_t x);

#endif
