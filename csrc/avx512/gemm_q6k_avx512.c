/* gemm_q6k_avx512.c: Q6_K weights x Q8_K activations, avx512 + VNNI (bit-identical to gemm_ref.c).
 * Per block: q (0..63, unsigned) . x with vpdpbusd, minus 32 * bsums (the -32 offset), with the
 * signed 8-bit group scales applied exactly through vpackssdw + vpmaddwd; the 16-lane int32
 * partial vectors of up to 16 tokens are reduced together (lane = token), then
 * acc = acc + (d*d8) * (float)S runs on 16 token lanes in block order. */
#include "avx512.h"

#define DXB 256 /* blocks per chunk of the d8 table */

G4_AI void q6_gemm(const int NT, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                   int64_t k, int64_t r0, int64_t r1) {
    const int64_t nb = k / QK_K;
    _Alignas(64) float dx[DXB * 16];
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    /* pack(D_v, D_v') puts lanes 4q..4q+3 of D_v (group 4v+q) then of D_v' (group 4v'+q) in 128-bit lane q */
    const __m512i i01 = _mm512_set_epi16(7, 7, 7, 7, 3, 3, 3, 3, 6, 6, 6, 6, 2, 2, 2, 2,
                                         5, 5, 5, 5, 1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i i23 = _mm512_add_epi16(i01, _mm512_set1_epi16(8));
    for (int64_t c0 = 0; c0 < nb; c0 += DXB) {
        const int kc = (int)(nb - c0 < DXB ? nb - c0 : DXB);
        for (int b = 0; b < kc; b++)
            for (int t = 0; t < 16; t++)
                dx[b * 16 + t] = t < NT ? ((const block_q8_K *)(x + (size_t)t * xrb))[c0 + b].d : 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            const block_q6_K *wb = (const block_q6_K *)(w + (size_t)r * wrb) + c0;
            _Alignas(64) float a[16];
            for (int t = 0; t < 16; t++) a[t] = (c0 > 0 && t < NT) ? y[t * ldy + r] : 0.0f;
            __m512 acc = _mm512_load_ps(a);
            float acc1 = a[0];
            for (int b = 0; b < kc; b++) {
                const block_q6_K *B = wb + b;
                __m512i W[4];
                for (int v = 0; v < 4; v++) {
                    const int h = v / 2, s = 4 * (v % 2);
                    const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(B->ql + 64 * h), s), m4);
                    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(B->qh + 32 * h)));
                    const __m512i cnt = _mm512_setr_epi64(2 * (v % 2) * 2, 2 * (v % 2) * 2, 2 * (v % 2) * 2, 2 * (v % 2) * 2,
                                                          2 * (v % 2) * 2 + 2, 2 * (v % 2) * 2 + 2, 2 * (v % 2) * 2 + 2, 2 * (v % 2) * 2 + 2);
                    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(qh, cnt), m3);
                    W[v] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
                }
                const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)B->scales));
                const __m512i scz = _mm512_castsi256_si512(sc16);
                const __m512i p01 = _mm512_permutexvar_epi16(i01, scz), p23 = _mm512_permutexvar_epi16(i23, scz);
                __m512i V[16];
                for (int t = 0; t < NT; t++) {
                    const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xrb) + c0 + b;
                    __m512i D[4];
                    for (int v = 0; v < 4; v++)
                        D[v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[v], _mm512_loadu_si512(xb->qs + 64 * v));
                    const __m512i s01 = _mm512_madd_epi16(_mm512_packs_epi32(D[0], D[1]), p01);
                    const __m512i s23 = _mm512_madd_epi16(_mm512_packs_epi32(D[2], D[3]), p23);
                    const __m256i bsc = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16);
                    V[t] = _mm512_sub_epi32(_mm512_add_epi32(s01, s23), _mm512_zextsi256_si512(_mm256_slli_epi32(bsc, 5)));
                }
                const float dwf = g4_fp16_to_fp32(B->d);
                if (NT == 1) {
                    const int32_t S = _mm512_reduce_add_epi32(V[0]);
                    const float dd = dwf * dx[b * 16];
                    acc1 = acc1 + dd * (float)S;
                } else {
                    for (int t = NT; t < 16; t++) V[t] = _mm512_setzero_si512();
                    __m512i U[8], T[4], X[2];
                    for (int u = 0; u < 8; u++) U[u] = g4x_merge(V[2 * u], V[2 * u + 1], 1);
                    for (int u = 0; u < 4; u++) T[u] = g4x_merge(U[2 * u], U[2 * u + 1], 2);
                    for (int u = 0; u < 2; u++) X[u] = g4x_merge(T[2 * u], T[2 * u + 1], 4);
                    const __m512i S = g4x_merge(X[0], X[1], 8);
                    const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(dwf), _mm512_load_ps(dx + b * 16));
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(S)));
                }
            }
            if (NT == 1) y[r] = acc1;
            else {
                _mm512_store_ps(a, acc);
                for (int t = 0; t < NT; t++) y[t * ldy + r] = a[t];
            }
        }
    }
}

