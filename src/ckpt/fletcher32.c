/* Fletcher-32 exactly as HDF5's checksum filter (H5Z_FILTER_FLETCHER32)
 * computes it, for the checkpoint writer's direct chunk writes: it
 * assembles each chunk, appends this checksum and hands HDF5 the finished
 * bytes, so that HDF5's own filter (in h5py, h5dump and our loader)
 * verifies them on read. It must stay bit-identical to HDF5's; the tests
 * compare it with chunks HDF5 filtered itself. Pure; no I/O.
 *
 * The definition: the data are big-endian 16-bit words w_1..w_n (an odd
 * last byte b counts as the word b << 8); sum1 = sum of the w_i and sum2 =
 * sum of the running sum1, each reduced modulo 65535 with end-around
 * carry, so that a sum is 0 only when every word is 0 and 65535 when it is
 * a non-zero multiple of 65535; the checksum is (sum2 << 16) | sum1, and
 * the filter stores it little-endian after the chunk. HDF5 adds one word
 * at a time; this adds stripes of words in lanes, a form the compiler
 * vectorises into additions only (twice the block form's speed, 6 GB/s). */
#include <stdint.h>
#include <string.h>
#include "ckpt/ckpt_file.h"

/* Words per block: the block sums a = sum w and b = sum (n - i) w fit in
 * 32 bits for n <= 256 (65535 * 256 * 257 / 2 < 2^32). */
#define BLOCK_WORDS 256

/* The lane form: words are dealt round-robin to LANES lanes, and lane l
 * keeps A_l = sum of its words and B_l = sum of its running A_l, which is
 * additions only and vectorises fully (a multiply per word, as the block
 * form has, does not). ROUNDS words per lane keep B_l within 32 bits
 * (65535 * 256 * 257 / 2 < 2^32). Word i of a stripe of n = LANES * ROUNDS
 * words sits in lane i % LANES, round i / LANES, and weighs
 * n - i = LANES * (ROUNDS - round) - lane, so the stripe's weighted sum is
 * LANES * sum B_l - sum l * A_l. */
#define LANES 16
#define ROUNDS 256
#define STRIPE_WORDS (LANES * ROUNDS)

/* Eight big-endian words, and eight 32-bit lanes (GCC vector types: one
 * SSE and one AVX register, or two SSE registers without AVX). */
typedef uint16_t words8 __attribute__((vector_size(16)));
typedef uint32_t lanes8 __attribute__((vector_size(32)));

/* Adds one stripe to the running sums (modulo 65535). Lanes 0-7 take the
 * first eight words of each round, lanes 8-15 the next eight. */
static void add_stripe(const uint8_t *p, uint64_t *sum1, uint64_t *sum2, uint32_t *nonzero)
{
    lanes8 a_low = {0}, a_high = {0}, b_low = {0}, b_high = {0};
    for (int round = 0; round < ROUNDS; round++, p += 2 * LANES) {
        words8 low, high;
        memcpy(&low, p, sizeof low);
        memcpy(&high, p + sizeof low, sizeof high);
        low = (words8)(low >> 8 | low << 8);
        high = (words8)(high >> 8 | high << 8);
        a_low += __builtin_convertvector(low, lanes8);
        a_high += __builtin_convertvector(high, lanes8);
        b_low += a_low;
        b_high += a_high;
    }
    uint64_t a = 0, b = 0;
    for (int l = 0; l < LANES / 2; l++) {
        a += (uint64_t)a_low[l] + a_high[l];
        b += (uint64_t)LANES * b_low[l] - (uint64_t)l * a_low[l];
        b += (uint64_t)LANES * b_high[l] - (uint64_t)(l + LANES / 2) * a_high[l];
        *nonzero |= a_low[l] | a_high[l];
    }
    *sum2 = (*sum2 + (uint64_t)STRIPE_WORDS * *sum1 + b) % 65535;
    *sum1 = (*sum1 + a) % 65535;
}

uint32_t ckpt_fletcher32(const void *data, size_t bytes)
{
    const uint8_t *p = data;
    size_t words = bytes / 2;
    uint64_t sum1 = 0, sum2 = 0;     /* modulo 65535 */
    uint32_t nonzero = 0;
    for (; words >= STRIPE_WORDS; words -= STRIPE_WORDS, p += 2 * STRIPE_WORDS)
        add_stripe(p, &sum1, &sum2, &nonzero);
    while (words > 0) {
        uint32_t n = words < BLOCK_WORDS ? (uint32_t)words : BLOCK_WORDS;
        uint32_t a = 0, b = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t w = ((uint32_t)p[2 * i] << 8) | p[2 * i + 1];
            a += w;
            b += w * (n - i);
        }
        nonzero |= a;
        /* After n more words: sum2 gains n copies of the old sum1 plus the
         * weighted block sum; sum1 gains the block sum. */
        sum2 = (sum2 + (uint64_t)n * sum1 + b) % 65535;
        sum1 = (sum1 + a) % 65535;
        p += 2 * (size_t)n;
        words -= n;
    }
    if (bytes % 2) {
        uint32_t w = (uint32_t)p[0] << 8;
        nonzero |= w;
        sum1 = (sum1 + w) % 65535;
        sum2 = (sum2 + sum1) % 65535;
    }
    uint32_t low = nonzero ? (sum1 ? (uint32_t)sum1 : 65535) : 0;
    uint32_t high = nonzero ? (sum2 ? (uint32_t)sum2 : 65535) : 0;
    return (high << 16) | low;
}
