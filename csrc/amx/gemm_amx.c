/* gemm_amx.c: Q8_0 x Q8_0 products on AMX-INT8 tiles, n_tok = 1..16, bit-identical to gemm_ref.c
 * (the integer dot products are exact whatever computes them; the per-block float sequence is the
 * reference's, in block order, no FMA).
 *
 * Tile A is read straight from the GGUF rows (16 rows x the 32 quants of one block, stride = row
 * bytes: no unpacking), tile B is that block of every token in the VNNI layout (8 rows of 4 bytes
 * per token), tdpbssd (signed x signed) gives C[row][t] = the block's exact isum for 16 rows and up
 * to 16 tokens, then acc = acc + (float)isum * (d_w * d_x) runs on 16 (row, token) lanes. The
 * weights are read once for all tokens and the per-token cost is one vector multiply-add per 16
 * items, so 2-8 tokens cost about what one does.
 *
 * Q4_0 / Q5_0 blocks (same 32-element layout with the f16 scale first) take the same path with tile A
 * unpacked from 16 rows into a stack buffer (qa_unpack16) instead of read in place.
 *
 * Q4_K has its own tile kernel (gemm_q4k_amx.c). An earlier one, with each C column one sub-block
 * of one token and the scales applied by vpmulld per (row, sub-block, token), was no faster than
 * avx512 at any n and was dropped.
 *
 * Prefetch: each row's blocks 8 ahead into L1, and the same blocks of the next 16-row group into L2
 * (that group's rows are read next, one whole chunk later). A/B in one process, 2 threads each
 * streaming 0.5 GiB (Sapphire Rapids-class VM, probe 32.7 GB/s), n = 1 / 2 / 4 / 8: 36.2 / 36.8 /
 * 38.1 / 42.3 ms against 39.0 / 40.1 / 42.1 / 45.5 without the L2 prefetch (29.7 vs 27.5 GB/s at
 * n = 1); dropping the L1 prefetch then costs 2 %.
 *
 * 16-token tiles (prefill) keep the 16 accumulators in registers (vector z = row z, lane = token: the
 * scale is a broadcast of the row's d times the tokens' d, no permutes) and read / write y as 16 token
 * vectors through one 16 x 16 transpose instead of 256 scalar accesses; with the tile product stored
 * QA_LAG blocks ahead of its epilogue (see QA_LAG). A/B in one process, single thread, weights in L2
 * (1 MiB), n = 16, 2-vCPU Xeon with AMX: Q8_0 k = 640 / 2048 0.38-0.41x / 0.64-0.68x the time of the
 * previous kernel (which kept the accumulators in memory); Q5_0 0.60 / 0.69-0.84x, Q4_0 k = 640
 * 0.45-0.60x; n = 8 unchanged (0.95-1.04x). pp512 on the real 270M (bench_model, 2 threads): Q4_K_M
 * 498.6 -> 668.8 t/s, Q8_0 535.5 -> 788.4 (different sessions: llama.cpp read 295.3 -> 352.7 and
 * 252.5 -> 352.7 on the same pair of runs, so about 1.2x of it is this kernel).
 *
 * One token goes to the avx512 kernel instead (q_rows16 in gemm_q32_avx512.c). Against it on the 2-vCPU
 * Xeon with AMX, single thread, this kernel at n = 1 took 1.3-1.5x the time in L2 and 1.1x from memory at
 * k = 640; at k = 5376 from memory 0.80x, before q_rows16's row-matched L2 prefetch cut its own time
 * there to 0.82-0.87x. The older figures were against q_row, its 4-row predecessor: A/B in one process, 2
 * threads x 174 MiB, k = 640 / 2048 / 5376 / 21504: 22.2 / 23.7 / 29.5 / 33.0 GB/s against 19.8 /
 * 21.8 / 28.1 / 26.6 for this kernel at n = 1. */
#include "amx.h"

