/* g4_ops.c: element-wise ops over the pool, in portable C (compiled with the extension's baseline
 * flags: no FMA, so every build and every CPU gives the same bits), with wider versions of the
 * same ops in the same order (AVX-512 GELU, AVX2 row norms) under target attributes, chosen at run
 * time by the CPU's features.
 *
 * GELU (tanh form) is evaluated as 0.5 x (1 + tanh z) = x / (1 + exp(-2z)), z = c (x + a x^3), with
 * exp by range reduction and the Cephes polynomial (~1-2 ulp): no libm call per element (glibc
 * tanhf cost ~15-20 ns an element, 1.7 ms per 31B layer at 4 tokens and 176 ms of a 270M pp512),
 * in 4-lane SSE2 (baseline x86-64; the tail of a row runs through the same 4-lane code, so a
 * value never depends on its position). For z very negative (x below about -10.2) exp's argument is
 * clamped to 89, 2^k becomes +inf and the result is exactly 0, as float32 tanh gives (1 + tanh z = 0):
 * an earlier clamp at 88 left x * 6e-39 there, values that reached the next product's activation
 * blocks as ~1e-36. For z large exp(-2z) -> exp(-87) and the result is x. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "g4_kernels.h"
#include "g4_ops.h"

/* 0: the 16- and 8-lane GELU are off (tests compare them with the 4-lane one) */
int g4_gelu_wide_ok = 1;

#if defined(__SSE2__)
#include <emmintrin.h>

/* exp and gelu_tanh(x) * u for one vector width, written once so that every width computes each
 * element by the very same float ops in the same order (the bits never depend on the width):
 * ATTR function attributes, SFX name suffix, P intrinsic prefix (_mm, _mm512), V / I float / int
 * vector types, B their width in bits.
 * exp: t clamped to [-87, 89] (above ~88.7: +inf), k = round(t / ln 2) by the 1.5 * 2^23 trick,
 * r = t - k ln 2 in two parts, the Cephes polynomial, times 2^k (k in [-126, 128]; k = 128 gives the
 * +inf bit pattern; kf is an integer, so its conversion is exact).
 * gelu: x / (1 + exp(-2 c (x + 0.044715 x^3))) * u. */
#define G4_GELU_DEFS(ATTR, SFX, P, V, I, B)                                                                     \
    ATTR static inline V g4_expf##SFX(V t) {                                                                    \
        t = P##_max_ps(P##_min_ps(t, P##_set1_ps(89.0f)), P##_set1_ps(-87.0f));                               \
        const V M = P##_set1_ps(12582912.0f);                                                                   \
        const V kf = P##_sub_ps(P##_add_ps(P##_mul_ps(t, P##_set1_ps(1.44269504088896341f)), M), M);          \
        const V r = P##_sub_ps(P##_sub_ps(t, P##_mul_ps(kf, P##_set1_ps(0.693359375f))),                      \
                               P##_mul_ps(kf, P##_set1_ps(-2.12194440e-4f)));                                   \
        V p = P##_set1_ps(1.9875691500e-4f);                                                                    \
        p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(1.3981999507e-3f));                                       \
        p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(8.3334519073e-3f));                                       \
        p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(4.1665795894e-2f));                                       \
        p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(1.6666665459e-1f));                                       \
        p = P##_add_ps(P##_mul_ps(p, r), P##_set1_ps(5.0000001201e-1f));                                       \
        p = P##_add_ps(P##_add_ps(P##_mul_ps(p, P##_mul_ps(r, r)), r), P##_set1_ps(1.0f));                     \
        const I k = P##_cvtps_epi32(kf);                                                                        \
        return P##_mul_ps(p, P##_castsi##B##_ps(P##_slli_epi32(P##_add_epi32(k, P##_set1_epi32(127)), 23)));   \
    }                                                                                                           \
    ATTR static inline V g4_gelu_mul##SFX(V x, V u) {                                                           \
        const V z = P##_mul_ps(P##_set1_ps(0.7978845608028654f),                                                \
                               P##_add_ps(x, P##_mul_ps(P##_mul_ps(P##_mul_ps(P##_set1_ps(0.044715f), x), x), x))); \
        const V e = g4_expf##SFX(P##_mul_ps(P##_set1_ps(-2.0f), z));                                          \
        return P##_mul_ps(P##_div_ps(x, P##_add_ps(P##_set1_ps(1.0f), e)), u);                                  \
    }

