# cython: language_level=3
"""Thin wrappers over the C kernel tables: check shapes, dtypes and contiguity, release the
GIL, call C. No model logic lives here. Python-facing helpers are in gemma4cpu/kernels.py."""
import threading

import numpy as np

from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc

from gemma4cpu._kernels cimport *

ISA_NAMES = ("ref", "avx2", "avx512", "amx")
# ggml type ids this build computes with
TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
# gemma4cpu's own layout, not a GGUF type: Q4_K repacked 8 rows at a time (csrc/g4_blocks.h block_q4_K_r8)
TYPE_Q4_K_R8 = 1012


def cpu_features():
    """Names of the CPU features detected by CPUID + XGETBV (OS support included)."""
    cdef uint32_t f = g4_cpu_features()
    out = []
    cdef int i = 0
    while g4_cpu_feature_name(i) != NULL:
        if f & (1u << i):
            out.append(g4_cpu_feature_name(i).decode())
        i += 1
    return out


def isa_supported(str name):
    if name not in ISA_NAMES:
        raise ValueError(f"unknown ISA {name!r}; choose from {', '.join(ISA_NAMES)} or 'auto'")
    cdef int idx = ISA_NAMES.index(name)
    return bool(g4_isa_supported(<g4_isa>idx))


def set_active(str name):
    """Select the table every kernel call uses. Raises instead of downgrading."""
    if name != "auto" and name not in ISA_NAMES:
        raise ValueError(f"unknown ISA {name!r}; choose from {', '.join(ISA_NAMES)} or 'auto'")
    b = name.encode()
    cdef const g4_kernels *k = g4_kernels_select(b)
    if k == NULL:
        raise RuntimeError(f"ISA {name!r} is not supported by this CPU/OS "
                           f"(detected features: {', '.join(cpu_features()) or 'none'})")
    g4_set_active(k)
    return k.isa.decode()


def active():
    return g4_active().isa.decode()


def table_report(str name):
    """{slot name: 'simd' | 'ref'} for the table of ISA `name` ('ref' entries are fallbacks)."""
    if name not in ISA_NAMES:
        raise ValueError(f"unknown ISA {name!r}")
    cdef int idx = ISA_NAMES.index(name)
    cdef const g4_kernels *k = g4_kernels_for(<g4_isa>idx)
    if k == NULL:
        raise RuntimeError(f"ISA {name!r} is not supported here")
    return {g4_slot_name(i).decode(): ("ref" if g4_slot_is_ref(k, i) else "simd") for i in range(g4_slot_count())}


def type_info(int ggml_type):
    """(block_size, block_bytes, k_multiple, activation kind) or raises for unsupported types."""
    if g4_wt_index(ggml_type) < 0:
        raise ValueError(f"weight type {ggml_type} is not supported by the kernels")
    return (g4_type_block_size(ggml_type), g4_type_block_bytes(ggml_type), g4_type_k_multiple(ggml_type),
            ("f32", "q8_0", "q8_K")[<int>g4_type_act(ggml_type)])


def act_row_bytes(int ggml_type, int64_t k):
    return g4_act_row_bytes(g4_type_act(ggml_type), k)


def quantize_act(int ggml_type, const float[:, ::1] x, uint8_t[:, ::1] out):
    """Quantise activation rows x (n, k) into out (n, act_row_bytes) with the active table,
    in the format the products of `ggml_type` take (Q8_K or Q8_0)."""
    cdef g4_act act = g4_type_act(ggml_type)
    if act == G4_ACT_F32:
        raise ValueError("float weight types take float activations")
    cdef int64_t n = x.shape[0], k = x.shape[1]
    if k % g4_type_k_multiple(ggml_type):
        raise ValueError(f"k={k} is not a multiple of {g4_type_k_multiple(ggml_type)}")
    if out.shape[0] != n or <size_t>out.shape[1] != g4_act_row_bytes(act, k):
        raise ValueError(f"out must be ({n}, {g4_act_row_bytes(act, k)}), got ({out.shape[0]}, {out.shape[1]})")
    cdef const g4_kernels *kt = g4_active()
    cdef g4_quant_fn fn = kt.quantize_row_q8_K if act == G4_ACT_Q8_K else kt.quantize_row_q8_0
    cdef int64_t i
    if n == 0:
        return
    with nogil:
        for i in range(n):
            fn(&x[i, 0], &out[i, 0], k)


