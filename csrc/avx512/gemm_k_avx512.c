/* gemm_k_avx512.c: Q4_K and Q5_K weights x Q8_K activations, avx512 + VNNI, n_tok = 1..16.
 *
 * Arithmetic (bit-identical to gemm_ref.c): per block an exact int32 S = sum_j sc_j * isum_j and
 * M = sum_j m_j * bsum32_j, then acc = acc + ((d*d8)*(float)S - (dmin*d8)*(float)M) in block order.
 *
 * Layout trick: the activations of a chunk of blocks are copied once per call into a stack buffer
 * with their 8-byte pieces transposed, so that vector v (v = 0..3) of a block holds bytes
 * 8v..8v+7 of each of the 8 sub-blocks. The weight nibbles are unpacked to the same order
 * (one vpermt2q + shift + and per vector), so one vpdpbusd chain of 4 gives a vector whose int32
 * lane l belongs to sub-block l/2 for every lane: the scales are then applied with a single
 * vpackssdw + vpmaddwd for two (row, token) items at once. 16 items (rows x tokens of one block)
 * are reduced together by a transposed merge tree; M needs no tree: 4 vpdpwssd of the rows' mins
 * by the tokens' bsum pairs give it in the same item lane order. The per-block float ops run on
 * 16 lanes. Each weight block is loaded and unpacked once for all tokens.
 */
#include "avx512.h"

#define XS 256                   /* buffer bytes per (block, token): the permuted qs */
#define XM 256                   /* buffer bytes per block: the bsum pairs of the M product, 4 x 16 lanes */
#define XBUF (112 * 1024)        /* stack budget for the permuted activations of one chunk */
/* Prefetch, per row of a group: the same block of the same row in the next row tile (G4X_KTILE rows,
 * ~48 KiB ahead at k = 5376) into L2, and one block ahead in this row into L1. A/B in one process,
 * two threads each streaming 1 GiB (Sapphire Rapids-class VM), against 2 blocks ahead into L1 only:
 * n = 1 / 2 / 4 / 8 / 16: 90.6 / 94.2 / 105.8 / 159.1 / 291.3 ms vs 101.0 / 116.0 / 125.6 / 198.6 /
 * 360.9. One token takes this path too (R = 16 rows x 1 token): 76.3 vs 82.0 ms for the former
 * one-row-at-a-time GEMV with 64 blocks of in-row prefetch, and 15.2 vs 16.8 cycles per block in L2. */
#ifndef G4X_PF
#define G4X_PF 1 /* blocks ahead in the row, into L1 */
#endif
#ifndef G4X_KTILE
#define G4X_KTILE 16 /* rows per tile (16..64) */
#endif

/* Copy activations of blocks [c0, c0+kc) of n tokens into the permuted buffer xp, their scales into dx,
 * and for the M product the 32-element bsums into xm: dword q of lane i of block b holds
 * (bsum32[2q], bsum32[2q+1]) of token tokof[i] as two int16 (|bsum32| <= 32 * 128 fits). */
static void k_prepare(const uint8_t *x, size_t xrb, int n, int64_t c0, int kc, uint8_t *xp, float *dx, uint32_t *xm,
                      const int *tokof) {
    for (int b = 0; b < kc; b++) {
        uint32_t pr[16][4];
        for (int t = 0; t < n; t++) {
            const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xrb) + c0 + b;
            uint64_t *d = (uint64_t *)(xp + ((size_t)b * n + t) * XS);
            uint64_t s[32];
            memcpy(s, xb->qs, 256);
            for (int v = 0; v < 4; v++)
                for (int j = 0; j < 8; j++) d[8 * v + j] = s[4 * j + v];
            for (int q = 0; q < 4; q++) {
                const int16_t lo = (int16_t)(xb->bsums[4 * q] + xb->bsums[4 * q + 1]);
                const int16_t hi = (int16_t)(xb->bsums[4 * q + 2] + xb->bsums[4 * q + 3]);
                pr[t][q] = (uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16);
            }
            dx[b * 16 + t] = xb->d;
        }
        for (int q = 0; q < 4; q++)
            for (int i = 0; i < 16; i++) xm[(size_t)b * 64 + q * 16 + i] = pr[tokof[i]][q];
    }
}

/* lane i of the reduced vectors holds item it(i) (see g4x_merge tree below) */
G4_AI int k_item_of_lane(int i) { return 2 * ((i & 1) + 2 * ((i >> 2) & 1) + 4 * ((i >> 3) & 1)) + ((i >> 1) & 1); }