/* ---- n_tok >= 2: a tile of rows, block-outer, R = 16/NTP rows x NTP tokens (NTP = q6_ntp(NT), NT rounded up
 * to a power of two) = 16 items per reduction tree.
 *
 * Per block and item the sum S is the same exact integer as above, computed with fewer
 * instructions per token:
 *   - the activations of the chunk are copied once per call with their 8-byte pieces interleaved
 *     (unpacklo/hi_epi64 of vectors 0,2 and of 1,3), and the weights are unpacked to the same
 *     order, so that two vpdpbusd chains of 2 cover the block and every int32 lane of a chain
 *     holds 8 elements of ONE 16-element group (chain 0: groups q, q, 8+q, 8+q in 128-bit lane
 *     q; chain 1: the same + 4);
 *   - the -32 offset is the chain's starting value -32 * (sum of the lane's 8 activations),
 *     computed once per call, so a lane holds sum (q - 32) * x, which lies in [-32512, 31496]
 *     for |x| <= 127 and so fits int16 exactly (Q8_K activations from the quantiser are never
 *     -128; a chunk that has one is computed token by token with the one-token code instead);
 *   - the group scales are applied by vpackssdw + vpmaddwd on two tokens at once, which also
 *     merges the pair (lane bit 1 = token of the pair);
 *   - 8 pair vectors (16 items) are reduced by 7 merges, then the float sequence runs on the
 *     16 item lanes.
 * Each weight block is unpacked once for all tokens, and each activation vector is loaded once
 * per token pair for all R rows of the group. */
#define XS6 384                 /* prepared bytes per (block, token): 4 x 64 interleaved qs, 2 x 64 offsets */
#define XBUF6 (112 * 1024)      /* stack budget for one chunk of prepared activations */
#ifndef G4X_Q6TILE
#define G4X_Q6TILE 16 /* rows per tile (16..64) */
#endif
#ifndef G4X_Q6PF
#define G4X_Q6PF 2              /* software prefetch distance in blocks (0: none) */
#endif

/* token slots per row of a reduction group: NT rounded up to a power of two, but at least 4. NT = 2
 * as 8 rows x 2 tokens keeps 6 x 8 = 48 weight-side vectors live (more than the 32 registers: spills,
 * measured slower than n = 4); as 4 rows x 4 slots (two empty) it costs what n = 4 costs. */
G4_AI int q6_ntp(int NT) { return NT == 1 ? 1 : NT <= 4 ? 4 : NT <= 8 ? 8 : 16; }

/* lane i of a reduced vector holds item 2 * pv + tk (see the merge tree in q6_group) */
G4_AI int q6_item_of_lane(int i) { return 2 * ((i & 1) | (((i >> 2) & 1) << 1) | (((i >> 3) & 1) << 2)) + ((i >> 1) & 1); }

