/* g4_dispatch.c: CPU feature detection (CPUID + XGETBV), table selection, type traits, and the
 * whole-operation entry points that split work over the pool. Compiled with baseline flags. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "g4_blocks.h"
#include "g4_impl.h"
#include "g4_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* ---- CPU features ---------------------------------------------------------------------- */
/* names of the G4_F_* bits (g4_kernels.h), in bit order */
static const char *const feature_names[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                                            "avx512dq", "avx512vnni", "avx512bf16", "amx_int8", "bmi2",
                                            "avx512vbmi"};

static uint32_t detect_features(void) {
    uint32_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return 0;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const int ymm_ok = (xcr0_lo & 0x6u) == 0x6u;          /* XMM and YMM state enabled by the OS */
    const int zmm_ok = ymm_ok && (xcr0_lo & 0xe0u) == 0xe0u; /* opmask, ZMM_Hi256, Hi16_ZMM */
    const int tile_ok = (xcr0_lo & 0x60000u) == 0x60000u; /* XTILECFG, XTILEDATA */
    if (!ymm_ok) return 0;
    if (fma) f |= G4_F_FMA;
    if (f16c) f |= G4_F_F16C;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        if ((b >> 5) & 1) f |= G4_F_AVX2;
        if ((b >> 8) & 1) f |= G4_F_BMI2;
        if (zmm_ok) {
            if ((b >> 16) & 1) f |= G4_F_AVX512F;
            if ((b >> 17) & 1) f |= G4_F_AVX512DQ;
            if ((b >> 30) & 1) f |= G4_F_AVX512BW;
            if ((b >> 31) & 1) f |= G4_F_AVX512VL;
            if ((c >> 11) & 1) f |= G4_F_AVX512VNNI;
            if ((c >> 1) & 1) f |= G4_F_AVX512VBMI;
        }
        if (tile_ok && ((d >> 25) & 1)) f |= G4_F_AMX_INT8;
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        if (zmm_ok && ((a1 >> 5) & 1)) f |= G4_F_AVX512BF16;
    }
#endif
    return f;
}

static uint32_t g_features;
static int g_features_done;

uint32_t g4_cpu_features(void) {
    if (!g_features_done) { g_features = detect_features(); g_features_done = 1; }
    return g_features;
}

const char *g4_cpu_feature_name(int bit) {
    if (bit < 0 || bit >= (int)(sizeof(feature_names) / sizeof(feature_names[0]))) return NULL;
    return feature_names[bit];
}

/* Tiers (each table's objects are compiled for exactly these features):
 *   avx2:   AVX2 + FMA + F16C + BMI2      Intel Haswell+ / AMD Zen 1+
 *   avx512: F + BW + VL + DQ + VNNI       Intel Ice Lake-SP, Sapphire Rapids+ / AMD Zen 4+
 *           (Skylake-SP has AVX-512 without VNNI: it gets the avx2 table, not a SIGILL)
 *   amx:    avx512 + VBMI + AMX-INT8, and the OS grants the tile state   Sapphire Rapids+ */
enum {
    NEEDS_AVX2 = G4_F_AVX2 | G4_F_FMA | G4_F_F16C | G4_F_BMI2,
    NEEDS_AVX512 = NEEDS_AVX2 | G4_F_AVX512F | G4_F_AVX512BW | G4_F_AVX512VL | G4_F_AVX512DQ | G4_F_AVX512VNNI,
    NEEDS_AMX = NEEDS_AVX512 | G4_F_AVX512VBMI | G4_F_AMX_INT8,
};
static const uint32_t isa_needs[G4_ISA_COUNT] = {
    [G4_ISA_REF] = 0,
    [G4_ISA_AVX2] = NEEDS_AVX2,
    [G4_ISA_AVX512] = NEEDS_AVX512,
    [G4_ISA_AMX] = NEEDS_AMX,
};

/* Linux hands out the AMX tile data state (8 KiB per thread) only to processes that ask for it:
 * without the permission the first tile instruction raises SIGILL. Asked once per process; the
 * answer holds for every thread of it. */
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
static int amx_permission(void) {
    static int state; /* 0 unknown, 1 granted, -1 refused */
    if (!state) {
        const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    }
    return state == 1;
}
#else
static int amx_permission(void) { return 0; }
#endif

