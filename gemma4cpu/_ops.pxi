# Small per-row vector operations of the forward pass (included by _kernels.pyx). They run on the
# calling thread with the GIL released; each row is computed on its own, in a fixed order, so a
# row's result never depends on how many rows share the call (batch invariance).
from libc.math cimport sqrt


def rmsnorm_rows(const float[:, ::1] x, w, double eps, float[:, ::1] out):
    """out[i] = x[i] * (mean(x[i]^2) + eps)^-1/2 (* w): sum of squares in double, scale rounded
    to float32, then x * scale (* w) in float32. w: float32 (d,) or None. out may alias x."""
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1], i, j
    if out.shape[0] != n or out.shape[1] != d:
        raise ValueError(f"rmsnorm: out ({out.shape[0]}, {out.shape[1]}) != x ({n}, {d})")
    if d == 0:
        raise ValueError("rmsnorm: rows must not be empty")
    cdef const float[::1] wv
    cdef bint has_w = w is not None
    if has_w:
        wv = w
        if wv.shape[0] != d:
            raise ValueError(f"rmsnorm: weight has {wv.shape[0]} values for rows of {d}")
    cdef double acc
    cdef float s
    with nogil:
        for i in range(n):
            acc = 0.0
            for j in range(d):
                acc = acc + <double>x[i, j] * <double>x[i, j]
            s = <float>(1.0 / sqrt(acc / d + eps))
            if has_w:
                for j in range(d):
                    out[i, j] = (x[i, j] * s) * wv[j]
            else:
                for j in range(d):
                    out[i, j] = x[i, j] * s


cdef extern from "<math.h>" nogil:
    float tanhf(float)


cdef extern from "g4_ops.h" nogil:
    void g4_gelu_mul(g4_pool *pool, const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                     int64_t ldo, int64_t n, int64_t d)


def gelu_mul(const float[:, :] g, const float[:, :] u, float[:, ::1] out, Pool pool=None):
    """out = gelu_tanh(g) * u elementwise in float32 (the gated MLP): 0.5 g (1 + tanh(c (g + 0.044715 g^3))) u,
    c = sqrt(2/pi). g and u may be strided views (the two halves of a fused gate-up product).
    With a pool (and contiguous columns) the elements are split over its workers (csrc/g4_ops.c);
    each element is computed by the same expression either way, so the bits are the same."""
    cdef Py_ssize_t n = g.shape[0], d = g.shape[1], i, j
    if u.shape[0] != n or u.shape[1] != d or out.shape[0] != n or out.shape[1] != d:
        raise ValueError(f"gelu_mul: g ({n}, {d}), u ({u.shape[0]}, {u.shape[1]}) and out "
                         f"({out.shape[0]}, {out.shape[1]}) must have one shape")
    cdef float c = 0.7978845608028654, a = 0.044715, x
    cdef g4_pool *p
    if n == 0 or d == 0:
        return
    if pool is not None and g.strides[1] == 4 and u.strides[1] == 4 and g.strides[0] % 4 == 0 \
            and u.strides[0] % 4 == 0:
        p = pool._get()
        with pool.lock:
            with nogil:
                g4_gelu_mul(p, &g[0, 0], g.strides[0] // 4, &u[0, 0], u.strides[0] // 4, &out[0, 0],
                            out.shape[1], n, d)
        return
    with nogil:
        for i in range(n):
            for j in range(d):
                x = g[i, j]
                out[i, j] = (0.5 * x * (1.0 + tanhf(c * (x + a * x * x * x)))) * u[i, j]