/* returns 0, or 1 if some activation byte is -128 (then nothing else is valid) */
static int q6_prepare(const uint8_t *x, size_t xrb, int n, int ntp, int64_t c0, int kc, uint8_t *xp, float *dxl) {
    const __m512i k32 = _mm512_set1_epi8(32), m128 = _mm512_set1_epi8((char)0x80);
    __mmask64 bad = 0;
    for (int b = 0; b < kc; b++) {
        for (int t = 0; t < n; t++) {
            const block_q8_K *xb = (const block_q8_K *)(x + (size_t)t * xrb) + c0 + b;
            const __m512i X0 = _mm512_loadu_si512(xb->qs), X1 = _mm512_loadu_si512(xb->qs + 64);
            const __m512i X2 = _mm512_loadu_si512(xb->qs + 128), X3 = _mm512_loadu_si512(xb->qs + 192);
            bad |= _mm512_cmpeq_epi8_mask(X0, m128) | _mm512_cmpeq_epi8_mask(X1, m128) |
                   _mm512_cmpeq_epi8_mask(X2, m128) | _mm512_cmpeq_epi8_mask(X3, m128);
            const __m512i A0 = _mm512_unpacklo_epi64(X0, X2), B0 = _mm512_unpackhi_epi64(X0, X2);
            const __m512i A1 = _mm512_unpacklo_epi64(X1, X3), B1 = _mm512_unpackhi_epi64(X1, X3);
            const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k32, A0), k32, B0);
            const __m512i s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k32, A1), k32, B1);
            uint8_t *d = xp + ((size_t)b * n + t) * XS6;
            _mm512_store_si512(d, A0);
            _mm512_store_si512(d + 64, B0);
            _mm512_store_si512(d + 128, A1);
            _mm512_store_si512(d + 192, B1);
            _mm512_store_si512(d + 256, _mm512_sub_epi32(_mm512_setzero_si512(), s0));
            _mm512_store_si512(d + 320, _mm512_sub_epi32(_mm512_setzero_si512(), s1));
        }
        for (int i = 0; i < 16; i++) {
            const int tok = q6_item_of_lane(i) % ntp;
            dxl[b * 16 + i] = tok < n ? ((const block_q8_K *)(x + (size_t)tok * xrb))[c0 + b].d : 0.0f;
        }
    }
    return bad != 0;
}

/* int16 p of the scale vectors: group q (p%4 < 2) or 8+q, q = p/8 (128-bit lane); +4 for chain 1 */
#define Q6_I0 _mm512_set_epi16(11, 11, 3, 3, 11, 11, 3, 3, 10, 10, 2, 2, 10, 10, 2, 2, 9, 9, 1, 1, 9, 9, 1, 1, 8, 8, 0, 0, 8, 8, 0, 0)

/* Block B of one row: prefetch G4X_Q6PF blocks ahead, the weights unpacked to q6_prepare's interleaved
 * order (the operands of the two chains: A0, B0 then A1, B1) and the group scales as the int16 lanes
 * of the two chains (P0, P1) */
G4_AI void q6_row_pf(const block_q6_K *B, __m512i *A0, __m512i *B0, __m512i *A1, __m512i *B1, __m512i *P0, __m512i *P1,
                     const int pfd) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    if (pfd > 0) {
        const char *pf = (const char *)(B + pfd);
        _mm_prefetch(pf, _MM_HINT_T0);
        _mm_prefetch(pf + 64, _MM_HINT_T0);
        _mm_prefetch(pf + 128, _MM_HINT_T0);
        _mm_prefetch(pf + 192, _MM_HINT_T0);
    }
    __m512i W[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) { /* elements 64v..64v+63, q in 0..63 */
        const int h = v / 2, s = 4 * (v % 2);
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(B->ql + 64 * h), s), m4);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(B->qh + 32 * h)));
        const __m512i cnt = _mm512_setr_epi64(s, s, s, s, s + 2, s + 2, s + 2, s + 2);
        const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(qh, cnt), m3);
        W[v] = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
    }
    *A0 = _mm512_unpacklo_epi64(W[0], W[2]);
    *B0 = _mm512_unpackhi_epi64(W[0], W[2]);
    *A1 = _mm512_unpacklo_epi64(W[1], W[3]);
    *B1 = _mm512_unpackhi_epi64(W[1], W[3]);
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)B->scales)));
    *P0 = _mm512_permutexvar_epi16(Q6_I0, sc);
    *P1 = _mm512_permutexvar_epi16(_mm512_add_epi16(Q6_I0, _mm512_set1_epi16(4)), sc);
}
G4_AI void q6_row(const block_q6_K *B, __m512i *A0, __m512i *B0, __m512i *A1, __m512i *B1, __m512i *P0, __m512i *P1) {
    q6_row_pf(B, A0, B0, A1, B1, P0, P1, G4X_Q6PF);
}

/* the 8 pair vectors of 16 items -> one vector, lane i = item q6_item_of_lane(i) */
G4_AI __m512i q6_reduce8(const __m512i *PV) {
    __m512i U[4], T[2];
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) U[u] = g4x_merge(PV[2 * u], PV[2 * u + 1], 1);
    T[0] = g4x_merge(U[0], U[1], 4);
    T[1] = g4x_merge(U[2], U[3], 4);
    return g4x_merge(T[0], T[1], 8);
}

