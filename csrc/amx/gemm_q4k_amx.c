/* gemm_q4k_amx.c: Q4_K weights x Q8_K activations on AMX-INT8 tiles for 6..16 tokens (verify
 * batches of draft-max >= 5 and the 16-token tiles of prefill), bit-identical to gemm_ref.c; fewer
 * tokens take the avx512 kernel. A/B in one process, two threads each streaming 1 GiB of a
 * 5376-wide matrix (Sapphire Rapids-class VM): n = 4 / 5 / 6 / 8 / 16 take 122 / 122 / 123 / 125 /
 * 189 ms here against avx512's 100 / 119 / 134 / 158 / 281 ms. The time per 16-row block is flat up
 * to 8 tokens: unpacking, tile products and the float epilogue each take about a third of it.
 *
 * Per block of 16 weight rows and up to 8 tokens:
 *  - A tile c (c = 0..3): the 16 rows' sub-blocks 2c and 2c+1 unpacked to bytes, row-major (64 bytes
 *    per row: the low nibbles of qs[32c..32c+31], then the high nibbles).
 *  - B tile c: the tokens' activations in the VNNI layout, block-diagonal over two columns per token:
 *    column 2t+h holds sub-block 2c+h of token t in its half of K and zeros in the other half. So
 *    tdpbusd gives C_c[row][2t+h] = the exact isum of sub-block 2c+h: all 16 columns are used with
 *    8 tokens, and no horizontal reduction is ever needed.
 *  - S = sum_j sc_j * isum_j is formed in float: each product is an integer below 2^22 and each half
 *    (even / odd sub-blocks: four products, below 2^24) is summed exactly by vfmadd; the two halves
 *    are then added once, which rounds exactly as the reference's (float)S of the exact int32 S.
 *  - M = sum_j m_j * (bsums[2j] + bsums[2j+1]) comes from a fifth product: A = the 8 mins of each row
 *    (zero-padded), B = each 32-element bsum split as 128*a + b (a, b signed bytes), two columns per
 *    token. That split needs |bsum32| < 2^14; Q8_K activations from quantize_row_q8_K stay below
 *    4096, and a call whose activations do not is handed to the avx512 kernel whole.
 *  - the reference's float ops per block, in block order and without FMA:
 *    acc = acc + ((d*d8)*(float)S - (dmin*d8)*(float)M), on 16 (row, token) lanes.
 * Each weight block is read and unpacked once for all tokens. */
#include "amx.h"

#define QB_BLK 4288              /* bytes per (block, token group): 4 B tiles, B_M (2 rows), d8 lanes */
#define QB_BM 4096               /* offset of B_M in a group's bytes */
#define QB_D8 (4096 + 128)       /* offset of the 16 d8 lanes */
#define QB_BUF (192 * 1024)      /* prepared activations of one chunk */
#ifndef G4Q_MIN_NT
#define G4Q_MIN_NT 6             /* fewer tokens take the avx512 kernel (faster there, measured) */
#endif

/* 6-bit scales and mins of a Q4_K block as 8 bytes each (same unpacking as the avx512 kernels) */
static inline void q4k_scales(const uint8_t *s12, uint64_t *sc8, uint64_t *mn8) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s12, 4);
    memcpy(&u1, s12 + 4, 4);
    memcpy(&u2, s12 + 8, 4);
    const uint32_t s03 = u0 & 0x3f3f3f3fu, m03 = u1 & 0x3f3f3f3fu;
    const uint32_t s47 = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
    const uint32_t m47 = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
    *sc8 = (uint64_t)s03 | ((uint64_t)s47 << 32);
    *mn8 = (uint64_t)m03 | ((uint64_t)m47 << 32);
}

/* every 32-element bsum of every token within the B_M split's range */
static int q4k_bsums_fit(const uint8_t *x, size_t xrb, int nt, int64_t nb) {
    for (int t = 0; t < nt; t++) {
        const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xrb);
        for (int64_t b = 0; b < nb; b++)
            for (int j = 0; j < 8; j++) {
                const int s = xb[b].bsums[2 * j] + xb[b].bsums[2 * j + 1];
                if (s < -16384 || s > 16383) return 0;
            }
    }
    return 1;
}