int g4_isa_supported(g4_isa isa) {
    if ((int)isa < 0 || isa >= G4_ISA_COUNT) return 0;
#if !(defined(__x86_64__) || defined(__i386__))
    if (isa != G4_ISA_REF) return 0;
#endif
    if ((g4_cpu_features() & isa_needs[isa]) != isa_needs[isa]) return 0;
    return isa != G4_ISA_AMX || amx_permission();
}

static const g4_kernels *const all_tables[G4_ISA_COUNT] = {&g4_kernels_ref, &g4_kernels_avx2,
                                                          &g4_kernels_avx512, &g4_kernels_amx};

const g4_kernels *g4_kernels_for(g4_isa isa) {
    return g4_isa_supported(isa) ? all_tables[isa] : NULL;
}

const g4_kernels *g4_kernels_select(const char *name) {
    if (!name || !strcmp(name, "auto")) {
        for (int i = G4_ISA_COUNT - 1; i >= 0; i--)
            if (g4_isa_supported((g4_isa)i)) return all_tables[i];
        return &g4_kernels_ref;
    }
    for (int i = 0; i < G4_ISA_COUNT; i++)
        if (!strcmp(name, all_tables[i]->isa)) return g4_kernels_for((g4_isa)i);
    return NULL;
}

static _Atomic(const g4_kernels *) g_active;

const g4_kernels *g4_active(void) {
    const g4_kernels *k = atomic_load(&g_active);
    if (!k) {
        k = g4_kernels_select("auto");
        atomic_store(&g_active, k);
    }
    return k;
}
void g4_set_active(const g4_kernels *k) { atomic_store(&g_active, k); }

/* ---- table report ------------------------------------------------------------------------ */
static const char *const wt_names[G4_WT_COUNT] = {"f32", "f16", "bf16", "q4_0", "q5_0", "q8_0",
                                                  "q4_K", "q5_K", "q6_K"};
static char slot_names[3 + 2 * G4_WT_COUNT][32];

int g4_slot_count(void) { return 3 + 2 * G4_WT_COUNT; }

const char *g4_slot_name(int slot) {
    if (slot < 0 || slot >= g4_slot_count()) return NULL;
    if (slot == 0) return "quantize_row_q8_0";
    if (slot == 1) return "quantize_row_q8_K";
    if (slot == 2 + 2 * G4_WT_COUNT) return "gemm_q4_K_r8";
    char *s = slot_names[slot];
    if (!s[0]) {
        const int wt = (slot - 2) / 2;
        snprintf(s, sizeof(slot_names[0]), "%s_%s", (slot - 2) % 2 ? "gemm" : "dequant_row", wt_names[wt]);
    }
    return s;
}

static const void *slot_ptr(const g4_kernels *k, int slot) {
    if (slot == 0) return (const void *)k->quantize_row_q8_0;
    if (slot == 1) return (const void *)k->quantize_row_q8_K;
    if (slot == 2 + 2 * G4_WT_COUNT) return (const void *)k->gemm_q4_K_r8;
    const int wt = (slot - 2) / 2;
    return (slot - 2) % 2 ? (const void *)k->wt[wt].gemm : (const void *)k->wt[wt].dequant_row;
}

int g4_slot_is_ref(const g4_kernels *k, int slot) {
    if (!k || slot < 0 || slot >= g4_slot_count()) return -1;
    return slot_ptr(k, slot) == slot_ptr(&g4_kernels_ref, slot);
}

/* ---- type traits --------------------------------------------------------------------------- */
int g4_wt_index(int t) {
    switch (t) {
    case G4_TYPE_F32: return G4_WT_F32;
    case G4_TYPE_F16: return G4_WT_F16;
    case G4_TYPE_BF16: return G4_WT_BF16;
    case G4_TYPE_Q4_0: return G4_WT_Q4_0;
    case G4_TYPE_Q5_0: return G4_WT_Q5_0;
    case G4_TYPE_Q8_0: return G4_WT_Q8_0;
    case G4_TYPE_Q4_K: case G4_TYPE_Q4_K_R8: return G4_WT_Q4_K;
    case G4_TYPE_Q5_K: return G4_WT_Q5_K;
    case G4_TYPE_Q6_K: return G4_WT_Q6_K;
    default: return -1;
    }
}

int g4_type_block_size(int t) {
    switch (g4_wt_index(t)) {
    case G4_WT_F32: case G4_WT_F16: case G4_WT_BF16: return 1;
    case G4_WT_Q4_0: case G4_WT_Q5_0: case G4_WT_Q8_0: return 32;
    case G4_WT_Q4_K: case G4_WT_Q5_K: case G4_WT_Q6_K: return QK_K;
    default: return 0;
    }
}

