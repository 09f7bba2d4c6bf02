/* Native CPU kernels of the Fiber Bundle Transformer's hot paths, of the cofactor regulariser's
 * causal heads and of the SSM's intra-chunk decay mask (attention_atlas.native).
 *
 * Plain C, no Python or torch headers: built once per machine by attention_atlas.native
 * (gcc -O3 -march=native -fopenmp-simd), loaded with ctypes, called on contiguous CPU tensors.
 * Each kernel is generated twice from one macro, for float (suffix _f32) and double (_f64);
 * the float64 build is what the tests compare with the library's references and gradcheck.
 *
 * Layouts (all row-major, contiguous):
 *   ut  (N, L, r, d)  U_t^T of every token t of every batch item n (the r-major storage of U)
 *   x   (N, 2L, d)    the queries then the keys of each item: q_t = x[n, t], k_t = x[n, L + t]
 *   out (N, L, L)     scores, accumulated into
 *
 * The pairwise metric terms of eq. (16) (attention_atlas.attention.riemannian.pairwise):
 *   P_ij = scale * ( sum_r (a_ir - u_ir . k_j)^2 + sum_r (u_jr . q_i - b_jr)^2 ),
 *   a_ir = u_ir . q_i,  b_jr = u_jr . k_j,
 * for j <= i (causal, and -inf written above the diagonal) or every j. Vectorised over j: each item's keys, queries' transposes
 * and factors are first copied token-innermost ((d, L), (r, d, L)) so every inner loop runs
 * over contiguous j.
 */
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define RESTRICT __restrict__

/* keys per block of the pairwise kernels: one or two vector registers of lanes */
#define JB 16
/* queries and keys per tile of the pairwise backward (a multiple of JB) */
#define TB 32
/* the largest metric rank the kernels take (ranks 1, 2, 4 and 8 have unrolled bodies) */
#define RMAX 16
/* the row stride of the pairwise kernels' token-innermost copies (kT, uT, b): L rounded up to
   an odd number of JB-blocks. At a multiple of 512 bytes (L = 128, float) the r d + d rows a
   block of keys reads all fall in one set in eight of the first-level cache and evict each
   other; an odd number of 64-byte blocks spreads them over every set. The same numbers; at
   L = 128 the forward took 0.66 and the backward 0.88 of their former time */
#define ROW_STRIDE(L) ((((L) + JB - 1) / JB) | 1) * JB
/* the stride of the pairwise backward's weight slabs W[s] (TB x TB each): a cache line more
   than TB TB, for the same reason (the R weights of a pair, read together, in different sets) */
#define WS (TB * TB + 16)
/* query rows per block of the causal-head kernels (independent sums in registers) */
#define RB 4

/* The lanes of the kernels' vector values (accumulators kept in registers): 16 where 16 floats
   fit one vector register (x86 with AVX-512), else 8. The pairwise kernels' d = 16 bodies then
   take each block of 16 keys or head columns as two halves of 8, the per-token lane kernels 8
   tokens per pass, a 16 x 16 transpose as four of 8 x 8. Every lane is its own sum (a key, a
   column or a token), so both widths give the same bits (tested). Without such a register gcc
   keeps a 16-float value in memory and splits each operation on it: on an AMD EPYC 7003 (AVX2)
   the pairwise bodies took 4.7 times (forward) and 3.7 times (backward) as long as plain loops
   over the same sums. */
#if !defined(VW) && defined(__AVX512F__)
#define VW 16
#elif !defined(VW)
#define VW 8
#endif
typedef float VW_f32 __attribute__((vector_size(VW * 4)));
typedef double VW_f64 __attribute__((vector_size(VW * 8)));
/* the lanes of the kernels' vector values (VW), for attention_atlas.native.vector_lanes */
int vector_lanes(void) { return VW; }

/* The exponentials (and the causal-head kernels further down) are compiled without trapping
 * math: it lets gcc blend the two sides of a float comparison in vector registers (no operation's
 * value changes: nothing here reads the floating-point exception flags). Without it a 256-bit
 * (AVX2) build left the exponentials' loop scalar. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif
/* exp(x) for x <= 0 in float, vectorisable (Cephes' expf: Cody-Waite reduction by ln 2 and a
 * degree-6 polynomial, a few ulp); 0 below -87 (exp(-87) ~ 1.6e-38, near the smallest normal
 * float), which no softmax row (whose largest term is 1) can see. */
/* MADD(a, b, c) is a * b + c: two roundings (level 1), or one (fmaf, the _fma variant, level 3) */
#define DEFINE_EXP_NONPOSITIVE_F32(NAME, MADD)                                                 \
static inline float NAME(float x) {                                                            \
    const int under = x < -87.0f;                                                              \
    x = under ? -87.0f : x;                                                                    \
    /* n = round(x log2 e) by adding and removing 1.5 * 2^23 (floorf does not vectorise) */   \
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                   \
    const float r = MADD(n, 2.12194440e-4f, MADD(-n, 0.693359375f, x));                       \
    float p = 1.9875691500e-4f;                                                                \
    p = MADD(p, r, 1.3981999507e-3f); p = MADD(p, r, 8.3334519073e-3f);                        \
    p = MADD(p, r, 4.1665795894e-2f); p = MADD(p, r, 1.6666665459e-1f);                        \
    p = MADD(p, r, 5.0000001201e-1f);                                                          \
    const float y = MADD(p * r, r, r) + 1.0f;                                                  \
    const int bits = ((int)n + 127) << 23;                                                     \
    float scale; memcpy(&scale, &bits, sizeof scale);                                          \
    return under ? 0.0f : y * scale;                                                           \
}
#define MUL_ADD(a, b, c) ((a) * (b) + (c))
DEFINE_EXP_NONPOSITIVE_F32(exp_nonpositive_f32, MUL_ADD)
DEFINE_EXP_NONPOSITIVE_F32(exp_nonpositive_fma_f32, fmaf)
static inline double exp_nonpositive_f64(double x) { return exp(x); }
static inline double exp_nonpositive_fma_f64(double x) { return exp(x); }
/* The softmax of a causal row of scores in place: o[j] for j < m (m >= 1) becomes
 * exp(o[j] - max) / sum, the entries j >= m (the -inf above the diagonal) 0. The sum in a fixed
 * order (eight partial sums, j mod 8, then neighbours, pairs and halves), whatever the vector
 * width; the exponentials those of the causal-head kernels (exp_nonpositive, a few ulp). Called
 * once a row of the pairwise forward is complete, while it is in the first-level cache: the
 * separate softmax read the whole (N, L, L) scores back (at chapter 4's long shape 16 MiB a
 * layer, out of the caches). */
/* eight partial sums p[0..7] added in one fixed tree: neighbours, pairs, halves */
#define TREE8(p) ((((p)[0] + (p)[1]) + ((p)[2] + (p)[3])) + (((p)[4] + (p)[5]) + ((p)[6] + (p)[7])))
#define DEFINE_SOFTMAX_ROW(T, SUF)                                                             \
static void softmax_row_##SUF(T* RESTRICT o, long m, long L) {                                 \
    /* the row's largest entry by 8 running maxima (one vector's lanes; a chain of scalar     \
       comparisons took half the function's time): the same value as the chain's (a NaN only  \
       where o[0] is one, in both) */                                                          \
    T pm[8] = {o[0], o[0], o[0], o[0], o[0], o[0], o[0], o[0]};                                \
    long j = 0;                                                                                \
    for (; j + 8 <= m; j += 8)                                                                 \
        for (int l = 0; l < 8; ++l) pm[l] = o[j + l] > pm[l] ? o[j + l] : pm[l];               \
    for (; j < m; ++j) pm[j & 7] = o[j] > pm[j & 7] ? o[j] : pm[j & 7];                        \
    T mx = pm[0];                                                                              \
    for (int l = 1; l < 8; ++l) mx = pm[l] > mx ? pm[l] : mx;                                  \
    T part[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                      \
    j = 0;                                                                                     \
    for (; j + 8 <= m; j += 8)                                                                 \
        for (int l = 0; l < 8; ++l) {                                                          \
            const T e = exp_nonpositive_##SUF(o[j + l] - mx);                                  \
            o[j + l] = e; part[l] += e;                                                        \
        }                                                                                      \
    for (; j < m; ++j) { const T e = exp_nonpositive_##SUF(o[j] - mx); o[j] = e; part[j & 7] += e; }\
    const T sum = TREE8(part);                                                                 \
    const T inv = (T)1 / sum;                                                                  \
    for (long c = 0; c < m; ++c) o[c] *= inv;                                                  \
    for (long c = m; c < L; ++c) o[c] = 0;                                                     \
}
DEFINE_SOFTMAX_ROW(float, f32)
DEFINE_SOFTMAX_ROW(double, f64)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#define DEFINE_KERNELS(T, SUF)                                                                 \
                                                                                               \
/* token-innermost copies of one item, zero-padded to Lp = ROW_STRIDE(L): kT (d, Lp),          \
   uT (r, d, Lp), b (r, Lp); a (L, r); qT (d, Lp) and a row (Lp) of scratch. Each centre       \
   a_ts = u_ts . q_t, b_ts = u_ts . k_t is one token's chain over c = 0..d-1 from 0, the       \
   tokens as vector lanes */                                                                   \
static void prepare_##SUF(const T* RESTRICT ut, const T* RESTRICT q, const T* RESTRICT k,      \
                          long L, long Lp, long r, long d, T* RESTRICT kT, T* RESTRICT uT,     \
                          T* RESTRICT a, T* RESTRICT b, T* RESTRICT qT) {                      \
    T* RESTRICT acc = qT + d * Lp;                                                             \
    memset(kT, 0, sizeof(T) * d * Lp);                                                         \
    memset(uT, 0, sizeof(T) * r * d * Lp);                                                     \
    memset(b, 0, sizeof(T) * r * Lp);                                                          \
    for (long t = 0; t < L; ++t) {                                                             \
        const T* u = ut + t * r * d;                                                           \
        for (long c = 0; c < d; ++c) {                                                         \
            kT[c * Lp + t] = k[t * d + c];                                                     \
            qT[c * Lp + t] = q[t * d + c];                                                     \
        }                                                                                      \
        for (long i = 0; i < r * d; ++i) uT[i * Lp + t] = u[i];                                \
    }                                                                                          \
    for (long s = 0; s < r; ++s) {                                                             \
        T* bs = b + s * Lp;                                                                    \
        for (long t = 0; t < L; ++t) acc[t] = 0;                                               \
        for (long c = 0; c < d; ++c) {                                                         \
            const T *w = uT + (s * d + c) * Lp, *qc = qT + c * Lp, *kc = kT + c * Lp;          \
            _Pragma("omp simd")                                                                \
            for (long t = 0; t < L; ++t) {                                                     \
                acc[t] += w[t] * qc[t];                                                        \
                bs[t] += w[t] * kc[t];                                                         \
            }                                                                                  \
        }                                                                                      \
        for (long t = 0; t < L; ++t) a[t * r + s] = acc[t];                                    \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* e[s][jj] = a_is - u_is . k_j and f[s][jj] = u_js . q_i - b_js for the JB keys from j0 */   \
static inline __attribute__((always_inline)) void block_terms_##SUF(                          \
        const T* RESTRICT ui, const T* RESTRICT qi, const T* RESTRICT ai, const T* RESTRICT kT, \
        const T* RESTRICT uT, const T* RESTRICT b, long Lp, long j0, long R, long d,          \
        T e[RMAX][JB], T f[RMAX][JB]) {                                                        \
    for (long s = 0; s < R; ++s)                                                               \
        for (long jj = 0; jj < JB; ++jj) { e[s][jj] = ai[s]; f[s][jj] = -b[s * Lp + j0 + jj]; } \
    for (long c = 0; c < d; ++c) {                                                             \
        const T* kc = kT + c * Lp + j0;                                                        \
        const T qc = qi[c];                                                                    \
        for (long s = 0; s < R; ++s) {                                                         \
            const T w = ui[s * d + c];                                                         \
            const T* uc = uT + (s * d + c) * Lp + j0;                                          \
            _Pragma("omp simd")                                                                \
            for (long jj = 0; jj < JB; ++jj) {                                                 \
                e[s][jj] -= w * kc[jj];                                                        \
                f[s][jj] += qc * uc[jj];                                                       \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* block_terms for d = 16 and the VW keys from j0 (the same sums in the same order), e and f   \
   vector values */                                                                            \
static inline __attribute__((always_inline)) void block_terms16_##SUF(                         \
        const T* RESTRICT ui, const T* RESTRICT qi, const T* RESTRICT ai, const T* RESTRICT kT, \
        const T* RESTRICT uT, const T* RESTRICT b, long Lp, long j0, long R,                   \
        VW_##SUF e[RMAX], VW_##SUF f[RMAX], VW_##SUF* dot) {  /* dot: q_i . k_j, or 0 */       \
    for (long s = 0; s < R; ++s) {                                                             \
        VW_##SUF bv;                                                                           \
        memcpy(&bv, b + s * Lp + j0, sizeof bv);                                               \
        f[s] = -bv;                                                                            \
        e[s] = ai[s] - (VW_##SUF){0};  /* a broadcast: x - 0 is x, -0 included */              \
    }                                                                                          \
    VW_##SUF dv = {0};  /* the dot product in a register (through *dot it went to memory) */   \
    for (long c = 0; c < 16; ++c) {                                                            \
        VW_##SUF kc, uc;                                                                       \
        memcpy(&kc, kT + c * Lp + j0, sizeof kc);                                              \
        const T qc = qi[c];                                                                    \
        if (dot) dv += qc * kc;                                                                \
        for (long s = 0; s < R; ++s) {                                                         \
            const T w = ui[s * 16 + c];                                                        \
            memcpy(&uc, uT + (s * 16 + c) * Lp + j0, sizeof uc);                               \
            e[s] -= w * kc;                                                                    \
            f[s] += qc * uc;                                                                   \
        }                                                                                      \
    }                                                                                          \
    if (dot) *dot = dv;                                                                        \
}                                                                                              \
static inline __attribute__((always_inline)) void forward_item_##SUF(                         \
        const T* RESTRICT u, const T* RESTRICT q, const T* RESTRICT kT, const T* RESTRICT uT,  \
        const T* RESTRICT a, const T* RESTRICT b, T* RESTRICT out, long L, long Lp, long R,   \
        long d, T scale, int causal, const T* RESTRICT row, const T* RESTRICT col, T c1,      \
        int sm) {                                                                              \
    T e[RMAX][JB], f[RMAX][JB];                                                                \
    for (long i = 0; i < L; ++i) {                                                             \
        const long m = causal ? i + 1 : L;                                                     \
        T* o = out + i * L;                                                                    \
        for (long j0 = 0; j0 < m; j0 += JB) {                                                  \
            if (d == 16 && JB == 16) {  /* the same sums, held in vector registers (VW lanes) */\
                for (long h = 0; h < 16 && j0 + h < m; h += VW) {                              \
                    const long jh = j0 + h, jn = m - jh < VW ? m - jh : VW;                    \
                    VW_##SUF ev[RMAX], fv[RMAX], rv = {0}, ov, dv;                             \
                    block_terms16_##SUF(u + i * R * 16, q + i * 16, a + i * R, kT, uT, b, Lp, jh,\
                                        R, ev, fv, row ? &dv : 0);                             \
                    for (long s = 0; s < R; ++s) rv += ev[s] * ev[s] + fv[s] * fv[s];          \
                    if (row) {  /* level 2: the base c1 q_i . k_j + row_i + col_j formed here */\
                        VW_##SUF cv;                                                           \
                        if (jh + VW <= L) memcpy(&cv, col + jh, sizeof cv);                    \
                        else for (long jj = 0; jj < VW; ++jj) cv[jj] = jh + jj < L ? col[jh + jj] : 0;\
                        ov = c1 * dv + row[i] + cv + scale * rv;                               \
                        if (jh + VW <= L)  /* whole: the keys past m get -inf below */         \
                            memcpy(o + jh, &ov, sizeof ov);                                    \
                        else for (long jj = 0; jj < jn; ++jj) o[jh + jj] = ov[jj];             \
                        continue;                                                              \
                    }                                                                          \
                    if (jn == VW) {                                                            \
                        memcpy(&ov, o + jh, sizeof ov);                                        \
                        ov += scale * rv;                                                      \
                        memcpy(o + jh, &ov, sizeof ov);                                        \
                    } else {                                                                   \
                        for (long jj = 0; jj < jn; ++jj) o[jh + jj] += scale * rv[jj];         \
                    }                                                                          \
                }                                                                              \
                continue;                                                                      \
            }                                                                                  \
            block_terms_##SUF(u + i * R * d, q + i * d, a + i * R, kT, uT, b, Lp, j0, R, d,    \
                              e, f);                                                           \
            T row[JB];                                                                         \
            for (long jj = 0; jj < JB; ++jj) row[jj] = 0;                                      \
            for (long s = 0; s < R; ++s)                                                       \
                for (long jj = 0; jj < JB; ++jj)                                               \
                    row[jj] += e[s][jj] * e[s][jj] + f[s][jj] * f[s][jj];                      \
            const long jn = m - j0 < JB ? m - j0 : JB;                                         \
            for (long jj = 0; jj < jn; ++jj) o[j0 + jj] += scale * row[jj];                    \
        }                                                                                      \
        for (long j = m; j < L; ++j) o[j] = -INFINITY; /* causal: above the diagonal */        \
        if (sm) softmax_row_##SUF(o, m, L); /* the row's softmax while it is in cache */       \
    }                                                                                          \
}                                                                                              \
                                                                                               \
void pairwise_forward_##SUF(const T* RESTRICT ut, const T* RESTRICT x, T* RESTRICT out,        \
                            long N, long L, long r, long d, double scale_, int causal,         \
                            const T* RESTRICT row, const T* RESTRICT col, double c1_) {        \
    const T scale = (T)scale_;                                                                 \
    const int sm = causal == 2; /* 2: causal, and each row's softmax (softmax_row) */          \
    causal = causal != 0;                                                                      \
    const long Lp = ROW_STRIDE(L);                                                             \
    T* buf = (T*)malloc(sizeof(T) * (d * Lp + r * d * Lp + L * r + r * Lp + (d + 1) * Lp));    \
    T *kT = buf, *uT = kT + d * Lp, *a = uT + r * d * Lp, *b = a + L * r, *qT = b + r * Lp;    \
    for (long n = 0; n < N; ++n) {                                                             \
        const T* u = ut + n * L * r * d;                                                       \
        const T* q = x + n * 2 * L * d;                                                        \
        prepare_##SUF(u, q, q + L * d, L, Lp, r, d, kT, uT, a, b, qT);                         \
        T* o = out + n * L * L;                                                                \
        const T *rw = row ? row + n * L : 0, *cl = col ? col + n * L : 0, c1 = (T)c1_;        \
        switch (r) {                                                                           \
            case 1: forward_item_##SUF(u, q, kT, uT, a, b, o, L, Lp, 1, d, scale, causal, rw, cl, c1, sm); break; \
            case 2: forward_item_##SUF(u, q, kT, uT, a, b, o, L, Lp, 2, d, scale, causal, rw, cl, c1, sm); break; \
            case 4: forward_item_##SUF(u, q, kT, uT, a, b, o, L, Lp, 4, d, scale, causal, rw, cl, c1, sm); break; \
            case 8: forward_item_##SUF(u, q, kT, uT, a, b, o, L, Lp, 8, d, scale, causal, rw, cl, c1, sm); break; \
            default: forward_item_##SUF(u, q, kT, uT, a, b, o, L, Lp, r, d, scale, causal, rw, cl, c1, sm);    \
        }                                                                                      \
    }                                                                                          \
    free(buf);                                                                                 \
}                                                                                              \
                                                                                               \
/* one pair's share of a token's sums in the pairwise backward (d = 16): au[s] += wa_s xv and \
   ax += wb_s u_s, with xv and u_s the other token's vector and factor rows (the query side:   \
   wa = W, which holds -g e, with its key, wb = W2; the key side the mirror) */                \
static inline __attribute__((always_inline)) void pair_sums16_##SUF(                           \
        VW_##SUF au[RMAX], VW_##SUF* ax, const T* RESTRICT xrow, const T* RESTRICT urow,       \
        const T* RESTRICT wa, const T* RESTRICT wb, long R, VW_##SUF* a3,                      \
        const T* RESTRICT w3) {                                                                \
    VW_##SUF xv, us;                                                                           \
    memcpy(&xv, xrow, sizeof xv);                                                              \
    if (a3) *a3 += w3[0] * xv;  /* level 2: c1 g_ij times the other token's key or query */   \
    for (long s = 0; s < R; ++s) {                                                             \
        memcpy(&us, urow + s * 16, sizeof us);                                                 \
        au[s] += wa[s * WS] * xv;                                                              \
        *ax += wb[s * WS] * us;                                                                \
    }                                                                                          \
}                                                                                              \
/* one token's sums over the other tokens o0 <= o < o1 of a tile (d = 16), accumulated into its \
   rows au (R, 16), ax (16) and, at level 2, a3 (16); the pair with other token o has weights  \
   wa[(o - o0) ws], wb and w3 likewise (as pair_sums16) */                                     \