/* blocks [c0, c0+kc) of nt tokens -> buf (layout: see QB_*) */
static void q4k_prepare(const uint8_t *x, size_t xrb, int nt, int ngr, int64_t c0, int kc, uint8_t *buf) {
    for (int b = 0; b < kc; b++)
        for (int g = 0; g < ngr; g++) {
            uint8_t *p = buf + ((size_t)b * ngr + g) * QB_BLK;
            memset(p, 0, QB_BLK);
            float *d8 = (float *)(p + QB_D8);
            for (int tl = 0; tl < 8 && 8 * g + tl < nt; tl++) {
                const block_q8_K *xb = (const block_q8_K *)(x + (size_t)(8 * g + tl) * xrb) + c0 + b;
                for (int c = 0; c < 4; c++)
                    for (int k4 = 0; k4 < 16; k4++) {
                        const int h = k4 >> 3;
                        memcpy(p + 1024 * c + 64 * k4 + 4 * (2 * tl + h), xb->qs + 32 * (2 * c + h) + 4 * (k4 & 7), 4);
                    }
                for (int j = 0; j < 8; j++) {
                    const int s = xb->bsums[2 * j] + xb->bsums[2 * j + 1];
                    const int lo = s & 127; /* s = 128 * hi + lo, lo in [0, 127], hi in [-128, 127] */
                    p[QB_BM + 64 * (j >> 2) + 4 * (2 * tl) + (j & 3)] = (uint8_t)(int8_t)((s - lo) / 128);
                    p[QB_BM + 64 * (j >> 2) + 4 * (2 * tl + 1) + (j & 3)] = (uint8_t)lo;
                }
                /* 128-bit lane i holds tokens 2i, 2i+1 of two rows: [t0 t1 t0 t1] */
                const int i = tl >> 1, e = tl & 1;
                d8[4 * i + e] = d8[4 * i + 2 + e] = xb->d;
            }
        }
}

/* one block of 16 rows unpacked for the tiles and the epilogue (double-buffered: block b+1 is
 * unpacked while block b's tile products run, so the tile loads never wait on fresh stores and the
 * epilogue's loads never wait on the tile stores) */
typedef struct {
    uint8_t a[4][16 * 64]; /* A tiles: sub-blocks (2c, 2c+1) of each row as bytes */
    uint8_t am[16 * 64];   /* A tile of the mins: 8 bytes per row, zero-padded */
    float scf[16][8];      /* sub-block scales as floats */
    float dwv[32], dmv[32]; /* d, dmin in the row-pair lane order */
} __attribute__((aligned(64))) q4k_unp;

/* nxt: bytes from a row to the same row of the next 16-row group, whose block is prefetched into L2
 * (one row group, ~48 KiB at k = 5376, ahead: nearer prefetches, or none, leave the tile products
 * waiting on memory; A/B with two threads streaming 1 GiB each, n = 8: 129 vs 145 ms at 1 block
 * ahead in the same row, 220 ms without) */
G4_AI void q4k_unpack(q4k_unp *u, const uint8_t *const *rowp, size_t off, size_t nxt) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i sh = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    /* d / dmin of 16 rows -> [d(2q) d(2q) d(2q+1) d(2q+1)] for row pairs q = 0..3 (lo) and 4..7 (hi) */
    const __m512i dlo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i dhi = _mm512_add_epi32(dlo, _mm512_set1_epi32(8));
    _Alignas(64) uint32_t dpair[16];
    for (int i = 0; i < 16; i++) {
        const uint8_t *blk = rowp[i] + off;
        _mm_prefetch((const char *)blk + nxt, _MM_HINT_T1);
        _mm_prefetch((const char *)blk + nxt + 64, _MM_HINT_T1);
        _mm_prefetch((const char *)blk + nxt + 128, _MM_HINT_T1);
        uint64_t sc8, mn8;
        q4k_scales(blk + 4, &sc8, &mn8);
        memcpy(u->am + 64 * i, &mn8, 8);
        _mm256_store_ps(u->scf[i], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8))));
        memcpy(&dpair[i], blk, 4);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c)));
            _mm512_store_si512(u->a[c] + 64 * i, _mm512_and_si512(_mm512_srlv_epi64(v, sh), m4));
        }
    }
    const __m512i dp = _mm512_load_si512(dpair);
    const __m512 dw = g4x_half16_to_ps(_mm512_cvtepi32_epi16(dp));
    const __m512 dm = g4x_half16_to_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dp, 16)));
    _mm512_store_ps(u->dwv, _mm512_permutexvar_ps(dlo, dw));
    _mm512_store_ps(u->dwv + 16, _mm512_permutexvar_ps(dhi, dw));
    _mm512_store_ps(u->dmv, _mm512_permutexvar_ps(dlo, dm));
    _mm512_store_ps(u->dmv + 16, _mm512_permutexvar_ps(dhi, dm));
}