int g4_type_block_bytes(int t) {
    switch (g4_wt_index(t)) {
    case G4_WT_F32: return 4;
    case G4_WT_F16: case G4_WT_BF16: return 2;
    case G4_WT_Q4_0: return sizeof(block_q4_0);
    case G4_WT_Q5_0: return sizeof(block_q5_0);
    case G4_WT_Q8_0: return sizeof(block_q8_0);
    case G4_WT_Q4_K: return sizeof(block_q4_K);
    case G4_WT_Q5_K: return sizeof(block_q5_K);
    case G4_WT_Q6_K: return sizeof(block_q6_K);
    default: return 0;
    }
}

int g4_type_k_multiple(int t) {
    const int bs = g4_type_block_size(t);
    return bs == 1 ? 16 : bs;
}

int g4_type_row_multiple(int t) { return t == G4_TYPE_Q4_K_R8 ? 8 : 1; }

g4_gemm_fn g4_type_gemm(const g4_kernels *k, int t) {
    if (t == G4_TYPE_Q4_K_R8) return k->gemm_q4_K_r8;
    const int wt = g4_wt_index(t);
    return wt < 0 ? NULL : k->wt[wt].gemm;
}

/* one group of 8 rows: rows (8 x row_bytes, row layout) -> g (R8), or back */
static void r8_pack_group(const uint8_t *rows, size_t wrb, int64_t nb, block_q4_K_r8 *g) {
    for (int r = 0; r < 8; r++)
        for (int64_t b = 0; b < nb; b++) g4_r8_put((const block_q4_K *)(rows + (size_t)r * wrb) + b, r, &g[b]);
}

static void r8_unpack_group(const block_q4_K_r8 *g, int64_t nb, uint8_t *rows, size_t wrb) {
    for (int r = 0; r < 8; r++)
        for (int64_t b = 0; b < nb; b++) g4_r8_get(&g[b], r, (block_q4_K *)(rows + (size_t)r * wrb) + b);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* g4_x86_256.h's helpers compiled for AVX2 here (this file has baseline flags; the one caller
 * below runs only where CPUID reports AVX2) */
#pragma GCC push_options
#pragma GCC target("avx2")
#include "g4_x86_256.h"
#pragma GCC pop_options
/* the same bytes with AVX2: each 32-byte code group is an 8 x 8 dword transpose (q[g][i][row] ->
 * row's qs[32g + 4i], g4_tr8x8_epi32); d, dmin and the scale dwords one row at a time */
__attribute__((target("avx2"))) static void r8_unpack_group_avx2(const block_q4_K_r8 *g, int64_t nb, uint8_t *rows,
                                                                size_t wrb) {
    for (int64_t b = 0; b < nb; b++) {
        const block_q4_K_r8 *s = &g[b];
        for (int r = 0; r < 8; r++) g4_r8_get_head(s, r, (block_q4_K *)(rows + (size_t)r * wrb) + b);
        for (int q = 0; q < 4; q++) {
            __m256i v[8], c[8];
            for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_si256((const __m256i *)s->q[q][i]);
            g4_tr8x8_epi32(v, c); /* c[r] lane i = dword r of v[i] = row r's dword i */
            for (int r = 0; r < 8; r++)
                _mm256_storeu_si256((__m256i *)(((block_q4_K *)(rows + (size_t)r * wrb) + b)->qs + 32 * q), c[r]);
        }
    }
}
#define G4_HAVE_UNPACK_AVX2 1
#endif

static void r8_unpack_rows(const void *w, int64_t r0, int64_t r1, int64_t k, void *out) {
    const int64_t nb = k / QK_K;
    const size_t wrb = (size_t)nb * sizeof(block_q4_K);
#ifdef G4_HAVE_UNPACK_AVX2
    if (g4_cpu_features() & G4_F_AVX2) {
        for (int64_t r = r0; r < r1; r += 8)
            r8_unpack_group_avx2((const block_q4_K_r8 *)((const uint8_t *)w + (size_t)r * wrb), nb,
                                 (uint8_t *)out + (size_t)(r - r0) * wrb, wrb);
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r += 8)
        r8_unpack_group((const block_q4_K_r8 *)((const uint8_t *)w + (size_t)r * wrb), nb,
                        (uint8_t *)out + (size_t)(r - r0) * wrb, wrb);
}

