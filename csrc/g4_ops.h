/* g4_ops.h: small whole-operation element-wise ops of the forward pass, split over the pool. */
#ifndef G4_OPS_H
#define G4_OPS_H

#include <stdint.h>

#include "g4_pool.h"

/* out[i][j] = gelu_tanh(g[i][j]) * u[i][j] for i < n, j < d; row strides in floats, columns
 * contiguous. Every element is computed by the same expression as the serial Cython loop it
 * replaces (gemma4cpu/_ops.pxi), so the result does not depend on the thread count. */
void g4_gelu_mul(g4_pool *pool, const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                 int64_t ldo, int64_t n, int64_t d);

#endif
