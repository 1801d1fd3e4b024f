/* Counter-based random numbers: a value is a pure function of
 * (seed, stream, index), so any rank can draw the numbers of any block or
 * sample without drawing anything before them. The mixer is SplitMix64's
 * finaliser applied to a combination of the three words. */
#include <math.h>
#include "dynmo/core.h"

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t dm_hash64(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
    h = mix64(h ^ (stream + 0x632be59bd9b4e019ULL));
    return mix64(h ^ (index + 0x85ebca77c2b2ae63ULL));
}

float dm_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return (float)(dm_hash64(seed, stream, index) >> 40) * (1.0f / 16777216.0f);
}

float dm_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    /* Box-Muller on two 53-bit uniforms drawn from one counter. */
    uint64_t a = dm_hash64(seed, stream, 2 * index);
    uint64_t b = dm_hash64(seed, stream, 2 * index + 1);
    double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}