G4_AI void q6_group(const int NT, const uint8_t *const *wrow, const uint8_t *xp, const float *dxl, const int b,
                    __m512 *accp, const __m512i rowidx) {
    const int NTP = q6_ntp(NT);
    const int R = 16 / NTP, NP = NTP / 2;
    if (NT == 1) {
        /* one token, 16 rows: the pairs of the packs are rows (2p, 2p+1) instead of tokens, with the
         * odd row's scales blended into int16 positions 4-7 of each 128-bit lane; each row's vectors
         * are used at once (no 16-row live set), and items = rows in the same lane order */
        const uint8_t *xa = xp + (size_t)b * XS6;
        const __m512i xa0 = _mm512_load_si512(xa), xa1 = _mm512_load_si512(xa + 64);
        const __m512i xa2 = _mm512_load_si512(xa + 128), xa3 = _mm512_load_si512(xa + 192);
        const __m512i oa0 = _mm512_load_si512(xa + 256), oa1 = _mm512_load_si512(xa + 320);
        __m512i PV1[8], pc0 = _mm512_setzero_si512(), pc1 = pc0, pp0 = pc0, pp1 = pc0;
        uint64_t dq[4] = {0, 0, 0, 0};
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const block_q6_K *B = (const block_q6_K *)wrow[i] + b;
            __m512i A0, B0, A1, B1, P0, P1;
            q6_row(B, &A0, &B0, &A1, &B1, &P0, &P1);
            const __m512i ca0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(oa0, A0, xa0), B0, xa1);
            const __m512i ca1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(oa1, A1, xa2), B1, xa3);
            dq[i / 4] |= (uint64_t)B->d << (16 * (i % 4));
            if (i % 2 == 0) {
                pc0 = ca0;
                pc1 = ca1;
                pp0 = P0;
                pp1 = P1;
            } else {
                const __m512i q0 = _mm512_mask_blend_epi16(0xF0F0F0F0u, pp0, P0);
                const __m512i q1 = _mm512_mask_blend_epi16(0xF0F0F0F0u, pp1, P1);
                PV1[i / 2] = _mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(pc0, ca0), q0),
                                              _mm512_madd_epi16(_mm512_packs_epi32(pc1, ca1), q1));
            }
        }
        const __m512i S1 = q6_reduce8(PV1);
        const __m512 dw1 = _mm512_permutexvar_ps(
            rowidx, _mm512_cvtph_ps(_mm256_set_epi64x((long long)dq[3], (long long)dq[2], (long long)dq[1], (long long)dq[0])));
        const __m512 dd1 = _mm512_mul_ps(dw1, _mm512_load_ps(dxl + (size_t)b * 16));
        *accp = _mm512_add_ps(*accp, _mm512_mul_ps(dd1, _mm512_cvtepi32_ps(S1)));
        return;
    }
    __m512i PV[8];
    __m512i A0[16], B0[16], A1[16], B1[16], P0[16], P1[16];
    uint64_t dwq[2] = {0, 0}; /* the R f16 scales, packed in registers (a store + wide reload would stall) */
#pragma GCC unroll 16
    for (int i = 0; i < R; i++) {
        const block_q6_K *B = (const block_q6_K *)wrow[i] + b;
        q6_row(B, &A0[i], &B0[i], &A1[i], &B1[i], &P0[i], &P1[i]);
        dwq[i / 4] |= (uint64_t)B->d << (16 * (i % 4));
    }