G4_AI void k_unpack_scales(const uint8_t *s12, uint64_t *sc8, uint64_t *mn8) {
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

/* One row's block: its 8 scales and 8 mins (bytes), d and dmin (the block's first 4 bytes) and the
 * nibbles (+ the fifth bit for Q5_K) unpacked to k_prepare's permuted order in W[0..3]. */
G4_AI void k_row(const int Q5, const uint8_t *blk, uint64_t *sc8, uint64_t *mn8, uint32_t *dwm, __m512i *W) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i sh = _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4);
    if (sc8) k_unpack_scales(blk + 4, sc8, mn8);
    memcpy(dwm, blk, 4);
    const uint8_t *qs = blk + (Q5 ? 48 : 16);
    const __m512i Q0 = _mm512_loadu_si512(qs), Q1 = _mm512_loadu_si512(qs + 64);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m512i idx = _mm512_setr_epi64(v, v, 4 + v, 4 + v, 8 + v, 8 + v, 12 + v, 12 + v);
        W[v] = _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutex2var_epi64(Q0, idx, Q1), sh), m4);
        if (Q5) {
            uint64_t qh;
            memcpy(&qh, blk + 16 + 8 * v, 8);
            const __m512i hq = _mm512_set1_epi64((long long)qh);
            /* byte p of vector v: sub-block j = p/8, element 8v + p%8 -> bit j of qh[8v + p%8] */
            const __m512i bm = _mm512_set_epi64(0x8080808080808080ll, 0x4040404040404040ll, 0x2020202020202020ll,
                                                0x1010101010101010ll, 0x0808080808080808ll, 0x0404040404040404ll,
                                                0x0202020202020202ll, 0x0101010101010101ll);
            W[v] = _mm512_mask_add_epi8(W[v], _mm512_test_epi8_mask(hq, bm), W[v], _mm512_set1_epi8(16));
        }
    }
}

/* The int16 scale operand of a (row a, row b) pair for vpmaddwd: scales sa of the first item, sb of the second */
G4_AI __m512i k_scp(uint64_t sa, uint64_t sb) {
    /* byte pattern: int16 lanes [sa_2q sa_2q sa_2q+1 sa_2q+1 sb_2q sb_2q sb_2q+1 sb_2q+1] in 128-bit lane q */
    const __m512i pat = _mm512_set_epi8(
        -1, 15, -1, 15, -1, 14, -1, 14, -1, 7, -1, 7, -1, 6, -1, 6,
        -1, 13, -1, 13, -1, 12, -1, 12, -1, 5, -1, 5, -1, 4, -1, 4,
        -1, 11, -1, 11, -1, 10, -1, 10, -1, 3, -1, 3, -1, 2, -1, 2,
        -1, 9, -1, 9, -1, 8, -1, 8, -1, 1, -1, 1, -1, 0, -1, 0);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_set_epi64x((long long)sb, (long long)sa)), pat);
}

/* The end of a block for 16 items: the pair vectors Sv[8] merged to S, M from the rows' mins mnr
 * (R = 16 / NT rows, 8 bytes each) and the tokens' bsum pairs in xm, d / dmin from dwm (row order),
 * then the float sequence on the item lanes into *accp. */