#define AMX_BUF (64 * 1024) /* bytes of prepared activations per chunk */
#define Q8CMAX 512          /* blocks per chunk at most (Q8_0) */

static void cfg_set(g4_tilecfg *c, int t, int rows, int colsb) {
    c->rows[t] = (uint8_t)rows;
    c->colsb[t] = (uint16_t)colsb;
}

/* ------------------------------------------------------------------------------------------- */
/* Q8_0                                                                                         */
/* ------------------------------------------------------------------------------------------- */

enum { QA_Q8_0, QA_Q4_0, QA_Q5_0 };

/* 16 rows (clamped to nr) of one Q4_0 / Q5_0 block unpacked to signed bytes, 32 per row (element j of
 * the block at byte j: the low nibbles of qs are elements 0..15, the high nibbles 16..31; Q5_0 adds
 * bit j of qh as bit 4), for tile A */
G4_AI void qa_unpack16(const int QT, const uint8_t *blk, size_t wrb, int nr, uint8_t *ab) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int i = 0; i < 16; i++) {
        const uint8_t *p = blk + (size_t)(i < nr ? i : nr - 1) * wrb;
        const __m128i qs = _mm_loadu_si128((const __m128i *)(p + (QT == QA_Q5_0 ? 6 : 2)));
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(qs, m4)),
                                            _mm_and_si128(_mm_srli_epi16(qs, 4), m4), 1);
        if (QT == QA_Q5_0) {
            uint32_t qh;
            memcpy(&qh, p + 2, 4);
            v = _mm256_mask_add_epi8(v, _cvtu32_mask32(qh), v, _mm256_set1_epi8(16));
            v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
        } else {
            v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
        }
        _mm256_store_si256((__m256i *)(ab + 32 * i), v);
    }
}

/* Pipeline depth in blocks: block b's tile product is stored into slot b % QA_D of a ring and its
 * float epilogue runs QA_LAG blocks later, and a Q4_0 / Q5_0 block is unpacked QA_LAG blocks before its
 * tile load. A tile store is not forwarded to vector loads (nor vector stores to a tile load): a load
 * right behind one waits until the store has left the core, which with one block of distance cost
 * more than the products themselves (micro-benchmark: tile loads + product + store + a 16-vector
 * epilogue 161 cycles per block at a distance of one block, 64 at two). */
#define QA_LAG 2
#define QA_D 4

/* 16 x 16 floats transposed in registers: lane j of r[i] -> lane i of r[j] (64 shuffles) */
G4_AI void qa_transpose16(__m512 *r) {
    __m512 a[16], b[16];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        a[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        b[4 * k] = _mm512_shuffle_ps(a[4 * k], a[4 * k + 2], 0x44);
        b[4 * k + 1] = _mm512_shuffle_ps(a[4 * k], a[4 * k + 2], 0xEE);
        b[4 * k + 2] = _mm512_shuffle_ps(a[4 * k + 1], a[4 * k + 3], 0x44);
        b[4 * k + 3] = _mm512_shuffle_ps(a[4 * k + 1], a[4 * k + 3], 0xEE);
    }
    /* b[4k + j], 128-bit lane L: element 4L + j of rows 4k..4k+3 */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512 c1 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0x88), c2 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0xDD);
        const __m512 d1 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0x88), d2 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0xDD);
        r[j] = _mm512_shuffle_f32x4(c1, d1, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(c1, d1, 0xDD);
        r[4 + j] = _mm512_shuffle_f32x4(c2, d2, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(c2, d2, 0xDD);
    }
}

/* NT16: the caller's tile has 16 tokens, so vector z of the accumulators is row z (lane = token) and the
 * per-item scale is a broadcast of the row's d times the tokens' d: no permutes */
