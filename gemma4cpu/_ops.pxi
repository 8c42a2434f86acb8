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


def gelu_mul(const float[:, :] g, const float[:, :] u, float[:, ::1] out):
    """out = gelu_tanh(g) * u elementwise in float32 (the gated MLP): 0.5 g (1 + tanh(c (g + 0.044715 g^3))) u,
    c = sqrt(2/pi). g and u may be strided views (the two halves of a fused gate-up product)."""
    cdef Py_ssize_t n = g.shape[0], d = g.shape[1], i, j
    if u.shape[0] != n or u.shape[1] != d or out.shape[0] != n or out.shape[1] != d:
        raise ValueError(f"gelu_mul: g ({n}, {d}), u ({u.shape[0]}, {u.shape[1]}) and out "
                         f"({out.shape[0]}, {out.shape[1]}) must have one shape")
    cdef float c = 0.7978845608028654, a = 0.044715, x
    with nogil:
        for i in range(n):
            for j in range(d):
                x = g[i, j]
                out[i, j] = (0.5 * x * (1.0 + tanhf(c * (x + a * x * x * x)))) * u[i, j]