#pragma GCC unroll 8
    for (int tp = 0; tp < NP; tp++) {
        const int ta = 2 * tp, tb = 2 * tp + 1;
        if (ta >= NT) {
            for (int i = 0; i < R; i++) PV[i * NP + tp] = _mm512_setzero_si512();
            continue;
        }
        const uint8_t *xa = xp + ((size_t)b * NT + ta) * XS6, *xb = xa + XS6;
        const __m512i xa0 = _mm512_load_si512(xa), xa1 = _mm512_load_si512(xa + 64);
        const __m512i xa2 = _mm512_load_si512(xa + 128), xa3 = _mm512_load_si512(xa + 192);
        const __m512i oa0 = _mm512_load_si512(xa + 256), oa1 = _mm512_load_si512(xa + 320);
        __m512i xb0 = _mm512_setzero_si512(), xb1 = xb0, xb2 = xb0, xb3 = xb0, ob0 = xb0, ob1 = xb0;
        if (tb < NT) {
            xb0 = _mm512_load_si512(xb);
            xb1 = _mm512_load_si512(xb + 64);
            xb2 = _mm512_load_si512(xb + 128);
            xb3 = _mm512_load_si512(xb + 192);
            ob0 = _mm512_load_si512(xb + 256);
            ob1 = _mm512_load_si512(xb + 320);
        }
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            const __m512i ca0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(oa0, A0[i], xa0), B0[i], xa1);
            const __m512i ca1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(oa1, A1[i], xa2), B1[i], xa3);
            __m512i cb0 = _mm512_setzero_si512(), cb1 = _mm512_setzero_si512();
            if (tb < NT) {
                cb0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ob0, A0[i], xb0), B0[i], xb1);
                cb1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ob1, A1[i], xb2), B1[i], xb3);
            }
            PV[i * NP + tp] = _mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(ca0, cb0), P0[i]),
                                               _mm512_madd_epi16(_mm512_packs_epi32(ca1, cb1), P1[i]));
        }
    }
    const __m512i S = q6_reduce8(PV);
    __m512 dw;
    if (R == 1) dw = _mm512_set1_ps(g4_fp16_to_fp32((uint16_t)dwq[0]));
    else dw = _mm512_permutexvar_ps(rowidx, _mm512_cvtph_ps(_mm256_castsi128_si256(_mm_set_epi64x((long long)dwq[1], (long long)dwq[0]))));
    const __m512 dd = _mm512_mul_ps(dw, _mm512_load_ps(dxl + (size_t)b * 16));
    *accp = _mm512_add_ps(*accp, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(S)));
}

G4_AI void q6_gemm_batch(const int NT, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                         int64_t k, int64_t r0, int64_t r1) {
    const int NTP = q6_ntp(NT);
    const int R = 16 / NTP;
    const int G = G4X_Q6TILE / R; /* groups per tile: the tile's rows share each block's activations in L1 */
    const int64_t nb = k / QK_K;
    int KC = XBUF6 / (NT * XS6 + 64);
    if (KC > nb) KC = (int)nb;
    _Alignas(64) uint8_t xp[XBUF6];
    _Alignas(64) float dxl[(XBUF6 / XS6) * 16];
    int rowof[16], tokof[16], valid[16];
    for (int i = 0; i < 16; i++) {
        const int it = q6_item_of_lane(i);
        rowof[i] = it / NTP;
        tokof[i] = it % NTP;
        valid[i] = tokof[i] < NT;
    }
    const __m512i rowidx = _mm512_loadu_si512(rowof);
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        if (q6_prepare(x, xrb, NT, NTP, c0, kc, xp, dxl)) {
            /* an activation of -128 (not produced by the quantiser): token by token, whole call */
            for (int t = 0; t < NT; t++) q6_gemm(1, w, wrb, x + (size_t)t * xrb, xrb, y + t * ldy, ldy, k, r0, r1);
            return;
        }
        for (int64_t rt = r0; rt < r1; rt += (int64_t)G * R) {
            const int ng = (int)((r1 - rt + R - 1) / R < G ? (r1 - rt + R - 1) / R : G);
            const uint8_t *wrow[64][16];
            int nrs[64];
            __m512 acc[64];
            for (int g = 0; g < ng; g++) {
                const int64_t r = rt + (int64_t)g * R;
                const int nr = (int)(r1 - r < R ? r1 - r : R);
                nrs[g] = nr;
                for (int i = 0; i < R; i++)
                    wrow[g][i] = w + (size_t)(r + (i < nr ? i : nr - 1)) * wrb + (size_t)c0 * sizeof(block_q6_K);
                acc[g] = g4x_items_load(y, ldy, r, nr, c0, valid, rowof, tokof);
            }
            for (int b = 0; b < kc; b++)
                for (int g = 0; g < ng; g++) q6_group(NT, wrow[g], xp, dxl, b, &acc[g], rowidx);
            for (int g = 0; g < ng; g++)
                g4x_items_store(y, ldy, rt + (int64_t)g * R, nrs[g], acc[g], valid, rowof, tokof);
        }
    }
}