/* acache: NULL, or tile A of every block of rows [r0, r1) already unpacked (qa_unpack_rows) */
G4_AI void q32_amx(const int QT, const int NT16, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb,
                   float *y, int64_t ldy, int nt, int64_t k, int64_t r0, int64_t r1, const uint8_t *acache) {
    if (NT16) nt = 16;
    const size_t BB = QT == QA_Q8_0 ? 34 : QT == QA_Q4_0 ? 18 : 22; /* weight block bytes, d first */
    const int64_t nb = k / QK8_0;
    const size_t BT = (size_t)8 * nt * 4; /* one block of every token: 8 rows of 4 bytes per token */
    int KC = (int)(AMX_BUF / BT);
    if (KC > Q8CMAX) KC = Q8CMAX;
    if (KC > nb) KC = (int)nb;
    _Alignas(64) uint8_t bb[AMX_BUF];
    _Alignas(64) float dxs[Q8CMAX * 16];
    _Alignas(64) uint8_t ab[QA_D][16 * 32];
    _Alignas(64) int32_t cb[QA_D][256];
    _Alignas(64) float dwr[QA_D][16]; /* the rows' d of the block in ring slot s */
    /* item P = r * nt + t lives in lane P % 16 of vector P / 16 */
    __m512i ridx[16], tidx[16];
    for (int z = 0; z < nt; z++) {
        _Alignas(64) int32_t ri[16], ti[16];
        for (int L = 0; L < 16; L++) { ri[L] = (16 * z + L) / nt; ti[L] = (16 * z + L) % nt; }
        ridx[z] = _mm512_load_si512(ri);
        tidx[z] = _mm512_load_si512(ti);
    }
    g4_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg_set(&cfg, 0, 16, 32);
    cfg_set(&cfg, 3, 16, 32);
    cfg_set(&cfg, 1, 8, nt * 4);
    cfg_set(&cfg, 4, 8, nt * 4);
    cfg_set(&cfg, 2, 16, nt * 4);
    cfg_set(&cfg, 5, 16, nt * 4);
    g4t_config(&cfg);
    const int gather_ok = wrb <= (size_t)(1u << 26);
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        for (int b = 0; b < kc; b++)
            for (int t = 0; t < nt; t++) {
                const block_q8_0 *xb = (const block_q8_0 *)(x + (size_t)t * xrb) + c0 + b;
                uint8_t *tile = bb + (size_t)b * BT;
                for (int kk = 0; kk < 8; kk++) memcpy(tile + (size_t)kk * nt * 4 + (size_t)t * 4, xb->qs + 4 * kk, 4);
                dxs[(size_t)b * 16 + t] = g4_fp16_to_fp32(xb->d);
            }
        for (int64_t rg = r0; rg < r1; rg += 16) {
            const int nr = (int)(r1 - rg < 16 ? r1 - rg : 16);
            const int64_t after = r1 - rg - 16;                       /* rows past this group */
            const int nn = after <= 0 ? 0 : after < 16 ? (int)after : 16; /* next group's rows */
            const uint8_t *base = w + (size_t)rg * wrb + (size_t)c0 * BB;
            _Alignas(64) int32_t offs[16];
            for (int i = 0; i < 16; i++) offs[i] = (int32_t)((i < nr ? i : nr - 1) * (int64_t)wrb);
            const __m512i offv = _mm512_load_si512(offs);
            __m512 acc[16];
            const __mmask16 rm = (__mmask16)((1u << nr) - 1);
            if (NT16) { /* y's 16 rows of token t are one vector: load by token, transpose to rows */
#pragma GCC unroll 16
                for (int z = 0; z < 16; z++)
                    acc[z] = c0 > 0 ? _mm512_maskz_loadu_ps(rm, y + (int64_t)z * ldy + rg) : _mm512_setzero_ps();
                if (c0 > 0) qa_transpose16(acc);
            } else
                for (int z = 0; z < nt; z++) {
                    _Alignas(64) float a[16];
                    for (int L = 0; L < 16; L++) {
                        const int r = (16 * z + L) / nt, t = (16 * z + L) % nt;
                        a[L] = (c0 > 0 && r < nr) ? y[(int64_t)t * ldy + rg + r] : 0.0f;
                    }
                    acc[z] = _mm512_load_ps(a);
                }
            /* tile A from ab[] rather than the rows in place (or from the cache) */
            const int a_own = !acache && (QT != QA_Q8_0 || nr < 16);
            const uint8_t *const ac = acache ? acache + ((size_t)((rg - r0) / 16) * (size_t)nb + (size_t)c0) * 512 : NULL;
            /* stage 1 (block b + QA_LAG): A bytes into the ring when not read in place */
            for (int b = 0; b < QA_LAG && b < kc && a_own; b++) {
                const uint8_t *blk = base + (size_t)b * BB;
                if (QT != QA_Q8_0) qa_unpack16(QT, blk, wrb, nr, ab[b % QA_D]);
                else
                    for (int i = 0; i < 16; i++) memcpy(ab[b % QA_D] + 32 * i, blk + (size_t)(i < nr ? i : nr - 1) * wrb + 2, 32);
            }
            for (int b = 0; b < kc + QA_LAG; b++) {
                const uint8_t *blk = base + (size_t)b * BB;
                if (a_own && b + QA_LAG < kc) {
                    const uint8_t *nbk = blk + QA_LAG * BB;
                    uint8_t *dst = ab[(b + QA_LAG) % QA_D];
                    if (QT != QA_Q8_0) qa_unpack16(QT, nbk, wrb, nr, dst);
                    else
                        for (int i = 0; i < 16; i++) memcpy(dst + 32 * i, nbk + (size_t)(i < nr ? i : nr - 1) * wrb + 2, 32);
                }
                /* stage 2 (block b): the tile product, C into ring slot b % QA_D, and the rows' d */
                if (b < kc) {
                    if ((b & 1) == 0) {
                        for (int i = 0; i < nr; i++) _mm_prefetch((const char *)blk + (size_t)i * wrb + 8 * BB, _MM_HINT_T0);
                        /* the same two blocks of the next 16-row group into L2 (see the note at the top) */
                        for (int i = 0; i < nn; i++) {
                            const char *q = (const char *)blk + (size_t)(16 + i) * wrb;
                            _mm_prefetch(q, _MM_HINT_T1);
                            _mm_prefetch(q + 64, _MM_HINT_T1);
                        }
                    }
                    const int s = b % QA_D;
                    const uint8_t *bt = bb + (size_t)b * BT;
                    const uint8_t *ap = ac ? ac + (size_t)b * 512 : a_own ? ab[s] : blk + 2;
                    const size_t as = ac || a_own ? 32 : wrb;
                    if ((b & 1) == 0) {
                        G4T_LOAD(0, ap, as);
                        G4T_LOAD(1, bt, nt * 4);
                        G4T_ZERO(2);
                        G4T_DPBSSD(2, 0, 1);
                        G4T_STORE(2, cb[s], nt * 4);
                    } else {
                        G4T_LOAD(3, ap, as);
                        G4T_LOAD(4, bt, nt * 4);
                        G4T_ZERO(5);
                        G4T_DPBSSD(5, 3, 4);
                        G4T_STORE(5, cb[s], nt * 4);
                    }
                    __m512i hv;
                    if (gather_ok) hv = _mm512_i32gather_epi32(offv, blk, 1);
                    else {
                        _Alignas(64) int32_t h[16];
                        for (int i = 0; i < 16; i++) {
                            uint16_t v;
                            memcpy(&v, blk + (size_t)(i < nr ? i : nr - 1) * wrb, 2);
                            h[i] = v;
                        }
                        hv = _mm512_load_si512(h);
                    }
                    _mm512_store_ps(dwr[s], g4x_half16_to_ps(_mm512_cvtepi32_epi16(hv)));
                }
                /* stage 3 (block e = b - QA_LAG): acc += (float)isum * (d_w * d_x), block order per lane */
                const int e = b - QA_LAG;
                if (e < 0) continue;
                const int s = e % QA_D;
                const __m512 dx = _mm512_load_ps(dxs + (size_t)e * 16);
                if (NT16) {
#pragma GCC unroll 16
                    for (int z = 0; z < 16; z++) {
                        const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(dwr[s][z]), dx);
                        acc[z] = _mm512_add_ps(acc[z], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[s] + 16 * z)), dd));
                    }
                } else {
                    const __m512 dw = _mm512_load_ps(dwr[s]);
                    for (int z = 0; z < nt; z++) {
                        const __m512 dd = _mm512_mul_ps(_mm512_permutexvar_ps(ridx[z], dw), _mm512_permutexvar_ps(tidx[z], dx));
                        acc[z] = _mm512_add_ps(acc[z], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[s] + 16 * z)), dd));
                    }
                }
            }
            if (NT16) {
                qa_transpose16(acc);
#pragma GCC unroll 16
                for (int z = 0; z < 16; z++) _mm512_mask_storeu_ps(y + (int64_t)z * ldy + rg, rm, acc[z]);
            } else
                for (int z = 0; z < nt; z++) {
                    _Alignas(64) float a[16];
                    _mm512_store_ps(a, acc[z]);
                    for (int L = 0; L < 16; L++) {
                        const int r = (16 * z + L) / nt, t = (16 * z + L) % nt;
                        if (r < nr) y[(int64_t)t * ldy + rg + r] = a[L];
                    }
                }
        }
    }
    g4t_release();
}