static inline __attribute__((always_inline)) void token_sums16_##SUF(                          \
        T* RESTRICT au_row, T* RESTRICT ax_row, T* RESTRICT a3_row, const T* RESTRICT xs,      \
        const T* RESTRICT us, long o0, long o1, const T* RESTRICT wa,                          \
        const T* RESTRICT wb, const T* RESTRICT w3, long ws, long R) {                         \
    for (long h = 0; h < 16; h += VW) {  /* VW columns at a time */                            \
        VW_##SUF au[RMAX], ax, a3 = {0};                                                       \
        for (long s = 0; s < R; ++s) memcpy(&au[s], au_row + s * 16 + h, sizeof ax);           \
        memcpy(&ax, ax_row + h, sizeof ax);                                                    \
        if (a3_row) memcpy(&a3, a3_row + h, sizeof a3);                                        \
        for (long o = o0; o < o1; ++o) {                                                       \
            const long w = (o - o0) * ws;                                                      \
            pair_sums16_##SUF(au, &ax, xs + o * 16 + h, us + o * R * 16 + h, wa + w, wb + w, R,  \
                              a3_row ? &a3 : 0, a3_row ? w3 + w : 0);                          \
        }                                                                                      \
        for (long s = 0; s < R; ++s) memcpy(au_row + s * 16 + h, &au[s], sizeof ax);           \
        memcpy(ax_row + h, &ax, sizeof ax);                                                    \
        if (a3_row) memcpy(a3_row + h, &a3, sizeof a3);                                        \
    }                                                                                          \
}                                                                                              \
/* token_sums16 for two tokens a and b at once, over o0 <= o < o1 for both: the same sums in the \
   same order per token (the same bits), the two tokens' chains interleaved. One token's ax takes \
   R dependent multiply-adds per pair and waits on their latency; two keep the units busy, and \
   the other token's rows are read once for both */                                            \
static inline __attribute__((always_inline)) void pair_joint16_##SUF(                          \
        T* RESTRICT au_a, T* RESTRICT ax_a, T* RESTRICT a3_a, const T* RESTRICT wa_a,          \
        const T* RESTRICT wb_a, const T* RESTRICT w3_a, T* RESTRICT au_b, T* RESTRICT ax_b,    \
        T* RESTRICT a3_b, const T* RESTRICT wa_b, const T* RESTRICT wb_b,                      \
        const T* RESTRICT w3_b, const T* RESTRICT xs, const T* RESTRICT us, long o0, long o1,  \
        long ws, long R) {                                                                     \
    for (long h = 0; h < 16; h += VW) {  /* VW columns at a time */                            \
        VW_##SUF ua[RMAX], ub[RMAX], xa, xb, ta = {0}, tb = {0}, xv, uv;                       \
        for (long s = 0; s < R; ++s) {                                                         \
            memcpy(&ua[s], au_a + s * 16 + h, sizeof xv);                                      \
            memcpy(&ub[s], au_b + s * 16 + h, sizeof xv);                                      \
        }                                                                                      \
        memcpy(&xa, ax_a + h, sizeof xv);                                                      \
        memcpy(&xb, ax_b + h, sizeof xv);                                                      \
        if (a3_a) { memcpy(&ta, a3_a + h, sizeof xv); memcpy(&tb, a3_b + h, sizeof xv); }      \
        for (long o = o0; o < o1; ++o) {                                                       \
            const long w = (o - o0) * ws;                                                      \
            memcpy(&xv, xs + o * 16 + h, sizeof xv);                                           \
            if (a3_a) { ta += w3_a[w] * xv; tb += w3_b[w] * xv; }                              \
            for (long s = 0; s < R; ++s) {                                                     \
                memcpy(&uv, us + (o * R + s) * 16 + h, sizeof uv);                             \
                ua[s] += wa_a[w + s * WS] * xv;                                                \
                xa += wb_a[w + s * WS] * uv;                                                   \
                ub[s] += wa_b[w + s * WS] * xv;                                                \
                xb += wb_b[w + s * WS] * uv;                                                   \
            }                                                                                  \
        }                                                                                      \
        for (long s = 0; s < R; ++s) {                                                         \
            memcpy(au_a + s * 16 + h, &ua[s], sizeof xv);                                      \
            memcpy(au_b + s * 16 + h, &ub[s], sizeof xv);                                      \
        }                                                                                      \
        memcpy(ax_a + h, &xa, sizeof xv);                                                      \
        memcpy(ax_b + h, &xb, sizeof xv);                                                      \
        if (a3_a) { memcpy(a3_a + h, &ta, sizeof xv); memcpy(a3_b + h, &tb, sizeof xv); }      \
    }                                                                                          \
}                                                                                              \
/* token_sums16 for token a over a0 <= o < a1 and token b over b0 <= o < b1 (the weights wa_a, \
   ... at o = a0 and wa_b, ... at o = b0): each alone where the other's range does not reach,  \
   both at once (pair_joint16) over the ranges' overlap; each token's sums in ascending o */   \
static inline __attribute__((always_inline)) void pair_sums2x16_##SUF(                         \
        T* RESTRICT au_a, T* RESTRICT ax_a, T* RESTRICT a3_a, long a0, long a1,                \
        const T* RESTRICT wa_a, const T* RESTRICT wb_a, const T* RESTRICT w3_a,                \
        T* RESTRICT au_b, T* RESTRICT ax_b, T* RESTRICT a3_b, long b0, long b1,                \
        const T* RESTRICT wa_b, const T* RESTRICT wb_b, const T* RESTRICT w3_b,                \
        const T* RESTRICT xs, const T* RESTRICT us, long ws, long R) {                         \
    const long c0 = a0 > b0 ? a0 : b0, c1 = a1 < b1 ? a1 : b1;                                 \
    if (c0 >= c1) {                                                                            \
        token_sums16_##SUF(au_a, ax_a, a3_a, xs, us, a0, a1, wa_a, wb_a, w3_a, ws, R);         \
        token_sums16_##SUF(au_b, ax_b, a3_b, xs, us, b0, b1, wa_b, wb_b, w3_b, ws, R);         \
        return;                                                                                \
    }                                                                                          \
    if (a0 < c0)                                                                               \
        token_sums16_##SUF(au_a, ax_a, a3_a, xs, us, a0, c0, wa_a, wb_a, w3_a, ws, R);         \
    if (b0 < c0)                                                                               \
        token_sums16_##SUF(au_b, ax_b, a3_b, xs, us, b0, c0, wa_b, wb_b, w3_b, ws, R);         \
    const long pa = (c0 - a0) * ws, pb = (c0 - b0) * ws;                                       \
    pair_joint16_##SUF(au_a, ax_a, a3_a, wa_a + pa, wb_a + pa, w3_a ? w3_a + pa : 0, au_b, ax_b, \
                       a3_b, wa_b + pb, wb_b + pb, w3_b ? w3_b + pb : 0, xs, us, c0, c1, ws,  \
                       R);                                                                     \
    const long qa = (c1 - a0) * ws, qb = (c1 - b0) * ws;                                       \
    if (c1 < a1)                                                                               \
        token_sums16_##SUF(au_a, ax_a, a3_a, xs, us, c1, a1, wa_a + qa, wb_a + qa,             \
                           w3_a ? w3_a + qa : 0, ws, R);                                       \
    if (c1 < b1)                                                                               \
        token_sums16_##SUF(au_b, ax_b, a3_b, xs, us, c1, b1, wa_b + qb, wb_b + qb,             \
                           w3_b ? w3_b + qb : 0, ws, R);                                       \
}                                                                                              \
/* one item's backward, tile by tile (TB x TB pairs): per tile, 1. the weights               \
   W[ii][jj][s] = -g_ij e_ijs (the query's metric, negated: every sum below adds) and W2 =     \
   g_ij f_ijs (the key's), 0 where j > i (causal), with the centres' sums da (L, r) of g e and  \
   db (r, Lp); 2. per query i, sums over the tile's keys in registers: ru_i += sum_j W k_j,    \
   rq_i += sum_j W2 u_j; 3. per key j, sums over the tile's queries: ck_j += sum_i W u_i,      \
   cu_j += sum_i W2 q_i. The accumulators ru, rq,                                              \
   ck, cu (zeroed by the caller) and the tile stay in the caches. */                           \
