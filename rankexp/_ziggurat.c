/* rankexp.seeding's ziggurat on the CPU, one pass over the weights, slow path included.
 *
 * The same numbers as seeding.normal_many_'s torch path, bit for bit (tested): number n of the
 * stream with 64-bit key K is z = SplitMix64(K + (n+1)·γ); layer i = z & 255, the signed 53-bit
 * j = z >> 11 (arithmetic); the value is T(j)·w[i] in the weights' type T (float64: exact j,
 * one rounding; float32: j rounded to float32 once, then one float32 multiply) when |j| < k[i],
 * else Marsaglia & Tsang's nfix (seeding._nfix) in float64 with uniforms from counters
 * n + t·2⁴⁸, its exp and log those of seeding.exact_exp/exact_log (IEEE-exact steps, constants
 * passed in from seeding.slow_path_constants), the value scaled and rounded to T once.  No
 * fast-math, no FMA contraction (-ffp-contract=off): every operation rounds as torch's.
 * target_clones picks AVX-512, AVX2 or the baseline at load time, so one build runs on every
 * x86-64 node of a cluster.
 *
 * rankexp_ziggurat_f64/f32(out, members, n, keys, offset, w, k, w64, f64, scale, c):
 *   out (members, n) row-major; keys (members,); w (256,) the scaled table in T; k (256,)
 *   int64 thresholds; w64, f64 (256,) the unscaled float64 tables; c the constants.
 *   Returns the number of draws that took the slow path.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 4096
#define GAMMA 0x9E3779B97F4A7C15ULL
#define SPAN (1LL << 48)
#define EXP_TERMS 14
#define LOG_TERMS 12
#define EXP_DOMAIN 60
/* c[]: r, sqrt(1/2), ln2_hi, ln2_lo, 1/ln2, EXP_TERMS exp coefficients, LOG_TERMS log ones */
#define C_R 0
#define C_SQRT_HALF 1
#define C_LN2_HI 2
#define C_LN2_LO 3
#define C_INV_LN2 4
#define C_EXP 5
#define C_LOG (C_EXP + EXP_TERMS)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t bits(uint64_t key, int64_t counter) {
    return mix(key + (uint64_t)(counter + 1) * GAMMA);
}

static inline double uniform53(uint64_t z) { return ((double)(z >> 11) + 0.5) * 0x1p-53; }