G4_GELU_DEFS(, 4, _mm, __m128, __m128i, 128)

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 16 lanes where the CPU has AVX-512 F, with contraction off for these functions (no FMA: checked by
 * the tests' bit comparison against the 4-lane path) */
#define G4_GELU512 __attribute__((target("avx512f"), optimize("fp-contract=off")))
G4_GELU_DEFS(G4_GELU512, 16, _mm512, __m512, __m512i, 512)

G4_GELU512 static int64_t g4_gelu_mul_row16(const float *g, const float *u, float *o, int64_t n) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(o + j, g4_gelu_mul16(_mm512_loadu_ps(g + j), _mm512_loadu_ps(u + j)));
    return j;
}

/* 8 lanes where the CPU has AVX2 (the same ops; no FMA in the target) */
#define G4_GELU256 __attribute__((target("avx2"), optimize("fp-contract=off")))
G4_GELU_DEFS(G4_GELU256, 8, _mm256, __m256, __m256i, 256)

G4_GELU256 static int64_t g4_gelu_mul_row8(const float *g, const float *u, float *o, int64_t j, int64_t n) {
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(o + j, g4_gelu_mul8(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j)));
    return j;
}
#endif

/* one row piece: out[j] = gelu_tanh(g[j]) * u[j]; 16 lanes where AVX-512 is there, then 8 where AVX2
 * is, then 4 lanes; the tail goes through the same 4-lane code */
void g4_gelu_mul_row(const float *g, const float *u, float *o, int64_t n) {
    int64_t j = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (g4_gelu_wide_ok && (g4_cpu_features() & G4_F_AVX512F)) j = g4_gelu_mul_row16(g, u, o, n);
    if (g4_gelu_wide_ok && (g4_cpu_features() & G4_F_AVX2)) j = g4_gelu_mul_row8(g, u, o, j, n);
#endif
    for (; j + 4 <= n; j += 4) _mm_storeu_ps(o + j, g4_gelu_mul4(_mm_loadu_ps(g + j), _mm_loadu_ps(u + j)));
    if (j < n) {
        float gb[4] = {0}, ub[4] = {0}, ob[4];
        memcpy(gb, g + j, (size_t)(n - j) * 4);
        memcpy(ub, u + j, (size_t)(n - j) * 4);
        _mm_storeu_ps(ob, g4_gelu_mul4(_mm_loadu_ps(gb), _mm_loadu_ps(ub)));
        memcpy(o + j, ob, (size_t)(n - j) * 4);
    }
}
#else
static inline float g4_expf_poly(float t) {
    t = t < 89.0f ? t : 89.0f;
    t = t > -87.0f ? t : -87.0f;
    const float kf = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (t - kf * 0.693359375f) - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * (r * r) + r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return p * s;
}

void g4_gelu_mul_row(const float *g, const float *u, float *o, int64_t n) {
    const float cc = 0.7978845608028654f, ca = 0.044715f;
    for (int64_t j = 0; j < n; j++) {
        const float x = g[j];
        const float z = cc * (x + ((ca * x) * x) * x);
        o[j] = (x / (1.0f + g4_expf_poly(-2.0f * z))) * u[j];
    }
}
#endif

typedef struct {
    const float *g, *u;
    float *out;
    int64_t ldg, ldu, ldo, n, d;
} gelu_ctx;

static void gelu_task(void *vctx, int ith, int nth) {
    const gelu_ctx *c = (const gelu_ctx *)vctx;
    const int64_t total = c->n * c->d;
    int64_t per = (total + nth - 1) / nth;
    per = (per + 15) & ~(int64_t)15; /* 64-byte pieces of out per worker (no false sharing within a row) */
    const int64_t a = per * ith, b = a + per < total ? a + per : total;
    for (int64_t e = a; e < b;) {
        const int64_t i = e / c->d, j0 = e % c->d;
        const int64_t j1 = c->d < j0 + (b - e) ? c->d : j0 + (b - e);
        g4_gelu_mul_row(c->g + i * c->ldg + j0, c->u + i * c->ldu + j0, c->out + i * c->ldo + j0, j1 - j0);
        e += j1 - j0;
    }
}