G4_AI void k_finish(const int NT, __m512i *Sv, const uint64_t *mnr, const uint32_t *dwm, const uint32_t *xm,
                    const float *dx, const int b, __m512 *accp, const __m512i rowidx, const __m512i tokidx) {
    const int R = 16 / NT;
    __m512i U[4], T[2];
    for (int u = 0; u < 4; u++) U[u] = g4x_merge(Sv[2 * u], Sv[2 * u + 1], 1);
    for (int u = 0; u < 2; u++) T[u] = g4x_merge(U[2 * u], U[2 * u + 1], 4);
    const __m512i S = g4x_merge(T[0], T[1], 8);
    /* M = sum_j m_j * bsum32_j directly in the item lane order: 4 vpdpwssd over (mins of row(i)) x (bsum
     * pairs of token(i), laid out per lane by k_prepare). Z holds the mins widened to int16, so that dword
     * 4r + q of the mins vectors is (m_2q, m_2q+1) of row r. */
    const __m512i ridx = _mm512_slli_epi32(rowidx, 2);
    __m512i M = _mm512_setzero_si512();
    if (R <= 4) {
        const __m512i Z = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)mnr));
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            M = _mm512_dpwssd_epi32(M, _mm512_permutexvar_epi32(_mm512_add_epi32(ridx, _mm512_set1_epi32(q)), Z),
                                    _mm512_load_si512(xm + (size_t)b * 64 + q * 16));
    } else if (R <= 8) {
        const __m512i Z0 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)mnr));
        const __m512i Z1 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(mnr + 4)));
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            M = _mm512_dpwssd_epi32(M, _mm512_permutex2var_epi32(Z0, _mm512_add_epi32(ridx, _mm512_set1_epi32(q)), Z1),
                                    _mm512_load_si512(xm + (size_t)b * 64 + q * 16));
    } else {
        const __m512i Z0 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)mnr));
        const __m512i Z1 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(mnr + 4)));
        const __m512i Z2 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(mnr + 8)));
        const __m512i Z3 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(mnr + 12)));
        const __mmask16 hi = _mm512_cmpge_epi32_mask(rowidx, _mm512_set1_epi32(8));
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const __m512i ix = _mm512_add_epi32(ridx, _mm512_set1_epi32(q));
            const __m512i A = _mm512_mask_blend_epi32(hi, _mm512_permutex2var_epi32(Z0, ix, Z1),
                                                      _mm512_permutex2var_epi32(Z2, ix, Z3));
            M = _mm512_dpwssd_epi32(M, A, _mm512_load_si512(xm + (size_t)b * 64 + q * 16));
        }
    }
    __m512i dm;
    if (R == 1) dm = _mm512_set1_epi32((int)dwm[0]);
    else dm = _mm512_permutexvar_epi32(rowidx, _mm512_loadu_si512(dwm));
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
    const __m512 d8 = NT == 1 ? _mm512_set1_ps(dx[b * 16]) : _mm512_permutexvar_ps(tokidx, _mm512_loadu_ps(dx + b * 16));
    const __m512 dd = _mm512_mul_ps(dw, d8), dmm = _mm512_mul_ps(dmin, d8);
    const __m512 tv = _mm512_sub_ps(_mm512_mul_ps(dd, _mm512_cvtepi32_ps(S)), _mm512_mul_ps(dmm, _mm512_cvtepi32_ps(M)));
    *accp = _mm512_add_ps(*accp, tv);
}

/* k_unpack_scales for 4 rows at once: row j's 12 scale bytes (blk_j + 4) in 128-bit lane j as dwords
 * [u0, u1, u2, -]; out: lane j = [sc8 (qword 0), mn8 (qword 1)] of row j, the same values. */
#ifndef G4X_KVSC
#define G4X_KVSC 1 /* 1: the scales of a group's rows unpacked 4 rows per vector (k_block); 0: row by row */
#endif
G4_AI __m512i k_unpack_scales4(const __m512i V) {
    const __m512i P = _mm512_srlv_epi32(_mm512_shuffle_epi32(V, (_MM_PERM_ENUM)0x98), _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4));
    const __m512i lo = _mm512_and_si512(P, _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
    const __m512i Q = _mm512_srli_epi32(_mm512_shuffle_epi32(V, (_MM_PERM_ENUM)0x50), 6);
    const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(Q, _mm512_set4_epi32(0x03030303, 0, 0x03030303, 0)), 4);
    return _mm512_or_si512(lo, hi);
}

/* One group of R = 16/NT rows x NT tokens, block b of the chunk. Q5 selects Q5_K. */
G4_AI void k_block(const int NT, const int Q5, const uint8_t *const *wrow, const uint8_t *xp, const float *dx,
                   const uint32_t *xm, const int b, __m512 *accp, const __m512i rowidx, const __m512i tokidx,
                   const size_t pfrow) {
    const int R = 16 / NT, NI = R * NT;
    const size_t BB = Q5 ? 176 : 144;
    __m512i Sv[8];
    uint32_t dwm[16];
    _Alignas(64) uint64_t mnr[16]; /* the 8 mins of each row (bytes); rows >= R are never read by a lane */
    /* pending first item of a pair */
    __m512i Pa = _mm512_setzero_si512(), Pa2 = _mm512_setzero_si512();
    uint64_t Psc = 0;
    _Alignas(64) uint64_t scm[16][2]; /* [row] = {sc8, mn8}, 4 rows a vector */
    const int vsc = G4X_KVSC && R >= 4; /* measured: no gain with 1-2 rows a group */
    if (vsc)
#pragma GCC unroll 4
        for (int i0 = 0; i0 < R; i0 += 4) {
            __m512i V = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int row = i0 + j < R ? i0 + j : R - 1;
                const __m128i u = _mm_loadu_si128((const __m128i *)(wrow[row] + (size_t)b * BB + 4));
                V = j == 0 ? _mm512_castsi128_si512(u) : _mm512_inserti32x4(V, u, j);
            }
            _mm512_store_si512(scm[i0], k_unpack_scales4(V));
        }