def dequantize_rows(int ggml_type, const uint8_t[:, ::1] w, int64_t k, float[:, ::1] out):
    """Dequantise rows of w (n_rows, row_bytes) holding k elements each into out (n_rows, k)."""
    cdef int wt = g4_wt_index(ggml_type)
    if wt < 0:
        raise ValueError(f"weight type {ggml_type} is not supported")
    if ggml_type == TYPE_Q4_K_R8:
        raise ValueError("Q4_K_R8 rows are interleaved 8 at a time: unpack_q4_K_r8 them first")
    cdef int bs = g4_type_block_size(ggml_type)
    if k <= 0 or k % bs:
        raise ValueError(f"k={k} is not a positive multiple of the block size {bs}")
    cdef int64_t n = w.shape[0]
    if <size_t>w.shape[1] < <size_t>(k // bs * g4_type_block_bytes(ggml_type)):
        raise ValueError(f"rows of {w.shape[1]} bytes are too short for k={k}")
    if out.shape[0] != n or out.shape[1] != k:
        raise ValueError(f"out must be ({n}, {k}), got ({out.shape[0]}, {out.shape[1]})")
    cdef g4_dequant_fn fn = g4_active().wt[wt].dequant_row
    cdef int64_t i
    if n == 0:
        return
    with nogil:
        for i in range(n):
            fn(&w[i, 0], &out[i, 0], k)


def gemm_rows(int ggml_type, const uint8_t[:, ::1] w, int64_t k, const uint8_t[:, ::1] xa,
              float[:, ::1] y, int64_t r0, int64_t r1):
    """One direct call of the active table's product on rows [r0, r1), single threaded:
    y[t, r] for t < xa.shape[0]. xa holds activations already in the product's format
    (quantize_act output, or float32 rows viewed as bytes for float weights)."""
    cdef int wt = g4_wt_index(ggml_type)
    if wt < 0:
        raise ValueError(f"weight type {ggml_type} is not supported")
    cdef int km = g4_type_k_multiple(ggml_type)
    if k <= 0 or k % km:
        raise ValueError(f"k={k} is not a positive multiple of {km}")
    cdef int bs = g4_type_block_size(ggml_type)
    if <size_t>w.shape[1] < <size_t>(k // bs * g4_type_block_bytes(ggml_type)):
        raise ValueError(f"rows of {w.shape[1]} bytes are too short for k={k}")
    cdef int64_t n_tok = xa.shape[0]
    if <size_t>xa.shape[1] < g4_act_row_bytes(g4_type_act(ggml_type), k):
        raise ValueError("activation rows too short")
    if not (0 <= r0 <= r1 <= w.shape[0]):
        raise ValueError(f"row range [{r0}, {r1}) outside [0, {w.shape[0]})")
    if y.shape[0] != n_tok or y.shape[1] < w.shape[0]:
        raise ValueError(f"y must be ({n_tok}, >= {w.shape[0]}), got ({y.shape[0]}, {y.shape[1]})")
    if n_tok == 0 or r0 == r1:
        return
    cdef int rm = g4_type_row_multiple(ggml_type)
    if w.shape[0] % rm or r0 % rm or r1 % rm:
        raise ValueError(f"this type's rows go in groups of {rm}: {w.shape[0]} rows, range [{r0}, {r1})")
    if rm > 1 and <size_t>w.shape[1] != <size_t>(k // bs * g4_type_block_bytes(ggml_type)):
        raise ValueError(f"rows of {w.shape[1]} bytes, expected exactly {k // bs * g4_type_block_bytes(ggml_type)}")
    cdef g4_gemm_fn fn = g4_type_gemm(g4_active(), ggml_type)
    if fn == NULL:
        raise ValueError(f"the {active()} table has no product for type {ggml_type}")
    with nogil:
        fn(&w[0, 0], w.shape[1], &xa[0, 0], xa.shape[1], &y[0, 0], y.shape[1], n_tok, k, r0, r1)


def _r8_convert(const uint8_t[:, ::1] src, uint8_t[:, ::1] dst, int64_t k, bint pack):
    cdef int64_t n = src.shape[0]
    if k <= 0 or k % 256:
        raise ValueError(f"k={k} is not a positive multiple of 256")
    if n % 8:
        raise ValueError(f"{n} rows: Q4_K_R8 needs a multiple of 8")
    if <size_t>src.shape[1] != <size_t>(k // 256 * 144) or dst.shape[0] != n or dst.shape[1] != src.shape[1]:
        raise ValueError(f"src and dst must both be ({n}, {k // 256 * 144}) uint8, got ({src.shape[0]}, "
                         f"{src.shape[1]}) and ({dst.shape[0]}, {dst.shape[1]})")
    if n == 0:
        return
    cdef int rc
    with nogil:
        rc = g4_repack_q4_K_r8(&src[0, 0], &dst[0, 0], n, k) if pack else g4_unpack_q4_K_r8(&src[0, 0], &dst[0, 0], n, k)
    if rc != 0:
        raise MemoryError("no memory for an 8-row buffer")


def repack_q4_K_r8(src, uint8_t[:, ::1] dst, int64_t k):
    """Q4_K rows (n, k/256*144) -> Q4_K_R8 in dst (same shape; dst may be src: in place). n % 8 == 0."""
    _r8_convert(src, dst, k, True)


def unpack_q4_K_r8(src, uint8_t[:, ::1] dst, int64_t k):
    """Q4_K_R8 rows -> Q4_K rows in dst (same shape; dst may be src). The inverse of repack_q4_K_r8."""
    _r8_convert(src, dst, k, False)


cdef class RowPlacement:
    """Rows of one weight matrix placed per pool group (NUMA distribute / mirror; csrc/g4_kernels.h
    g4_matmul_split): group g computes rows [bounds[g], bounds[g+1]), reading them from copies[g]
    ((n_rows, row_bytes) uint8, e.g. a copy on group g's node) or, without copies, from the matrix
    given to Pool.matmul. Built once per matrix at load; matmul takes it with no per-call cost."""
    cdef int64_t *split
    cdef const void **wg
    cdef readonly int n_groups
    cdef readonly tuple bounds
    cdef readonly tuple copies
    cdef readonly int64_t row_bytes

    def __cinit__(self, bounds, copies=None):
        cdef const uint8_t[:, ::1] mv
        cdef int g
        b = tuple(int(v) for v in bounds)
        cdef int64_t n_rows = b[len(b) - 1] if len(b) else 0  # (wraparound is off: no b[-1])
        if len(b) < 2 or b[0] != 0 or any(b[i + 1] < b[i] for i in range(len(b) - 1)):
            raise ValueError(f"row bounds must start at 0 and not decrease, got {list(b)}")
        self.bounds = b
        self.n_groups = len(b) - 1
        self.row_bytes = -1
        self.split = <int64_t *>malloc(sizeof(int64_t) * len(b))
        if self.split == NULL:
            raise MemoryError()
        for g in range(len(b)):
            self.split[g] = b[g]
        self.copies = ()
        if copies is not None:
            copies = tuple(copies)
            if len(copies) != self.n_groups:
                raise ValueError(f"{self.n_groups} groups need {self.n_groups} copies, got {len(copies)}")
            self.wg = <const void **>malloc(sizeof(void *) * self.n_groups)
            if self.wg == NULL:
                raise MemoryError()
            for g in range(self.n_groups):
                mv = copies[g]
                if mv.shape[0] != n_rows or (self.row_bytes >= 0 and mv.shape[1] != self.row_bytes):
                    raise ValueError(f"copy {g} is ({mv.shape[0]}, {mv.shape[1]}), expected ({n_rows}, rows of "
                                     f"one length)")
                self.row_bytes = mv.shape[1]
                self.wg[g] = &mv[0, 0]
            self.copies = copies  # keeps the buffers alive

    def __dealloc__(self):
        free(self.split)
        free(self.wg)

    @property
    def n_rows(self):
        return self.bounds[self.n_groups]


cdef class Pool:
    """Persistent pinned worker pool. Worker 0 is the calling thread: pinned to cpus[0] while it
    runs work (its affinity is given back after each call), or for a whole `with pool.pinned():`
    block. One C call per whole operation."""
    cdef g4_pool *p
    cdef object lock
    cdef readonly tuple cpus

    def __cinit__(self, int n_threads=1, cpus=None, int spin_us=200):
        cdef char msg[256]
        cdef int *c = NULL
        cdef int i
        msg[0] = 0
        if cpus is not None:
            cpus = tuple(int(v) for v in cpus)
            if len(cpus) != n_threads:
                raise ValueError(f"{n_threads} threads need {n_threads} CPUs, got {len(cpus)}")
            c = <int *>malloc(sizeof(int) * n_threads)
            for i in range(n_threads):
                c[i] = cpus[i]
        try:
            with nogil:
                self.p = g4_pool_create(n_threads, c, spin_us, msg, sizeof(msg))
        finally:
            free(c)
        if self.p == NULL:
            raise RuntimeError(f"cannot create the thread pool: {msg.decode()}")
        self.cpus = cpus if cpus is not None else ()
        self.lock = threading.Lock()

    def __dealloc__(self):
        if self.p != NULL:
            g4_pool_destroy(self.p)
            self.p = NULL

    def close(self):
        with self.lock:
            if self.p != NULL:
                g4_pool_destroy(self.p)
                self.p = NULL

    cdef g4_pool *_get(self) except NULL:
        if self.p == NULL:
            raise RuntimeError("the pool is closed")
        return self.p

    @property
    def size(self):
        return g4_pool_size(self._get())

    def pinned(self):
        """Context manager: hold the calling thread on cpus[0] for the whole block (one pair of
        affinity calls instead of three per operation); its affinity is restored on exit. Only one
        thread holds it at a time: others still get correct, per-call pinning."""
        return _PinSession(self)

    def set_groups(self, first):
        """Split the workers into contiguous groups (one per NUMA node): group g = workers
        [first[g], first[g+1]), first[0] = 0 and first[-1] = size."""
        cdef g4_pool *p = self._get()
        cdef char msg[256]
        cdef int *f
        cdef int i, rc = 0
        first = [int(v) for v in first]
        if len(first) < 2:
            raise ValueError(f"group bounds need at least two entries, got {first}")
        f = <int *>malloc(sizeof(int) * len(first))
        if f == NULL:
            raise MemoryError()
        for i in range(len(first)):
            f[i] = first[i]
        with self.lock:
            rc = g4_pool_set_groups(p, len(first) - 1, f, msg, sizeof(msg))
        free(f)
        if rc != 0:
            raise ValueError(msg.decode())

    @property
    def groups(self):
        """Worker bounds of the groups: (0, ..., size); one group = (0, size)."""
        cdef g4_pool *p = self._get()
        return tuple(g4_pool_group_first(p, g) for g in range(g4_pool_n_groups(p) + 1))

    def pin_plan(self):
        """[(worker, cpu or -1, linux tid or -1)]: worker 0's tid is the last calling thread."""
        cdef g4_pool *p = self._get()
        return [(i, g4_pool_cpu(p, i), g4_pool_tid(p, i)) for i in range(g4_pool_size(p))]

    def matmul(self, int ggml_type, const uint8_t[:, ::1] w, int64_t k, const float[:, ::1] x,
               float[:, ::1] y, int64_t r0=0, int64_t r1=-1, RowPlacement placement=None):
        """y[t, r0:r1] = W[r0:r1] . x[t]: w (n_rows, row_bytes) raw GGUF rows of k elements,
        x (n_tok, >= k) float32, y (n_tok, >= n_rows) float32. placement: rows per worker group
        (RowPlacement; its group count must be the pool's)."""
        cdef g4_pool *p = self._get()
        cdef char msg[256]
        cdef int64_t n_rows = w.shape[0], n_tok = x.shape[0]
        cdef int rc
        cdef const int64_t *split = NULL
        cdef const void **wg = NULL
        cdef int n_split = 0
        msg[0] = 0
        if placement is not None:
            if placement.n_rows != n_rows:
                raise ValueError(f"placement is for {placement.n_rows} rows, the matrix has {n_rows}")
            if placement.wg != NULL and placement.row_bytes != w.shape[1]:
                raise ValueError(f"placement copies have rows of {placement.row_bytes} bytes, the matrix "
                                 f"{w.shape[1]}")
            split, wg, n_split = placement.split, placement.wg, placement.n_groups
        if r1 < 0:
            r1 = n_rows
        if y.shape[0] != n_tok:
            raise ValueError(f"y has {y.shape[0]} rows for {n_tok} tokens")
        if x.shape[1] < k:
            raise ValueError(f"x rows have {x.shape[1]} < k={k} elements")
        if n_tok == 0 or n_rows == 0:
            return
        with self.lock:
            with nogil:
                rc = g4_matmul_split(p, ggml_type, &w[0, 0], w.shape[1], n_rows, &x[0, 0], x.shape[1], n_tok,
                                     k, &y[0, 0], y.shape[1], r0, r1, split, n_split, wg, msg, sizeof(msg))
        if rc != 0:
            raise ValueError(msg.decode())
cdef class _PinSession:
    cdef Pool pool

    def __cinit__(self, Pool pool):
        self.pool = pool

    def __enter__(self):
        g4_pool_enter(self.pool._get())
        return self.pool

    def __exit__(self, *exc):
        if self.pool.p != NULL:
            g4_pool_leave(self.pool.p)
        return False


include "_attn.pxi"
include "_ops.pxi"
include "_tok.pxi"
include "_layers.pxi"
