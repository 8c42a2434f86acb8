/* g4_ops.h: small whole-operation element-wise ops of the forward pass, split over the pool. */
#ifndef G4_OPS_H
#define G4_OPS_H

#include <stdint.h>

#include "g4_pool.h"

/* out[i][j] = gelu_tanh(g[i][j]) * u[i][j] for i < n, j < d; row strides in floats, columns
 * contiguous; pool NULL = the calling thread. Every element is computed on its own by one
 * expression (g4_gelu_mul_row), so the result does not depend on the thread count or the split. */
void g4_gelu_mul_row(const float *g, const float *u, float *o, int64_t n);
/* 1 (default): g4_gelu_mul_row runs 16 lanes at a time where the CPU has AVX-512, 8 where it has
 * AVX2 (same bits as the 4-lane code); 0: 4 lanes only (for the tests that compare them) */
extern int g4_gelu_wide_ok;
void g4_gelu_mul(g4_pool *pool, const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                 int64_t ldo, int64_t n, int64_t d);


/* Row norms of the forward pass (the float ops of model.rmsnorm / norm_rope / add_rmsnorm, which
 * call these): per row, sum of squares in double (8 interleaved partial sums, a fixed order), scale
 * s = (float)(1 / sqrt(sum / d + eps)), then (x * s) * w in float32 (w may be NULL: no weight). Rows are contiguous (d values). */
void g4_rmsnorm_rows(const float *x, const float *w, double eps, float *out, int64_t n, int64_t d);
/* 1 (default): the row norms run 8 lanes at a time where the CPU has AVX2 (the same bits as the
 * portable code); 0: portable code only (for the tests that compare the two) */
extern int g4_norm_wide_ok;
/* rows = n_tok * heads rows of d (even) values, row i rotated (NEOX pairs j, j + d/2) with row i / heads of
 * cos / sin (n_tok, d/2) after its norm; out may alias x */
void g4_norm_rope(const float *x, const float *w, double eps, const float *cos, const float *sin, int64_t heads,
                  int64_t rows, int64_t d, float *out);
/* x[i] += rmsnorm(y[i], w) in place; then, if out2, out2[i] = rmsnorm(x[i], w2) */
void g4_add_rmsnorm(float *x, const float *y, const float *w, double eps, const float *w2, float *out2, int64_t n,
                    int64_t d);
/* the same over the pool's workers (rows split in contiguous ranges; norm_rope by token) when the
 * call has at least 65536 values and the pool more than one worker, else on the calling thread: the
 * same bits either way */
void g4_rmsnorm_rows_pool(g4_pool *pool, const float *x, const float *w, double eps, float *out, int64_t n, int64_t d);
void g4_norm_rope_pool(g4_pool *pool, const float *x, const float *w, double eps, const float *cos, const float *sin,
                       int64_t heads, int64_t rows, int64_t d, float *out);
void g4_add_rmsnorm_pool(g4_pool *pool, float *x, const float *y, const float *w, double eps, const float *w2,
                         float *out2, int64_t n, int64_t d);

#endif