/* ---- one token, streamed (the default; G4X_Q6STREAM=0 gives q6_group's NT == 1 branch back): the same
 * 16-row groups, per-(row, block) integers and merges, but the group's rows are read as a few long
 * sequential runs instead of 16 interleaved streams. A pass takes G4X_Q6RP row pairs over G4X_Q6SB
 * blocks and parks its pair vectors (and the rows' f16 scales) in an L1 buffer; after the 8 pairs the
 * 16-row merges and the float sequence run block by block from it. Each pass prefetches, at the block
 * it reads, the rows of the pass at least G4X_Q6PFB bytes ahead (crossing into the next group), as
 * the avx2 rows8 kernels sweep their next group. Same integers, same float sequence per row: same bits.
 * Zen 5 VM (1 thread, bench/kernel_micro.c, ns per 32 weights from memory, 1 GiB; minima of 4-5
 * alternations, interleaved form -> this): k = 1024 (the 31B assistant's LM head) 1.94-2.02 -> 0.74-0.77,
 * k = 5376 1.09-1.17 -> 0.88-0.92, k = 21504 0.84-0.92 -> 0.86-0.94; in L2 (128 rows, k = 5376)
 * 1.07x the time. The interleaved form with its in-row prefetch was chosen on an AMX Xeon. */
#ifndef G4X_Q6SB
#define G4X_Q6SB 32 /* blocks per sub-chunk: 8 pair vectors x 64 B x 32 = 16 KiB of L1 */
#endif
#ifndef G4X_Q6RP
#define G4X_Q6RP 2 /* row pairs per pass */
#endif
#ifndef G4X_Q6STREAM
#define G4X_Q6STREAM 1
#endif
#ifndef G4X_Q6NPF
#define G4X_Q6NPF 1 /* 1: prefetch the rows of a later pass (above); 0: in-row, G4X_Q6PF blocks ahead */
#endif
#ifndef G4X_Q6PFB
#define G4X_Q6PFB 4096 /* at least this many bytes of rows ahead (whole passes) */
#endif

static void q6_gemv_stream(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                           int64_t k, int64_t r0, int64_t r1) {
    const int64_t nb = k / QK_K;
    int KC = XBUF6 / (XS6 + 64);
    if (KC > nb) KC = (int)nb;
    _Alignas(64) uint8_t xp[XBUF6];
    _Alignas(64) float dxl[(XBUF6 / XS6) * 16];
    _Alignas(64) __m512i pv[G4X_Q6SB * 8];
    _Alignas(64) uint16_t dq[G4X_Q6SB * 16];
    int rowof[16], tokof[16], valid[16];
    for (int i = 0; i < 16; i++) {
        rowof[i] = q6_item_of_lane(i);
        tokof[i] = 0;
        valid[i] = 1;
    }
    const __m512i rowidx = _mm512_loadu_si512(rowof);
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        if (q6_prepare(x, xrb, 1, 1, c0, kc, xp, dxl)) {
            q6_gemm(1, w, wrb, x, xrb, y, ldy, k, r0, r1);
            return;
        }
        for (int64_t r = r0; r < r1; r += 16) {
            const int nr = (int)(r1 - r < 16 ? r1 - r : 16);
            const block_q6_K *wrow[16];
            for (int i = 0; i < 16; i++)
                wrow[i] = (const block_q6_K *)(w + (size_t)(r + (i < nr ? i : nr - 1)) * wrb) + c0;
            __m512 acc = g4x_items_load(y, ldy, r, nr, c0, valid, rowof, tokof);
            for (int s0 = 0; s0 < kc; s0 += G4X_Q6SB) {
                const int sb = kc - s0 < G4X_Q6SB ? kc - s0 : G4X_Q6SB;
                const int64_t passb = (int64_t)2 * G4X_Q6RP * sb * (int64_t)sizeof(block_q6_K);
                for (int p0 = 0; p0 < 8; p0 += G4X_Q6RP) {
                    const uint8_t *nx[2 * G4X_Q6RP];
                    const int nnx = g4x_stream_rows_ahead(w, wrb, r, r1, 2 * p0, 2 * G4X_Q6RP, passb, G4X_Q6PFB,
                                                          (size_t)(c0 + s0) * sizeof(block_q6_K), nx);
                    for (int b = 0; b < sb; b++) {
                        if (G4X_Q6NPF) g4x_prefetch_block(nx, nnx, b, (int)sizeof(block_q6_K));
                        const uint8_t *xa = xp + (size_t)(s0 + b) * XS6;
                        const __m512i xa0 = _mm512_load_si512(xa), xa1 = _mm512_load_si512(xa + 64);
                        const __m512i xa2 = _mm512_load_si512(xa + 128), xa3 = _mm512_load_si512(xa + 192);
                        const __m512i oa0 = _mm512_load_si512(xa + 256), oa1 = _mm512_load_si512(xa + 320);
#pragma GCC unroll 4
                        for (int p = p0; p < p0 + G4X_Q6RP; p++) {
                            __m512i c[2][2], P[2][2];
#pragma GCC unroll 2
                            for (int j = 0; j < 2; j++) {
                                const block_q6_K *B = wrow[2 * p + j] + s0 + b;
                                __m512i A0, B0, A1, B1;
                                q6_row_pf(B, &A0, &B0, &A1, &B1, &P[j][0], &P[j][1], G4X_Q6NPF ? 0 : G4X_Q6PF);
                                c[j][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(oa0, A0, xa0), B0, xa1);
                                c[j][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(oa1, A1, xa2), B1, xa3);
                                dq[b * 16 + 2 * p + j] = B->d;
                            }
                            const __m512i q0 = _mm512_mask_blend_epi16(0xF0F0F0F0u, P[0][0], P[1][0]);
                            const __m512i q1 = _mm512_mask_blend_epi16(0xF0F0F0F0u, P[0][1], P[1][1]);
                            pv[b * 8 + p] = _mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(c[0][0], c[1][0]), q0),
                                                             _mm512_madd_epi16(_mm512_packs_epi32(c[0][1], c[1][1]), q1));
                        }
                    }
                }
                for (int b = 0; b < sb; b++) {
                    const __m512i S1 = q6_reduce8(pv + (size_t)b * 8);
                    const __m512 dw1 = _mm512_permutexvar_ps(
                        rowidx, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(dq + b * 16))));
                    const __m512 dd1 = _mm512_mul_ps(dw1, _mm512_load_ps(dxl + (size_t)(s0 + b) * 16));
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(dd1, _mm512_cvtepi32_ps(S1)));
                }
            }
            g4x_items_store(y, ldy, r, nr, acc, valid, rowof, tokof);
        }
    }
}