static inline double from_bits(uint64_t b) {
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static inline uint64_t to_bits(double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

/* seeding.horner: sum of a[i] x^i, highest degree first, p·x + a[i] (a multiply, then an add) */
#define INLINE static inline __attribute__((always_inline))
INLINE double horner(double x, const double *a, int n) {
    double p = a[n - 1];
#pragma GCC unroll 16
    for (int i = n - 2; i >= 0; i--) p = p * x + a[i];
    return p;
}

/* seeding.exact_exp: y in [-EXP_DOMAIN ln 2, 0].  round-half-even by the 1.5·2^52 trick
 * (exact for |v| < 2^51: torch.round's value), 2^-down built from its bits (exact) */
INLINE double exact_exp(double y, const double *c) {
    const double k = (y * c[C_INV_LN2] + 0x1.8p52) - 0x1.8p52;
    const double r = (y - k * c[C_LN2_HI]) - k * c[C_LN2_LO];
    const double p = horner(r, c + C_EXP, EXP_TERMS);
    int64_t down = (int64_t)(-k);
    down = down < 0 ? 0 : (down > EXP_DOMAIN ? EXP_DOMAIN : down);
    return p * from_bits((uint64_t)(1023 - down) << 52);
}

/* seeding.exact_log: u > 0 and normal (a uniform53 is ≥ 2^-54); frexp from the bits */
INLINE double exact_log(double u, const double *c) {
    const uint64_t b = to_bits(u);
    int64_t e = (int64_t)((b >> 52) & 0x7ff) - 1022;
    const double m0 = from_bits((b & 0x000fffffffffffffULL) | (1022ULL << 52)); /* in [1/2, 1) */
    const int low = m0 < c[C_SQRT_HALF];
    const double m = low ? m0 + m0 : m0;
    e -= low;
    const double f = m - 1.0;
    const double s = f / (f + 2.0);
    const double q = horner(s * s, c + C_LOG, LOG_TERMS);
    const double de = (double)e;
    return de * c[C_LN2_HI] + (de * c[C_LN2_LO] + (s + s) * q);
}

/* seeding._nfix for one draw from try t0 on (t0 = 1: its first): the tail beyond r (layer 0)
 * and the wedges */
static double nfix(uint64_t key, int64_t counter, int64_t layer, int64_t j, int64_t t0,
                   const double *w64, const double *f64, const int64_t *k, const double *c) {
    const double r = c[C_R];
    for (int64_t t = t0; t < SPAN / 2; t += 2) {
        const double u1 = uniform53(bits(key, counter + t * SPAN));
        const uint64_t z2 = bits(key, counter + (t + 1) * SPAN);
        if (layer == 0) { /* the tail: x = -ln(u1)/r, accepted when -2 ln(u2) > x^2 */
            const double xt = -exact_log(u1, c) / r;
            if (exact_log(uniform53(z2), c) * -2.0 > xt * xt) return (j < 0 ? -1.0 : 1.0) * (r + xt);
            continue; /* a tail stays in the tail */
        }
        const double x = (double)j * w64[layer];
        const double fi = f64[layer], fb = f64[layer - 1];
        if (u1 * (fb - fi) + fi < exact_exp((-0.5 * x) * x, c)) return x;
        const int64_t l2 = (int64_t)(z2 & 255u), j2 = (int64_t)z2 >> 11;
        if ((j2 < 0 ? -j2 : j2) < k[l2]) return (double)j2 * w64[l2];
        layer = l2;
        j = j2;
    }
    return NAN;
}

/* nfix of the draws with counters cnt[0 … n) of the stream key (n ≤ BATCH) into v: their first
 * try in loops the compiler vectorizes (its exp and both logs for every draw: cheaper than
 * branching), the decisions after, the rare later tries one by one (the same numbers as nfix) */
#define BATCH 256
INLINE void nfix_batch(uint64_t key, const int64_t *restrict cnt, int64_t n,
                       const double *restrict w64, const double *restrict f64,
                       const int64_t *restrict k, const double *restrict c, double *restrict v) {
    int64_t lay[BATCH], jj[BATCH];
    uint64_t z2[BATCH];
    double u1[BATCH], x[BATCH], ex[BATCH], l1[BATCH], l2[BATCH];
    for (int64_t i = 0; i < n; i++) {
        const uint64_t z = bits(key, cnt[i]);
        lay[i] = (int64_t)(z & 255u);
        jj[i] = (int64_t)z >> 11;
        u1[i] = uniform53(bits(key, cnt[i] + SPAN));
        z2[i] = bits(key, cnt[i] + 2 * SPAN);
        x[i] = (double)jj[i] * w64[lay[i]];
    }
    for (int64_t i = 0; i < n; i++) ex[i] = exact_exp((-0.5 * x[i]) * x[i], c);
    for (int64_t i = 0; i < n; i++) l1[i] = exact_log(u1[i], c);
    for (int64_t i = 0; i < n; i++) l2[i] = exact_log(uniform53(z2[i]), c);
    const double r = c[C_R];
    for (int64_t i = 0; i < n; i++) {
        if (lay[i] == 0) {
            const double xt = -l1[i] / r;
            v[i] = l2[i] * -2.0 > xt * xt ? (jj[i] < 0 ? -1.0 : 1.0) * (r + xt)
                                          : nfix(key, cnt[i], 0, jj[i], 3, w64, f64, k, c);
            continue;
        }
        const double fi = f64[lay[i]], fb = f64[lay[i] - 1];
        if (u1[i] * (fb - fi) + fi < ex[i]) {
            v[i] = x[i];
            continue;
        }
        const int64_t lb = (int64_t)(z2[i] & 255u), jb = (int64_t)z2[i] >> 11;
        v[i] = (jb < 0 ? -jb : jb) < k[lb] ? (double)jb * w64[lb]
                                           : nfix(key, cnt[i], lb, jb, 3, w64, f64, k, c);
    }
}

/* the slow path of the nr draws collected in rc, written into row (the kernel's locals) */
#define FLUSH(T)                                                                              \
    do {                                                                                      \
        nfix_batch(key, rc, nr, w64, f64, k, c, rv);                                          \
        for (int64_t q = 0; q < nr; q++) row[rc[q] - offset] = (T)(rv[q] * scale);            \
        slow += nr;                                                                           \
        nr = 0;                                                                               \
    } while (0)

#define KERNEL(NAME, T)                                                                       \
    CLONES int64_t NAME(T *restrict out, int64_t members, int64_t n,                          \
                        const int64_t *restrict keys, int64_t offset, const T *restrict w,   \
                        const int64_t *restrict k, const double *restrict w64,               \
                        const double *restrict f64, double scale, const double *restrict c) { \
        unsigned char flags[BLOCK];                                                           \
        int64_t rc[BATCH];                                                                    \
        double rv[BATCH];                                                                     \
        int64_t slow = 0;                                                                     \
        for (int64_t e = 0; e < members; e++) {                                               \
            const uint64_t key = (uint64_t)keys[e];                                           \
            T *restrict row = out + e * n;                                                    \
            for (int64_t s = 0; s < n; s += BLOCK) {                                          \
                const int64_t cnt = n - s < BLOCK ? n - s : BLOCK;                            \
                const uint64_t base = key + (uint64_t)(offset + s + 1) * GAMMA;               \
                for (int64_t i = 0; i < cnt; i++) {                                           \
                    const uint64_t z = mix(base + (uint64_t)i * GAMMA);                       \
                    const int64_t layer = (int64_t)(z & 255u);                                \
                    const int64_t j = (int64_t)z >> 11;                                       \
                    row[s + i] = w[layer] * (T)j;                                             \
                    flags[i] = (j < 0 ? -j : j) >= k[layer];                                  \
                }                                                                             \
                for (int64_t i = cnt; i < BLOCK; i++) flags[i] = 0;                           \
                int64_t nr = 0;                                                               \
                for (int64_t i = 0; i < cnt; i++) {                                           \
                    if ((i & 7) == 0) { /* ≈ 89 % of 8-draw words need no slow path */       \
                        uint64_t word;                                                        \
                        memcpy(&word, flags + i, 8);                                          \
                        if (!word) {                                                          \
                            i += 7;                                                           \
                            continue;                                                         \
                        }                                                                     \
                    }                                                                         \
                    if (flags[i]) rc[nr++] = offset + s + i;                                  \
                    if (nr == BATCH) FLUSH(T);                                                \
                }                                                                             \
                if (nr) FLUSH(T); /* the block's last batch */                                \
            }                                                                                 \
        }                                                                                     \
        return slow;                                                                          \
    }

KERNEL(rankexp_ziggurat_f64, double)
KERNEL(rankexp_ziggurat_f32, float)

/* rankexp_ziggurat_cols_f64/f32(out, members, rows, cols, keys, offset, w, k, w64, f64, scale, c,
 *                               idx, starts):
 *   the draws of the columns idx[starts[e] … starts[e+1]) of every row of member e's
 *   (rows, cols) row-major matrix only (element (i, a) is counter offset + i·cols + a, as in a
 *   whole draw); the other columns are left as they are.  Returns the slow-path count. */
#define COLUMNS(NAME, T)                                                                      \
    CLONES int64_t NAME(T *restrict out, int64_t members, int64_t rows, int64_t cols,         \
                        const int64_t *restrict keys, int64_t offset, const T *restrict w,   \
                        const int64_t *restrict k, const double *restrict w64,               \
                        const double *restrict f64, double scale, const double *restrict c,  \
                        const int64_t *restrict idx, const int64_t *restrict starts) {       \
        int64_t slow = 0;                                                                     \
        int64_t rc[BATCH];                                                                    \
        double rv[BATCH];                                                                     \
        for (int64_t e = 0; e < members; e++) {                                               \
            const uint64_t key = (uint64_t)keys[e];                                           \
            const int64_t *restrict a = idx + starts[e];                                      \
            const int64_t na = starts[e + 1] - starts[e];                                     \
            for (int64_t i = 0; i < rows; i++) {                                              \
                T *restrict row = out + (e * rows + i) * cols;                                \
                const int64_t first = offset + i * cols;                                      \
                const uint64_t base = key + (uint64_t)(first + 1) * GAMMA;                    \
                int64_t nrej = 0;                                                             \
                int64_t rej[BLOCK];                                                           \
                for (int64_t t0 = 0; t0 < na; t0 += BLOCK) {                                  \
                    const int64_t cnt = na - t0 < BLOCK ? na - t0 : BLOCK;                    \
                    nrej = 0;                                                                 \
                    for (int64_t t = t0; t < t0 + cnt; t++) {                                 \
                        const uint64_t z = mix(base + (uint64_t)a[t] * GAMMA);                \
                        const int64_t layer = (int64_t)(z & 255u);                            \
                        const int64_t j = (int64_t)z >> 11;                                   \
                        row[a[t]] = w[layer] * (T)j;                                          \
                        rej[nrej] = a[t];                                                     \
                        nrej += (j < 0 ? -j : j) >= k[layer];                                 \
                    }                                                                         \
                    for (int64_t r0 = 0; r0 < nrej; r0 += BATCH) {                           \
                        const int64_t nb = nrej - r0 < BATCH ? nrej - r0 : BATCH;             \
                        for (int64_t q = 0; q < nb; q++) rc[q] = first + rej[r0 + q];         \
                        nfix_batch(key, rc, nb, w64, f64, k, c, rv);                          \
                        for (int64_t q = 0; q < nb; q++) row[rej[r0 + q]] = (T)(rv[q] * scale); \
                    }                                                                         \
                    slow += nrej;                                                             \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        return slow;                                                                          \
    }

COLUMNS(rankexp_ziggurat_cols_f64, double)
COLUMNS(rankexp_ziggurat_cols_f32, float)

/* the layout of c[]: the number of exp and log coefficients and exp's domain (checked by
 * rankexp.native against seeding's) */
int64_t rankexp_ziggurat_layout(int64_t which) {
    return which == 0 ? EXP_TERMS : (which == 1 ? LOG_TERMS : EXP_DOMAIN);
}