#pragma GCC unroll 16
    for (int i = 0; i < R; i++) {
        const uint8_t *blk = wrow[i] + (size_t)b * BB;
        { /* may point past the matrix: prefetches do not fault */
            const char *nx = (const char *)blk + pfrow;
            _mm_prefetch(nx, _MM_HINT_T1);
            _mm_prefetch(nx + 64, _MM_HINT_T1);
            _mm_prefetch(nx + 128, _MM_HINT_T1);
        }
        if (G4X_PF > 0) {
            _mm_prefetch((const char *)blk + G4X_PF * BB, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + G4X_PF * BB + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + G4X_PF * BB + 128, _MM_HINT_T0);
        }
        uint64_t sc8, mn8;
        __m512i W[4];
        if (vsc) {
            k_row(Q5, blk, NULL, NULL, &dwm[i], W);
            sc8 = scm[i][0];
            mn8 = scm[i][1];
        } else k_row(Q5, blk, &sc8, &mn8, &dwm[i], W);
        mnr[i] = mn8;
        __m512i scp_row = _mm512_setzero_si512();
        if (NT % 2 == 0) scp_row = k_scp(sc8, sc8);
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) {
            const int it = i * NT + t;
            const uint8_t *xv = xp + ((size_t)b * NT + t) * XS;
            __m512i Dv, Dv2 = _mm512_setzero_si512();
            if (!Q5) {
                __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0], _mm512_loadu_si512(xv));
                d = _mm512_dpbusd_epi32(d, W[1], _mm512_loadu_si512(xv + 64));
                d = _mm512_dpbusd_epi32(d, W[2], _mm512_loadu_si512(xv + 128));
                Dv = _mm512_dpbusd_epi32(d, W[3], _mm512_loadu_si512(xv + 192));
            } else { /* 5-bit weights: two chains so every lane fits int16 */
                const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0], _mm512_loadu_si512(xv));
                const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[2], _mm512_loadu_si512(xv + 128));
                Dv = _mm512_dpbusd_epi32(d0, W[1], _mm512_loadu_si512(xv + 64));
                Dv2 = _mm512_dpbusd_epi32(d1, W[3], _mm512_loadu_si512(xv + 192));
            }
            if (it % 2 == 0 && it + 1 < NI) { Pa = Dv; Pa2 = Dv2; Psc = sc8; continue; }
            /* finish pair p = it / 2: (pending, this) or (this, nothing) */
            const int p = it / 2, single = it % 2 == 0;
            const __m512i da = single ? Dv : Pa, db = single ? _mm512_setzero_si512() : Dv;
            const __m512i da2 = single ? Dv2 : Pa2, db2 = single ? _mm512_setzero_si512() : Dv2;
            __m512i scp;
            if (NT % 2 == 0) scp = scp_row;
            else {
                const uint64_t sa = single ? sc8 : Psc;
                scp = k_scp(sa, sc8);
            }
            __m512i s = _mm512_madd_epi16(_mm512_packs_epi32(da, db), scp);
            if (Q5) s = _mm512_add_epi32(s, _mm512_madd_epi16(_mm512_packs_epi32(da2, db2), scp));
            Sv[p] = s;
        }
    }
    for (int p = (NI + 1) / 2; p < 8; p++) Sv[p] = _mm512_setzero_si512();
    k_finish(NT, Sv, mnr, dwm, xm, dx, b, accp, rowidx, tokidx);
}