/* one token: q6_gemv_stream (above), or with G4X_Q6STREAM=0 the batch path as 16 rows x 1 token
 * (q6_group's NT == 1 branch: rows paired in the packs). That branch was 4 rows x 4 token slots (3 empty): paired runs with two threads streaming
 * (390 MiB each, Sapphire Rapids-class VM) read 44 ms for that against 70 ms for the older one-row
 * path; the 16-row form, single thread, A/B in one process (2-vCPU Xeon with AMX, medians of 9
 * alternating calls, k = 5376): 0.81-0.97x the time in L2, 0.93-0.99x from memory. Every path
 * computes the same per-(row, token) sequence, so the bits are the same. */
#define Q6_CASES \
    switch (n_tok) { \
    case 1: if (G4X_Q6STREAM) q6_gemv_stream(w, wrb, x, xrb, y, ldy, k, r0, r1); else q6_gemm_batch(1, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 2: q6_gemm_batch(2, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 3: q6_gemm_batch(3, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 4: q6_gemm_batch(4, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 5: q6_gemm_batch(5, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 6: q6_gemm_batch(6, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 7: q6_gemm_batch(7, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 8: q6_gemm_batch(8, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 9: q6_gemm_batch(9, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 10: q6_gemm_batch(10, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 11: q6_gemm_batch(11, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 12: q6_gemm_batch(12, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 13: q6_gemm_batch(13, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 14: q6_gemm_batch(14, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    case 15: q6_gemm_batch(15, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    default: q6_gemm_batch(16, w, wrb, x, xrb, y, ldy, k, r0, r1); break; \
    }

static void q6k_tile(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                     int64_t n_tok, int64_t k, int64_t r0, int64_t r1) { Q6_CASES }

void g4_gemm_q6_K_q8_K_avx512(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,
                              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < n_tok; t += 16)
        q6k_tile((const uint8_t *)w, wrb, (const uint8_t *)x + (size_t)t * xrb, xrb, y + t * ldy, ldy,
                 n_tok - t < 16 ? n_tok - t : 16, k, r0, r1);
}
