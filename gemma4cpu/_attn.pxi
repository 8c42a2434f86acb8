# Flash attention over a KV cache and cache storage (csrc/g4_attn.h, one to one).
# Included at the end of _kernels.pyx (`include "_attn.pxi"`) so it shares the Pool object, the
# active table (g4_active) and the module's lock discipline: one C call per whole layer.
from libc.stdint cimport int32_t

cdef extern from "g4_attn.h" nogil:
    ctypedef struct g4_attn_args:
        const float *q
        int64_t q_stride
        const int32_t *q_pos
        int64_t n_q
        const void *k
        const void *v
        size_t k_slot_bytes
        size_t v_slot_bytes
        const int32_t *kv_pos
        int64_t n_slots
        int k_type
        int v_type
        int n_head
        int n_head_kv
        int hd
        int32_t window
        float scale
        float softcap
        float *out
        int64_t out_stride
    ctypedef void (*g4_attn_fn)(const g4_attn_args *a, int64_t i0, int64_t i1, int h0, int h1)
    ctypedef struct g4_attn_kernels:
        const char *isa
        g4_attn_fn flash_attn
        int block
    const g4_attn_kernels g4_attn_ref
    size_t g4_kv_head_bytes(int kv_type, int hd)
    size_t g4_kv_slot_bytes(int kv_type, int n_head_kv, int hd)
    int g4_kv_store(int kv_type, const float *x, int64_t n, int n_head_kv, int hd, void *cache,
                    size_t slot_bytes, const int64_t *slots)
    const g4_attn_kernels *g4_attn_for(const char *isa)
    int g4_flash_attn(g4_pool *pool, const g4_attn_args *a, char *msg, size_t msg_len)

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}


def kv_slot_bytes(int kv_type, int n_head_kv, int hd):
    """Bytes of one cache slot (n_head_kv heads of hd values); raises for invalid combinations."""
    cdef size_t b = g4_kv_slot_bytes(kv_type, n_head_kv, hd)
    if b == 0:
        raise ValueError(f"no cache layout for kv_type={kv_type}, n_head_kv={n_head_kv}, hd={hd} "
                         f"(types {KV_TYPES}; hd a positive multiple of 32)")
    return b


def kv_store(int kv_type, const float[:, ::1] x, int n_head_kv, int hd, uint8_t[:, ::1] cache,
             const int64_t[::1] slots):
    """Store rows x (n, n_head_kv*hd) into cache slots `slots` (n,) of cache (n_slots, slot_bytes),
    converting / quantising to kv_type (f16 round-to-nearest-even, q8_0 and q4_0 per 32-block)."""
    cdef size_t sb = kv_slot_bytes(kv_type, n_head_kv, hd)
    cdef int64_t n = x.shape[0], i
    if x.shape[1] != <int64_t>n_head_kv * hd:
        raise ValueError(f"x rows have {x.shape[1]} values, expected n_head_kv*hd = {n_head_kv * hd}")
    if slots.shape[0] != n:
        raise ValueError(f"{slots.shape[0]} slots for {n} rows")
    if <size_t>cache.shape[1] < sb:
        raise ValueError(f"cache rows of {cache.shape[1]} bytes < {sb} bytes per slot")
    for i in range(n):
        if not 0 <= slots[i] < cache.shape[0]:
            raise ValueError(f"slot {slots[i]} outside [0, {cache.shape[0]})")
    if n == 0:
        return
    with nogil:
        g4_kv_store(kv_type, &x[0, 0], n, n_head_kv, hd, &cache[0, 0], cache.shape[1], &slots[0])