static int r8_convert(const void *src, void *dst, int64_t n_rows, int64_t k, int pack) {
    if (n_rows < 0 || n_rows % 8 || k <= 0 || k % QK_K) return -1;
    const int64_t nb = k / QK_K;
    const size_t wrb = (size_t)nb * sizeof(block_q4_K), gb = 8 * wrb;
    uint8_t *tmp = NULL;
    if (src == dst && n_rows) {
        tmp = (uint8_t *)malloc(gb);
        if (!tmp) return -1;
    }
    for (int64_t r = 0; r < n_rows; r += 8) {
        const uint8_t *s = (const uint8_t *)src + (size_t)r * wrb;
        uint8_t *d = (uint8_t *)dst + (size_t)r * wrb;
        if (tmp) {
            memcpy(tmp, s, gb);
            s = tmp;
        }
        if (pack) r8_pack_group(s, wrb, nb, (block_q4_K_r8 *)d);
        else r8_unpack_group((const block_q4_K_r8 *)s, nb, d, wrb);
    }
    free(tmp);
    return 0;
}

int g4_repack_q4_K_r8(const void *src, void *dst, int64_t n_rows, int64_t k) { return r8_convert(src, dst, n_rows, k, 1); }
int g4_unpack_q4_K_r8(const void *src, void *dst, int64_t n_rows, int64_t k) { return r8_convert(src, dst, n_rows, k, 0); }

g4_act g4_type_act(int t) {
    switch (g4_wt_index(t)) {
    case G4_WT_Q4_0: case G4_WT_Q5_0: case G4_WT_Q8_0: return G4_ACT_Q8_0;
    case G4_WT_Q4_K: case G4_WT_Q5_K: case G4_WT_Q6_K: return G4_ACT_Q8_K;
    default: return G4_ACT_F32;
    }
}

size_t g4_act_row_bytes(g4_act act, int64_t k) {
    switch (act) {
    case G4_ACT_Q8_0: return (size_t)(k / QK8_0) * sizeof(block_q8_0);
    case G4_ACT_Q8_K: return (size_t)(k / QK_K) * sizeof(block_q8_K);
    default: return (size_t)k * sizeof(float);
    }
}

/* ---- whole operations over the pool -------------------------------------------------------- */
/* Rows are split statically in multiples of 16 (64 bytes of y per token: no false sharing).
 * For more than G4_TOK_TILE tokens, each worker walks its rows in L2-sized chunks and, per
 * chunk, all token tiles; every (row, token) result is computed by the same kernel code, so the
 * tiling cannot change a bit of the output. */
#define G4_TOK_TILE 16
/* Q4_K_R8: up to this many tokens the R8 product; more (the row kernels' 13-16-token tiles and
 * prefill) unpack L2 row chunks and run the Q4_K kernels (16-token prefill slices of a 31B-shaped
 * model, 2 threads: through the R8 product 0.72-0.78x the row layout's tokens/s, through the
 * unpacked chunks 0.96-1.03x) */
#define G4_R8_DIRECT_MAX 12
#define G4_L2_CHUNK_BYTES (256u * 1024u)

typedef struct {
    g4_gemm_fn gemm;
    g4_gemm_fn gemm_wide; /* NULL: one gemm call per 16-token tile */
    const void *w;
    size_t wrb;
    const void *x;
    size_t xrb;
    float *y;
    int64_t ldy, n_tok, k, r0, r1;
    /* activation quantisation phase */
    g4_quant_fn quant;
    const float *xf;
    int64_t ldx;
    void *xq;
    /* per-group rows (NUMA distribute / mirror): group g computes rows [split[g], split[g+1])
     * with its own workers, reading them from w_group[g] (or w); NULL: all workers share [r0, r1) */
    const g4_pool *pool;
    const int64_t *split;
    const void *const *w_group;
    /* Q4_K_R8 weights with more than G4_R8_DIRECT_MAX tokens: each worker unpacks its L2 row chunk
     * into row layout (its own `unpack_bytes` slice of `unpack`) and runs the Q4_K products on it */
    int r8;
    g4_gemm_fn row_gemm, row_wide;
    uint8_t *unpack;
    size_t unpack_bytes;
} matmul_ctx;

static int64_t chunk_rows(size_t wrb, int r8) {
    int64_t chunk = (int64_t)(G4_L2_CHUNK_BYTES / (wrb ? wrb : 1));
    if (chunk < 16) chunk = 16;
    return r8 ? chunk & ~(int64_t)7 : chunk;
}