/* ------------------------------------------------------------------------------------------- */
/* entry points: up to 16 tokens per call (the pool tiles larger batches)                       */
/* ------------------------------------------------------------------------------------------- */
/* Token tiles of fewer than MIN_NT tokens take the avx512 kernel: Q8_0 one token (faster at every
 * width, see the note at the top); Q4_0 / Q5_0 below 8 tokens. Q5_0 here against avx512, k = 640,
 * single thread, A/B in one process (2-vCPU Xeon with AMX, medians of 9 alternating calls), from
 * memory n = 2 / 4 / 6 / 8 / 12 / 16: 1.38 / 1.28 / 1.07 / 0.99 / 0.75 / 0.73x the time (in L2:
 * 1.37 / 1.28 / 1.02 / 0.93 / 0.72 / 0.71x): the unpacking into tile A and the per-block epilogue
 * cost about the same at every n, so only larger tiles (prefill) gain. */
#define QA_ENTRY(NAME, QT, AVX, MIN_NT)                                                                   \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy, int64_t n_tok, \
              int64_t k, int64_t r0, int64_t r1) {                                                        \
        for (int64_t t = 0; t < n_tok; t += 16) {                                                         \
            const int nt = (int)(n_tok - t < 16 ? n_tok - t : 16);                                        \
            const uint8_t *xt = (const uint8_t *)x + (size_t)t * xrb;                                     \
            if (nt < MIN_NT) AVX(w, wrb, xt, xrb, y + t * ldy, ldy, nt, k, r0, r1);                        \
            else if (nt == 16) q32_amx(QT, 1, (const uint8_t *)w, wrb, xt, xrb, y + t * ldy, ldy, 16, k, r0, r1, NULL); \
            else q32_amx(QT, 0, (const uint8_t *)w, wrb, xt, xrb, y + t * ldy, ldy, nt, k, r0, r1, NULL); \
        }                                                                                                 \
    }