static inline __attribute__((always_inline)) void backward_item_##SUF(                        \
        const T* RESTRICT u, const T* RESTRICT q, const T* RESTRICT k, const T* RESTRICT kT,   \
        const T* RESTRICT uT, const T* RESTRICT a, const T* RESTRICT b,                        \
        const T* RESTRICT grad, T* RESTRICT ru, T* RESTRICT rq, T* RESTRICT ck,               \
        T* RESTRICT cu, T* RESTRICT W, T* RESTRICT W2, T* RESTRICT da, T* RESTRICT db,       \
        long L, long Lp, long R, long d, T two_scale, int causal, T c1, T* RESTRICT W3,        \
        T* RESTRICT rq3, T* RESTRICT ck3) {                                                    \
    T e[RMAX][JB], f[RMAX][JB];                                                                \
    for (long i0 = 0; i0 < L; i0 += TB) {                                                      \
        const long i1 = i0 + TB < L ? i0 + TB : L;                                             \
        const long jend = causal ? i1 : L;                                                     \
        for (long j0 = 0; j0 < jend; j0 += TB) {                                               \
            const long j1 = j0 + TB < jend ? j0 + TB : jend;                                   \
            for (long i = i0; i < i1; ++i) {                                                   \
                const T* gi = grad + i * L;                                                    \
                for (long jb = j0; jb < j1; jb += JB) {                                        \
                    if (d == 16 && JB == 16 && jb + JB <= j1) {  /* as below, in registers */  \
                      /* VW keys at a time; none past the diagonal (j > i: weights 0, never read) */\
                      for (long h = 0; h < 16 && !(causal && jb + h > i); h += VW) {           \
                        const long jh = jb + h;                                                \
                        VW_##SUF ev[RMAX], fv[RMAX], gv, wv, w2v, dbv;                         \
                        block_terms16_##SUF(u + i * R * 16, q + i * 16, a + i * R, kT, uT, b, Lp,\
                                            jh, R, ev, fv, 0);                                 \
                        memcpy(&gv, gi + jh, sizeof gv);                                       \
                        gv = two_scale * gv;                                                   \
                        if (causal && jh + VW - 1 > i)  /* 0 for the keys j > i, as below */   \
                            for (long jj = i + 1 > jh ? i + 1 - jh : 0; jj < VW; ++jj) gv[jj] = 0;\
                        const long p = (i - i0) * TB + jh - j0;                                \
                        if (W3) {  /* level 2: the base's weights c1 g_ij, 0 where j > i */    \
                            VW_##SUF g3;                                                       \
                            memcpy(&g3, gi + jh, sizeof g3);                                   \
                            g3 = c1 * g3;                                                      \
                            if (causal && jh + VW - 1 > i)                                     \
                                for (long jj = i + 1 > jh ? i + 1 - jh : 0; jj < VW; ++jj) g3[jj] = 0;\
                            memcpy(W3 + p, &g3, sizeof g3);                                    \
                        }                                                                      \
                        for (long s = 0; s < R; ++s) {                                         \
                            wv = gv * ev[s];                                                   \
                            w2v = gv * fv[s];                                                  \
                            const VW_##SUF nw = -wv;  /* W holds -g e: every sum below adds */ \
                            memcpy(W + s * WS + p, &nw, sizeof nw);                            \
                            memcpy(W2 + s * WS + p, &w2v, sizeof w2v);                         \
                            T acc = da[i * R + s];                                             \
                            for (long jj = 0; jj < VW; ++jj) acc += wv[jj];                    \
                            da[i * R + s] = acc;                                               \
                            memcpy(&dbv, db + s * Lp + jh, sizeof dbv);                        \
                            dbv -= w2v;                                                        \
                            memcpy(db + s * Lp + jh, &dbv, sizeof dbv);                        \
                        }                                                                      \
                      }                                                                        \
                        continue;                                                              \
                    }                                                                          \
                    block_terms_##SUF(u + i * R * d, q + i * d, a + i * R, kT, uT, b, Lp, jb,  \
                                      R, d, e, f);                                             \
                    for (long jj = 0; jj < JB && jb + jj < j1; ++jj) {                         \
                        const long j = jb + jj;                                                \
                        const T g = (causal && j > i) ? 0 : two_scale * gi[j];                 \
                        const long p = (i - i0) * TB + j - j0;  /* W and W2 are (R, TB, TB) */ \
                        if (W3) W3[p] = (causal && j > i) ? 0 : c1 * gi[j];                    \
                        for (long s = 0; s < R; ++s) {                                         \
                            const T w = g * e[s][jj], w2 = g * f[s][jj];                       \
                            W[s * WS + p] = -w;                                           \
                            W2[s * WS + p] = w2;                                          \
                            da[i * R + s] += w;                                                \
                            db[s * Lp + j] -= w2;                                              \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            if (d == 16) {  /* the same sums, their accumulators held in vector registers */   \
                for (long i = i0; i < i1; i += 2) {  /* the queries' sums over the tile's keys */  \
                    const long jm = causal && i + 1 < j1 ? i + 1 : j1, w0 = (i - i0) * TB;     \
                    if (i + 1 < i1) {  /* two queries at once */                               \
                        const long jm2 = causal && i + 2 < j1 ? i + 2 : j1, w1 = w0 + TB;      \
                        pair_sums2x16_##SUF(ru + i * R * 16, rq + i * 16, W3 ? rq3 + i * 16 : 0, \
                                            j0, jm, W + w0, W2 + w0, W3 ? W3 + w0 : 0,         \
                                            ru + (i + 1) * R * 16, rq + (i + 1) * 16,          \
                                            W3 ? rq3 + (i + 1) * 16 : 0, j0, jm2, W + w1,      \
                                            W2 + w1, W3 ? W3 + w1 : 0, k, u, 1, R);            \
                        continue;                                                              \
                    }                                                                          \
                    token_sums16_##SUF(ru + i * R * 16, rq + i * 16, W3 ? rq3 + i * 16 : 0, k, u, \
                                       j0, jm, W + w0, W2 + w0, W3 ? W3 + w0 : 0, 1, R); \
                }                                                                              \
                for (long j = j0; j < j1; j += 2) {  /* the keys' sums over the tile's queries */ \
                    const long lo = causal && j > i0 ? j : i0, w0 = (lo - i0) * TB + j - j0;   \
                    if (j + 1 < j1) {  /* two keys at once */                                  \
                        const long lo2 = causal && j + 1 > i0 ? j + 1 : i0;                    \
                        const long w1 = (lo2 - i0) * TB + j + 1 - j0;                          \
                        pair_sums2x16_##SUF(cu + j * R * 16, ck + j * 16, W3 ? ck3 + j * 16 : 0, \
                                            lo, i1, W2 + w0, W + w0, W3 ? W3 + w0 : 0,         \
                                            cu + (j + 1) * R * 16, ck + (j + 1) * 16,          \
                                            W3 ? ck3 + (j + 1) * 16 : 0, lo2, i1, W2 + w1,     \
                                            W + w1, W3 ? W3 + w1 : 0, q, u, TB, R);            \
                        continue;                                                              \
                    }                                                                          \
                    token_sums16_##SUF(cu + j * R * 16, ck + j * 16, W3 ? ck3 + j * 16 : 0, q, u, \
                                       lo, i1, W2 + w0, W + w0, W3 ? W3 + w0 : 0, TB, R); \
                }                                                                              \
                continue;                                                                      \
            }                                                                                  \
            for (long i = i0; i < i1; ++i) {                                                   \
                T au[RMAX][d], aq[d];                                                          \
                for (long s = 0; s < R; ++s)                                                   \
                    for (long c = 0; c < d; ++c) au[s][c] = ru[(i * R + s) * d + c];           \
                for (long c = 0; c < d; ++c) aq[c] = rq[i * d + c];                            \
                const long jm = causal && i + 1 < j1 ? i + 1 : j1;                             \
                for (long j = j0; j < jm; ++j) {                                               \
                    const T* kj = k + j * d;                                                   \
                    const T* uj = u + j * R * d;                                               \
                    const T* w = W + (i - i0) * TB + j - j0;  /* w[s * WS] */                             \
                    const T* w2 = W2 + (i - i0) * TB + j - j0;                           \
                    for (long s = 0; s < R; ++s) {                                             \
                        const T ws = w[s * WS], w2s = w2[s * WS];                                        \
                        _Pragma("omp simd")                                                    \
                        for (long c = 0; c < d; ++c) {                                         \
                            au[s][c] += ws * kj[c];                                            \
                            aq[c] += w2s * uj[s * d + c];                                      \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
                for (long s = 0; s < R; ++s)                                                   \
                    for (long c = 0; c < d; ++c) ru[(i * R + s) * d + c] = au[s][c];           \
                for (long c = 0; c < d; ++c) rq[i * d + c] = aq[c];                            \
            }                                                                                  \
            for (long j = j0; j < j1; ++j) {                                                   \
                T au[RMAX][d], ak[d];                                                          \
                for (long s = 0; s < R; ++s)                                                   \
                    for (long c = 0; c < d; ++c) au[s][c] = cu[(j * R + s) * d + c];           \
                for (long c = 0; c < d; ++c) ak[c] = ck[j * d + c];                            \
                for (long i = causal && j > i0 ? j : i0; i < i1; ++i) {                        \
                    const T* qi = q + i * d;                                                   \
                    const T* ui = u + i * R * d;                                               \
                    const T* w = W + (i - i0) * TB + j - j0;  /* w[s * WS] */                             \
                    const T* w2 = W2 + (i - i0) * TB + j - j0;                           \
                    for (long s = 0; s < R; ++s) {                                             \
                        const T ws = w[s * WS], w2s = w2[s * WS];                                        \
                        _Pragma("omp simd")                                                    \
                        for (long c = 0; c < d; ++c) {                                         \
                            ak[c] += ws * ui[s * d + c];                                       \
                            au[s][c] += w2s * qi[c];                                           \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
                for (long s = 0; s < R; ++s)                                                   \
                    for (long c = 0; c < d; ++c) cu[(j * R + s) * d + c] = au[s][c];           \
                for (long c = 0; c < d; ++c) ck[j * d + c] = ak[c];                            \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* the gradient of one item's causal scores from the gradient g of the kernel's output: through \
   the softmax when p (its probabilities) is given, ds_ij = p_ij (g_ij - sum_l g_il p_il), else \
   g_ij itself, for j <= i, and 0 above the diagonal; written to ds (L, L), with its row sums   \
   dr and column sums dc (the gradients of the scores' row and column terms) where given. Each \
   row's two sums as 8 partial sums, added in a fixed tree at the end */                        \
static void scores_grad_##SUF(const T* RESTRICT g, const T* RESTRICT p, T* RESTRICT ds,        \
                              long L, T* RESTRICT dr, T* RESTRICT dc) {                        \
    if (dc) memset(dc, 0, sizeof(T) * L);                                                      \
    for (long i = 0; i < L; ++i) {                                                             \
        const T *gi = g + i * L, *pi = p ? p + i * L : 0;                                      \
        T* RESTRICT o = ds + i * L;                                                            \
        T dot = 0;                                                                             \
        if (pi) {                                                                              \
            T part[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                              \
            long j = 0;                                                                        \
            for (; j + 8 <= i + 1; j += 8)                                                     \
                for (int l = 0; l < 8; ++l) part[l] += gi[j + l] * pi[j + l];                  \
            for (; j <= i; ++j) part[j & 7] += gi[j] * pi[j];                                  \
            dot = TREE8(part);                                                                 \
            for (long j = 0; j <= i; ++j) o[j] = pi[j] * (gi[j] - dot);                        \
        } else {                                                                               \
            for (long j = 0; j <= i; ++j) o[j] = gi[j];                                        \
        }                                                                                      \
        for (long j = i + 1; j < L; ++j) o[j] = 0;                                             \
        if (dr) {                                                                              \
            T part[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                              \
            long j = 0;                                                                        \
            for (; j + 8 <= i + 1; j += 8)                                                     \
                for (int l = 0; l < 8; ++l) part[l] += o[j + l];                               \
            for (; j <= i; ++j) part[j & 7] += o[j];                                           \
            dr[i] = TREE8(part);                                                               \
        }                                                                                      \
        if (dc)                                                                                \
            for (long j = 0; j <= i; ++j) dc[j] += o[j];                                       \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* grad: the gradient of the scores (causal: read for j <= i only), or with sg != 0 the        \
   gradient of the kernel's output, which scores_grad turns into the scores' (through the     \
   softmax when probs is given) item by item while it is in cache, into ds (N, L, L) when      \
   given, else a scratch item; d_row and d_col (N, L) then get its row and column sums */      \
void pairwise_backward_##SUF(const T* RESTRICT ut, const T* RESTRICT x,                        \
                             const T* RESTRICT grad, T* RESTRICT d_ut, T* RESTRICT d_x,        \
                             long N, long L, long r, long d, double scale_, int causal,       \
                             double c1_, int sg, const T* RESTRICT probs, T* RESTRICT ds,     \
                             T* RESTRICT d_row, T* RESTRICT d_col) {                           \
    const T two_scale = (T)(2.0 * scale_), c1 = (T)c1_;                                        \
    const long Lp = ROW_STRIDE(L);                                                             \
    const long nacc = L * r * d + L * d;  /* ru and rq; then ck and cu */                      \
    T* buf = (T*)malloc(sizeof(T) * (d * Lp + r * d * Lp + r * Lp + L * r                     \
                                     + 2 * WS * r + L * r + 2 * nacc));                   \
    T *kT = buf, *uT = kT + d * Lp, *db = uT + r * d * Lp, *a = db + r * Lp;                   \
    T *W = a + L * r, *W2 = W + WS * r, *da = W2 + WS * r;                                     \
    T *ru = da + L * r, *rq = ru + L * r * d, *ck = rq + L * d, *cu = ck + L * d;              \
    T* b = (T*)malloc(sizeof(T) * (r + d + 1) * Lp);  /* b, then prepare's qT and scratch */   \
    /* level 2 (c1 != 0, d = 16): the base's weights and its shares of dq and dk */           \
    T* W3 = c1_ != 0.0 ? (T*)malloc(sizeof(T) * (TB * TB + 2 * L * d)) : 0;                    \
    T *rq3 = W3 ? W3 + TB * TB : 0, *ck3 = W3 ? rq3 + L * d : 0;                               \
    T* gs = sg && !ds ? (T*)malloc(sizeof(T) * L * L) : 0;  /* scores_grad's scratch item */     \
    for (long n = 0; n < N; ++n) {                                                             \
        const T* u = ut + n * L * r * d;                                                       \
        const T* q = x + n * 2 * L * d;                                                        \
        const T* k = q + L * d;                                                                \
        T* du = d_ut + n * L * r * d;                                                          \
        T* dq = d_x + n * 2 * L * d;                                                           \
        T* dk = dq + L * d;                                                                    \
        prepare_##SUF(u, q, k, L, Lp, r, d, kT, uT, a, b, b + r * Lp);                         \
        memset(db, 0, sizeof(T) * r * Lp);                                                     \
        memset(da, 0, sizeof(T) * (L * r + 2 * nacc));                                         \
        if (W3) memset(rq3, 0, sizeof(T) * 2 * L * d);                                         \
        const T* gr = grad + n * L * L;                                                        \
        if (sg) {  /* the scores' gradient, item by item */                                    \
            T* o = ds ? ds + n * L * L : gs;                                                   \
            scores_grad_##SUF(gr, probs ? probs + n * L * L : 0, o, L, d_row ? d_row + n * L : 0,\
                              d_col ? d_col + n * L : 0);                                      \
            gr = o;                                                                            \
        }                                                                                      \
        switch (r * 1000 + d) {                                                                \
            case 2016: backward_item_##SUF(u, q, k, kT, uT, a, b, gr, ru, rq, ck, cu, W, W2,  \
                                           da, db, L, Lp, 2, 16, two_scale, causal, c1, W3,   \
                                           rq3, ck3); break;                                   \
            case 4016: backward_item_##SUF(u, q, k, kT, uT, a, b, gr, ru, rq, ck, cu, W, W2,  \
                                           da, db, L, Lp, 4, 16, two_scale, causal, c1, W3,   \
                                           rq3, ck3); break;                                   \
            case 8016: backward_item_##SUF(u, q, k, kT, uT, a, b, gr, ru, rq, ck, cu, W, W2,  \
                                           da, db, L, Lp, 8, 16, two_scale, causal, c1, W3,   \
                                           rq3, ck3); break;                                   \
            default: backward_item_##SUF(u, q, k, kT, uT, a, b, gr, ru, rq, ck, cu, W, W2,    \
                                         da, db, L, Lp, r, d, two_scale, causal, c1, W3, rq3,  \
                                         ck3);                                                 \
        }                                                                                      \
        /* the centres: a_is = u_is . q_i and b_js = u_js . k_j */                             \
        if (d == 16) {  /* the loop below, its 16 columns as one vector value */               \
            for (long t = 0; t < L; ++t)                                                       \
              for (long h = 0; h < 16; h += VW) {  /* VW columns at a time */                  \
                VW_##SUF sq, sk, qv, kv, wv, rv, cv, dv;                                       \
                memcpy(&sq, rq + t * 16 + h, sizeof sq);                                       \
                memcpy(&sk, ck + t * 16 + h, sizeof sk);                                       \
                memcpy(&qv, q + t * 16 + h, sizeof qv);                                        \
                memcpy(&kv, k + t * 16 + h, sizeof kv);                                        \
                for (long s = 0; s < r; ++s) {                                                 \
                    const T das = da[t * r + s], dbs = db[s * Lp + t];                         \
                    const long o = (t * r + s) * 16 + h;                                       \
                    memcpy(&wv, u + o, sizeof wv);                                             \
                    memcpy(&rv, ru + o, sizeof rv);                                            \
                    memcpy(&cv, cu + o, sizeof cv);                                            \
                    dv = rv + cv + das * qv + dbs * kv;                                        \
                    memcpy(du + o, &dv, sizeof dv);                                            \
                    sq += das * wv;                                                            \
                    sk += dbs * wv;                                                            \
                }                                                                              \
                if (W3) {  /* level 2: the base's shares */                                    \
                    VW_##SUF e3;                                                               \
                    memcpy(&e3, rq3 + t * 16 + h, sizeof e3); sq += e3;                        \
                    memcpy(&e3, ck3 + t * 16 + h, sizeof e3); sk += e3;                        \
                }                                                                              \
                memcpy(dq + t * 16 + h, &sq, sizeof sq);                                       \
                memcpy(dk + t * 16 + h, &sk, sizeof sk);                                       \
            }                                                                                  \
            continue;                                                                          \
        }                                                                                      \
        for (long t = 0; t < L; ++t)                                                           \
            for (long c = 0; c < d; ++c) {                                                     \
                T sq = rq[t * d + c], sk = ck[t * d + c];                                      \
                for (long s = 0; s < r; ++s) {                                                 \
                    const T das = da[t * r + s], dbs = db[s * Lp + t];                         \
                    const T w = u[(t * r + s) * d + c];                                        \
                    du[(t * r + s) * d + c] = ru[(t * r + s) * d + c] + cu[(t * r + s) * d + c] \
                                              + das * q[t * d + c] + dbs * k[t * d + c];       \
                    sq += das * w;                                                             \
                    sk += dbs * w;                                                             \
                }                                                                              \
                dq[t * d + c] = sq;                                                            \
                dk[t * d + c] = sk;                                                            \
            }                                                                                  \
    }                                                                                          \
    free(b);                                                                                   \
    free(W3);                                                                                  \
    free(gs);                                                                                  \
    free(buf);                                                                                 \
}

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)

/* ---- per-token kernels: every token's U^T (r, d) is a contiguous block of ut (N, r, d) ----
 * Tokens go TK at a time, as vector lanes: each block is first copied token-innermost
 * (U[s][c][lane], x[c][lane]; lanes past N are zeros), so every loop below runs over lanes,
 * with no reduction inside a vector and no dependence between lanes. */
#define TK 16
#define FMA_f32 fmaf
#define FMA_f64 fma
#define LANES for (long l = 0; l < TK; ++l)
#define SIMD_LANES _Pragma("omp simd") LANES
/* the pragma over a token-by-token sum over c (SUMS_f64(acc), before its loop) in the bodies
 * for any d: the double build lets the compiler split the sum into vector partial sums; the
 * float build keeps each sum a chain in the order c = 0..d-1. (For d = 16 the projection and
 * skew kernels take their own bodies, token by token or tokens as lanes, both summing in the
 * order of tree16.) */
#define PRAGMA_(...) _Pragma(#__VA_ARGS__)
#define SUMS_f32(...)
#define SUMS_f64(...) PRAGMA_(omp simd reduction(+:__VA_ARGS__))

/* A VW x VW block transposed in vector registers: log2(VW) rounds of two-source shuffles (each
 * interleaves rows j and j + VW / 2: after them a row's and a column's index bits have traded
 * places); a 16 x 16 block as (16 / VW)^2 such blocks. Data movement only: the same numbers. */
#if VW == 16
#define SHUFFLE_MASK_LO {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}
#define SHUFFLE_MASK_HI {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31}
#if defined(__clang__)
#define SHUFFLE_LO(a, b) __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23)
#define SHUFFLE_HI(a, b) __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31)
#endif
#elif VW == 8
#define SHUFFLE_MASK_LO {0, 8, 1, 9, 2, 10, 3, 11}
#define SHUFFLE_MASK_HI {4, 12, 5, 13, 6, 14, 7, 15}
#if defined(__clang__)
#define SHUFFLE_LO(a, b) __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11)
#define SHUFFLE_HI(a, b) __builtin_shufflevector(a, b, 4, 12, 5, 13, 6, 14, 7, 15)
#endif
#else
#error "VW must be 8 or 16"
#endif
#if !defined(__clang__)
#define SHUFFLE_LO(a, b) __builtin_shuffle(a, b, lo)
#define SHUFFLE_HI(a, b) __builtin_shuffle(a, b, hi)
#endif
/* The float helpers are inlined (their vectors stay in registers); the double ones, on no
 * training path, are called: inlining them everywhere made the build 3.5 times as long (gcc 12
 * -O3 on one core of an AMD EPYC: 36 s, against 128 s), for no run's benefit. */
#define INLINE_F32 inline __attribute__((always_inline))
#define INLINE_F64 __attribute__((noinline))
/* the shuffles' masks, of VW lanes */
typedef int MW_f32 __attribute__((vector_size(VW * 4)));
typedef long long MW_f64 __attribute__((vector_size(VW * 8)));
/* A vector of VW numbers at any address of a number: the helpers below load and store whole
 * vectors through these. A memcpy of a vector from one memory place to another (a row into a
 * stack array, say) is split into 16-byte moves by gcc 12 tuned for an AMD EPYC 7003 (znver3),
 * and the whole-vector load that follows two such stores cannot take their data from the store
 * queue: it waits for them to retire. Loading straight into a vector value avoids it: the lane
 * path's skew backward took 251 us against 294 at chapter 4's book shape, the projection's 155
 * against 179 (the kernels alone, interleaved); the transposes of the Woodbury and Fiber
 * Bundle-terms kernels go through the same helpers. */
typedef float VWU_f32 __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef double VWU_f64 __attribute__((vector_size(VW * 8), aligned(8), may_alias));
#define LOADV(SUF, ptr) (*(const VWU_##SUF*)(ptr))
#define STOREV(SUF, ptr, v) (*(VWU_##SUF*)(ptr) = (v))
/* Eight numbers of one token's row of 16 (a half), for the token-by-token skew kernels, and a
 * whole vector's sum in the order of tree16 (below), in every lane: the sums of neighbours,
 * then of pairs, then of halves (a + b and b + a are the same number). */
typedef float TV_f32 __attribute__((vector_size(32)));
typedef double TV_f64 __attribute__((vector_size(64)));
typedef float TVU_f32 __attribute__((vector_size(32), aligned(4), may_alias));
typedef double TVU_f64 __attribute__((vector_size(64), aligned(8), may_alias));
typedef int TM_f32 __attribute__((vector_size(32)));
typedef long long TM_f64 __attribute__((vector_size(64)));
#if defined(__clang__)
#define TV_SWAP(SUF, v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define TV_SWAP(SUF, v, ...) __builtin_shuffle(v, (TM_##SUF){__VA_ARGS__})
#endif
#define TV_SUM(SUF, v)                                                                         \
    ({ const TV_##SUF s0_ = (v);                                                               \
       const TV_##SUF s1_ = s0_ + TV_SWAP(SUF, s0_, 1, 0, 3, 2, 5, 4, 7, 6);                  \
       const TV_##SUF s2_ = s1_ + TV_SWAP(SUF, s1_, 2, 3, 0, 1, 6, 7, 4, 5);                  \
       s2_ + TV_SWAP(SUF, s2_, 4, 5, 6, 7, 0, 1, 2, 3); })
#define DEFINE_TRANSPOSE(T, SUF, INLINE)                                                       \
static INLINE void shuffle_rounds_##SUF(VW_##SUF v[VW]) {                                      \
    const MW_##SUF lo = SHUFFLE_MASK_LO, hi = SHUFFLE_MASK_HI;                                 \
    (void)lo; (void)hi;                                                                        \
    VW_##SUF w[VW];                                                                            \
    for (int round = 0; (1 << round) < VW; ++round) {                                          \
        for (long j = 0; j < VW / 2; ++j) {                                                    \
            w[2 * j] = SHUFFLE_LO(v[j], v[j + VW / 2]);                                        \
            w[2 * j + 1] = SHUFFLE_HI(v[j], v[j + VW / 2]);                                    \
        }                                                                                      \
        for (long j = 0; j < VW; ++j) v[j] = w[j];                                             \
    }                                                                                          \
}                                                                                              \
/* dst[i ds + l] = src[l ss + i] for l, i < 16 */                                              \
static INLINE void transpose16_##SUF(                                                          \
        const T* RESTRICT src, long ss, T* RESTRICT dst, long ds) {                            \
    for (long bi = 0; bi < 16; bi += VW)                                                       \
        for (long bj = 0; bj < 16; bj += VW) {                                                 \
            VW_##SUF v[VW];                                                                    \
            for (long l = 0; l < VW; ++l) v[l] = LOADV(SUF, src + (bi + l) * ss + bj);         \
            shuffle_rounds_##SUF(v);                                                           \
            for (long i = 0; i < VW; ++i) STOREV(SUF, dst + (bj + i) * ds + bi, v[i]);         \
        }                                                                                      \
}
DEFINE_TRANSPOSE(float, f32, INLINE_F32)
DEFINE_TRANSPOSE(double, f64, INLINE_F64)

/* Vector lanes: VW tokens at a time as the lanes of vector values, rows of 16 numbers gathered\
 * from (and scattered to) arbitrary addresses. rows_in: v[i] lane l = row[l][i] (i < 16; a lane\
 * past nb reads zeros); rows_out: row[l][i] = v[i] lane l for l < nb. */                      \
#define DEFINE_ROW_LANES(T, SUF, INLINE)                                                       \
static INLINE void rows_in_##SUF(                                                              \
        const T* const* rows, long nb, VW_##SUF v[16]) {                                       \
    for (long bj = 0; bj < 16; bj += VW) {                                                     \
        VW_##SUF t[VW];                                                                        \
        for (long l = 0; l < VW; ++l) {                                                        \
            if (l < nb) t[l] = LOADV(SUF, rows[l] + bj);                                       \
            else t[l] = (VW_##SUF){0};                                                         \
        }                                                                                      \
        shuffle_rounds_##SUF(t);                                                               \
        for (long l = 0; l < VW; ++l) v[bj + l] = t[l];                                        \
    }                                                                                          \
}                                                                                              \
static INLINE void rows_out_##SUF(                                                             \
        const VW_##SUF v[16], long nb, T* const* rows) {                                       \
    for (long bj = 0; bj < 16; bj += VW) {                                                     \
        VW_##SUF t[VW];                                                                        \
        for (long l = 0; l < VW; ++l) t[l] = v[bj + l];                                        \
        shuffle_rounds_##SUF(t);                                                               \
        for (long l = 0; l < nb; ++l) STOREV(SUF, rows[l] + bj, t[l]);                         \
    }                                                                                          \
}\
/* rows of 16 numbers at base + (n0 + l) stride + off, for l < nb */                           \
static inline __attribute__((always_inline)) void strided_rows_##SUF(                          \
        const T* base, long n0, long nb, long stride, long off, const T* rows[16]) {           \
    for (long l = 0; l < nb; ++l) rows[l] = base + (n0 + l) * stride + off;                    \
}                                                                                              \
/* rows of tokens n0 .. n0 + nb - 1 of an (A, M, I) grid of tokens, token (a M + m) I + i at    \
   x + a sa + m sm + i si (the first located by division, the rest counted) */                 \
static inline __attribute__((always_inline)) void token_rows_##SUF(                            \
        const T* x, long n0, long nb, long M, long I, long sa, long sm, long si,               \
        const T* rows[16]) {                                                                   \
    long a = n0 / (M * I), m = n0 / I % M, i = n0 % I;                                         \
    for (long l = 0; l < nb; ++l) {                                                            \
        rows[l] = x + a * sa + m * sm + i * si;                                                \
        if (++i == I) { i = 0; if (++m == M) { m = 0; ++a; } }                                 \
    }                                                                                          \
}                                                                                              \
/* a backward pass's inputs for VW tokens as lanes: X from x's rows (an (A, M, I) token grid,  \
   as token_rows), G from g's (16 contiguous numbers per token), and DX = G */                 \
