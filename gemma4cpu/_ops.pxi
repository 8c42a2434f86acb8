# Small per-row vector operations of the forward pass (included by _kernels.pyx), all in
# csrc/g4_ops.c (the C layer loop calls the same functions). They run with the GIL released, on the
# calling thread (the norms) or over a pool (gelu_mul); each row
# or element is computed on its own, in a fixed order, so a result never depends on how many rows
# share the call (batch invariance).


cdef extern from "g4_ops.h" nogil:
    void g4_rmsnorm_rows(const float *x, const float *w, double eps, float *out, int64_t n, int64_t d)
    void g4_norm_rope(const float *x, const float *w, double eps, const float *cos, const float *sin, int64_t heads,
                      int64_t rows, int64_t d, float *out)
    void g4_add_rmsnorm(float *x, const float *y, const float *w, double eps, const float *w2, float *out2,
                        int64_t n, int64_t d)
    void g4_rmsnorm_rows_pool(g4_pool *pool, const float *x, const float *w, double eps, float *out, int64_t n,
                              int64_t d)
    void g4_norm_rope_pool(g4_pool *pool, const float *x, const float *w, double eps, const float *cos,
                           const float *sin, int64_t heads, int64_t rows, int64_t d, float *out)
    void g4_add_rmsnorm_pool(g4_pool *pool, float *x, const float *y, const float *w, double eps, const float *w2,
                             float *out2, int64_t n, int64_t d)
    int g4_gelu_wide_ok
    int g4_norm_wide_ok
    void g4_gelu_mul(g4_pool *pool, const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                     int64_t ldo, int64_t n, int64_t d)