static void matmul_task(void *vctx, int ith, int nth) {
    const matmul_ctx *c = (const matmul_ctx *)vctx;
    const int worker = ith;
    int64_t lo = c->r0, hi = c->r1;
    const void *w = c->w;
    if (c->split) {
        int g, li, ln;
        g4_pool_group_of(c->pool, ith, &g, &li, &ln);
        if (c->split[g] > lo) lo = c->split[g];
        if (c->split[g + 1] < hi) hi = c->split[g + 1];
        if (c->w_group) w = c->w_group[g];
        ith = li;
        nth = ln;
    }
    const int64_t rows = hi - lo;
    if (rows <= 0) return;
    int64_t per = (rows + nth - 1) / nth;
    per = (per + 15) & ~(int64_t)15;
    const int64_t a = lo + per * ith;
    const int64_t b = a + per < hi ? a + per : hi;
    if (a >= b) return;
    if (c->n_tok <= G4_TOK_TILE && !c->r8) {
        c->gemm(w, c->wrb, c->x, c->xrb, c->y, c->ldy, c->n_tok, c->k, a, b);
        return;
    }
    const int64_t chunk = chunk_rows(c->wrb, c->r8);
    for (int64_t ra = a; ra < b; ra += chunk) {
        const int64_t rb = ra + chunk < b ? ra + chunk : b;
        if (c->r8) { /* same bits: the Q4_K products on the same rows, moved back into row layout */
            uint8_t *buf = c->unpack + (size_t)worker * c->unpack_bytes;
            r8_unpack_rows(w, ra, rb, c->k, buf);
            if (c->row_wide) {
                c->row_wide(buf, c->wrb, c->x, c->xrb, c->y + ra, c->ldy, c->n_tok, c->k, 0, rb - ra);
                continue;
            }
            for (int64_t t = 0; t < c->n_tok; t += G4_TOK_TILE) {
                const int64_t nt = c->n_tok - t < G4_TOK_TILE ? c->n_tok - t : G4_TOK_TILE;
                c->row_gemm(buf, c->wrb, (const uint8_t *)c->x + (size_t)t * c->xrb, c->xrb, c->y + t * c->ldy + ra,
                            c->ldy, nt, c->k, 0, rb - ra);
            }
            continue;
        }
        if (c->gemm_wide) { /* the kernel tiles the tokens itself (and reuses what it unpacked) */
            c->gemm_wide(w, c->wrb, c->x, c->xrb, c->y, c->ldy, c->n_tok, c->k, ra, rb);
            continue;
        }
        for (int64_t t = 0; t < c->n_tok; t += G4_TOK_TILE) {
            const int64_t nt = c->n_tok - t < G4_TOK_TILE ? c->n_tok - t : G4_TOK_TILE;
            c->gemm(w, c->wrb, (const uint8_t *)c->x + (size_t)t * c->xrb, c->xrb, c->y + t * c->ldy,
                    c->ldy, nt, c->k, ra, rb);
        }
    }
}

static void quant_task(void *vctx, int ith, int nth) {
    const matmul_ctx *c = (const matmul_ctx *)vctx;
    for (int64_t t = ith; t < c->n_tok; t += nth)
        c->quant(c->xf + t * c->ldx, (uint8_t *)c->xq + (size_t)t * c->xrb, c->k);
}

int g4_matmul(g4_pool *pool, int type, const void *w, size_t wrb, int64_t n_rows, const float *x,
              int64_t ldx, int64_t n_tok, int64_t k, float *y, int64_t ldy, int64_t r0, int64_t r1,
              char *msg, size_t msg_len) {
    return g4_matmul_split(pool, type, w, wrb, n_rows, x, ldx, n_tok, k, y, ldy, r0, r1, NULL, 0, NULL,
                           msg, msg_len);
}