static inline __attribute__((always_inline)) void lanes_x_g_##SUF(                             \
        const T* x, const T* g, long n0, long nb, long M, long I, long sa, long sm, long si,   \
        VW_##SUF X[16], VW_##SUF G[16], VW_##SUF DX[16]) {                                     \
    const T* rows[16];                                                                         \
    token_rows_##SUF(x, n0, nb, M, I, sa, sm, si, rows);                                       \
    rows_in_##SUF(rows, nb, X);                                                                \
    strided_rows_##SUF(g, n0, nb, 16, 0, rows);                                                \
    rows_in_##SUF(rows, nb, G);                                                                \
    for (long c = 0; c < 16; ++c) DX[c] = G[c];                                                \
}                                                                                              \
/* sum_c a[c] b[c] over c < 16 per lane, in a fixed order: p_k = a_k b_k + a_(k+8) b_(k+8),    \
   then ((p_0 + p_1) + (p_2 + p_3)) + ((p_4 + p_5) + (p_6 + p_7)) (the order of the            \
   token-by-token skew kernels, TV_SUM: the two paths give the same bits) */                   \
static inline __attribute__((always_inline)) void tree16_##SUF(                                \
        const VW_##SUF a[16], const VW_##SUF b[16], VW_##SUF* out) {  /* out, not a return:    \
                          a vector return value changes the ABI where no register holds it */  \
    VW_##SUF p[8];                                                                             \
    for (long k = 0; k < 8; ++k) p[k] = a[k] * b[k] + a[k + 8] * b[k + 8];                     \
    *out = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));                  \
}
DEFINE_ROW_LANES(float, f32, INLINE_F32)
DEFINE_ROW_LANES(double, f64, INLINE_F64)

#define DEFINE_TOKEN_KERNELS(T, SUF)                                                           \
                                                                                               \
/* copy rows [n0, n0 + nb) of a (N, w) array into (w, TK), zero-padded; and back. A block of  \
   TK = 16 whole rows with w a multiple of 16 goes as 16 x 16 transposes (transpose16: the     \
   scalar copy below, which the compiler does not vectorise for w = 64, cost more than the    \
   arithmetic of the kernels that stage U) */                                                  \