def rmsnorm_rows(const float[:, ::1] x, w, double eps, float[:, ::1] out, Pool pool=None):
    """out[i] = x[i] * (mean(x[i]^2) + eps)^-1/2 (* w): sum of squares in double (8 interleaved
    partial sums in a fixed order), scale rounded
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
    if n == 0:
        return
    cdef g4_pool *p = NULL
    if pool is not None:  # rows split over the workers (large calls): the same bits
        p = pool._get()
        with pool.lock:
            with nogil:
                g4_rmsnorm_rows_pool(p, &x[0, 0], &wv[0] if has_w else NULL, eps, &out[0, 0], n, d)
        return
    with nogil:
        g4_rmsnorm_rows(&x[0, 0], &wv[0] if has_w else NULL, eps, &out[0, 0], n, d)


def set_gelu_wide(bint on):
    """Let gelu_mul use 16 lanes where the CPU has AVX-512 and 8 where it has AVX2 (default) or only
    4; returns the previous setting. The bits are the same either way (tests/test_ops.py checks it)."""
    cdef bint old = g4_gelu_wide_ok != 0
    global g4_gelu_wide_ok
    g4_gelu_wide_ok = 1 if on else 0
    return old


def set_norm_wide(bint on):
    """Let the row norms (rmsnorm_rows, norm_rope, add_rmsnorm and the layer loop's) use 8-lane AVX2
    code where the CPU has it (the default) or only the portable code; the bits are the same.
    Returns the previous setting (for tests)."""
    cdef bint old = g4_norm_wide_ok != 0
    global g4_norm_wide_ok
    g4_norm_wide_ok = 1 if on else 0
    return old


def gelu_mul(g, u, float[:, ::1] out, Pool pool=None):
    """out = gelu_tanh(g) * u elementwise in float32 (the gated MLP), 0.5 g (1 + tanh(c (g + 0.044715 g^3))) u
    with c = sqrt(2/pi), evaluated as g / (1 + exp(-2 c (g + 0.044715 g^3))) * u (csrc/g4_ops.c: no
    libm call per element). g and u are float32 (n, d) arrays, possibly strided views (the two
    halves of a fused gate-up product; columns that are not contiguous are copied first). With a
    pool the elements are split over its workers; each element is computed on its own by one
    expression, so the bits do not depend on the pool or the split."""
    cdef const float[:, :] gv = g
    cdef const float[:, :] uv = u
    cdef Py_ssize_t n = gv.shape[0], d = gv.shape[1]
    if uv.shape[0] != n or uv.shape[1] != d or out.shape[0] != n or out.shape[1] != d:
        raise ValueError(f"gelu_mul: g ({n}, {d}), u ({uv.shape[0]}, {uv.shape[1]}) and out "
                         f"({out.shape[0]}, {out.shape[1]}) must have one shape")
    if n == 0 or d == 0:
        return
    if gv.strides[1] != 4 or gv.strides[0] % 4:
        gv = np.ascontiguousarray(g, dtype=np.float32)
    if uv.strides[1] != 4 or uv.strides[0] % 4:
        uv = np.ascontiguousarray(u, dtype=np.float32)
    cdef g4_pool *p = NULL
    if pool is not None:
        p = pool._get()
        with pool.lock:
            with nogil:
                g4_gelu_mul(p, &gv[0, 0], gv.strides[0] // 4, &uv[0, 0], uv.strides[0] // 4, &out[0, 0],
                            out.shape[1], n, d)
    else:
        with nogil:
            g4_gelu_mul(NULL, &gv[0, 0], gv.strides[0] // 4, &uv[0, 0], uv.strides[0] // 4, &out[0, 0],
                        out.shape[1], n, d)


def norm_rope(const float[:, ::1] x, w, double eps, const float[:, ::1] cos, const float[:, ::1] sin,
              Py_ssize_t heads, float[:, ::1] out, Pool pool=None):
    """The q / k path of attention in one call: x (n * heads, hd) rows (token i // heads), each
    RMS-normalised as rmsnorm_rows does (weight w, or none), then rotated NEOX style with row
    i // heads of cos / sin (n, hd / 2): out[j] = a c - b s, out[j + hd/2] = b c + a s for
    a = normed[j], b = normed[j + hd/2], every op in float32 exactly as model.apply_rope's numpy
    expression (dims left unrotated have c = 1, s = 0). out may alias x."""
    cdef Py_ssize_t rows = x.shape[0], d = x.shape[1], half = d // 2, i, j, t
    if heads < 1 or rows % heads:
        raise ValueError(f"norm_rope: {rows} rows are not a whole number of tokens of {heads} heads")
    if d == 0 or d % 2:
        raise ValueError(f"norm_rope: head dim must be even and > 0, got {d}")
    if out.shape[0] != rows or out.shape[1] != d:
        raise ValueError(f"norm_rope: out ({out.shape[0]}, {out.shape[1]}) != x ({rows}, {d})")
    if cos.shape[0] != rows // heads or sin.shape[0] != rows // heads or cos.shape[1] != half or sin.shape[1] != half:
        raise ValueError(f"norm_rope: cos/sin ({cos.shape[0]}, {cos.shape[1]}) / ({sin.shape[0]}, {sin.shape[1]}) "
                         f"do not fit {rows // heads} tokens of head dim {d}")
    cdef const float[::1] wv
    cdef bint has_w = w is not None
    if has_w:
        wv = w
        if wv.shape[0] != d:
            raise ValueError(f"norm_rope: weight has {wv.shape[0]} values for rows of {d}")
    if rows == 0:
        return
    cdef g4_pool *p = NULL
    if pool is not None:
        p = pool._get()
        with pool.lock:
            with nogil:
                g4_norm_rope_pool(p, &x[0, 0], &wv[0] if has_w else NULL, eps, &cos[0, 0], &sin[0, 0], heads, rows, d,
                                  &out[0, 0])
        return
    with nogil:
        g4_norm_rope(&x[0, 0], &wv[0] if has_w else NULL, eps, &cos[0, 0], &sin[0, 0], heads, rows, d, &out[0, 0])


def add_rmsnorm(float[:, ::1] x, const float[:, ::1] y, w, double eps, w2=None, float[:, ::1] out2=None,
                Pool pool=None):
    """The residual step in one call: x[i] = x[i] + rmsnorm(y[i]) (weight w, or none; the same
    float32 ops as rmsnorm_rows then numpy's x + r), in place; then, when out2 is given,
    out2[i] = rmsnorm(x[i]) with weight w2 (or none): the next sub-layer's input norm."""
    cdef Py_ssize_t n = x.shape[0], d = x.shape[1], i, j
    if y.shape[0] != n or y.shape[1] != d:
        raise ValueError(f"add_rmsnorm: y ({y.shape[0]}, {y.shape[1]}) != x ({n}, {d})")
    if d == 0:
        raise ValueError("add_rmsnorm: rows must not be empty")
    cdef bint norm2 = out2 is not None
    if norm2 and (out2.shape[0] != n or out2.shape[1] != d):
        raise ValueError(f"add_rmsnorm: out2 ({out2.shape[0]}, {out2.shape[1]}) != x ({n}, {d})")
    cdef const float[::1] wv
    cdef const float[::1] wv2
    cdef bint has_w = w is not None, has_w2 = w2 is not None
    if has_w:
        wv = w
        if wv.shape[0] != d:
            raise ValueError(f"add_rmsnorm: weight has {wv.shape[0]} values for rows of {d}")
    if has_w2:
        wv2 = w2
        if wv2.shape[0] != d:
            raise ValueError(f"add_rmsnorm: second weight has {wv2.shape[0]} values for rows of {d}")
    if n == 0:
        return
    cdef g4_pool *p = NULL
    if pool is not None:
        p = pool._get()
        with pool.lock:
            with nogil:
                g4_add_rmsnorm_pool(p, &x[0, 0], &y[0, 0], &wv[0] if has_w else NULL, eps, &wv2[0] if has_w2 else NULL,
                                    &out2[0, 0] if norm2 else NULL, n, d)
        return
    with nogil:
        g4_add_rmsnorm(&x[0, 0], &y[0, 0], &wv[0] if has_w else NULL, eps, &wv2[0] if has_w2 else NULL,
                       &out2[0, 0] if norm2 else NULL, n, d)