void g4_gelu_mul(g4_pool *pool, const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                 int64_t ldo, int64_t n, int64_t d) {
    gelu_ctx c = {g, u, out, ldg, ldu, ldo, n, d};
    if (!pool || n * d < 4096 || g4_pool_size(pool) == 1) gelu_task(&c, 0, 1);
    else g4_pool_run(pool, gelu_task, &c);
}

/* ---- row norms (see g4_ops.h; the reference for every path: Cython wrappers and the layer loop) ---- */
/* 1 (default): the row norms run 8 lanes at a time where the CPU has AVX2 (the same float / double
 * ops in the same order per element: the same bits as the portable code); 0: portable code only */
int g4_norm_wide_ok = 1;

static inline float g4_scale_of(const double t[8], int64_t d, double eps) {
    const double acc = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    return (float)(1.0 / sqrt(acc / (double)d + eps));
}
/* 8 interleaved partial sums (element j into sum j % 8), added pairwise at the end: a fixed order,
 * so every path and thread count gives the same bits, without one 4-cycle dependent add per
 * element (a single chain cost ~7 % of a 270M prefill). From element j on (the vector code's tail). */
static inline float g4_row_scale_from(const float *x, int64_t d, double eps, double t[8], int64_t j) {
    double s0 = t[0], s1 = t[1], s2 = t[2], s3 = t[3], s4 = t[4], s5 = t[5], s6 = t[6], s7 = t[7]; /* registers */
    for (; j + 8 <= d; j += 8) {
        const float *p = x + j;
        s0 = s0 + (double)p[0] * (double)p[0];
        s1 = s1 + (double)p[1] * (double)p[1];
        s2 = s2 + (double)p[2] * (double)p[2];
        s3 = s3 + (double)p[3] * (double)p[3];
        s4 = s4 + (double)p[4] * (double)p[4];
        s5 = s5 + (double)p[5] * (double)p[5];
        s6 = s6 + (double)p[6] * (double)p[6];
        s7 = s7 + (double)p[7] * (double)p[7];
    }
    t[0] = s0, t[1] = s1, t[2] = s2, t[3] = s3, t[4] = s4, t[5] = s5, t[6] = s6, t[7] = s7;
    for (; j < d; j++) t[j & 7] = t[j & 7] + (double)x[j] * (double)x[j];
    return g4_scale_of(t, d, eps);
}
static inline float g4_row_scale_c(const float *x, int64_t d, double eps) {
    double t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    return g4_row_scale_from(x, d, eps, t, 0);
}
/* o = (x * s) * w (w NULL: x * s); o may be x. From element j on. */
static inline void g4_scale_row_from(const float *x, float s, const float *w, float *o, int64_t d, int64_t j) {
    if (w)
        for (; j < d; j++) o[j] = (x[j] * s) * w[j];
    else
        for (; j < d; j++) o[j] = x[j] * s;
}
/* x = x + (y * s) * w (w NULL: x + y * s). From element j on. */
static inline void g4_add_scaled_from(float *x, const float *y, float s, const float *w, int64_t d, int64_t j) {
    if (w)
        for (; j < d; j++) x[j] = x[j] + (y[j] * s) * w[j];
    else
        for (; j < d; j++) x[j] = x[j] + y[j] * s;
}
/* NEOX rotation of one normed row in place: o[j] = a c - b s, o[j + half] = b c + a s. From j on. */
static inline void g4_rope_row_from(float *o, const float *c, const float *sn, int64_t half, int64_t j) {
    for (; j < half; j++) {
        const float a = o[j], b = o[j + half];
        o[j] = a * c[j] - b * sn[j];
        o[j + half] = b * c[j] + a * sn[j];
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* AVX (no FMA in the target: nothing can be contracted): lane k of the two double vectors is
 * partial sum k, each float product and sum the portable code's own */
#define G4_NORM256 __attribute__((target("avx2"), optimize("fp-contract=off")))
G4_NORM256 static float g4_row_scale_256(const float *x, int64_t d, double eps) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t j = 0;
    for (; j + 8 <= d; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(lo, lo));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(hi, hi));
    }
    double t[8];
    _mm256_storeu_pd(t, a0);
    _mm256_storeu_pd(t + 4, a1);
    return g4_row_scale_from(x, d, eps, t, j);
}
G4_NORM256 static void g4_scale_row_256(const float *x, float s, const float *w, float *o, int64_t d) {
    const __m256 sv = _mm256_set1_ps(s);
    int64_t j = 0;
    if (w)
        for (; j + 8 <= d; j += 8)
            _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), sv), _mm256_loadu_ps(w + j)));
    else
        for (; j + 8 <= d; j += 8) _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), sv));
    g4_scale_row_from(x, s, w, o, d, j);
}
G4_NORM256 static void g4_add_scaled_256(float *x, const float *y, float s, const float *w, int64_t d) {
    const __m256 sv = _mm256_set1_ps(s);
    int64_t j = 0;
    if (w)
        for (; j + 8 <= d; j += 8)
            _mm256_storeu_ps(x + j, _mm256_add_ps(_mm256_loadu_ps(x + j),
                                                  _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(y + j), sv), _mm256_loadu_ps(w + j))));
    else
        for (; j + 8 <= d; j += 8)
            _mm256_storeu_ps(x + j, _mm256_add_ps(_mm256_loadu_ps(x + j), _mm256_mul_ps(_mm256_loadu_ps(y + j), sv)));
    g4_add_scaled_from(x, y, s, w, d, j);
}
G4_NORM256 static void g4_rope_row_256(float *o, const float *c, const float *sn, int64_t half) {
    int64_t j = 0;
    for (; j + 8 <= half; j += 8) {
        const __m256 a = _mm256_loadu_ps(o + j), b = _mm256_loadu_ps(o + j + half);
        const __m256 cv = _mm256_loadu_ps(c + j), sv = _mm256_loadu_ps(sn + j);
        _mm256_storeu_ps(o + j, _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv)));
        _mm256_storeu_ps(o + j + half, _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, sv)));
    }
    g4_rope_row_from(o, c, sn, half, j);
}
static inline int g4_norm_wide(void) { return g4_norm_wide_ok && (g4_cpu_features() & G4_F_AVX2); }
#else
static inline int g4_norm_wide(void) { return 0; }
#define g4_row_scale_256(x, d, eps) g4_row_scale_c(x, d, eps)
#define g4_scale_row_256(x, s, w, o, d) g4_scale_row_from(x, s, w, o, d, 0)
#define g4_add_scaled_256(x, y, s, w, d) g4_add_scaled_from(x, y, s, w, d, 0)
#define g4_rope_row_256(o, c, sn, half) g4_rope_row_from(o, c, sn, half, 0)
#endif