static inline void stage_##SUF(const T* RESTRICT src, long n0, long nb, long w, T* RESTRICT dst) { \
    if (nb == TK && TK == 16 && w % 16 == 0) {                                                 \
        for (long i0 = 0; i0 < w; i0 += 16)                                                    \
            transpose16_##SUF(src + n0 * w + i0, w, dst + i0 * TK, TK);                        \
        return;                                                                                \
    }                                                                                          \
    for (long l = 0; l < nb; ++l)                                                              \
        for (long i = 0; i < w; ++i) dst[i * TK + l] = src[(n0 + l) * w + i];                  \
    for (long l = nb; l < TK; ++l)                                                             \
        for (long i = 0; i < w; ++i) dst[i * TK + l] = 0;                                      \
}                                                                                              \
static inline void unstage_##SUF(const T* RESTRICT src, long n0, long nb, long w, T* RESTRICT dst) { \
    if (nb == TK && TK == 16 && w % 16 == 0) {                                                 \
        for (long i0 = 0; i0 < w; i0 += 16)                                                    \
            transpose16_##SUF(src + i0 * TK, TK, dst + n0 * w + i0, w);                        \
        return;                                                                                \
    }                                                                                          \
    for (long l = 0; l < nb; ++l)                                                              \
        for (long i = 0; i < w; ++i) dst[(n0 + l) * w + i] = src[i * TK + l];                  \
}                                                                                              \
/* out[s][l] = sum_c U[s][c][l] v[c][l] for s < r */                                           \
static inline __attribute__((always_inline)) void lanes_ut_##SUF(                             \
        const T* RESTRICT U, const T* RESTRICT v, T* RESTRICT out, long r, long d) {           \
    for (long s = 0; s < r; ++s) {                                                             \
        T* o = out + s * TK;                                                                   \
        SIMD_LANES o[l] = 0;                                                                   \
        for (long c = 0; c < d; ++c) {                                                         \
            const T* u = U + (s * d + c) * TK;                                                 \
            const T* vc = v + c * TK;                                                          \
            SIMD_LANES o[l] += u[l] * vc[l];                                                   \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
/* y[c][l] = x[c][l] + sign sum_s z[s][l] U[s][c][l] */                                        \
static inline __attribute__((always_inline)) void lanes_u_##SUF(                              \
        const T* RESTRICT U, const T* RESTRICT z, const T* RESTRICT x, T* RESTRICT y, T sign,  \
        long r, long d) {                                                                      \
    for (long c = 0; c < d; ++c) {                                                             \
        T* yc = y + c * TK;                                                                    \
        const T* xc = x + c * TK;                                                              \
        SIMD_LANES yc[l] = xc[l];                                                              \
        for (long s = 0; s < r; ++s) {                                                         \
            const T* u = U + (s * d + c) * TK;                                                 \
            const T* zs = z + s * TK;                                                          \
            SIMD_LANES yc[l] += sign * zs[l] * u[l];                                           \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* y = x + s U (U^T x) per token (Phase A++, eq. (20)): ut (N, r, d), y (N, d); the tokens    \
   n = (b H + h) L + l of x read at b sb + h sh + l sl (a strided (B, H, L, d) view: a head's   \
   queries inside the qkv projection) */                                                       \
static inline __attribute__((always_inline)) void projection_forward_body_##SUF(const T* RESTRICT ut, const T* RESTRICT x, T* RESTRICT y,        \
                              long B, long H, long L, long sb, long sh, long sl, long r,       \
                              long d, double s_) {                                             \
    const T s = (T)s_;                                                                         \
    long n = 0;                                                                                \
    for (long b = 0; b < B; ++b) for (long h = 0; h < H; ++h) for (long l = 0; l < L; ++l, ++n) { \
        const T* u = ut + n * r * d;                                                           \
        const T* xn = x + b * sb + h * sh + l * sl;                                            \
        T* yn = y + n * d;                                                                     \
        for (long c = 0; c < d; ++c) yn[c] = xn[c];                                            \
        for (long t = 0; t < r; ++t) {                                                         \
            T acc = 0;                                                                         \
            SUMS_##SUF(acc)                                                                    \
            for (long c = 0; c < d; ++c) acc += u[t * d + c] * xn[c];                          \
            acc *= s;                                                                          \
            for (long c = 0; c < d; ++c) yn[c] += acc * u[t * d + c];                          \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* its backward for the gradient g (N, d) of y: dx (N, d) = g + s U U^T g (written), dut += s \
   (c g^T + e x^T) with c = U^T x, e = U^T g (accumulated); returns sum e . c (the gradient   \
   of s); x read as in the forward */                                                          \
static inline __attribute__((always_inline)) double projection_backward_body_##SUF(const T* RESTRICT ut, const T* RESTRICT x,                    \
                                 const T* RESTRICT g, T* RESTRICT dx, T* RESTRICT dut,         \
                                 long B, long H, long L, long sb, long sh, long sl, long r,    \
                                 long d, double s_) {                                          \
    const T s = (T)s_;                                                                         \
    double ds = 0;                                                                             \
    long n = 0;                                                                                \
    for (long b = 0; b < B; ++b) for (long h = 0; h < H; ++h) for (long l = 0; l < L; ++l, ++n) { \
        const T* u = ut + n * r * d;                                                           \
        const T* xn = x + b * sb + h * sh + l * sl;                                            \
        const T* gn = g + n * d;                                                               \
        T* dxn = dx + n * d;                                                                   \
        T* dun = dut + n * r * d;                                                              \
        for (long c = 0; c < d; ++c) dxn[c] = gn[c];                                           \
        T dsn = 0;                                                                             \
        for (long t = 0; t < r; ++t) {                                                         \
            T ct = 0, et = 0;                                                                  \
            SUMS_##SUF(ct, et)                                                                 \
            for (long c = 0; c < d; ++c) { ct += u[t * d + c] * xn[c]; et += u[t * d + c] * gn[c]; } \
            dsn += et * ct;                                                                    \
            const T sc = s * ct, se = s * et;                                                  \
            for (long c = 0; c < d; ++c) {                                                     \
                dxn[c] += se * u[t * d + c];                                                   \
                dun[t * d + c] += sc * gn[c] + se * xn[c];                                     \
            }                                                                                  \
        }                                                                                      \
        ds += dsn;                                                                             \
    }                                                                                          \
    return ds;                                                                                 \
}                                                                                              \
                                                                                               \
/* projection_forward_body and projection_backward_body for d = 16, token by token, each row  \
   as two halves of 8 (TV): the sums over c in the order of tree16 (the lanes path's) */      \
static inline __attribute__((always_inline)) void projection_forward_token16_##SUF(            \
        const T* RESTRICT ut, const T* RESTRICT x, T* RESTRICT y, long B, long H, long L,      \
        long sb, long sh, long sl, long r, double s_) {                                        \
    const T s = (T)s_;                                                                         \
    long n = 0;                                                                                \
    for (long b = 0; b < B; ++b) for (long h = 0; h < H; ++h) for (long l = 0; l < L; ++l, ++n) { \
        const T* u = ut + n * r * 16;                                                          \
        const T* xn = x + b * sb + h * sh + l * sl;                                            \
        const TV_##SUF x0 = *(const TVU_##SUF*)xn, x1 = *(const TVU_##SUF*)(xn + 8);          \
        TV_##SUF y0 = x0, y1 = x1;                                                             \
        for (long t = 0; t < r; ++t) {                                                         \
            const TV_##SUF u0 = *(const TVU_##SUF*)(u + t * 16);                               \
            const TV_##SUF u1 = *(const TVU_##SUF*)(u + t * 16 + 8);                           \
            const TV_##SUF acc = TV_SUM(SUF, u0 * x0 + u1 * x1) * s;                           \
            y0 += acc * u0; y1 += acc * u1;                                                    \
        }                                                                                      \
        *(TVU_##SUF*)(y + n * 16) = y0; *(TVU_##SUF*)(y + n * 16 + 8) = y1;                    \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) double projection_backward_token16_##SUF(         \
        const T* RESTRICT ut, const T* RESTRICT x, const T* RESTRICT g, T* RESTRICT dx,        \
        T* RESTRICT dut, long B, long H, long L, long sb, long sh, long sl, long r,            \
        double s_) {                                                                           \
    const T s = (T)s_;                                                                         \
    double ds = 0;                                                                             \
    long n = 0;                                                                                \
    for (long b = 0; b < B; ++b) for (long h = 0; h < H; ++h) for (long l = 0; l < L; ++l, ++n) { \
        const T* u = ut + n * r * 16;                                                          \
        const T* xn = x + b * sb + h * sh + l * sl;                                            \
        const T* gn = g + n * 16;                                                              \
        T* dun = dut + n * r * 16;                                                             \
        const TV_##SUF x0 = *(const TVU_##SUF*)xn, x1 = *(const TVU_##SUF*)(xn + 8);          \
        const TV_##SUF g0 = *(const TVU_##SUF*)gn, g1 = *(const TVU_##SUF*)(gn + 8);          \
        TV_##SUF d0 = g0, d1 = g1;                                                             \
        T dsn = 0;                                                                             \
        for (long t = 0; t < r; ++t) {                                                         \
            const TV_##SUF u0 = *(const TVU_##SUF*)(u + t * 16);                               \
            const TV_##SUF u1 = *(const TVU_##SUF*)(u + t * 16 + 8);                           \
            const TV_##SUF ct = TV_SUM(SUF, u0 * x0 + u1 * x1);                                \
            const TV_##SUF et = TV_SUM(SUF, u0 * g0 + u1 * g1);                                \
            dsn += et[0] * ct[0];                                                              \
            const TV_##SUF sc = s * ct, se = s * et;                                           \
            d0 += se * u0; d1 += se * u1;                                                      \
            TVU_##SUF* du = (TVU_##SUF*)(dun + t * 16);                                        \
            du[0] += sc * g0 + se * x0;                                                        \
            *(TVU_##SUF*)(dun + t * 16 + 8) += sc * g1 + se * x1;                              \
        }                                                                                      \
        ds += dsn;                                                                             \
        *(TVU_##SUF*)(dx + n * 16) = d0; *(TVU_##SUF*)(dx + n * 16 + 8) = d1;                  \
    }                                                                                          \
    return ds;                                                                                 \
}                                                                                              \
                                                                                               \
/* projection_forward_body and projection_backward_body for d = 16, VW tokens per pass as    \
   vector lanes (as the skew kernels: the operations of the token16 bodies in the same order,  \
   so the same bits) */                                                                        \
static inline __attribute__((always_inline)) void projection_forward_lanes_##SUF(              \
        const T* RESTRICT ut, const T* RESTRICT x, T* RESTRICT y, long B, long H, long L,      \
        long sb, long sh, long sl, long r, double s_) {                                        \
    const T s = (T)s_;                                                                         \
    const long N = B * H * L;                                                                  \
    for (long n0 = 0; n0 < N; n0 += VW) {                                                      \
        const long nb = N - n0 < VW ? N - n0 : VW;                                             \
        const T* rows[16];                                                                     \
        T* out[16];                                                                            \
        VW_##SUF X[16], Y[16], Ut[16];                                                         \
        token_rows_##SUF(x, n0, nb, H, L, sb, sh, sl, rows);                                   \
        rows_in_##SUF(rows, nb, X);                                                            \
        for (long c = 0; c < 16; ++c) Y[c] = X[c];                                             \
        for (long t = 0; t < r; ++t) {                                                         \
            strided_rows_##SUF(ut, n0, nb, r * 16, t * 16, rows);                              \
            rows_in_##SUF(rows, nb, Ut);                                                       \
            VW_##SUF acc; tree16_##SUF(Ut, X, &acc); acc *= s;                                          \
            for (long c = 0; c < 16; ++c) Y[c] += acc * Ut[c];                                 \
        }                                                                                      \
        for (long l = 0; l < nb; ++l) out[l] = y + (n0 + l) * 16;                              \
        rows_out_##SUF(Y, nb, out);                                                            \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) double projection_backward_lanes_##SUF(           \
        const T* RESTRICT ut, const T* RESTRICT x, const T* RESTRICT g, T* RESTRICT dx,        \
        T* RESTRICT dut, long B, long H, long L, long sb, long sh, long sl, long r,            \
        double s_) {                                                                           \
    const T s = (T)s_;                                                                         \
    const long N = B * H * L;                                                                  \
    double ds = 0;                                                                             \
    for (long n0 = 0; n0 < N; n0 += VW) {                                                      \
        const long nb = N - n0 < VW ? N - n0 : VW;                                             \
        const T* rows[16];                                                                     \
        T* out[16];                                                                            \
        VW_##SUF X[16], G[16], DX[16], Ut[16], DU[16], dsn = {0};                              \
        lanes_x_g_##SUF(x, g, n0, nb, H, L, sb, sh, sl, X, G, DX);                             \
        for (long t = 0; t < r; ++t) {                                                         \
            strided_rows_##SUF(ut, n0, nb, r * 16, t * 16, rows);                              \
            rows_in_##SUF(rows, nb, Ut);                                                       \
            strided_rows_##SUF(dut, n0, nb, r * 16, t * 16, rows);                             \
            rows_in_##SUF(rows, nb, DU);                                                       \
            VW_##SUF ct, et; tree16_##SUF(Ut, X, &ct); tree16_##SUF(Ut, G, &et);                     \
            dsn += et * ct;                                                                    \
            const VW_##SUF sc = s * ct, se = s * et;                                           \
            for (long c = 0; c < 16; ++c) {                                                    \
                DX[c] += se * Ut[c];                                                           \
                DU[c] += sc * G[c] + se * X[c];                                                \
            }                                                                                  \
            for (long l = 0; l < nb; ++l) out[l] = dut + (n0 + l) * r * 16 + t * 16;           \
            rows_out_##SUF(DU, nb, out);                                                       \
        }                                                                                      \
        for (long l = 0; l < nb; ++l) { ds += dsn[l]; out[l] = dx + (n0 + l) * 16; }           \
        rows_out_##SUF(DX, nb, out);                                                           \
    }                                                                                          \
    return ds;                                                                                 \
}                                                                                              \
                                                                                               \
/* Cholesky factor (lower) of cap = I + U^T U per lane: Lc[a][b][l], and 1 / Lc[a][a] */      \
static inline __attribute__((always_inline)) void capacitance_##SUF(                          \
        const T* RESTRICT U, long r, long d, T* RESTRICT Lc, T* RESTRICT inv) {               \
    for (long a = 0; a < r; ++a) {                                                             \
        for (long b = 0; b <= a; ++b) {                                                        \
            T acc[TK];                                                                         \
            SIMD_LANES acc[l] = a == b ? 1 : 0;                                                \
            for (long c = 0; c < d; ++c) {                                                     \
                const T *ua = U + (a * d + c) * TK, *ub = U + (b * d + c) * TK;                \
                SIMD_LANES acc[l] += ua[l] * ub[l];                                            \
            }                                                                                  \
            for (long k = 0; k < b; ++k) {                                                     \
                const T *la = Lc + (a * RMAX + k) * TK, *lb = Lc + (b * RMAX + k) * TK;        \
                SIMD_LANES acc[l] -= la[l] * lb[l];                                            \
            }                                                                                  \
            T* o = Lc + (a * RMAX + b) * TK;                                                   \
            if (a == b) {                                                                      \
                T* iv = inv + a * TK;                                                          \
                SIMD_LANES { o[l] = sqrt(acc[l]); iv[l] = 1 / o[l]; }                          \
            } else {                                                                           \
                const T* iv = inv + b * TK;                                                    \
                SIMD_LANES o[l] = acc[l] * iv[l];                                              \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
/* z = cap^{-1} z in place per lane, z[s][l] */                                                \
static inline __attribute__((always_inline)) void cholesky_solve_##SUF(                       \
        const T* RESTRICT Lc, const T* RESTRICT inv, long r, T* RESTRICT z) {                  \
    for (long a = 0; a < r; ++a) {                                                             \
        T* za = z + a * TK;                                                                    \
        for (long k = 0; k < a; ++k) {                                                         \
            const T *lk = Lc + (a * RMAX + k) * TK, *zk = z + k * TK;                          \
            SIMD_LANES za[l] -= lk[l] * zk[l];                                                 \
        }                                                                                      \
        const T* iv = inv + a * TK;                                                            \
        SIMD_LANES za[l] *= iv[l];                                                             \
    }                                                                                          \
    for (long a = r - 1; a >= 0; --a) {                                                        \
        T* za = z + a * TK;                                                                    \
        for (long k = a + 1; k < r; ++k) {                                                     \
            const T *lk = Lc + (k * RMAX + a) * TK, *zk = z + k * TK;                          \
            SIMD_LANES za[l] -= lk[l] * zk[l];                                                 \
        }                                                                                      \
        const T* iv = inv + a * TK;                                                            \
        SIMD_LANES za[l] *= iv[l];                                                             \
    }                                                                                          \
}                                                                                              \
/* Y = (I + U U^T)^{-1} X = X - U cap^{-1} U^T X per lane (Woodbury, eq. (26)) */             \
static inline __attribute__((always_inline)) void woodbury_lanes_##SUF(                       \
        const T* RESTRICT U, const T* RESTRICT Lc, const T* RESTRICT inv, const T* RESTRICT X, \
        T* RESTRICT Y, long r, long d) {                                                       \
    T z[RMAX * TK];                                                                            \
    lanes_ut_##SUF(U, X, z, r, d);                                                             \
    cholesky_solve_##SUF(Lc, inv, r, z);                                                       \
    lanes_u_##SUF(U, z, X, Y, (T)-1, r, d);                                                    \
}                                                                                              \
                                                                                               \
static inline __attribute__((always_inline)) void woodbury_forward_body_##SUF(                \
        const T* RESTRICT ut, const T* RESTRICT x, T* RESTRICT y, long N, long r, long d) {    \
    T U[RMAX * d * TK], X[d * TK], Y[d * TK], Lc[RMAX * RMAX * TK], inv[RMAX * TK];            \
    for (long n0 = 0; n0 < N; n0 += TK) {                                                      \
        const long nb = N - n0 < TK ? N - n0 : TK;                                             \
        stage_##SUF(ut, n0, nb, r * d, U);                                                     \
        stage_##SUF(x, n0, nb, d, X);                                                          \
        capacitance_##SUF(U, r, d, Lc, inv);                                                   \
        woodbury_lanes_##SUF(U, Lc, inv, X, Y, r, d);                                          \
        unstage_##SUF(Y, n0, nb, d, y);                                                        \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* backward of y = g^{-1} x for dy: dx = w = g^{-1} dy, dU^T = -((U^T y) w^T + (U^T w) y^T) */ \
static inline __attribute__((always_inline)) void woodbury_backward_body_##SUF(               \
        const T* RESTRICT ut, const T* RESTRICT y, const T* RESTRICT dy, T* RESTRICT dx,       \
        T* RESTRICT dut, long N, long r, long d) {                                             \
    T U[RMAX * d * TK], Yv[d * TK], DY[d * TK], W[d * TK], D[RMAX * d * TK];                   \
    T Lc[RMAX * RMAX * TK], inv[RMAX * TK], uy[RMAX * TK], uw[RMAX * TK];                      \
    for (long n0 = 0; n0 < N; n0 += TK) {                                                      \
        const long nb = N - n0 < TK ? N - n0 : TK;                                             \
        stage_##SUF(ut, n0, nb, r * d, U);                                                     \
        stage_##SUF(y, n0, nb, d, Yv);                                                         \
        stage_##SUF(dy, n0, nb, d, DY);                                                        \
        capacitance_##SUF(U, r, d, Lc, inv);                                                   \
        woodbury_lanes_##SUF(U, Lc, inv, DY, W, r, d);                                         \
        lanes_ut_##SUF(U, Yv, uy, r, d);                                                       \
        lanes_ut_##SUF(U, W, uw, r, d);                                                        \
        for (long t = 0; t < r; ++t)                                                           \
            for (long q = 0; q < d; ++q) {                                                     \
                T* o = D + (t * d + q) * TK;                                                   \
                const T *a1 = uy + t * TK, *a2 = uw + t * TK, *wq = W + q * TK, *yq = Yv + q * TK; \
                SIMD_LANES o[l] = -(a1[l] * wq[l] + a2[l] * yq[l]);                            \
            }                                                                                  \
        unstage_##SUF(W, n0, nb, d, dx);                                                       \
        unstage_##SUF(D, n0, nb, r * d, dut);                                                  \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* y = x + sum_p w_p (L_p R_p^T - R_p L_p^T) x per token (transport eq. (24) and torsion       \
   eq. (22)). The tokens n = (b Q + l) H + h, b < B, l < Q, h < H; wts[p] (N, 2, r, d) holds   \
   L_p^T, R_p^T of pair p (one pointer per pair: the pairs come from different nets); x is read\
   at b sb + l sl + h sh (strides of a (B, Q, H, d) view, d contiguous); y (N, d); w (P). */   \
/* skew_forward_body and skew_backward_body for d = 16, token by token, each row as two halves  \
   of 8 (TV): every sum over c in the order of tree16 (the lanes path's: the same bits) */    \
static inline __attribute__((always_inline)) void skew_forward_token16_##SUF(                  \
        T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT w, T* RESTRICT y,       \
        long B, long Q, long H, long sb, long sl, long sh, long P, long r, long fs) {           \
    for (long b = 0; b < B; ++b) for (long l = 0; l < Q; ++l) for (long h = 0; h < H; ++h) {   \
        const long n = (b * Q + l) * H + h;                                                    \
        const T* xn = x + b * sb + l * sl + h * sh;                                            \
        const TV_##SUF x0 = *(const TVU_##SUF*)xn, x1 = *(const TVU_##SUF*)(xn + 8);          \
        TV_##SUF y0 = x0, y1 = x1;                                                             \
        for (long p = 0; p < P; ++p) {                                                         \
            const T wp = w[p];                                                                 \
            const T* lt = wts[p] + n * fs;                                                     \
            for (long t = 0; t < r; ++t) {                                                     \
                const T* lr = lt + t * 16; const T* rr = lt + (r + t) * 16;                    \
                const TV_##SUF l0 = *(const TVU_##SUF*)lr, l1 = *(const TVU_##SUF*)(lr + 8);  \
                const TV_##SUF r0 = *(const TVU_##SUF*)rr, r1 = *(const TVU_##SUF*)(rr + 8);  \
                const TV_##SUF cl = TV_SUM(SUF, l0 * x0 + l1 * x1) * wp;                       \
                const TV_##SUF cr = TV_SUM(SUF, r0 * x0 + r1 * x1) * wp;                       \
                y0 += cr * l0 - cl * r0;                                                       \
                y1 += cr * l1 - cl * r1;                                                       \
            }                                                                                  \
        }                                                                                      \
        *(TVU_##SUF*)(y + n * 16) = y0; *(TVU_##SUF*)(y + n * 16 + 8) = y1;                    \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) void skew_backward_token16_##SUF(                 \
        T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT g, const T* RESTRICT w, \
        T* const* RESTRICT dwts, T* RESTRICT dx, double* dw,                                   \
        long B, long Q, long H, long sb, long sl, long sh, long P, long r, long fs) {           \
    for (long b = 0; b < B; ++b) for (long l = 0; l < Q; ++l) for (long h = 0; h < H; ++h) {   \
        const long n = (b * Q + l) * H + h;                                                    \
        const T* xn = x + b * sb + l * sl + h * sh;                                            \
        const T* gn = g + n * 16;                                                              \
        T* dxn = dx + b * sb + l * sl + h * sh;                                                \
        const TV_##SUF x0 = *(const TVU_##SUF*)xn, x1 = *(const TVU_##SUF*)(xn + 8);          \
        const TV_##SUF g0 = *(const TVU_##SUF*)gn, g1 = *(const TVU_##SUF*)(gn + 8);          \
        TV_##SUF d0 = g0, d1 = g1;                                                             \
        for (long p = 0; p < P; ++p) {                                                         \
            const T wp = w[p];                                                                 \
            const T* lt = wts[p] + n * fs;                                                     \
            T* dl = dwts[p] + n * fs;                                                          \
            T dwp = 0;                                                                         \
            for (long t = 0; t < r; ++t) {                                                     \
                const T* lr = lt + t * 16; const T* rr = lt + (r + t) * 16;                    \
                const TV_##SUF l0 = *(const TVU_##SUF*)lr, l1 = *(const TVU_##SUF*)(lr + 8);  \
                const TV_##SUF r0 = *(const TVU_##SUF*)rr, r1 = *(const TVU_##SUF*)(rr + 8);  \
                const TV_##SUF cl = TV_SUM(SUF, l0 * x0 + l1 * x1);                            \
                const TV_##SUF cr = TV_SUM(SUF, r0 * x0 + r1 * x1);                            \
                const TV_##SUF el = TV_SUM(SUF, l0 * g0 + l1 * g1);                            \
                const TV_##SUF er = TV_SUM(SUF, r0 * g0 + r1 * g1);                            \
                dwp += el[0] * cr[0] - er[0] * cl[0];                                          \
                d0 -= wp * (er * l0 - el * r0);                                                \
                d1 -= wp * (er * l1 - el * r1);                                                \
                T* o = dl + t * 16;                                                            \
                *(TVU_##SUF*)o = wp * (cr * g0 - er * x0);                                     \
                *(TVU_##SUF*)(o + 8) = wp * (cr * g1 - er * x1);                               \
                o = dl + (r + t) * 16;                                                         \
                *(TVU_##SUF*)o = wp * (el * x0 - cl * g0);                                     \
                *(TVU_##SUF*)(o + 8) = wp * (el * x1 - cl * g1);                               \
            }                                                                                  \
            dw[p] += dwp;                                                                      \
        }                                                                                      \
        *(TVU_##SUF*)dxn = d0; *(TVU_##SUF*)(dxn + 8) = d1;                                    \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) void skew_forward_body_##SUF(                     \
        T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT w, T* RESTRICT y,       \
        long B, long Q, long H, long sb, long sl, long sh, long P, long r, long d, long fs) {           \
    for (long b = 0; b < B; ++b) for (long l = 0; l < Q; ++l) for (long h = 0; h < H; ++h) {   \
        const long n = (b * Q + l) * H + h;                                                    \
        const T* xn = x + b * sb + l * sl + h * sh;                                            \
        T* yn = y + n * d;                                                                     \
        for (long c = 0; c < d; ++c) yn[c] = xn[c];                                            \
        for (long p = 0; p < P; ++p) {                                                         \
            const T* lt = wts[p] + n * fs;                                              \
            const T* rt = lt + r * d;                                                          \
            for (long t = 0; t < r; ++t) {                                                     \
                T cl = 0, cr = 0;                                                              \
                SUMS_##SUF(cl, cr)                                                             \
                for (long c = 0; c < d; ++c) { cl += lt[t * d + c] * xn[c]; cr += rt[t * d + c] * xn[c]; }\
                cl *= w[p]; cr *= w[p];                                                        \
                for (long c = 0; c < d; ++c) yn[c] += cr * lt[t * d + c] - cl * rt[t * d + c]; \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* its backward for g (N, d): dx = g - sum_p w_p T_p g (written at x's strides), dL^T = w (c_R \
   g^T - e_R x^T), dR^T = w (e_L x^T - c_L g^T) (written to dwts[p], laid out as wts[p]),      \
   dw_p += sum e_L . c_R - e_R . c_L (accumulated) */                                          \
static inline __attribute__((always_inline)) void skew_backward_body_##SUF(                    \
        T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT g, const T* RESTRICT w, \
        T* const* RESTRICT dwts, T* RESTRICT dx, double* dw,                                   \
        long B, long Q, long H, long sb, long sl, long sh, long P, long r, long d, long fs) {           \
    for (long b = 0; b < B; ++b) for (long l = 0; l < Q; ++l) for (long h = 0; h < H; ++h) {   \
        const long n = (b * Q + l) * H + h;                                                    \
        const T* xn = x + b * sb + l * sl + h * sh;                                            \
        const T* gn = g + n * d;                                                               \
        T* dxn = dx + b * sb + l * sl + h * sh;                                                \
        for (long c = 0; c < d; ++c) dxn[c] = gn[c];                                           \
        for (long p = 0; p < P; ++p) {                                                         \
            const T* lt = wts[p] + n * fs;                                              \
            const T* rt = lt + r * d;                                                          \
            T* dl = dwts[p] + n * fs;                                                   \
            T* dr = dl + r * d;                                                                \
            T dwp = 0;                                                                         \
            for (long t = 0; t < r; ++t) {                                                     \
                T cl = 0, cr = 0, el = 0, er = 0;                                              \
                SUMS_##SUF(cl, cr, el, er)                                                     \
                for (long c = 0; c < d; ++c) {                                                 \
                    cl += lt[t * d + c] * xn[c]; cr += rt[t * d + c] * xn[c];                  \
                    el += lt[t * d + c] * gn[c]; er += rt[t * d + c] * gn[c];                  \
                }                                                                              \
                dwp += el * cr - er * cl;                                                      \
                const T wp = w[p];                                                             \
                for (long c = 0; c < d; ++c) {                                                 \
                    dxn[c] -= wp * (er * lt[t * d + c] - el * rt[t * d + c]);                  \
                    dl[t * d + c] = wp * (cr * gn[c] - er * xn[c]);                            \
                    dr[t * d + c] = wp * (el * xn[c] - cl * gn[c]);                            \
                }                                                                              \
            }                                                                                  \
            dw[p] += dwp;                                                                      \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* skew_forward_body and skew_backward_body for d = 16, VW tokens per pass as vector lanes     \
   (rows gathered by rows_in: the tokens' x at their strides, each factor row), every          \
   sum over c per lane in the order of tree16 (no horizontal sums), as the token16 bodies;     \
   dw_p's per-lane sums are added in lane order */                                             \
/* rows t of a pair's L^T and R^T (r rows each, fs numbers per token from wp) for VW tokens    \
   as lanes */                                                                                 \
static inline __attribute__((always_inline)) void lanes_pair_##SUF(                            \
        const T* wp, long n0, long nb, long fs, long r, long t, VW_##SUF Lt[16],               \
        VW_##SUF Rt[16]) {                                                                     \
    const T* rows[16];                                                                         \
    strided_rows_##SUF(wp, n0, nb, fs, t * 16, rows);                                          \
    rows_in_##SUF(rows, nb, Lt);                                                               \
    strided_rows_##SUF(wp, n0, nb, fs, (r + t) * 16, rows);                                    \
    rows_in_##SUF(rows, nb, Rt);                                                               \
}                                                                                              \
static inline __attribute__((always_inline)) void skew_forward_lanes_##SUF(                    \
        T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT w, T* RESTRICT y,       \
        long B, long Q, long H, long sb, long sl, long sh, long P, long r, long fs) {           \
    const long N = B * Q * H;                                                                  \
    for (long n0 = 0; n0 < N; n0 += VW) {                                                      \
        const long nb = N - n0 < VW ? N - n0 : VW;                                             \
        const T* rows[16];                                                                     \
        VW_##SUF X[16], Y[16], Lt[16], Rt[16];                                                 \
        token_rows_##SUF(x, n0, nb, Q, H, sb, sl, sh, rows);                                   \
        rows_in_##SUF(rows, nb, X);                                                            \
        for (long c = 0; c < 16; ++c) Y[c] = X[c];                                             \
        for (long p = 0; p < P; ++p) {                                                         \
            const T wp = w[p];                                                                 \
            for (long t = 0; t < r; ++t) {                                                     \
                lanes_pair_##SUF(wts[p], n0, nb, fs, r, t, Lt, Rt);                            \
                VW_##SUF cl, cr; tree16_##SUF(Lt, X, &cl); tree16_##SUF(Rt, X, &cr);                       \
                cl *= wp; cr *= wp;                                                            \
                for (long c = 0; c < 16; ++c) Y[c] += cr * Lt[c] - cl * Rt[c];                 \
            }                                                                                  \
        }                                                                                      \
        T* out[16];                                                                            \
        for (long l = 0; l < nb; ++l) out[l] = y + (n0 + l) * 16;                              \
        rows_out_##SUF(Y, nb, out);                                                            \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) void skew_backward_lanes_##SUF(                   \
        T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT g, const T* RESTRICT w, \
        T* const* RESTRICT dwts, T* RESTRICT dx, double* dw,                                   \
        long B, long Q, long H, long sb, long sl, long sh, long P, long r, long fs) {           \
    const long N = B * Q * H;                                                                  \
    for (long n0 = 0; n0 < N; n0 += VW) {                                                      \
        const long nb = N - n0 < VW ? N - n0 : VW;                                             \
        const T* rows[16];                                                                     \
        T* out[16];                                                                            \
        VW_##SUF X[16], G[16], DX[16], Lt[16], Rt[16], DL[16], DR[16];                         \
        lanes_x_g_##SUF(x, g, n0, nb, Q, H, sb, sl, sh, X, G, DX);                             \
        for (long p = 0; p < P; ++p) {                                                         \
            const T wp = w[p];                                                                 \
            VW_##SUF dwp = {0};                                                                \
            for (long t = 0; t < r; ++t) {                                                     \
                lanes_pair_##SUF(wts[p], n0, nb, fs, r, t, Lt, Rt);                            \
                VW_##SUF cl, cr, el, er; tree16_##SUF(Lt, X, &cl); tree16_##SUF(Rt, X, &cr);           \
                tree16_##SUF(Lt, G, &el); tree16_##SUF(Rt, G, &er);                 \
                dwp += el * cr - er * cl;                                                      \
                for (long c = 0; c < 16; ++c) {                                                \
                    DX[c] -= wp * (er * Lt[c] - el * Rt[c]);                                   \
                    DL[c] = wp * (cr * G[c] - er * X[c]);                                      \
                    DR[c] = wp * (el * X[c] - cl * G[c]);                                      \
                }                                                                              \
                for (long l = 0; l < nb; ++l) out[l] = dwts[p] + (n0 + l) * fs + t * 16;       \
                rows_out_##SUF(DL, nb, out);                                                   \
                for (long l = 0; l < nb; ++l) out[l] = dwts[p] + (n0 + l) * fs + (r + t) * 16; \
                rows_out_##SUF(DR, nb, out);                                                   \
            }                                                                                  \
            for (long l = 0; l < nb; ++l) dw[p] += dwp[l];  /* token by token, in order */     \
        }                                                                                      \
        token_rows_##SUF(dx, n0, nb, Q, H, sb, sl, sh, rows);                                  \
        for (long l = 0; l < nb; ++l) out[l] = (T*)rows[l];                                    \
        rows_out_##SUF(DX, nb, out);                                                           \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* G[i][j][l] = u_i . u_j per lane of U (r, d, TK) and V (for C_t = U_t^T U_{t+1}) */         \
static inline __attribute__((always_inline)) void lanes_gram_##SUF(                           \
        const T* RESTRICT U, const T* RESTRICT V, T* RESTRICT G, long r, long d) {             \
    for (long i = 0; i < r; ++i)                                                               \
        for (long j = 0; j < r; ++j) {                                                         \
            T* o = G + (i * r + j) * TK;                                                       \
            SIMD_LANES o[l] = 0;                                                               \
            for (long c = 0; c < d; ++c) {                                                     \
                const T *ui = U + (i * d + c) * TK, *vj = V + (j * d + c) * TK;                \
                SIMD_LANES o[l] += ui[l] * vj[l];                                              \
            }                                                                                  \
        }                                                                                      \
}                                                                                              \
                                                                                               \
/* Gram sums of the regularisers (eqs. (32), (33)) per item of ut (N, L, r, d):                \
   self_sq (N, L) = |U_t^T U_t|_F^2, cross (N, L-1) = |U_t^T U_{t+1}|_F^2,                     \
   total (N) = |sum_t U_t U_t^T|_F^2; M (N, d, d) = sum_t U_t U_t^T kept for the backward.     \
   Lanes are the tokens t0.. of one item; V holds the next token's factor of each lane. */    \
static inline __attribute__((always_inline)) void gram_forward_body_##SUF(                    \
        const T* RESTRICT ut, T* RESTRICT self_sq, T* RESTRICT cross, T* RESTRICT total,       \
        T* RESTRICT M, long N, long L, long r, long d) {                                       \
    T U[RMAX * d * TK], V[RMAX * d * TK], G[RMAX * RMAX * TK], Ma[d * d * TK], o[TK];          \
    for (long n = 0; n < N; ++n) {                                                             \
        const T* u = ut + n * L * r * d;                                                       \
        for (long t = 0; t < d * d * TK; ++t) Ma[t] = 0;                                       \
        for (long t0 = 0; t0 < L; t0 += TK) {                                                  \
            const long nb = L - t0 < TK ? L - t0 : TK;                                         \
            const long nv = L - t0 - 1 < TK ? L - t0 - 1 : TK;  /* lanes with a next token */  \
            stage_##SUF(u, t0, nb, r * d, U);                                                  \
            stage_##SUF(u, t0 + 1, nv, r * d, V);                                              \
            lanes_gram_##SUF(U, U, G, r, d);                                                   \
            SIMD_LANES o[l] = 0;                                                               \
            for (long t = 0; t < r * r; ++t) { const T* gt = G + t * TK; SIMD_LANES o[l] += gt[l] * gt[l]; } \
            for (long l = 0; l < nb; ++l) self_sq[n * L + t0 + l] = o[l];                      \
            lanes_gram_##SUF(U, V, G, r, d);                                                   \
            SIMD_LANES o[l] = 0;                                                               \
            for (long t = 0; t < r * r; ++t) { const T* gt = G + t * TK; SIMD_LANES o[l] += gt[l] * gt[l]; } \
            for (long l = 0; l < nv; ++l) cross[n * (L - 1) + t0 + l] = o[l];                  \
            for (long b = 0; b < d; ++b)                                                       \
                for (long c = 0; c < d; ++c) {                                                 \
                    T* mb = Ma + (b * d + c) * TK;                                             \
                    for (long i = 0; i < r; ++i) {                                             \
                        const T *ub = U + (i * d + b) * TK, *uc = U + (i * d + c) * TK;        \
                        SIMD_LANES mb[l] += ub[l] * uc[l];                                     \
                    }                                                                          \
                }                                                                              \
        }                                                                                      \
        T* m = M + n * d * d;                                                                  \
        T tot = 0;                                                                             \
        for (long b = 0; b < d * d; ++b) {                                                     \
            T acc = 0;                                                                         \
            for (long l = 0; l < TK; ++l) acc += Ma[b * TK + l];                               \
            m[b] = acc;                                                                        \
            tot += acc * acc;                                                                  \
        }                                                                                      \
        total[n] = tot;                                                                        \
    }                                                                                          \
}                                                                                              \
                                                                                               \
/* their backward with respect to U_t^T: 4 ds_t G_t U_t^T + 2 dc_t C_t U_{t+1}^T               \
   + 2 dc_{t-1} C_{t-1}^T U_{t-1}^T + 4 dm U_t^T M (written into dut) */                      \
static inline __attribute__((always_inline)) void gram_backward_body_##SUF(                   \
        const T* RESTRICT ut, const T* RESTRICT M, const T* RESTRICT ds, const T* RESTRICT dc, \
        const T* RESTRICT dm, T* RESTRICT dut, long N, long L, long r, long d) {              \
    T U[RMAX * d * TK], V[RMAX * d * TK], Pv[RMAX * d * TK], D[RMAX * d * TK];                 \
    T G[RMAX * RMAX * TK], fs[TK], fn[TK], fp[TK];                                             \
    for (long n = 0; n < N; ++n) {                                                             \
        const T* u = ut + n * L * r * d;                                                       \
        const T* m = M + n * d * d;                                                            \
        const T fm = 4 * dm[n];                                                                \
        for (long t0 = 0; t0 < L; t0 += TK) {                                                  \
            const long nb = L - t0 < TK ? L - t0 : TK;                                         \
            const long nv = L - t0 - 1 < TK ? L - t0 - 1 : TK;                                 \
            stage_##SUF(u, t0, nb, r * d, U);                                                  \
            stage_##SUF(u, t0 + 1, nv, r * d, V);                                              \
            if (t0 > 0) stage_##SUF(u, t0 - 1, nb, r * d, Pv);                                 \
            else { stage_##SUF(u, 0, 0, r * d, Pv); for (long l = 1; l < nb; ++l)              \
                       for (long i = 0; i < r * d; ++i) Pv[i * TK + l] = u[(l - 1) * r * d + i]; } \
            LANES {                                                                            \
                const long t = t0 + l;                                                         \
                fs[l] = l < nb ? 4 * ds[n * L + t] : 0;                                        \
                fn[l] = l < nv ? 2 * dc[n * (L - 1) + t] : 0;                                  \
                fp[l] = l < nb && t > 0 ? 2 * dc[n * (L - 1) + t - 1] : 0;                     \
            }                                                                                  \
            for (long i = 0; i < r; ++i)  /* 4 dm U^T M */                                    \
                for (long c = 0; c < d; ++c) {                                                 \
                    T* o = D + (i * d + c) * TK;                                               \
                    SIMD_LANES o[l] = 0;                                                       \
                    for (long b = 0; b < d; ++b) {                                             \
                        const T mbc = fm * m[b * d + c];                                       \
                        const T* ub = U + (i * d + b) * TK;                                    \
                        SIMD_LANES o[l] += mbc * ub[l];                                        \
                    }                                                                          \
                }                                                                              \
            /* + 4 ds G_t U_t^T, 2 dc C_t U_{t+1}^T, 2 dc_{t-1} C_{t-1}^T U_{t-1}^T */         \
            for (long pass = 0; pass < 3; ++pass) {                                            \
                const T* other = pass == 0 ? U : pass == 1 ? V : Pv;                           \
                const T* f = pass == 0 ? fs : pass == 1 ? fn : fp;                             \
                lanes_gram_##SUF(U, other, G, r, d);  /* G[i][j] = u_i . other_j */           \
                for (long i = 0; i < r; ++i)                                                   \
                    for (long j = 0; j < r; ++j) {                                             \
                        const T* gij = G + (i * r + j) * TK;                                   \
                        for (long c = 0; c < d; ++c) {                                         \
                            T* o = D + (i * d + c) * TK;                                       \
                            const T* oj = other + (j * d + c) * TK;                            \
                            SIMD_LANES o[l] += f[l] * gij[l] * oj[l];                          \
                        }                                                                      \
                    }                                                                          \
            }                                                                                  \
            unstage_##SUF(D, t0, nb, r * d, dut + n * L * r * d); \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
/* The Fiber Bundle regularisers of one layer (attention_atlas.native.functions.FiberBundleTerms), \
   ut (N, L, r, d): kappa_t = |U_t|_F^2, s_t = |G_t|^2 and c_t = |C_t|^2 with G_t = U_t^T U_t  \
   and C_t = U_t^T U_{t+1}, T_n = |M_n|^2 with M_n = sum_t U_t U_t^T; out (5, double) = the    \
   means anti (eq. (31)), div (eq. (32)), smooth (eq. (33)), cap (eq. (34)), l2 (mean kappa).  \
   With dut, the gradient of sc * sum_k w_k out_k with respect to ut: 2 dk_t U_t^T             \
   + 4 ds_t G_t U_t^T + 2 dc_t C_t U_{t+1}^T + 2 dc_{t-1} C_{t-1}^T U_{t-1}^T + 4 dT U_t^T M.  \
   Each item is staged once, token-innermost with a zero column either side, S (r d, Ls) with  \
   token t in column t + 1, so a block's tokens, their successors and their predecessors are   \
   the same rows read one column apart; G_t and C_t (GS, CS (r r, Ls), column t + 1) and       \
   kappa_t (KS) stay there for the gradient. grams = 0 (div and smooth weigh 0): no Gram       \
   sums. Sums over tokens in double; M on and above its diagonal. */                           \
static inline __attribute__((always_inline)) void lanes_gram_s_##SUF(                          \
        const T* RESTRICT U, const T* RESTRICT V, long su, T* RESTRICT G, long sg, long r,     \
        long d) {                                                                              \
    T acc[RMAX * RMAX * TK];  /* the r r sums side by side: each c's 2 r rows read once */     \
    for (long t = 0; t < r * r * TK; ++t) acc[t] = 0;                                          \
    for (long c = 0; c < d; ++c)                                                               \
        for (long i = 0; i < r; ++i)                                                           \
            for (long j = 0; j < r; ++j) {                                                     \
                T* o = acc + (i * r + j) * TK;                                                 \
                const T *ui = U + (i * d + c) * su, *vj = V + (j * d + c) * su;                \
                SIMD_LANES o[l] = FMA_##SUF(ui[l], vj[l], o[l]);                               \
            }                                                                                  \
    for (long t = 0; t < r * r; ++t) {                                                         \
        T* g = G + t * sg; const T* a = acc + t * TK;                                          \
        SIMD_LANES g[l] = a[l];                                                                \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) void fbt_terms_body_##SUF(                        \
        const T* RESTRICT ut, T* RESTRICT dut, double* RESTRICT out, long N, long L, long r,   \
        long d, const double* RESTRICT w, double kmin, double kmax, double sc, int grams,      \
        T* RESTRICT S, T* RESTRICT GS, T* RESTRICT CS, T* RESTRICT KS, long Ls) {              \
    T D[RMAX * d * TK], Ma[d * d * TK], fs[TK], fn[TK], fp[TK], fk[TK], o[TK], m[d * d];       \
    const double NL = (double)N * L, NL1 = (double)N * (L - 1);                                \
    double anti = 0, cap = 0, l2 = 0, div = 0, smooth = 0;                                     \
    const double ds_div = -w[1] * 2.0 / (N * (L - 1.0)), ds_sm = w[2] / NL1;                   \
    const double dc_all = -2.0 * w[2] / NL1, dT = w[1] * 2.0 / (N * (double)L * (L - 1.0));    \
    for (long i = 0; i < r * d * Ls; ++i) S[i] = 0;                                            \
    for (long i = 0; i < r * r * Ls; ++i) CS[i] = 0;                                           \
    for (long n = 0; n < N; ++n) {                                                             \
        const T* u = ut + n * L * r * d;                                                       \
        for (long t = 0; t < L; ++t)                                                           \
            for (long i = 0; i < r * d; ++i) S[i * Ls + t + 1] = u[t * r * d + i];             \
        double s_sum = 0, s_pair = 0, c_sum = 0;                                               \
        for (long t = 0; t < d * d * TK; ++t) Ma[t] = 0;                                       \
        for (long t0 = 0; t0 < L; t0 += TK) {                                                  \
            const long nb = L - t0 < TK ? L - t0 : TK;                                         \
            const T* U = S + t0 + 1;                                                           \
            T* kap = KS + t0;                                                                  \
            SIMD_LANES kap[l] = 0;                                                             \
            for (long i = 0; i < r * d; ++i) { const T* ui = U + i * Ls; SIMD_LANES kap[l] += ui[l] * ui[l]; } \
            for (long l = 0; l < nb; ++l) {                                                    \
                const double k = kap[l];                                                       \
                anti += k < kmin ? kmin - k : 0.0;                                             \
                cap += k > kmax ? k - kmax : 0.0;                                              \
                l2 += k;                                                                       \
            }                                                                                  \
            if (!grams) continue;                                                              \
            T* G = GS + t0 + 1;                                                                \
            lanes_gram_s_##SUF(U, U, Ls, G, Ls, r, d);                                         \
            SIMD_LANES o[l] = 0;                                                               \
            for (long t = 0; t < r * r; ++t) { const T* gt = G + t * Ls; SIMD_LANES o[l] += gt[l] * gt[l]; } \
            for (long l = 0; l < nb; ++l) {                                                    \
                const long t = t0 + l;                                                         \
                s_sum += o[l];                                                                 \
                s_pair += (double)o[l] * ((t < L - 1) + (t > 0));                              \
            }                                                                                  \
            T* C = CS + t0 + 1;                                                                \
            lanes_gram_s_##SUF(U, U + 1, Ls, C, Ls, r, d);  /* zero where t + 1 = L */         \
            SIMD_LANES o[l] = 0;                                                               \
            for (long t = 0; t < r * r; ++t) { const T* ct = C + t * Ls; SIMD_LANES o[l] += ct[l] * ct[l]; } \
            for (long l = 0; l < nb; ++l) c_sum += o[l];                                       \
            for (long b = 0; b < d; ++b)                                                       \
                for (long c = b; c < d; ++c) {                                                 \
                    T* mb = Ma + (b * d + c) * TK;                                             \
                    for (long i = 0; i < r; ++i) {                                             \
                        const T *ub = U + (i * d + b) * Ls, *uc = U + (i * d + c) * Ls;        \
                        SIMD_LANES mb[l] = FMA_##SUF(ub[l], uc[l], mb[l]);                     \
                    }                                                                          \
                }                                                                              \
        }                                                                                      \
        if (grams) {                                                                           \
            double tot = 0;                                                                    \
            for (long b = 0; b < d; ++b)                                                       \
                for (long c = b; c < d; ++c) {                                                 \
                    T acc = 0;                                                                 \
                    for (long l = 0; l < TK; ++l) acc += Ma[(b * d + c) * TK + l];             \
                    m[b * d + c] = m[c * d + b] = acc;                                         \
                    tot += (b == c ? 1.0 : 2.0) * (double)acc * acc;                           \
                }                                                                              \
            div -= (2.0 * L * s_sum - 2.0 * tot) / ((double)L * (L - 1));                      \
            smooth += s_pair - 2.0 * c_sum;                                                    \
        }                                                                                      \
        if (!dut) continue;                                                                    \
        const T fm = (T)(4 * sc * dT);                                                         \
        T* RESTRICT dn = dut + n * L * r * d;                                                  \
        for (long t0 = 0; t0 < L; t0 += TK) {                                                  \
            const long nb = L - t0 < TK ? L - t0 : TK;                                         \
            const T* U = S + t0 + 1;                                                           \
            LANES {                                                                            \
                const long t = t0 + l;                                                         \
                const double k = KS[t0 + l];                                                   \
                const double dk = (-(k < kmin) * w[0] + (k > kmax) * w[3] + w[4]) / NL;        \
                fk[l] = l < nb ? (T)(2 * sc * dk) : 0;                                         \
                fs[l] = l < nb ? (T)(4 * sc * (ds_div + ds_sm * ((t < L - 1) + (t > 0)))) : 0; \
                fn[l] = l < nb && t < L - 1 ? (T)(2 * sc * dc_all) : 0;                        \
                fp[l] = l < nb && t > 0 ? (T)(2 * sc * dc_all) : 0;                            \
            }                                                                                  \
            for (long i = 0; i < r * d; ++i) {  /* 2 dk U^T */                                 \
                T* o2 = D + i * TK; const T* ui = U + i * Ls;                                  \
                SIMD_LANES o2[l] = fk[l] * ui[l];                                              \
            }                                                                                  \
            if (grams) {                                                                       \
                for (long i = 0; i < r; ++i) {  /* + 4 dT U^T M, a row's d sums at once */     \
                    T* o2 = D + i * d * TK;                                                    \
                    for (long b = 0; b < d; ++b) {                                             \
                        const T* ub = U + (i * d + b) * Ls;                                    \
                        for (long c = 0; c < d; ++c) {                                         \
                            const T mbc = fm * m[b * d + c];                                   \
                            SIMD_LANES o2[c * TK + l] = FMA_##SUF(mbc, ub[l], o2[c * TK + l]); \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
                /* + 4 ds G_t U_t^T, 2 dc C_t U_{t+1}^T, 2 dc_{t-1} C_{t-1}^T U_{t-1}^T */     \
                for (long pass = 0; pass < 3; ++pass) {                                        \
                    const T* other = pass == 0 ? U : pass == 1 ? U + 1 : U - 1;                \
                    const T* f = pass == 0 ? fs : pass == 1 ? fn : fp;                         \
                    const T* Gp = pass == 0 ? GS + t0 + 1 : pass == 1 ? CS + t0 + 1 : CS + t0; \
                    for (long i = 0; i < r; ++i)                                               \
                        for (long j = 0; j < r; ++j) {                                         \
                            T fg[TK];                                                          \
                            const T* gij = Gp + (pass == 2 ? j * r + i : i * r + j) * Ls;      \
                            SIMD_LANES fg[l] = f[l] * gij[l];                                  \
                            for (long c = 0; c < d; ++c) {                                     \
                                T* o2 = D + (i * d + c) * TK;                                  \
                                const T* oj = other + (j * d + c) * Ls;                        \
                                SIMD_LANES o2[l] = FMA_##SUF(fg[l], oj[l], o2[l]);             \
                            }                                                                  \
                        }                                                                      \
                }                                                                              \
            }                                                                                  \
            unstage_##SUF(D, t0, nb, r * d, dn);  /* this item's rows of dut */                \
        }                                                                                      \
    }                                                                                          \
    out[0] = anti / NL; out[1] = grams ? div / N : 0; out[2] = grams ? smooth / NL1 : 0;       \
    out[3] = cap / NL; out[4] = l2 / NL;                                                       \
}                                                                                              \
void fbt_terms_##SUF(const T* RESTRICT ut, T* RESTRICT dut, double* RESTRICT out, long N, long L, long r, long d, const double* RESTRICT w, double kmin, double kmax, double sc, int grams) { \
    const long Ls = (L + TK - 1) / TK * TK + 2;  /* columns: a zero, L tokens, zeros */        \
    T* S = (T*)malloc(sizeof(T) * (r * d + 2 * r * r + 1) * Ls);                               \
    if (!S) { for (int k = 0; k < 5; ++k) out[k] = NAN; return; }  /* no memory */             \
    T *GS = S + r * d * Ls, *CS = GS + r * r * Ls, *KS = CS + r * r * Ls;                      \
    if (r == 4 && d == 16) fbt_terms_body_##SUF(ut, dut, out, N, L, 4, 16, w, kmin, kmax, sc, grams, S, GS, CS, KS, Ls); \
    else if (r == 8 && d == 16) fbt_terms_body_##SUF(ut, dut, out, N, L, 8, 16, w, kmin, kmax, sc, grams, S, GS, CS, KS, Ls); \
    else fbt_terms_body_##SUF(ut, dut, out, N, L, r, d, w, kmin, kmax, sc, grams, S, GS, CS, KS, Ls); \
    free(S);                                                                                   \
}                                                                                              \
/* out[n] = sum_i x[n][i]^2 for x (N, w) contiguous (kappa_t = |U_t|_F^2 on ut rows; level 2) */ \
void sumsq_##SUF(const T* RESTRICT x, T* RESTRICT out, long N, long w) {                       \
    for (long n0 = 0; n0 < N; n0 += TK) {                                                      \
        const long nb = N - n0 < TK ? N - n0 : TK;                                             \
        T acc[TK];                                                                             \
        SIMD_LANES acc[l] = 0;                                                                 \
        for (long i = 0; i < w; ++i) {                                                         \
            const T* xi = x + n0 * w + i;                                                      \
            for (long l = 0; l < nb; ++l) acc[l] += xi[l * w] * xi[l * w];                     \
        }                                                                                      \
        for (long l = 0; l < nb; ++l) out[n0 + l] = acc[l];                                    \
    }                                                                                          \
}                                                                                              \
void projection_forward_##SUF(const T* RESTRICT ut, const T* RESTRICT x, T* RESTRICT y, long B, long H, long L, long sb, long sh, long sl, long r, long d, double s_, int lanes) {\
    if (lanes && d == 16) {                                                                    \
        projection_forward_lanes_##SUF(ut, x, y, B, H, L, sb, sh, sl, r, s_); return;          \
    }                                                                                          \
    if (d == 16 && r == 4) { projection_forward_token16_##SUF(ut, x, y, B, H, L, sb, sh, sl, 4, s_); return; }\
    if (d == 16) { projection_forward_token16_##SUF(ut, x, y, B, H, L, sb, sh, sl, r, s_); return; }\
    if (r == 2 && d == 16) { projection_forward_body_##SUF(ut, x, y, B, H, L, sb, sh, sl, 2, 16, s_); return; }\
    if (r == 4 && d == 16) { projection_forward_body_##SUF(ut, x, y, B, H, L, sb, sh, sl, 4, 16, s_); return; }\
    if (r == 8 && d == 16) { projection_forward_body_##SUF(ut, x, y, B, H, L, sb, sh, sl, 8, 16, s_); return; }\
    projection_forward_body_##SUF(ut, x, y, B, H, L, sb, sh, sl, r, d, s_);                    \
}                                                                                              \
double projection_backward_##SUF(const T* RESTRICT ut, const T* RESTRICT x, const T* RESTRICT g, T* RESTRICT dx, T* RESTRICT dut, long B, long H, long L, long sb, long sh, long sl, long r, long d, double s_, int lanes) {\
    if (lanes && d == 16) {                                                                    \
        return projection_backward_lanes_##SUF(ut, x, g, dx, dut, B, H, L, sb, sh, sl, r, s_); \
    }                                                                                          \
    if (d == 16 && r == 4) return projection_backward_token16_##SUF(ut, x, g, dx, dut, B, H, L, sb, sh, sl, 4, s_);\
    if (d == 16) return projection_backward_token16_##SUF(ut, x, g, dx, dut, B, H, L, sb, sh, sl, r, s_);\
    if (r == 2 && d == 16) { return projection_backward_body_##SUF(ut, x, g, dx, dut, B, H, L, sb, sh, sl, 2, 16, s_); }\
    if (r == 4 && d == 16) { return projection_backward_body_##SUF(ut, x, g, dx, dut, B, H, L, sb, sh, sl, 4, 16, s_); }\
    if (r == 8 && d == 16) { return projection_backward_body_##SUF(ut, x, g, dx, dut, B, H, L, sb, sh, sl, 8, 16, s_); }\
    return projection_backward_body_##SUF(ut, x, g, dx, dut, B, H, L, sb, sh, sl, r, d, s_);   \
}                                                                                              \
void woodbury_forward_##SUF(const T* RESTRICT ut, const T* RESTRICT x, T* RESTRICT y, long N, long r, long d) {\
    if (r == 2 && d == 16) { woodbury_forward_body_##SUF(ut, x, y, N, 2, 16); return; }        \
    if (r == 4 && d == 16) { woodbury_forward_body_##SUF(ut, x, y, N, 4, 16); return; }        \
    if (r == 8 && d == 16) { woodbury_forward_body_##SUF(ut, x, y, N, 8, 16); return; }        \
    woodbury_forward_body_##SUF(ut, x, y, N, r, d);                                            \
}                                                                                              \
void woodbury_backward_##SUF(const T* RESTRICT ut, const T* RESTRICT y, const T* RESTRICT dy, T* RESTRICT dx, T* RESTRICT dut, long N, long r, long d) {\
    if (r == 2 && d == 16) { woodbury_backward_body_##SUF(ut, y, dy, dx, dut, N, 2, 16); return; }\
    if (r == 4 && d == 16) { woodbury_backward_body_##SUF(ut, y, dy, dx, dut, N, 4, 16); return; }\
    if (r == 8 && d == 16) { woodbury_backward_body_##SUF(ut, y, dy, dx, dut, N, 8, 16); return; }\
    woodbury_backward_body_##SUF(ut, y, dy, dx, dut, N, r, d);                                 \
}                                                                                              \
void skew_forward_##SUF(T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT w, T* RESTRICT y, long B, long Q, long H, long sb, long sl, long sh, long P, long r, long d, long fs, int lanes) {\
    if (lanes && d == 16) {  /* lanes */                                                       \
        skew_forward_lanes_##SUF(wts, x, w, y, B, Q, H, sb, sl, sh, P, r, fs); return;         \
    }                                                                                          \
    if (d == 16 && r == 2) { skew_forward_token16_##SUF(wts, x, w, y, B, Q, H, sb, sl, sh, P, 2, fs); return; }\
    if (d == 16) { skew_forward_token16_##SUF(wts, x, w, y, B, Q, H, sb, sl, sh, P, r, fs); return; }\
    if (r == 2 && d == 16) { skew_forward_body_##SUF(wts, x, w, y, B, Q, H, sb, sl, sh, P, 2, 16, fs); return; }\
    if (r == 4 && d == 16) { skew_forward_body_##SUF(wts, x, w, y, B, Q, H, sb, sl, sh, P, 4, 16, fs); return; }\
    if (r == 8 && d == 16) { skew_forward_body_##SUF(wts, x, w, y, B, Q, H, sb, sl, sh, P, 8, 16, fs); return; }\
    skew_forward_body_##SUF(wts, x, w, y, B, Q, H, sb, sl, sh, P, r, d, fs);                       \
}                                                                                              \
void skew_backward_##SUF(T* const* RESTRICT wts, const T* RESTRICT x, const T* RESTRICT g, const T* RESTRICT w, T* const* RESTRICT dwts, T* RESTRICT dx, double* dw, long B, long Q, long H, long sb, long sl, long sh, long P, long r, long d, long fs, int lanes) {\
    if (lanes && d == 16) {  /* lanes */                                                       \
        skew_backward_lanes_##SUF(wts, x, g, w, dwts, dx, dw, B, Q, H, sb, sl, sh, P, r, fs); return;\
    }                                                                                          \
    if (d == 16 && r == 2) { skew_backward_token16_##SUF(wts, x, g, w, dwts, dx, dw, B, Q, H, sb, sl, sh, P, 2, fs); return; }\
    if (d == 16) { skew_backward_token16_##SUF(wts, x, g, w, dwts, dx, dw, B, Q, H, sb, sl, sh, P, r, fs); return; }\
    if (r == 2 && d == 16) { skew_backward_body_##SUF(wts, x, g, w, dwts, dx, dw, B, Q, H, sb, sl, sh, P, 2, 16, fs); return; }\
    if (r == 4 && d == 16) { skew_backward_body_##SUF(wts, x, g, w, dwts, dx, dw, B, Q, H, sb, sl, sh, P, 4, 16, fs); return; }\
    if (r == 8 && d == 16) { skew_backward_body_##SUF(wts, x, g, w, dwts, dx, dw, B, Q, H, sb, sl, sh, P, 8, 16, fs); return; }\
    skew_backward_body_##SUF(wts, x, g, w, dwts, dx, dw, B, Q, H, sb, sl, sh, P, r, d, fs);        \
}                                                                                              \
void gram_forward_##SUF(const T* RESTRICT ut, T* RESTRICT self_sq, T* RESTRICT cross, T* RESTRICT total, T* RESTRICT M, long N, long L, long r, long d) {\
    if (r == 2 && d == 16) { gram_forward_body_##SUF(ut, self_sq, cross, total, M, N, L, 2, 16); return; }\
    if (r == 4 && d == 16) { gram_forward_body_##SUF(ut, self_sq, cross, total, M, N, L, 4, 16); return; }\
    if (r == 8 && d == 16) { gram_forward_body_##SUF(ut, self_sq, cross, total, M, N, L, 8, 16); return; }\
    gram_forward_body_##SUF(ut, self_sq, cross, total, M, N, L, r, d);                         \
}                                                                                              \
void gram_backward_##SUF(const T* RESTRICT ut, const T* RESTRICT M, const T* RESTRICT ds, const T* RESTRICT dc, const T* RESTRICT dm, T* RESTRICT dut, long N, long L, long r, long d) {\
    if (r == 2 && d == 16) { gram_backward_body_##SUF(ut, M, ds, dc, dm, dut, N, L, 2, 16); return; }\
    if (r == 4 && d == 16) { gram_backward_body_##SUF(ut, M, ds, dc, dm, dut, N, L, 4, 16); return; }\
    if (r == 8 && d == 16) { gram_backward_body_##SUF(ut, M, ds, dc, dm, dut, N, L, 8, 16); return; }\
    gram_backward_body_##SUF(ut, M, ds, dc, dm, dut, N, L, r, d);                              \
}

DEFINE_TOKEN_KERNELS(float, f32)
DEFINE_TOKEN_KERNELS(double, f64)

/* ---- the closed-form penalty of causal dot-product heads (cofactor.penalty.CausalHeadPenalty)
 * B matrices, matrix b's queries and keys from qs[b] and ks[b], token i at qs[b] + i rq (rows
 * of d contiguous numbers: a head's view of a projection is read in place); z_ij = scale q_i .
 * k_j for j <= i; A (B, n (n + 1) / 2) its row softmax, the entries j <= i of row i packed
 * from i (i + 1) / 2; s (B, n, double) s_i = sum_{j<i} A_ij (positive terms: per-lane float
 * sums added in double); loss (B, double) the penalty of each head from m = prod_{i>=1} s_i
 * (causal_head_loss).
 * Backward: g (B, double) dloss_b; gs_i = scale g dloss/dm dm/ds_i (dm/ds_i the exclusive
 * product of the other s_k, by prefix and suffix products: exact where an s_k vanishes);
 * dz_ij = A_ij gs_i ([j < i] - s_i) for j <= i; dq_i = sum_j dz_ij k_j, dk_j = sum_i dz_ij
 * q_i (written to dqs[b], dks[b] with row strides rdq, rdk; overwritten).
 * The forward runs over blocks of JB contiguous j (each matrix's keys staged transposed,
 * (d, n) padded to a multiple of JB), the logits of a block in registers. */

/* -log(m + eps) + beta KL(u || p), p = (m + eps, eps, ..., eps) (cofactor.penalty._loss_of_m),
 * and its derivative in m (*dm) */
static double causal_head_loss(double m, long n, double beta, double eps, double* dm) {
    double loss = -log(m + eps);
    *dm = -1.0 / (m + eps);
    if (beta != 0.0) {
        const double cst = (double)(n - 1) / (double)n * log(eps) + log((double)n);
        loss += beta * (log(m + (double)n * eps) - log(m + eps) / (double)n - cst);
        *dm += beta * (1.0 / (m + (double)n * eps) - 1.0 / ((double)n * (m + eps)));
    }
    return loss;
}

/* The causal-head kernels below are compiled without trapping math, as the exponentials (before
 * the pairwise kernels): it lets gcc blend the two sides of a float comparison in vector
 * registers (no operation's value changes: nothing here reads the floating-point exception
 * flags). Without it a 256-bit (AVX2) build left the exponentials' loop scalar, half of the heads
 * kernel's time (an AVX-512 build masks it); for the whole file it slowed the Fiber Bundle step
 * by 2 to 4% on the same machine. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

#define DEFINE_CAUSAL_HEAD_KERNELS(T, SUF)                                                     \
static inline __attribute__((always_inline)) void causal_head_forward_body_##SUF(              \
    T* const* RESTRICT qs, T* const* RESTRICT ks, long rq, long rk, T* RESTRICT A,           \
    double* RESTRICT s, long B, double* RESTRICT loss, long n, long d, double scale,          \
    double beta, double eps, T* RESTRICT kt, T* RESTRICT zrows, T* RESTRICT qsc,            \
    const int fm) {                                                                            \
    const T sc = (T)scale;                                                                     \
    const long np = (n + JB - 1) / JB * JB, tri = n * (n + 1) / 2;                             \
    for (long b = 0; b < B; ++b) {                                                             \
        const T* RESTRICT qb = qs[b]; const T* RESTRICT kb = ks[b];                            \
        for (long c = 0; c < d; ++c) for (long j = 0; j < np; ++j)                             \
            kt[c * np + j] = j < n ? kb[j * rk + c] : (T)0;                                    \
        for (long i = 0; i < n; ++i) /* the queries scaled, contiguous (the products as before) */\
            _Pragma("omp simd") for (long c = 0; c < d; ++c) qsc[i * d + c] = sc * qb[i * rq + c];\
        for (long i0 = 0; i0 < n; i0 += RB) { /* RB rows at once: RB independent sums */      \
            const long top_row = i0 + RB - 1 < n ? i0 + RB - 1 : n - 1;                        \
            const T* qr[RB];                                                                   \
            for (long r = 0; r < RB; ++r) qr[r] = qsc + (i0 + r < n ? i0 + r : n - 1) * d;     \
            T mx[RB][JB];                                                                      \
            for (long r = 0; r < RB; ++r)                                                      \
                _Pragma("omp simd") for (long l = 0; l < JB; ++l) mx[r][l] = -INFINITY;        \
            for (long j0 = 0; j0 <= top_row; j0 += JB) { /* RB x JB logits in registers */    \
                T acc[RB][JB];                                                                 \
                for (long r = 0; r < RB; ++r)                                                  \
                    _Pragma("omp simd") for (long l = 0; l < JB; ++l) acc[r][l] = 0;           \
                for (long c = 0; c < d; ++c) {                                                 \
                    const T* RESTRICT kc = kt + c * np + j0;                                   \
                    for (long r = 0; r < RB; ++r) {                                            \
                        const T a = qr[r][c];                                                  \
                        if (fm) {                                                              \
                            _Pragma("omp simd") for (long l = 0; l < JB; ++l) acc[r][l] = FMA_##SUF(a, kc[l], acc[r][l]); \
                        } else {                                                               \
                            _Pragma("omp simd") for (long l = 0; l < JB; ++l) acc[r][l] += a * kc[l]; \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
                for (long r = 0; r < RB; ++r) { /* lanes l >= lim are above the diagonal */   \
                    const long lim = i0 + r + 1 - j0; T* RESTRICT zr = zrows + r * np + j0;    \
                    _Pragma("omp simd") for (long l = 0; l < JB; ++l) {                        \
                        const T z = l < lim ? acc[r][l] : -INFINITY;                           \
                        zr[l] = z; mx[r][l] = z > mx[r][l] ? z : mx[r][l];                     \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            /* each row's maximum, then (below) its sum, lane by lane in the same order as one \
               row alone, the RB rows' chains interleaved (a row's chain is latency-bound) */ \
            const long rows_here = n - i0 < RB ? n - i0 : RB;                                  \
            T top[RB], lo[RB][JB];                                                             \
            for (long r = 0; r < RB; ++r) top[r] = mx[r][0];                                   \
            for (long l = 1; l < JB; ++l)                                                      \
                for (long r = 0; r < RB; ++r) top[r] = mx[r][l] > top[r] ? mx[r][l] : top[r];  \
            for (long r = 0; r < RB; ++r) /* rows past n - 1 keep 0: their sums are not used */ \
                _Pragma("omp simd") for (long l = 0; l < JB; ++l) lo[r][l] = 0;                \
            for (long r = 0; r < rows_here; ++r) {                                             \
                const long i = i0 + r, m = i + 1, last = (m - 1) / JB * JB;                    \
                T* RESTRICT zrow = zrows + r * np;                                             \
                T* RESTRICT lr = lo[r];                                                        \
                const T tr = top[r];                                                           \
                for (long j0 = 0; j0 < m; j0 += JB) { /* exp, and the sum below the diagonal */\
                    const long cut = j0 == last ? i - j0 : JB; /* lane of j = i */            \
                    _Pragma("omp simd") for (long l = 0; l < JB; ++l) {                        \
                        const T e = fm ? exp_nonpositive_fma_##SUF(zrow[j0 + l] - tr)          \
                                       : exp_nonpositive_##SUF(zrow[j0 + l] - tr);             \
                        zrow[j0 + l] = e; lr[l] += l < cut ? e : (T)0;                         \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            double lower[RB] = {0.0};                                                          \
            for (long l = 0; l < JB; ++l)                                                      \
                for (long r = 0; r < RB; ++r) lower[r] += (double)lo[r][l];                    \
            for (long r = 0; r < rows_here; ++r) {                                             \
                const long i = i0 + r, m = i + 1, last = (m - 1) / JB * JB;                    \
                T* RESTRICT zrow = zrows + r * np;                                             \
                T* RESTRICT row = A + b * tri + i * (i + 1) / 2;                               \
                const double total = lower[r] + (double)zrow[i];                               \
                const T inv = (T)(1.0 / total);                                                \
                for (long j0 = 0; j0 < last; j0 += JB) { /* the row's m entries, packed */    \
                    _Pragma("omp simd") for (long l = 0; l < JB; ++l) row[j0 + l] = zrow[j0 + l] * inv; \
                }                                                                              \
                for (long j = last; j < m; ++j) row[j] = zrow[j] * inv;                        \
                s[b * n + i] = lower[r] / total;                                               \
            }                                                                                  \
        }                                                                                      \
        double m = 1.0, dm;                                                                    \
        for (long i = 1; i < n; ++i) m *= s[b * n + i];                                        \
        loss[b] = causal_head_loss(m, n, beta, eps, &dm);                                      \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) void causal_head_backward_body_##SUF(             \
    T* const* RESTRICT qs, T* const* RESTRICT ks, long rq, long rk, const T* RESTRICT A,     \
    const double* RESTRICT g, const double* RESTRICT s, T* const* RESTRICT dqs,              \
    T* const* RESTRICT dks, long rdq, long rdk, long B, long n, long d, double scale,          \
    double beta, double eps, double* RESTRICT gs, double* RESTRICT after, T* RESTRICT dzb,   \
    const int fm) {                                                                            \
    for (long b = 0; b < B; ++b) {                                                             \
        const T* RESTRICT qb = qs[b]; const T* RESTRICT kb = ks[b];                            \
        T* RESTRICT dqb = dqs[b]; T* RESTRICT dkb = dks[b];                                    \
        for (long j = 0; j < n; ++j) memset(dkb + j * rdk, 0, sizeof(T) * d);                 \
        const double* sb = s + b * n;                                                          \
        double m = 1.0, dm;                                                                    \
        for (long i = 1; i < n; ++i) m *= sb[i];                                               \
        causal_head_loss(m, n, beta, eps, &dm);                                                \
        after[n - 1] = 1.0; /* after_i = prod_{k > i} s_k */                                   \
        for (long i = n - 1; i > 1; --i) after[i - 1] = after[i] * sb[i];                      \
        const double c = g[b] * dm * scale;                                                    \
        double before = 1.0; /* prod_{1 <= k < i} s_k */                                       \
        gs[0] = 0.0;                                                                           \
        for (long i = 1; i < n; ++i) { gs[i] = c * before * after[i]; before *= sb[i]; }       \
        for (long i0 = 0; i0 < n; i0 += RB) { /* RB rows at once: each dk_j read once */      \
            const long top_row = i0 + RB - 1 < n ? i0 + RB - 1 : n - 1;                        \
            const T* qr[RB]; const T* rows[RB]; T gi[RB], gsi[RB];                             \
            T aq[RB][d]; /* the rows' dq kept local (the compiler cannot tell that a pointer \
                            read from an array shares no memory with the dk_j it writes) */  \
            for (long r = 0; r < RB; ++r) {                                                    \
                const long i = i0 + r < n ? i0 + r : n - 1;                                    \
                qr[r] = qb + i * rq; rows[r] = A + b * (n * (n + 1) / 2) + i * (i + 1) / 2;    \
                gi[r] = (T)gs[i]; gsi[r] = (T)(gs[i] * sb[i]);                                 \
                for (long c = 0; c < d; ++c) aq[r][c] = 0;                                     \
            }                                                                                  \
            for (long r = 0; r < RB; ++r) { /* dz_ij, 0 above the diagonal and past row n - 1 */\
                const long i = i0 + r; const T* RESTRICT ar = rows[r]; T* RESTRICT dzr = dzb + r * n;\
                const T gir = gi[r], gsr = gsi[r];                                             \
                _Pragma("omp simd") for (long j = 0; j <= top_row; ++j) {                      \
                    const T a = j <= i && i < n ? ar[j] : (T)0;                                \
                    dzr[j] = j <= i && i < n ? a * ((j < i ? gir : (T)0) - gsr) : (T)0;         \
                }                                                                              \
            }                                                                                  \
            for (long j = 0; j <= top_row; ++j) {                                              \
                const T* RESTRICT kj = kb + j * rk; T* RESTRICT dkj = dkb + j * rdk;           \
                T dz[RB];                                                                      \
                for (long r = 0; r < RB; ++r) dz[r] = dzb[r * n + j];                          \
                _Pragma("omp simd")                                                            \
                for (long c = 0; c < d; ++c) {                                                 \
                    T acc = dkj[c];                                                            \
                    if (fm) for (long r = 0; r < RB; ++r) {                                    \
                        aq[r][c] = FMA_##SUF(dz[r], kj[c], aq[r][c]); acc = FMA_##SUF(dz[r], qr[r][c], acc); } \
                    else for (long r = 0; r < RB; ++r) { aq[r][c] += dz[r] * kj[c]; acc += dz[r] * qr[r][c]; } \
                    dkj[c] = acc;                                                              \
                }                                                                              \
            }                                                                                  \
            for (long r = 0; r < RB && i0 + r < n; ++r) {                                      \
                T* dqi = dqb + (i0 + r) * rdq;                                                 \
                for (long c = 0; c < d; ++c) dqi[c] = aq[r][c];                                \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
void causal_head_forward_##SUF(T* const* RESTRICT qs, T* const* RESTRICT ks, T* RESTRICT A,    \
                               double* RESTRICT s, double* RESTRICT loss, long B, long n,      \
                               long d, long rq, long rk, double scale, double beta, double eps) {\
    const long np = (n + JB - 1) / JB * JB;                                                    \
    T* kt = (T*)malloc(sizeof(T) * (np * (d + RB) + n * d));                                   \
    if (!kt) return;                                                                           \
    T* qsc = kt + np * (d + RB);                                                               \
    if (d == 16)                                                                               \
        causal_head_forward_body_##SUF(qs, ks, rq, rk, A, s, B, loss, n, 16, scale, beta, eps, kt, kt + np * 16, qsc, 0);\
    else causal_head_forward_body_##SUF(qs, ks, rq, rk, A, s, B, loss, n, d, scale, beta, eps, kt, kt + np * d, qsc, 0);\
    free(kt);                                                                                  \
}                                                                                              \
void causal_head_backward_##SUF(T* const* RESTRICT qs, T* const* RESTRICT ks, const T* RESTRICT A,\
                                const double* RESTRICT g, const double* RESTRICT s,            \
                                T* const* RESTRICT dqs, T* const* RESTRICT dks, long B, long n,\
                                long d, long rq, long rk, long rdq, long rdk, double scale,    \
                                double beta, double eps) {                                     \
    double* tmp = (double*)malloc(sizeof(double) * 2 * n);                                     \
    T* dzb = (T*)malloc(sizeof(T) * RB * n);                                                   \
    if (!tmp || !dzb) { free(tmp); free(dzb); return; }                                        \
    if (d == 16)                                                                               \
        causal_head_backward_body_##SUF(qs, ks, rq, rk, A, g, s, dqs, dks, rdq, rdk, B, n, 16, scale, beta, eps, tmp, tmp + n, dzb, 0);\
    else causal_head_backward_body_##SUF(qs, ks, rq, rk, A, g, s, dqs, dks, rdq, rdk, B, n, d, scale, beta, eps, tmp, tmp + n, dzb, 0);\
    free(tmp); free(dzb);                                                                      \
}                                                                                              \
/* The mean penalty of B = nl items nh matrices and, with grad, its gradient in one call,      \
   matrix by matrix (the softmax rows of one matrix stay in a small buffer, never written      \
   out). Matrix (l, t, h), in that order: queries from qb[l] + t sqt + h sqh, rows rq apart    \
   (element strides), keys likewise from kb[l]; loss (B + 1) each penalty, then their mean;    \
   gq, gk (B, n, d) contiguous, d(mean loss)/dq and /dk (g = 1/B per matrix). */              \
void causal_heads_fused_##SUF(T* const* RESTRICT qb, T* const* RESTRICT kb, long nl, long nt, \
                              long nh, long sqt, long sqh, long skt, long skh, T* RESTRICT gq, \
                              T* RESTRICT gk, double* RESTRICT loss, long n, long d, long rq,  \
                              long rk, double scale, double beta, double eps, int grad,        \
                              int fm) {                                                        \
    const long np = (n + JB - 1) / JB * JB, B = nl * nt * nh;                                  \
    T* kt = (T*)malloc(sizeof(T) * (np * (d + RB) + n * (n + 1) / 2 + n * d + RB * n));        \
    double* s = (double*)malloc(sizeof(double) * 3 * n);                                       \
    if (!kt || !s) { free(kt); free(s); return; }                                              \
    T* A = kt + np * (d + RB);                                                                 \
    T* qsc = A + n * (n + 1) / 2; /* the scaled queries, then the backward's dz rows */        \
    T* dzb = qsc + n * d;                                                                      \
    const double g = 1.0 / (double)B;                                                          \
    double sum = 0.0;                                                                          \
    for (long b = 0; b < B; ++b) {                                                             \
        const long l = b / (nt * nh), t = b / nh % nt, h = b % nh;                             \
        T* qp = qb[l] + t * sqt + h * sqh; T* kp = kb[l] + t * skt + h * skh;                  \
        if (d == 16 && fm)                                                                     \
            causal_head_forward_body_##SUF(&qp, &kp, rq, rk, A, s, 1, loss + b, n, 16, scale, beta, eps, kt, kt + np * 16, qsc, 1);\
        else if (d == 16)                                                                      \
            causal_head_forward_body_##SUF(&qp, &kp, rq, rk, A, s, 1, loss + b, n, 16, scale, beta, eps, kt, kt + np * 16, qsc, 0);\
        else if (fm) causal_head_forward_body_##SUF(&qp, &kp, rq, rk, A, s, 1, loss + b, n, d, scale, beta, eps, kt, kt + np * d, qsc, 1);\
        else causal_head_forward_body_##SUF(&qp, &kp, rq, rk, A, s, 1, loss + b, n, d, scale, beta, eps, kt, kt + np * d, qsc, 0);\
        sum += loss[b];                                                                        \
        if (!grad) continue;                                                                   \
        T* dq = gq + b * n * d; T* dk = gk + b * n * d;                                        \
        if (d == 16 && fm)                                                                     \
            causal_head_backward_body_##SUF(&qp, &kp, rq, rk, A, &g, s, &dq, &dk, 16, 16, 1, n, 16, scale, beta, eps, s + n, s + 2 * n, dzb, 1);\
        else if (d == 16)                                                                      \
            causal_head_backward_body_##SUF(&qp, &kp, rq, rk, A, &g, s, &dq, &dk, 16, 16, 1, n, 16, scale, beta, eps, s + n, s + 2 * n, dzb, 0);\
        else if (fm) causal_head_backward_body_##SUF(&qp, &kp, rq, rk, A, &g, s, &dq, &dk, d, d, 1, n, d, scale, beta, eps, s + n, s + 2 * n, dzb, 1);\
        else causal_head_backward_body_##SUF(&qp, &kp, rq, rk, A, &g, s, &dq, &dk, d, d, 1, n, d, scale, beta, eps, s + n, s + 2 * n, dzb, 0);\
    }                                                                                          \
    loss[B] = sum / (double)B;                                                                 \
    free(kt); free(s);                                                                         \
}

DEFINE_CAUSAL_HEAD_KERNELS(float, f32)
DEFINE_CAUSAL_HEAD_KERNELS(double, f64)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* ---- the SSM's intra-chunk decay mask (attention.sma.duality._MaskedScoresT) ----
 * M chunks of length l in the transposed layout (s, t): scores (M, l, l), a (M, l) the decays
 * exp(A) (formed by the caller, with torch's exp). Each chunk's mask L_st = a_{s+1} ... a_t for
 * t >= s (the product along the row accumulated in double and rounded per entry, as torch's
 * CPU cumprod does), 0 for t < s, is formed in a buffer that stays in the first-level cache,
 * never written out: the forward writes out = scores o L, the backward forms L again and
 * writes d_scores = grad o L and G = d_scores o scores (the sums of G stay with the caller),
 * laid out as grad: as L, or its transpose (t, s) (transposed), the layout autograd hands the
 * caller. Every entry is the same float operations as the PyTorch path's in the same order
 * (no product reassociated or contracted: -std=c99 keeps -ffp-contract=off), so the same bits.
 * The row products, a chain each, run SB rows at a time as the lanes of one vector. */
#define SB 8
typedef double V8_f64 __attribute__((vector_size(64)));
typedef long V8I_f64 __attribute__((vector_size(64)));
typedef float V8_f32 __attribute__((vector_size(32)));

#define DEFINE_SSM_KERNELS(T, SUF)                                                             \
/* one chunk's mask into Lb (l, l), or its transpose (trans); tile (l, SB) scratch: rows s0 .. s0 + SB - 1 as lanes,   \
   their products column by column (lane ss takes a_t once t > s0 + ss, so only the first   \
   SB - 1 columns need a per-lane choice), then copied out row by row */                      \
static void ssm_mask_##SUF(const T* RESTRICT am, T* RESTRICT Lb, T* RESTRICT tile, long l,      \
                           int trans) {                                                        \
    const V8_f64 lane = {0, 1, 2, 3, 4, 5, 6, 7}, ones = {1, 1, 1, 1, 1, 1, 1, 1};            \
    for (long s0 = 0; s0 < l; s0 += SB) {                                                      \
        const long ns = l - s0 < SB ? l - s0 : SB, t1 = s0 + SB < l ? s0 + SB : l;             \
        V8_f64 acc = ones;                                                                     \
        for (long t = s0 + 1; t < t1; ++t) {                                                   \
            const V8_f64 at = ones * (double)am[t];                                            \
            const V8I_f64 take = (double)(t - s0) > lane;  /* all bits set where t > s */      \
            V8_f64 f;                                                                          \
            const V8I_f64 bits = ((V8I_f64)at & take) | ((V8I_f64)ones & ~take);               \
            memcpy(&f, &bits, sizeof f);                                                       \
            acc *= f;                                                                          \
            const V8_##SUF v = __builtin_convertvector(acc, V8_##SUF);                         \
            memcpy(tile + t * SB, &v, sizeof v);                                               \
        }                                                                                      \
        for (long t = t1; t < l; ++t) {  /* every lane's row is left of t */                   \
            acc *= (double)am[t];                                                              \
            const V8_##SUF v = __builtin_convertvector(acc, V8_##SUF);                         \
            memcpy(tile + t * SB, &v, sizeof v);                                               \
        }                                                                                      \
        if (trans) {  /* Lb[t][s]: the tile's rows are its columns' pieces */                 \
            for (long t = 0; t < l; ++t)                                                       \
                for (long ss = 0; ss < ns; ++ss)                                               \
                    Lb[t * l + s0 + ss] = t < s0 + ss ? 0 : t == s0 + ss ? 1 : tile[t * SB + ss]; \
            continue;                                                                          \
        }                                                                                      \
        for (long ss = 0; ss < ns; ++ss) {                                                     \
            const long row = s0 + ss;                                                          \
            T* Lr = Lb + row * l;                                                              \
            for (long t = 0; t < row; ++t) Lr[t] = 0;                                          \
            Lr[row] = 1;                                                                       \
            for (long t = row + 1; t < l; ++t) Lr[t] = tile[t * SB + ss];                      \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
void ssm_mask_forward_##SUF(const T* RESTRICT scores, const T* RESTRICT a, T* RESTRICT out,   \
                            long M, long l) {                                                  \
    T* Lb = (T*)malloc(sizeof(T) * (l * l + l * SB));                                          \
    const long ll = l * l;                                                                     \
    for (long m = 0; m < M; ++m) {                                                             \
        ssm_mask_##SUF(a + m * l, Lb, Lb + ll, l, 0);                                          \
        const T* sc = scores + m * ll;                                                         \
        T* o = out + m * ll;                                                                   \
        _Pragma("omp simd")                                                                    \
        for (long e = 0; e < ll; ++e) o[e] = sc[e] * Lb[e];                                    \
    }                                                                                          \
    free(Lb);                                                                                  \
}                                                                                              \
void ssm_mask_backward_##SUF(const T* RESTRICT grad, const T* RESTRICT a,                      \
                             const T* RESTRICT scores, T* RESTRICT d_scores, T* RESTRICT G,    \
                             long M, long l, int transposed) {                                 \
    T* Lb = (T*)malloc(sizeof(T) * (l * l + l * SB));                                          \
    const long ll = l * l;                                                                     \
    for (long m = 0; m < M; ++m) {                                                             \
        ssm_mask_##SUF(a + m * l, Lb, Lb + ll, l, transposed);                                 \
        const T *g = grad + m * ll, *sc = scores + m * ll;                                     \
        T *dm = d_scores + m * ll, *Gm = G + m * ll;                                           \
        if (!transposed) {  /* grad, d_scores and G laid out as L: (s, t) */                   \
            _Pragma("omp simd")                                                                \
            for (long e = 0; e < ll; ++e) {                                                    \
                const T d = g[e] * Lb[e];                                                      \
                dm[e] = d;                                                                     \
                Gm[e] = d * sc[e];                                                             \
            }                                                                                  \
            continue;                                                                          \
        }                                                                                      \
        for (long t = 0; t < l; ++t)  /* grad, d_scores and G (t, s) in memory */              \
            for (long s = 0; s < l; ++s) {                                                     \
                const T d = g[t * l + s] * Lb[t * l + s];                                      \
                dm[t * l + s] = d;                                                             \
                Gm[t * l + s] = d * sc[s * l + t];                                             \
            }                                                                                  \
    }                                                                                          \
    free(Lb);                                                                                  \
}

DEFINE_SSM_KERNELS(float, f32)
DEFINE_SSM_KERNELS(double, f64)
