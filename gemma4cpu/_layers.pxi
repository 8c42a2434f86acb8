# The layer loop of a decode / verify step in C (csrc/g4_layers.h; included by _kernels.pyx).
# LayerLoop holds C pointers to one model's weights, norms and KV cache rows (and references that
# keep them alive); run() takes the residual stream of n <= max_tok tokens through every layer with
# one C call per half layer and an interrupt check between the halves. gemma4cpu.model builds it
# (Model._layer_loop) and falls back to its Python loop for what this does not cover.
from cpython.exc cimport PyErr_CheckSignals
from libc.string cimport memset

cdef extern from "g4_layers.h" nogil:
    ctypedef struct g4_lmat:
        int type
        const void *w
        size_t row_bytes
        int64_t n_rows
        int64_t k
        const int64_t *split
        const void *const *wg
        int n_split
    ctypedef struct g4_lkv:
        void *k
        void *v
        int32_t *pos
        int64_t n_slots
        int64_t used
        size_t k_slot
        size_t v_slot
        int n_head_kv
        int hd
    ctypedef struct g4_layer:
        g4_lmat q, k, v, o, gate, up, down
        const float *attn_norm
        const float *q_norm
        const float *k_norm
        const float *post_attn_norm
        const float *ffn_norm
        const float *post_ffw_norm
        const float *next_attn_norm
        int fuse_next
        int n_head, hd, v_norm
        int src
        int32_t window
        float attn_scale, out_scale
        int rope
    ctypedef struct g4_lws:
        float *a
        float *q
        float *att
        float *kr
        float *vr
        float *kn
        float *f
        float *ao
        float *mo
        float *g
        float *u
        float *h
        int64_t *slots
    int g4_layer_attn(g4_pool *pool, const g4_layer *L, const g4_lkv *kv, int k_type, int v_type, float *x,
                      int64_t n, int64_t D, const int32_t *pos, const float *cos, const float *sin, double eps,
                      int a_ready, const g4_lws *ws, char *msg, size_t msg_len)
    int g4_layer_ffn(g4_pool *pool, const g4_layer *L, float *x, int64_t n, int64_t D, double eps,
                     const g4_lws *ws, char *msg, size_t msg_len)


cdef const float *_vec(object v, int64_t d, list keep, str what) except? NULL:
    """float32 (d,) pointer of a norm weight, NULL for None."""
    cdef const float[::1] mv
    if v is None:
        return NULL
    mv = v
    if mv.shape[0] != d:
        raise ValueError(f"{what}: {mv.shape[0]} values, expected {d}")
    keep.append(mv)
    return &mv[0]


cdef int _mat(g4_lmat *m, object mat, int64_t k, list keep, str what) except -1:
    """Fill m from a weights.Mat (None: absent) whose rows take k inputs."""
    cdef const uint8_t[:, ::1] rows
    cdef RowPlacement pl
    memset(m, 0, sizeof(g4_lmat))
    if mat is None:
        return 0
    rows = mat.rows
    if mat.n_in != k or rows.shape[0] != mat.n_out:
        raise ValueError(f"{what}: ({mat.n_out} x {mat.n_in}) with {rows.shape[0]} rows does not take {k} inputs")
    keep.append(rows)
    m.type = mat.type_id
    m.w = &rows[0, 0]
    m.row_bytes = rows.shape[1]
    m.n_rows = rows.shape[0]
    m.k = k
    if mat.placement is not None:
        pl = mat.placement
        if pl.n_rows != m.n_rows or (pl.wg != NULL and pl.row_bytes != <int64_t>m.row_bytes):
            raise ValueError(f"{what}: its placement does not fit the matrix")
        keep.append(pl)
        m.split, m.wg, m.n_split = pl.split, pl.wg, pl.n_groups
    return 0