QA_ENTRY(g4_gemm_q8_0_q8_0_amx, QA_Q8_0, g4_gemm_q8_0_q8_0_avx512, 2)
QA_ENTRY(g4_gemm_q4_0_q8_0_amx, QA_Q4_0, g4_gemm_q4_0_q8_0_avx512, 8)
QA_ENTRY(g4_gemm_q5_0_q8_0_amx, QA_Q5_0, g4_gemm_q5_0_q8_0_avx512, 8)

/* ------------------------------------------------------------------------------------------- */
/* wide entries (the pool's prefill path: any n_tok on one L2 row chunk)                        */
/* ------------------------------------------------------------------------------------------- */
/* Q4_0 / Q5_0 tile A has to be unpacked from the nibbles; the tiled entry above does it again for
 * every 16-token tile. The wide entry unpacks a slice of rows once into a per-thread cache and runs
 * every token tile of the call on it (slices of QA_CACHE bytes of unpacked A: 16 rows x 32 bytes per
 * block). Same tile products and float sequence as the tiled entry, so the same bits. The cache is a
 * per-thread buffer kept for the thread's lifetime (at most QA_CACHE bytes); if it cannot be
 * allocated the call takes the tiled entry. */
#define QA_CACHE (512u * 1024u)

static _Thread_local uint8_t *qa_cache;

