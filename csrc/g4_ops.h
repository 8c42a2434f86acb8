/* g4_ops.h: small whole-operation element-wise ops of the forward pass, split over the pool. */
#ifndef G4_OPS_H
#define G4_OPS_H

#include <stdint.h>

#include "g4_pool.h"

/* out[i][j] = gelu_tanh(g[i][j]) * u[i][j] for i < n, j < d; row strides in floats, columns
 * contiguous; pool NULL = the calling thread. Every element is computed on its own by one
 * expression (g4_gelu_mul_row), so the result does not depend on the thread count or the split. */
void g4_gelu_mul_row(const float *g, const float *u, float *o, int64_t n);
void g4_gelu_mul(g4_pool *pool, const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                 int64_t ldo, int64_t n, int64_t d);

#endif