/* the five tile products of one (block, token group): C_c = isums of sub-blocks 2c, 2c+1, C_4 = M parts */
G4_AI void q4k_tiles(const q4k_unp *u, const uint8_t *p, int32_t (*cst)[256]) {
    G4T_ZERO(0);
    G4T_ZERO(1);
    G4T_ZERO(2);
    G4T_ZERO(3);
    G4T_ZERO(4);
    G4T_LOAD(5, u->a[0], 64);
    G4T_LOAD(6, p, 64);
    G4T_DPBUSD(0, 5, 6);
    G4T_LOAD(7, u->a[1], 64);
    G4T_LOAD(6, p + 1024, 64);
    G4T_DPBUSD(1, 7, 6);
    G4T_LOAD(5, u->a[2], 64);
    G4T_LOAD(6, p + 2048, 64);
    G4T_DPBUSD(2, 5, 6);
    G4T_LOAD(7, u->a[3], 64);
    G4T_LOAD(6, p + 3072, 64);
    G4T_DPBUSD(3, 7, 6);
    G4T_LOAD(5, u->am, 64);
    G4T_LOAD(6, p + QB_BM, 64);
    G4T_DPBUSD(4, 5, 6);
    G4T_STORE(0, cst[0], 64);
    G4T_STORE(1, cst[1], 64);
    G4T_STORE(2, cst[2], 64);
    G4T_STORE(3, cst[3], 64);
    G4T_STORE(4, cst[4], 64);
}

/* acc[q] (row pair q, 8 tokens) += the block's terms */
G4_AI void q4k_epilogue(const q4k_unp *u, const uint8_t *p, const int32_t (*cst)[256], __m512 *acc, int npair) {
    const __m512 pat128 = _mm512_setr_ps(128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1);
    const __m512 d8 = _mm512_load_ps((const float *)(p + QB_D8));
    for (int q = 0; q < npair; q++) {
        __m512 f[2], mf[2];
        for (int e = 0; e < 2; e++) {
            const int m = 2 * q + e;
            double s2[4];
            memcpy(s2, u->scf[m], 32);
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cst[0] + 16 * m)), _mm512_castpd_ps(_mm512_set1_pd(s2[0])));
            v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cst[1] + 16 * m)), _mm512_castpd_ps(_mm512_set1_pd(s2[1])), v);
            v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cst[2] + 16 * m)), _mm512_castpd_ps(_mm512_set1_pd(s2[2])), v);
            f[e] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cst[3] + 16 * m)), _mm512_castpd_ps(_mm512_set1_pd(s2[3])), v);
            mf[e] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cst[4] + 16 * m)), pat128);
        }
        /* lanes [S(2q, t) S(2q, t+1) S(2q+1, t) S(2q+1, t+1)] per 128-bit lane: the even and odd
         * sub-block halves meet in one rounding, (float) of the exact sum */
        const __m512 S = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], 0x88), _mm512_shuffle_ps(f[0], f[1], 0xDD));
        const __m512 M = _mm512_add_ps(_mm512_shuffle_ps(mf[0], mf[1], 0x88), _mm512_shuffle_ps(mf[0], mf[1], 0xDD));
        const __m512 dd = _mm512_mul_ps(_mm512_broadcast_f32x4(_mm_load_ps(u->dwv + 4 * q)), d8);
        const __m512 dmn = _mm512_mul_ps(_mm512_broadcast_f32x4(_mm_load_ps(u->dmv + 4 * q)), d8);
        acc[q] = _mm512_add_ps(acc[q], _mm512_sub_ps(_mm512_mul_ps(dd, S), _mm512_mul_ps(dmn, M)));
    }
}