cdef class LayerLoop:
    """C layer loop over `layers` (one dict per layer, see gemma4cpu.model.Model._layer_loop) and the
    producing layers' caches `kv` (dicts: k, v, pos arrays, n_head_kv, hd)."""
    cdef g4_layer *L
    cdef g4_lkv *kv
    cdef g4_lws ws
    cdef readonly int n_layers, n_kv, max_tok, n_rope
    cdef readonly int64_t D
    cdef double eps
    cdef int k_type, v_type
    cdef int rope_half[16]
    cdef list keep

    def __cinit__(self, list layers, list kv, int64_t D, double eps, int k_type, int v_type, int max_tok,
                  int n_rope):
        cdef int i, hd_max = 0, hq_max = 0, hkv_max = 0
        cdef int64_t ff_max = 0
        cdef g4_layer *l
        cdef const uint8_t[:, ::1] kr
        cdef const uint8_t[:, ::1] vr
        cdef int32_t[::1] pr
        self.keep = []
        if max_tok < 1 or not layers:
            raise ValueError("a layer loop needs layers and max_tok >= 1")
        self.n_layers, self.n_kv, self.D, self.eps = len(layers), len(kv), D, eps
        self.k_type, self.v_type, self.max_tok, self.n_rope = k_type, v_type, max_tok, n_rope
        if not 1 <= n_rope <= 16:
            raise ValueError(f"n_rope={n_rope} must be in 1..16")
        for i in range(16):
            self.rope_half[i] = -1
        self.L = <g4_layer *>calloc(len(layers), sizeof(g4_layer))
        self.kv = <g4_lkv *>calloc(max(1, len(kv)), sizeof(g4_lkv))
        if self.L == NULL or self.kv == NULL:
            raise MemoryError()
        for i, c in enumerate(kv):
            kr, vr, pr = c["k"], c["v"], c["pos"]
            self.keep += [kr, vr, pr]
            if kr.shape[0] != pr.shape[0] or vr.shape[0] != pr.shape[0] or pr.shape[0] < 1:
                raise ValueError(f"cache {i}: k / v / pos slot counts {kr.shape[0]} / {vr.shape[0]} / {pr.shape[0]}")
            self.kv[i].k, self.kv[i].v, self.kv[i].pos = <void *>&kr[0, 0], <void *>&vr[0, 0], &pr[0]
            self.kv[i].n_slots, self.kv[i].used = pr.shape[0], 0
            self.kv[i].k_slot, self.kv[i].v_slot = kr.shape[1], vr.shape[1]
            self.kv[i].n_head_kv, self.kv[i].hd = c["n_head_kv"], c["hd"]
            if kv_slot_bytes(k_type, c["n_head_kv"], c["hd"]) > <size_t>kr.shape[1] or \
                    kv_slot_bytes(v_type, c["n_head_kv"], c["hd"]) > <size_t>vr.shape[1]:
                raise ValueError(f"cache {i}: slots too small for its type")
        for i, d in enumerate(layers):
            l = &self.L[i]
            l.n_head, l.hd, l.src = d["n_head"], d["hd"], d["src"]
            if not 0 <= l.src < len(kv):
                raise ValueError(f"layer {i}: cache {l.src} outside the {len(kv)} producing layers")
            if self.kv[l.src].hd != l.hd or l.n_head % self.kv[l.src].n_head_kv:
                raise ValueError(f"layer {i}: head dim {l.hd} / {l.n_head} heads do not fit cache {l.src}")
            if not 0 <= d["rope"] < n_rope:
                raise ValueError(f"layer {i}: rope table {d['rope']} outside {n_rope}")
            l.rope, l.window, l.v_norm = d["rope"], d["window"], d["v_norm"]
            if self.rope_half[l.rope] not in (-1, l.hd // 2):
                raise ValueError(f"layer {i}: rope table {l.rope} is shared by layers of different head dims")
            self.rope_half[l.rope] = l.hd // 2
            l.attn_scale, l.out_scale, l.fuse_next = d["attn_scale"], d["out_scale"], d["fuse_next"]
            hkv = self.kv[l.src].n_head_kv
            _mat(&l.q, d["q"], D, self.keep, f"layer {i} q")
            _mat(&l.k, d["k"], D, self.keep, f"layer {i} k")
            _mat(&l.v, d["v"], D, self.keep, f"layer {i} v")
            _mat(&l.o, d["o"], <int64_t>l.n_head * l.hd, self.keep, f"layer {i} o")
            _mat(&l.gate, d["gate"], D, self.keep, f"layer {i} gate")
            _mat(&l.up, d["up"], D, self.keep, f"layer {i} up")
            if l.q.w == NULL or l.o.w == NULL or l.gate.w == NULL or l.up.w == NULL:
                raise ValueError(f"layer {i}: q, o, gate and up are required")
            if l.v.w != NULL and l.k.w == NULL:
                raise ValueError(f"layer {i}: v without k")
            if l.q.n_rows != <int64_t>l.n_head * l.hd or l.o.n_rows != D or l.up.n_rows != l.gate.n_rows or (
                    l.k.w != NULL and l.k.n_rows != <int64_t>hkv * l.hd) or (
                    l.v.w != NULL and l.v.n_rows != <int64_t>hkv * l.hd):
                raise ValueError(f"layer {i}: projection shapes do not fit {l.n_head} / {hkv} heads of {l.hd}, D={D}")
            _mat(&l.down, d["down"], l.gate.n_rows, self.keep, f"layer {i} down")
            if l.down.w == NULL or l.down.n_rows != D:
                raise ValueError(f"layer {i}: down must map {l.gate.n_rows} -> {D}")
            l.attn_norm = _vec(d["attn_norm"], D, self.keep, f"layer {i} attn_norm")
            l.q_norm = _vec(d["q_norm"], l.hd, self.keep, f"layer {i} q_norm")
            l.k_norm = _vec(d["k_norm"], l.hd, self.keep, f"layer {i} k_norm")
            l.post_attn_norm = _vec(d["post_attn_norm"], D, self.keep, f"layer {i} post_attn_norm")
            l.ffn_norm = _vec(d["ffn_norm"], D, self.keep, f"layer {i} ffn_norm")
            l.post_ffw_norm = _vec(d["post_ffw_norm"], D, self.keep, f"layer {i} post_ffw_norm")
            l.next_attn_norm = _vec(d["next_attn_norm"], D, self.keep, f"layer {i} next_attn_norm")
            hd_max, hq_max, hkv_max = max(hd_max, l.hd), max(hq_max, l.n_head), max(hkv_max, hkv)
            ff_max = max(ff_max, l.gate.n_rows)
        # scratch, sized once
        cdef int64_t T = max_tok
        wq, wkv = T * hq_max * hd_max, T * hkv_max * hd_max
        bufs = {name: np.zeros(size, np.float32) for name, size in (
            ("a", T * D), ("q", wq), ("att", wq), ("kr", wkv), ("vr", wkv), ("kn", wkv), ("f", T * D),
            ("ao", T * D), ("mo", T * D), ("g", T * ff_max), ("u", T * ff_max), ("h", T * ff_max))}
        slots = np.zeros(T, np.int64)
        self.keep += [bufs, slots]
        cdef float[::1] fv
        cdef int64_t[::1] sv = slots
        fv = bufs["a"]; self.ws.a = &fv[0]
        fv = bufs["q"]; self.ws.q = &fv[0]
        fv = bufs["att"]; self.ws.att = &fv[0]
        fv = bufs["kr"]; self.ws.kr = &fv[0]
        fv = bufs["vr"]; self.ws.vr = &fv[0]
        fv = bufs["kn"]; self.ws.kn = &fv[0]
        fv = bufs["f"]; self.ws.f = &fv[0]
        fv = bufs["ao"]; self.ws.ao = &fv[0]
        fv = bufs["mo"]; self.ws.mo = &fv[0]
        fv = bufs["g"]; self.ws.g = &fv[0]
        fv = bufs["u"]; self.ws.u = &fv[0]
        fv = bufs["h"]; self.ws.h = &fv[0]
        self.ws.slots = &sv[0]

    def __dealloc__(self):
        free(self.L)
        free(self.kv)

    def run(self, Pool pool, float[:, ::1] x, const int32_t[::1] pos, tuple cos, tuple sin, used):
        """x (n, D) float32, the embedded tokens at positions pos (n,), through every layer in place.
        cos / sin: one (n, hd/2) table per rope index; used: slots each cache's attention reads
        (after this call's append). The cache bookkeeping is the caller's (KVCache.reserve)."""
        cdef int64_t n = x.shape[0], i
        cdef int il, rc = 0, a_ready = 0
        cdef char msg[256]
        cdef g4_pool *p = pool._get()
        cdef g4_layer *l
        cdef const float[:, ::1] cv
        cdef const float *cp[16]
        cdef const float *sp[16]
        if not 1 <= n <= self.max_tok or x.shape[1] != self.D or pos.shape[0] != n:
            raise ValueError(f"layer loop: x ({n}, {x.shape[1]}) / {pos.shape[0]} positions; needs 1..{self.max_tok} "
                             f"rows of {self.D}")
        if len(cos) != self.n_rope or len(sin) != self.n_rope or len(used) != self.n_kv:
            raise ValueError("layer loop: rope tables / cache lengths do not fit the plan")
        for i in range(self.n_kv):
            u = used[i]
            if not 0 <= u <= self.kv[i].n_slots:
                raise ValueError(f"layer loop: cache {i} uses {u} of {self.kv[i].n_slots} slots")
            self.kv[i].used = u
        for i in range(n - 1):
            if pos[i + 1] != pos[i] + 1 or pos[i] < 0:
                raise ValueError("layer loop: positions must be consecutive and >= 0")
        for i in range(self.n_rope):
            for t in (cos[i], sin[i]):
                cv = t
                if cv.shape[0] != n or (self.rope_half[i] >= 0 and cv.shape[1] != self.rope_half[i]):
                    raise ValueError(f"layer loop: rope table {i} is ({cv.shape[0]}, {cv.shape[1]}), needs "
                                     f"({n}, {self.rope_half[i]})")
                if t is cos[i]:
                    cp[i] = &cv[0, 0]
                else:
                    sp[i] = &cv[0, 0]
        msg[0] = 0
        with pool.lock:
            for il in range(self.n_layers):
                l = &self.L[il]
                with nogil:
                    rc = g4_layer_attn(p, l, self.kv, self.k_type, self.v_type, &x[0, 0], n, self.D, &pos[0],
                                       cp[l.rope], sp[l.rope], self.eps, a_ready, &self.ws, msg, sizeof(msg))
                if rc != 0:
                    raise ValueError(f"layer {il}: {msg.decode()}")
                PyErr_CheckSignals()
                with nogil:
                    rc = g4_layer_ffn(p, l, &x[0, 0], n, self.D, self.eps, &self.ws, msg, sizeof(msg))
                if rc != 0:
                    raise ValueError(f"layer {il}: {msg.decode()}")
                PyErr_CheckSignals()
                a_ready = l.fuse_next
