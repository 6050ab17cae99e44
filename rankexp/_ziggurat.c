/* The fast path of rankexp.seeding's ziggurat on the CPU, one pass over the weights.
 *
 * The same numbers as seeding._fast_path, bit for bit (tested): number n of the stream with
 * 64-bit key K is z = SplitMix64(K + (n+1)·γ); layer i = z & 255, the signed 53-bit
 * j = z >> 11 (arithmetic); the value is T(j)·w[i] in the weights' type T (float64: exact j,
 * one rounding; float32: j rounded to float32 once, then one float32 multiply), and the draw
 * is redone by the slow path (seeding._nfix, in torch) when |j| ≥ k[i].  No fast-math: every
 * operation is IEEE round-to-nearest as torch's.  target_clones picks AVX-512, AVX2 or the
 * baseline at load time, so one build runs on every x86-64 node of a cluster.
 *
 * rankexp_ziggurat_f64/f32(out, members, n, keys, offset, w, k, rej, cap, pos):
 *   out (members, n) row-major; keys (members,); w, k (256,); pos[0], pos[1] = member and
 *   element to start at, updated to where the call stopped: it stops early (pos < (members, 0))
 *   only when fewer than BLOCK slots are left in rej.  Returns the number of rejected flat
 *   indices e·n + s written to rej.
 */
#include <stdint.h>

#define BLOCK 4096
#define GAMMA 0x9E3779B97F4A7C15ULL

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

#define KERNEL(NAME, T)                                                                       \
    CLONES int64_t NAME(T *restrict out, int64_t members, int64_t n,                          \
                        const int64_t *restrict keys, int64_t offset, const T *restrict w,   \
                        const int64_t *restrict k, int64_t *restrict rej, int64_t cap,       \
                        int64_t *restrict pos) {                                             \
        unsigned char flags[BLOCK];                                                           \
        int64_t nrej = 0;                                                                     \
        for (int64_t e = pos[0]; e < members; e++) {                                          \
            const uint64_t key = (uint64_t)keys[e];                                           \
            T *restrict row = out + e * n;                                                    \
            for (int64_t s = (e == pos[0] ? pos[1] : 0); s < n; s += BLOCK) {                 \
                if (nrej + BLOCK > cap) {                                                     \
                    pos[0] = e;                                                               \
                    pos[1] = s;                                                               \
                    return nrej;                                                              \
                }                                                                             \
                const int64_t c = n - s < BLOCK ? n - s : BLOCK;                              \
                const uint64_t base = key + (uint64_t)(offset + s + 1) * GAMMA;               \
                for (int64_t i = 0; i < c; i++) {                                             \
                    uint64_t z = base + (uint64_t)i * GAMMA;                                  \
                    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;                              \
                    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;                              \
                    z ^= z >> 31;                                                             \
                    const int64_t layer = (int64_t)(z & 255u);                                \
                    const int64_t j = (int64_t)z >> 11;                                       \
                    row[s + i] = w[layer] * (T)j;                                             \
                    flags[i] = (j < 0 ? -j : j) >= k[layer];                                  \
                }                                                                             \
                for (int64_t i = 0; i < c; i++)                                               \
                    if (flags[i]) rej[nrej++] = e * n + s + i;                                \
            }                                                                                 \
        }                                                                                     \
        pos[0] = members;                                                                     \
        pos[1] = 0;                                                                           \
        return nrej;                                                                          \
    }

KERNEL(rankexp_ziggurat_f64, double)
KERNEL(rankexp_ziggurat_f32, float)

/* draws per block: a call needs at least this many free slots in rej to make progress */
int64_t rankexp_ziggurat_block(void) { return BLOCK; }