static void q4k_amx(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy, int nt,
                    int64_t k, int64_t r0, int64_t r1) {
    const int64_t nb = k / QK_K;
    const int ngr = (nt + 7) / 8;
    int KC = QB_BUF / (ngr * QB_BLK);
    if (KC > nb) KC = (int)nb;
    /* + 1 KiB: the B_M tile load reads 16 rows of 64 bytes from its 2-row slot (rows 2..15 meet
     * zero A bytes, so whatever they hold does not count) */
    _Alignas(64) uint8_t buf[QB_BUF + 1024];
    q4k_unp U[2];
    _Alignas(64) int32_t cst[2][5][256];
    memset(U[0].am, 0, sizeof U[0].am);
    memset(U[1].am, 0, sizeof U[1].am);
    memset(buf + QB_BUF, 0, 1024);
    g4_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    g4t_config(&cfg);
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        q4k_prepare(x, xrb, nt, ngr, c0, kc, buf);
        for (int64_t rg = r0; rg < r1; rg += 16) {
            const int nr = (int)(r1 - rg < 16 ? r1 - rg : 16);
            const int npair = (nr + 1) / 2;
            const uint8_t *rowp[16];
            for (int i = 0; i < 16; i++) rowp[i] = w + (size_t)(rg + (i < nr ? i : nr - 1)) * wrb + (size_t)c0 * sizeof(block_q4_K);
            __m512 acc[2][8];
            for (int g = 0; g < ngr; g++)
                for (int q = 0; q < 8; q++) {
                    _Alignas(64) float a[16];
                    for (int L = 0; L < 16; L++) {
                        const int r = 2 * q + ((L >> 1) & 1), t = 8 * g + 2 * (L >> 2) + (L & 1);
                        a[L] = (c0 > 0 && r < nr && t < nt) ? y[(int64_t)t * ldy + rg + r] : 0.0f;
                    }
                    acc[g][q] = _mm512_load_ps(a);
                }
            const size_t nxt = 16 * wrb; /* may point past the matrix: prefetches do not fault */
            q4k_unpack(&U[0], rowp, 0, nxt);
            for (int b = 0; b < kc; b++) {
                const q4k_unp *u = &U[b & 1];
                for (int g = 0; g < ngr; g++) {
                    const uint8_t *p = buf + ((size_t)b * ngr + g) * QB_BLK;
                    q4k_tiles(u, p, cst[g]);
                    q4k_epilogue(u, p, (const int32_t (*)[256])cst[g], acc[g], npair);
                }
                if (b + 1 < kc) q4k_unpack(&U[(b + 1) & 1], rowp, (size_t)(b + 1) * sizeof(block_q4_K), nxt);
            }
            for (int g = 0; g < ngr; g++)
                for (int q = 0; q < npair; q++) {
                    _Alignas(64) float a[16];
                    _mm512_store_ps(a, acc[g][q]);
                    for (int L = 0; L < 16; L++) {
                        const int r = 2 * q + ((L >> 1) & 1), t = 8 * g + 2 * (L >> 2) + (L & 1);
                        if (r < nr && t < nt) y[(int64_t)t * ldy + rg + r] = a[L];
                    }
                }
        }
    }
    g4t_release();
}

void g4_gemm_q4_K_q8_K_amx(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,
                           int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < n_tok; t += 16) {
        const int nt = (int)(n_tok - t < 16 ? n_tok - t : 16);
        const uint8_t *xt = (const uint8_t *)x + (size_t)t * xrb;
        if (nt < G4Q_MIN_NT || r1 <= r0 || !q4k_bsums_fit(xt, xrb, nt, k / QK_K))
            g4_gemm_q4_K_q8_K_avx512(w, wrb, xt, xrb, y + t * ldy, ldy, nt, k, r0, r1);
        else
            q4k_amx((const uint8_t *)w, wrb, xt, xrb, y + t * ldy, ldy, nt, k, r0, r1);
    }
}
