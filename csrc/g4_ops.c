/* g4_ops.c: element-wise ops over the pool. Compiled with the extension's baseline flags, like the
 * Cython code these replace, so every element gets the same float sequence (no FMA on baseline
 * x86-64; float ops in float, the outer factors in double as the C literals 0.5 / 1.0 make them). */
#include <math.h>

#include "g4_ops.h"

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
    const float cc = 0.7978845608028654f, ca = 0.044715f;
    for (int64_t e = a; e < b;) {
        const int64_t i = e / c->d, j0 = e % c->d;
        const int64_t j1 = c->d < j0 + (b - e) ? c->d : j0 + (b - e);
        const float *g = c->g + i * c->ldg, *u = c->u + i * c->ldu;
        float *o = c->out + i * c->ldo;
        for (int64_t j = j0; j < j1; j++) {
            const float x = g[j];
            o[j] = (float)(((0.5 * x) * (1.0 + tanhf(cc * (x + ((ca * x) * x) * x)))) * u[j]);
        }
        e += j1 - j0;
    }
}

void g4_gelu_mul(g4_pool *pool, const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                 int64_t ldo, int64_t n, int64_t d) {
    gelu_ctx c = {g, u, out, ldg, ldu, ldo, n, d};
    if (n * d < 4096 || g4_pool_size(pool) == 1) gelu_task(&c, 0, 1);
    else g4_pool_run(pool, gelu_task, &c);
}
