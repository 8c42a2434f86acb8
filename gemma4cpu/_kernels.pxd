# Mirror of csrc/g4_kernels.h and csrc/g4_pool.h (one to one; keep in step with the headers).
from libc.stdint cimport int64_t, uint32_t

cdef extern from "g4_pool.h" nogil:
    ctypedef struct g4_pool:
        pass
    ctypedef void (*g4_task_fn)(void *ctx, int ith, int nth)
    g4_pool *g4_pool_create(int n_threads, const int *cpus, int spin_us, char *msg, size_t msg_len)
    void g4_pool_destroy(g4_pool *p)
    int g4_pool_size(const g4_pool *p)
    int g4_pool_cpu(const g4_pool *p, int i)
    long g4_pool_tid(const g4_pool *p, int i)
    void g4_pool_run(g4_pool *p, g4_task_fn fn, void *ctx)
    void *g4_pool_scratch(g4_pool *p, size_t nbytes)
    int g4_pool_enter(g4_pool *p)
    void g4_pool_leave(g4_pool *p)
    int g4_pool_set_groups(g4_pool *p, int n_groups, const int *first, char *msg, size_t msg_len)
    int g4_pool_n_groups(const g4_pool *p)
    int g4_pool_group_first(const g4_pool *p, int g)
    void g4_pool_group_of(const g4_pool *p, int ith, int *group, int *local, int *count)

cdef extern from "g4_kernels.h" nogil:
    ctypedef enum g4_isa:
        G4_ISA_REF
        G4_ISA_AVX2
        G4_ISA_AVX512
        G4_ISA_AMX
        G4_ISA_COUNT
    ctypedef enum g4_act:
        G4_ACT_F32
        G4_ACT_Q8_0
        G4_ACT_Q8_K
    ctypedef void (*g4_dequant_fn)(const void *w, float *y, int64_t k)
    ctypedef void (*g4_quant_fn)(const float *x, void *y, int64_t k)
    ctypedef void (*g4_gemm_fn)(const void *w, size_t w_row_bytes, const void *x, size_t x_row_bytes,
                                float *y, int64_t ldy, int64_t n_tok, int64_t k, int64_t r0, int64_t r1)
    ctypedef struct g4_wt_kernels:
        g4_dequant_fn dequant_row
        g4_gemm_fn gemm
    ctypedef struct g4_kernels:
        const char *isa
        g4_quant_fn quantize_row_q8_0
        g4_quant_fn quantize_row_q8_K
        g4_wt_kernels wt[9]

    int g4_wt_index(int ggml_type)
    int g4_type_block_size(int ggml_type)
    int g4_type_block_bytes(int ggml_type)
    g4_act g4_type_act(int ggml_type)
    size_t g4_act_row_bytes(g4_act act, int64_t k)
    int g4_type_k_multiple(int ggml_type)
    int g4_type_row_multiple(int ggml_type)
    g4_gemm_fn g4_type_gemm(const g4_kernels *k, int ggml_type)
    int g4_repack_q4_K_r8(const void *src, void *dst, int64_t n_rows, int64_t k)
    int g4_unpack_q4_K_r8(const void *src, void *dst, int64_t n_rows, int64_t k)
    int g4_isa_supported(g4_isa isa)
    const g4_kernels *g4_kernels_for(g4_isa isa)
    const g4_kernels *g4_kernels_select(const char *name)
    const g4_kernels *g4_active()
    void g4_set_active(const g4_kernels *k)
    int g4_slot_count()
    const char *g4_slot_name(int slot)
    int g4_slot_is_ref(const g4_kernels *k, int slot)
    uint32_t g4_cpu_features()
    const char *g4_cpu_feature_name(int bit)
    int g4_matmul(g4_pool *pool, int ggml_type, const void *w, size_t w_row_bytes, int64_t n_rows,
                  const float *x, int64_t ldx, int64_t n_tok, int64_t k, float *y, int64_t ldy,
                  int64_t r0, int64_t r1, char *msg, size_t msg_len)
    int g4_matmul_split(g4_pool *pool, int ggml_type, const void *w, size_t w_row_bytes, int64_t n_rows,
                        const float *x, int64_t ldx, int64_t n_tok, int64_t k, float *y, int64_t ldy,
                        int64_t r0, int64_t r1, const int64_t *split, int n_split, const void *const *w_group,
                        char *msg, size_t msg_len)