static inline float g4_row_scale(const float *x, int64_t d, double eps, int wide) {
    return wide ? g4_row_scale_256(x, d, eps) : g4_row_scale_c(x, d, eps);
}
static inline void g4_scale_row(const float *x, float s, const float *w, float *o, int64_t d, int wide) {
    if (wide) g4_scale_row_256(x, s, w, o, d);
    else g4_scale_row_from(x, s, w, o, d, 0);
}

void g4_rmsnorm_rows(const float *x, const float *w, double eps, float *out, int64_t n, int64_t d) {
    const int wide = g4_norm_wide();
    for (int64_t i = 0; i < n; i++)
        g4_scale_row(x + i * d, g4_row_scale(x + i * d, d, eps, wide), w, out + i * d, d, wide);
}

void g4_norm_rope(const float *x, const float *w, double eps, const float *cos, const float *sin, int64_t heads,
                  int64_t rows, int64_t d, float *out) {
    const int64_t half = d / 2;
    const int wide = g4_norm_wide();
    for (int64_t i = 0; i < rows; i++) {
        float *o = out + i * d;
        g4_scale_row(x + i * d, g4_row_scale(x + i * d, d, eps, wide), w, o, d, wide);
        const float *c = cos + (i / heads) * half, *sn = sin + (i / heads) * half;
        if (wide) g4_rope_row_256(o, c, sn, half);
        else g4_rope_row_from(o, c, sn, half, 0);
    }
}