cdef int _attn_args(g4_attn_args *a, const float[:, ::1] q, const int32_t[::1] q_pos, const uint8_t[:, ::1] k,
                    const uint8_t[:, ::1] v, const int32_t[::1] kv_pos, int k_type, int v_type, int n_head,
                    int n_head_kv, int hd, int window, float scale, float softcap, float[:, ::1] out) except -1:
    cdef int64_t n_q = q.shape[0], n_slots = kv_pos.shape[0]
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise ValueError(f"n_head={n_head} must be a positive multiple of n_head_kv={n_head_kv}")
    cdef size_t kb = kv_slot_bytes(k_type, n_head_kv, hd), vb = kv_slot_bytes(v_type, n_head_kv, hd)
    if q.shape[1] < <int64_t>n_head * hd:
        raise ValueError(f"q is ({q.shape[0]}, {q.shape[1]}), rows need n_head*hd = {n_head * hd} values")
    if out.shape[0] != n_q or out.shape[1] < <int64_t>n_head * hd:
        raise ValueError(f"out must be ({n_q}, >= {n_head * hd}), got ({out.shape[0]}, {out.shape[1]})")
    if q_pos.shape[0] != n_q:
        raise ValueError(f"q_pos has {q_pos.shape[0]} positions for {n_q} query rows")
    if k.shape[0] < n_slots or <size_t>k.shape[1] < kb:
        raise ValueError(f"k is ({k.shape[0]}, {k.shape[1]}), needs (>= {n_slots} slots, >= {kb} bytes)")
    if v.shape[0] < n_slots or <size_t>v.shape[1] < vb:
        raise ValueError(f"v is ({v.shape[0]}, {v.shape[1]}), needs (>= {n_slots} slots, >= {vb} bytes)")
    if window < 0 or not softcap >= 0:
        raise ValueError(f"window={window} and softcap={softcap} must be >= 0")
    a.q = &q[0, 0] if n_q else NULL
    a.q_stride = q.shape[1]
    a.q_pos = &q_pos[0] if n_q else NULL
    a.n_q = n_q
    a.k = &k[0, 0] if n_slots else NULL
    a.v = &v[0, 0] if n_slots else NULL
    a.k_slot_bytes = k.shape[1]
    a.v_slot_bytes = v.shape[1]
    a.kv_pos = &kv_pos[0] if n_slots else NULL
    a.n_slots = n_slots
    a.k_type = k_type
    a.v_type = v_type
    a.n_head = n_head
    a.n_head_kv = n_head_kv
    a.hd = hd
    a.window = window
    a.scale = scale
    a.softcap = softcap
    a.out = &out[0, 0] if n_q else NULL
    a.out_stride = out.shape[1]
    return 0


def flash_attn(Pool pool, const float[:, ::1] q, const int32_t[::1] q_pos, const uint8_t[:, ::1] k,
               const uint8_t[:, ::1] v, const int32_t[::1] kv_pos, int k_type, int v_type, int n_head,
               int n_head_kv, int hd, int window, float scale, float softcap, float[:, ::1] out):
    """Whole-layer attention over the pool with the active ISA's kernel (csrc/g4_attn.h):
    q (n_q, >= n_head*hd) f32, q_pos (n_q,) i32, k/v (>= n_slots, slot bytes) u8 cache rows in
    k_type / v_type (KV_TYPES ids),
    kv_pos (n_slots,) i32 (-1 = empty), out (n_q, >= n_head*hd) f32."""
    cdef g4_attn_args a
    cdef char msg[256]
    cdef int rc
    cdef g4_pool *p = pool._get()
    msg[0] = 0
    _attn_args(&a, q, q_pos, k, v, kv_pos, k_type, v_type, n_head, n_head_kv, hd, window, scale, softcap, out)
    if a.n_q == 0:
        return
    with pool.lock:
        with nogil:
            rc = g4_flash_attn(p, &a, msg, sizeof(msg))
    if rc != 0:
        raise ValueError(msg.decode())


def flash_attn_range(const float[:, ::1] q, const int32_t[::1] q_pos, const uint8_t[:, ::1] k,
                     const uint8_t[:, ::1] v, const int32_t[::1] kv_pos, int k_type, int v_type, int n_head,
                     int n_head_kv, int hd, int window, float scale, float softcap, float[:, ::1] out,
                     int64_t i0, int64_t i1, int h0, int h1):
    """One direct, single-threaded call of the active ISA's kernel on rows [i0, i1) x heads [h0, h1)
    (tests: nothing outside that rectangle of out may change)."""
    cdef g4_attn_args a
    _attn_args(&a, q, q_pos, k, v, kv_pos, k_type, v_type, n_head, n_head_kv, hd, window, scale, softcap, out)
    if not (0 <= i0 <= i1 <= a.n_q and 0 <= h0 <= h1 <= n_head):
        raise ValueError(f"range [{i0}, {i1}) x [{h0}, {h1}) outside {a.n_q} rows x {n_head} heads")
    if i0 == i1 or h0 == h1:
        return
    cdef g4_attn_fn fn = g4_attn_for(g4_active().isa).flash_attn
    with nogil:
        fn(&a, i0, i1, h0, h1)


def attn_table_report(str name):
    """{'flash_attn': 'simd' | 'ref'} for ISA `name` (merge into table_report: 'ref' = fallback)."""
    if name not in ISA_NAMES:
        raise ValueError(f"unknown ISA {name!r}")
    cdef const g4_attn_kernels *t = g4_attn_for(name.encode())
    return {"flash_attn": "ref" if t.flash_attn == g4_attn_ref.flash_attn else "simd"}


def attn_block(str name):
    """Slots per online-softmax block of ISA `name`'s attention (part of its operation sequence)."""
    if name not in ISA_NAMES:
        raise ValueError(f"unknown ISA {name!r}")
    return g4_attn_for(name.encode()).block


def attn_active():
    """Name of the attention table the active kernel table selects."""
    return g4_attn_for(g4_active().isa).isa.decode()