G4_AI void k_gemm(const int NT, const int Q5, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,
                  int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
    const int R = 16 / NT, NI = R * NT;
    const int G = G4X_KTILE / R; /* groups per row tile: the tile's rows share each block's activations in L1 */
    const size_t BB = Q5 ? 176 : 144;
    const int64_t nb = k / QK_K;
    enum { KCMAX = XBUF / (XS + XM) };
    int KC = XBUF / (NT * XS + XM);
    if (KC > nb) KC = (int)nb;
    /* one buffer: the permuted qs of KC blocks x NT tokens, then the KC blocks' bsum pairs */
    _Alignas(64) uint8_t xp[XBUF];
    uint32_t *const xm = (uint32_t *)(xp + (size_t)KC * NT * XS);
    _Alignas(64) float dx[KCMAX * 16];
    int rowof[16], tokof[16], valid[16];
    for (int i = 0; i < 16; i++) {
        const int it = k_item_of_lane(i);
        valid[i] = it < NI;
        rowof[i] = (it < NI ? it : 0) / NT;
        tokof[i] = (it < NI ? it : 0) % NT;
    }
    const __m512i rowidx = _mm512_loadu_si512(rowof), tokidx = _mm512_loadu_si512(tokof);
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        k_prepare(x, xrb, NT, c0, kc, xp, dx, xm, tokof);
        for (int64_t rt = r0; rt < r1; rt += (int64_t)G * R) {
            const int ng = (int)((r1 - rt + R - 1) / R < G ? (r1 - rt + R - 1) / R : G);
            const uint8_t *wrow[64][16];
            int nrs[64];
            __m512 acc[64];
            for (int g = 0; g < ng; g++) {
                const int64_t r = rt + (int64_t)g * R;
                const int nr = (int)(r1 - r < R ? r1 - r : R);
                nrs[g] = nr;
                for (int i = 0; i < R; i++) wrow[g][i] = w + (size_t)(r + (i < nr ? i : nr - 1)) * wrb + (size_t)c0 * BB;
                acc[g] = g4x_items_load(y, ldy, r, nr, c0, valid, rowof, tokof);
            }
            for (int b = 0; b < kc; b++)
                for (int g = 0; g < ng; g++) k_block(NT, Q5, wrow[g], xp, dx, xm, b, &acc[g], rowidx, tokidx, (size_t)G * R * wrb);
            for (int g = 0; g < ng; g++)
                g4x_items_store(y, ldy, rt + (int64_t)g * R, nrs[g], acc[g], valid, rowof, tokof);
        }
    }
}

/* One token, streamed (the default; G4X_KSTREAM=0 gives k_block's 16-row NT == 1 form back): as the
 * Q6_K one (gemm_q6k_avx512.c, q6_gemv_stream), the 16-row group's rows are read as a few long
 * sequential runs: a pass takes G4X_KRP row pairs over G4X_KSB blocks and parks the pair vectors, the
 * rows' mins and d / dmin in L1 buffers, prefetching the rows of the pass at least G4X_KPFB bytes ahead
 * at the block it reads; then k_finish runs block by block. Same integers and float sequence: same bits. */
#ifndef G4X_KSTREAM
#define G4X_KSTREAM 1
#endif
#ifndef G4X_KSB
#define G4X_KSB 32
#endif
#ifndef G4X_KRP
#define G4X_KRP 2
#endif
#ifndef G4X_KPFB
#define G4X_KPFB 4096
#endif