void g4_add_rmsnorm(float *x, const float *y, const float *w, double eps, const float *w2, float *out2, int64_t n,
                    int64_t d) {
    const int wide = g4_norm_wide();
    for (int64_t i = 0; i < n; i++) {
        float *xr = x + i * d;
        const float *yr = y + i * d;
        const float s = g4_row_scale(yr, d, eps, wide);
        if (wide) g4_add_scaled_256(xr, yr, s, w, d);
        else g4_add_scaled_from(xr, yr, s, w, d, 0);
        if (out2) g4_scale_row(xr, g4_row_scale(xr, d, eps, wide), w2, out2 + i * d, d, wide);
    }
}

/* ---- the row norms over the pool (prefill-sized calls): rows are independent, so the split never
 * changes a bit; norm_rope splits by token (its cos / sin row) ---- */
typedef struct {
    int op; /* 0 rmsnorm, 1 norm_rope, 2 add_rmsnorm */
    const float *x, *y, *w, *w2, *cos, *sin;
    float *xm, *out, *out2;
    double eps;
    int64_t n, d, heads; /* n: rows (ops 0, 2) or tokens (op 1) */
} norm_ctx;

static void norm_task(void *vctx, int ith, int nth) {
    const norm_ctx *c = (const norm_ctx *)vctx;
    const int64_t per = (c->n + nth - 1) / nth, a = per * ith, b = a + per < c->n ? a + per : c->n;
    if (a >= b) return;
    if (c->op == 0) g4_rmsnorm_rows(c->x + a * c->d, c->w, c->eps, c->out + a * c->d, b - a, c->d);
    else if (c->op == 1) {
        const int64_t r0 = a * c->heads, half = c->d / 2;
        g4_norm_rope(c->x + r0 * c->d, c->w, c->eps, c->cos + a * half, c->sin + a * half, c->heads,
                     (b - a) * c->heads, c->d, c->out + r0 * c->d);
    } else
        g4_add_rmsnorm(c->xm + a * c->d, c->y + a * c->d, c->w, c->eps, c->w2, c->out2 ? c->out2 + a * c->d : NULL,
                       b - a, c->d);
}

static int norm_split(g4_pool *pool, int64_t elems) { return pool && g4_pool_size(pool) > 1 && elems >= 65536; }

void g4_rmsnorm_rows_pool(g4_pool *pool, const float *x, const float *w, double eps, float *out, int64_t n, int64_t d) {
    if (!norm_split(pool, n * d)) { g4_rmsnorm_rows(x, w, eps, out, n, d); return; }
    norm_ctx c = {.op = 0, .x = x, .w = w, .out = out, .eps = eps, .n = n, .d = d};
    g4_pool_run(pool, norm_task, &c);
}

void g4_norm_rope_pool(g4_pool *pool, const float *x, const float *w, double eps, const float *cos, const float *sin,
                       int64_t heads, int64_t rows, int64_t d, float *out) {
    if (!norm_split(pool, rows * d)) { g4_norm_rope(x, w, eps, cos, sin, heads, rows, d, out); return; }
    norm_ctx c = {.op = 1, .x = x, .w = w, .cos = cos, .sin = sin, .out = out, .eps = eps, .n = rows / heads, .d = d,
                  .heads = heads};
    g4_pool_run(pool, norm_task, &c);
}

void g4_add_rmsnorm_pool(g4_pool *pool, float *x, const float *y, const float *w, double eps, const float *w2,
                         float *out2, int64_t n, int64_t d) {
    if (!norm_split(pool, n * d)) { g4_add_rmsnorm(x, y, w, eps, w2, out2, n, d); return; }
    norm_ctx c = {.op = 2, .xm = x, .y = y, .w = w, .w2 = w2, .out2 = out2, .eps = eps, .n = n, .d = d};
    g4_pool_run(pool, norm_task, &c);
}