int g4_matmul_split(g4_pool *pool, int type, const void *w, size_t wrb, int64_t n_rows, const float *x,
                    int64_t ldx, int64_t n_tok, int64_t k, float *y, int64_t ldy, int64_t r0, int64_t r1,
                    const int64_t *split, int n_split, const void *const *w_group, char *msg, size_t msg_len) {
    const int wt = g4_wt_index(type);
    if (wt < 0) { snprintf(msg, msg_len, "unsupported weight type %d", type); return -1; }
    const int km = g4_type_k_multiple(type);
    if (k <= 0 || k % km) { snprintf(msg, msg_len, "k=%lld is not a positive multiple of %d", (long long)k, km); return -1; }
    const size_t need = (size_t)(k / g4_type_block_size(type)) * (size_t)g4_type_block_bytes(type);
    if (wrb < need) { snprintf(msg, msg_len, "row stride %zu < %zu bytes for k=%lld", wrb, need, (long long)k); return -1; }
    if (n_tok < 1) { snprintf(msg, msg_len, "n_tok=%lld < 1", (long long)n_tok); return -1; }
    if (r0 < 0 || r1 > n_rows || r0 > r1) {
        snprintf(msg, msg_len, "row range [%lld, %lld) outside [0, %lld)", (long long)r0, (long long)r1, (long long)n_rows);
        return -1;
    }
    if (ldx < k || ldy < r1) { snprintf(msg, msg_len, "bad strides ldx=%lld ldy=%lld", (long long)ldx, (long long)ldy); return -1; }
    if (split) {
        if (n_split != g4_pool_n_groups(pool)) {
            snprintf(msg, msg_len, "row split has %d groups, the pool %d", n_split, g4_pool_n_groups(pool));
            return -1;
        }
        if (split[0] != 0 || split[n_split] != n_rows) {
            snprintf(msg, msg_len, "row split must run from 0 to %lld", (long long)n_rows);
            return -1;
        }
        for (int g = 0; g < n_split; g++)
            if (split[g + 1] < split[g]) { snprintf(msg, msg_len, "row split bounds must not decrease"); return -1; }
        if (w_group)
            for (int g = 0; g < n_split; g++)
                if (!w_group[g]) { snprintf(msg, msg_len, "no weight copy for group %d", g); return -1; }
    }
    const int r8 = type == G4_TYPE_Q4_K_R8;
    const g4_kernels *kt = g4_active();
    if (r8) {
        if (wrb != need || n_rows % 8 || r0 % 8 || r1 % 8) {
            snprintf(msg, msg_len, "Q4_K_R8 weights need rows of exactly %zu bytes (got %zu) and a row count and "
                     "row range in multiples of 8 (got %lld rows, [%lld, %lld))", need, wrb, (long long)n_rows,
                     (long long)r0, (long long)r1);
            return -1;
        }
        if (split)
            for (int g = 0; g <= n_split; g++)
                if (split[g] % 8) { snprintf(msg, msg_len, "Q4_K_R8 row split bounds must be multiples of 8"); return -1; }
        if (!kt->gemm_q4_K_r8) { snprintf(msg, msg_len, "the %s table has no Q4_K_R8 product", kt->isa); return -1; }
    }
    if (r0 == r1) return 0;
    matmul_ctx c = {.gemm = g4_type_gemm(kt, type), .gemm_wide = r8 ? NULL : kt->wt[wt].gemm_wide, .w = w, .wrb = wrb, .y = y, .ldy = ldy, .n_tok = n_tok,
                    .k = k, .r0 = r0, .r1 = r1, .xf = x, .ldx = ldx, .pool = pool, .split = split,
                    .w_group = split ? w_group : NULL};
    const g4_act act = g4_type_act(type);
    if (act == G4_ACT_F32) {
        c.x = x;
        c.xrb = (size_t)ldx * sizeof(float);
    } else {
        c.xrb = g4_act_row_bytes(act, k);
        const size_t xq_bytes = (c.xrb * (size_t)n_tok + 63) & ~(size_t)63;
        size_t extra = 0;
        if (r8 && n_tok > G4_R8_DIRECT_MAX) {
            c.r8 = 1;
            c.row_gemm = kt->wt[wt].gemm;
            c.row_wide = kt->wt[wt].gemm_wide;
            c.unpack_bytes = ((size_t)chunk_rows(wrb, 1) * wrb + 63) & ~(size_t)63;
            extra = c.unpack_bytes * (size_t)g4_pool_size(pool);
        }
        c.xq = g4_pool_scratch(pool, xq_bytes + extra);
        if (!c.xq) { snprintf(msg, msg_len, "out of memory for %lld activation rows", (long long)n_tok); return -1; }
        c.unpack = (uint8_t *)c.xq + xq_bytes;
        c.quant = act == G4_ACT_Q8_K ? kt->quantize_row_q8_K : kt->quantize_row_q8_0;
        if (n_tok >= 4 && g4_pool_size(pool) > 1) g4_pool_run(pool, quant_task, &c);
        else quant_task(&c, 0, 1);
        c.x = c.xq;
    }
    g4_pool_run(pool, matmul_task, &c);
    return 0;
}