static uint8_t *qa_cache_get(void) {
    if (!qa_cache) {
        void *p = NULL;
        if (posix_memalign(&p, 64, QA_CACHE) != 0) return NULL;
        qa_cache = (uint8_t *)p;
    }
    return qa_cache;
}

/* rows [r0, r1) (16-row groups, the last clamped like qa_unpack16), all nb blocks -> cache */
G4_AI void qa_unpack_rows(const int QT, const uint8_t *w, size_t wrb, int64_t nb, int64_t r0, int64_t r1, uint8_t *ac) {
    const size_t BB = QT == QA_Q4_0 ? 18 : 22;
    for (int64_t rg = r0; rg < r1; rg += 16) {
        const int nr = (int)(r1 - rg < 16 ? r1 - rg : 16);
        const uint8_t *row = w + (size_t)rg * wrb;
        uint8_t *dst = ac + (size_t)((rg - r0) / 16) * (size_t)nb * 512;
        for (int64_t b = 0; b < nb; b++) qa_unpack16(QT, row + (size_t)b * BB, wrb, nr, dst + (size_t)b * 512);
    }
}

#define QA_WIDE(NAME, QT, TILED)                                                                             \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy, int64_t n_tok,   \
              int64_t k, int64_t r0, int64_t r1) {                                                          \
        const int64_t nb = k / QK8_0;                                                                       \
        const int64_t slice = (int64_t)(QA_CACHE / ((size_t)nb * 512)) * 16; /* rows per cache fill */     \
        uint8_t *ac = n_tok >= 32 && slice >= 16 ? qa_cache_get() : NULL;                                  \
        if (!ac) { TILED(w, wrb, x, xrb, y, ldy, n_tok, k, r0, r1); return; }                              \
        for (int64_t ra = r0; ra < r1; ra += slice) {                                                       \
            const int64_t rb = r1 - ra < slice ? r1 : ra + slice;                                           \
            qa_unpack_rows(QT, (const uint8_t *)w, wrb, nb, ra, rb, ac);                                    \
            for (int64_t t = 0; t < n_tok; t += 16) {                                                       \
                const int nt = (int)(n_tok - t < 16 ? n_tok - t : 16);                                      \
                const uint8_t *xt = (const uint8_t *)x + (size_t)t * xrb;                                   \
                if (nt == 16) q32_amx(QT, 1, (const uint8_t *)w, wrb, xt, xrb, y + t * ldy, ldy, 16, k, ra, rb, ac); \
                else q32_amx(QT, 0, (const uint8_t *)w, wrb, xt, xrb, y + t * ldy, ldy, nt, k, ra, rb, ac); \
            }                                                                                               \
        }                                                                                                   \
    }

QA_WIDE(g4_gemm_wide_q4_0_q8_0_amx, QA_Q4_0, g4_gemm_q4_0_q8_0_amx)
QA_WIDE(g4_gemm_wide_q5_0_q8_0_amx, QA_Q5_0, g4_gemm_q5_0_q8_0_amx)