G4_AI void k_gemv_stream(const int Q5, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,
                         int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
    const size_t BB = Q5 ? 176 : 144;
    const int64_t nb = k / QK_K;
    enum { KCMAX = XBUF / (XS + XM) };
    int KC = KCMAX;
    if (KC > nb) KC = (int)nb;
    _Alignas(64) uint8_t xp[XBUF];
    uint32_t *const xm = (uint32_t *)(xp + (size_t)KC * XS);
    _Alignas(64) float dx[KCMAX * 16];
    _Alignas(64) __m512i sv[G4X_KSB * 8];
    _Alignas(64) uint64_t mnb[G4X_KSB * 16];
    _Alignas(64) uint32_t dwb[G4X_KSB * 16];
    int rowof[16], tokof[16], valid[16];
    for (int i = 0; i < 16; i++) {
        rowof[i] = k_item_of_lane(i);
        tokof[i] = 0;
        valid[i] = 1;
    }
    const __m512i rowidx = _mm512_loadu_si512(rowof), tokidx = _mm512_setzero_si512();
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        k_prepare(x, xrb, 1, c0, kc, xp, dx, xm, tokof);
        for (int64_t r = r0; r < r1; r += 16) {
            const int nr = (int)(r1 - r < 16 ? r1 - r : 16);
            const uint8_t *wrow[16];
            for (int i = 0; i < 16; i++) wrow[i] = w + (size_t)(r + (i < nr ? i : nr - 1)) * wrb + (size_t)c0 * BB;
            __m512 acc = g4x_items_load(y, ldy, r, nr, c0, valid, rowof, tokof);
            for (int s0 = 0; s0 < kc; s0 += G4X_KSB) {
                const int sb = kc - s0 < G4X_KSB ? kc - s0 : G4X_KSB;
                const int64_t passb = (int64_t)2 * G4X_KRP * sb * (int64_t)BB;
                for (int p0 = 0; p0 < 8; p0 += G4X_KRP) {
                    const uint8_t *nx[2 * G4X_KRP];
                    const int nnx = g4x_stream_rows_ahead(w, wrb, r, r1, 2 * p0, 2 * G4X_KRP, passb, G4X_KPFB,
                                                          (size_t)(c0 + s0) * BB, nx);
                    for (int b = 0; b < sb; b++) {
                        g4x_prefetch_block(nx, nnx, b, (int)BB);
                        const uint8_t *xv = xp + (size_t)(s0 + b) * XS;
                        const __m512i x0 = _mm512_loadu_si512(xv), x1 = _mm512_loadu_si512(xv + 64);
                        const __m512i x2 = _mm512_loadu_si512(xv + 128), x3 = _mm512_loadu_si512(xv + 192);
#pragma GCC unroll 4
                        for (int p = p0; p < p0 + G4X_KRP; p++) {
                            __m512i D[2], D2[2];
                            uint64_t sc[2];
#pragma GCC unroll 2
                            for (int j = 0; j < 2; j++) {
                                const int i = 2 * p + j;
                                __m512i W[4];
                                k_row(Q5, wrow[i] + (size_t)(s0 + b) * BB, &sc[j], &mnb[b * 16 + i], &dwb[b * 16 + i], W);
                                if (!Q5) {
                                    __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0], x0);
                                    d = _mm512_dpbusd_epi32(d, W[1], x1);
                                    d = _mm512_dpbusd_epi32(d, W[2], x2);
                                    D[j] = _mm512_dpbusd_epi32(d, W[3], x3);
                                    D2[j] = _mm512_setzero_si512();
                                } else {
                                    const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[0], x0);
                                    const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[2], x2);
                                    D[j] = _mm512_dpbusd_epi32(d0, W[1], x1);
                                    D2[j] = _mm512_dpbusd_epi32(d1, W[3], x3);
                                }
                            }
                            const __m512i scp = k_scp(sc[0], sc[1]);
                            __m512i v = _mm512_madd_epi16(_mm512_packs_epi32(D[0], D[1]), scp);
                            if (Q5) v = _mm512_add_epi32(v, _mm512_madd_epi16(_mm512_packs_epi32(D2[0], D2[1]), scp));
                            sv[b * 8 + p] = v;
                        }
                    }
                }
                for (int b = 0; b < sb; b++)
                    k_finish(1, sv + (size_t)b * 8, mnb + (size_t)b * 16, dwb + (size_t)b * 16, xm, dx, s0 + b, &acc,
                             rowidx, tokidx);
            }
            g4x_items_store(y, ldy, r, nr, acc, valid, rowof, tokof);
        }
    }
}

#define K_CASES(Q5)                                                                                   \
    switch (n_tok) {                                                                                  \
    case 1: if (G4X_KSTREAM) k_gemv_stream(Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); else k_gemm(1, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 2: k_gemm(2, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 3: k_gemm(3, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 4: k_gemm(4, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 5: k_gemm(5, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 6: k_gemm(6, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 7: k_gemm(7, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 8: k_gemm(8, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 9: k_gemm(9, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 10: k_gemm(10, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 11: k_gemm(11, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 12: k_gemm(12, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 13: k_gemm(13, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 14: k_gemm(14, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 15: k_gemm(15, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    default: k_gemm(16, Q5, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    }

static void q4k_tile(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                     int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    K_CASES(0)
}
static void q5k_tile(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                     int64_t n_tok, int64_t k, int64_t r0, int64_t r1) { K_CASES(1) }

void g4_gemm_q4_K_q8_K_avx512(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,
                              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < n_tok; t += 16)
        q4k_tile((const uint8_t *)w, wrb, (const uint8_t *)x + (size_t)t * xrb, xrb, y + t * ldy, ldy,
                 n_tok - t < 16 ? n_tok - t : 16, k, r0, r1);
}

void g4_gemm_q5_K_q8_K_avx512(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,
                              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < n_tok; t += 16)
        q5k_tile((const uint8_t *)w, wrb, (const uint8_t *)x + (size_t)t * xrb, xrb, y + t * ldy, ldy,
                 n_tok - t < 16 ? n_tok - t : 16, k, r0, r1);
}
