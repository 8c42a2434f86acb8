/* gemm_q32_avx512.c: Q8_0 / Q4_0 / Q5_0 weights x Q8_0 activations, and F32 / F16 / BF16 weights x
 * float activations, avx512 + VNNI, n_tok = 1..16 (bit-identical to gemm_ref.c).
 *
 * 32-blocks: weights are unpacked to bytes two blocks per vector, once per row for all tokens. The
 * batch paths copy the activations once per call into a stack buffer as x + 128 (vpdpbusd needs an
 * unsigned operand), and each weight block's correction -128 * sum(w) (shared by every token) is
 * the starting value of the dot product. One token (q_rows16) does it the other way round: the
 * weights go to the unsigned domain (Q8_0 w + 128, Q4_0 / Q5_0 their stored 4- / 5-bit values) and
 * the per-block correction -bias * sum(x), the same for every row, is one broadcast add per block.
 * Dot products of 16 items (rows, or rows x tokens) for a pair of blocks are reduced together by a
 * transposed merge tree, so (float)isum * (d_w * d_x) and the in-order accumulation acc = acc + p
 * run on 16 item lanes.
 * One token, single thread, A/B in one process against the former one-row-at-a-time path (4 rows
 * interleaved, a scalar in-order sum per row; 2-vCPU Xeon with AMX, noisy host, medians of 9
 * alternating calls): k = 640 in L2 0.62-0.77x the time (Q8_0 / Q5_0 / Q4_0), from memory (64 MiB)
 * 0.76-0.94x; Q8_0 k = 5376 from memory 0.91-0.99x.
 *
 * Which path takes n_tok tokens (q_gemm): 1 token q_rows16; 2-8 tokens the slot-lanes path q8q_gemm
 * (below; it replaced the split described next, which G4X_Q8Q=0 brings back); the items path
 * q_group16 took Q8_0 with 2-4 tokens and Q4_0 / Q5_0 with 2-5 (rows x tokens in the 16 lanes, one merge tree per block pair); more
 * tokens the token-lanes path q8t_* (no merge tree: each weight dword is broadcast to every token
 * lane; Q4_0 / Q5_0 blocks are unpacked to their unsigned values first). Crossovers measured on a
 * 2-vCPU AMD EPYC Zen 5 (family 26), single thread, k = 5376, 128 rows in L2, A/B against the
 * previous split (Q8_0 on q8t from 2 tokens, Q4_0 / Q5_0 on q_group16 up to 16): Q8_0 2 tokens 0.79x
 * the time; Q5_0 / Q4_0 6 tokens 0.81 / 0.75x, 8 tokens 0.78x, 16 tokens and prefill (64) 0.44-0.48x.
 * The items path prefetches the next row tile into L2 (one region when rows are whole), as the avx2
 * 8-row passes do: from memory (374 MiB) Q8_0 2 / 3 tokens 1.06 / 0.70 -> 0.80 / 0.55 ns per
 * row-token-block, Q5_0 2 / 4 tokens 1.0 / 0.67 -> 0.72 / 0.52; in L2 it costs 5-8 %. Q8_0 with 4
 * tokens is 1.13x slower on the items path in L2 but 0.87x from memory, and bench_kernels.py (1 GiB,
 * three alternated pairs of builds) reads 0.92x the time at 1 and 2 threads: items path. */
#include "avx512.h"
#include "../g4_x86_256.h"

#ifndef G4X_QTG
#define G4X_QTG 1
#endif
#define QBUF (112 * 1024) /* stack budget for one chunk of biased activations (36 B per block) */

G4_AI int q_lane_of_block(int beta) { return (beta >> 1) | ((beta & 1) << 3); }

/* activations and f32 scales of blocks [c0, c0+kc) of n tokens (the batch paths); kcp = kc rounded up
 * to 16. The bytes are stored as x + 128 (unsigned) and the weights carry the correction; dxp is in
 * the lane order of the merge tree (q_lane_of_block). */
static void q_prepare(const uint8_t *x, size_t xrb, int n, int64_t c0, int kc, int kcp, uint8_t *xu, float *dxp) {
    const __m256i b80 = _mm256_set1_epi8((char)0x80);
    for (int t = 0; t < n; t++) {
        const block_q8_0 *xb = (const block_q8_0 *)(x + (size_t)t * xrb) + c0;
        uint8_t *u = xu + (size_t)t * kcp * 32;
        float *d = dxp + (size_t)t * kcp;
        for (int b = 0; b < kcp; b++) {
            const int li = (b & ~15) + q_lane_of_block(b & 15);
            if (b < kc) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)xb[b].qs);
                _mm256_store_si256((__m256i *)(u + 32 * b), _mm256_xor_si256(v, b80));
                d[li] = g4_fp16_to_fp32(xb[b].d);
            } else {
                _mm256_store_si256((__m256i *)(u + 32 * b), _mm256_setzero_si256());
                d[li] = 0.0f;
            }
        }
    }
}

enum { QT_Q8_0, QT_Q4_0, QT_Q5_0 };

/* bytes of one block, and the bias of its weights in the unsigned domain (Q8_0 w + 128, Q4_0 / Q5_0
 * their stored values w + 8 / w + 16) */
G4_AI int q_block_bytes(const int QT) { return QT == QT_Q8_0 ? 34 : QT == QT_Q4_0 ? 18 : 22; }
G4_AI int q_bias(const int QT) { return QT == QT_Q8_0 ? 128 : QT == QT_Q4_0 ? 8 : 16; }

/* weights of blocks b, b+1 (b+1 only if two) of a row, 32 bytes each: signed (uns = 0), or in the
 * unsigned domain (uns = 1): w + 128 for Q8_0, the stored 4- / 5-bit values (w + 8 / w + 16) for Q4_0 / Q5_0, so that
 * vpdpbusd takes them as its unsigned operand against signed activations (q_prepare1's correction). */
G4_AI __m512i q_unpack2(const int QT, const uint8_t *p, const int BB, int two, const int uns) {
    __m512i v;
    if (QT == QT_Q8_0) {
        const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2)));
        v = two ? _mm512_inserti64x4(lo, _mm256_loadu_si256((const __m256i *)(p + BB + 2)), 1) : lo;
        if (uns) v = _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
        return two ? v : _mm512_maskz_mov_epi64(0x0F, v); /* the upper half of lo is undefined */
    }
    const int off = QT == QT_Q4_0 ? 2 : 6;
    /* 128-bit lanes: qa, qa, qb, qb (broadcasts from memory: load uops, one blend) */
    __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + off)));
    if (two) t = _mm512_mask_broadcast_i32x4(t, 0xFF00, _mm_loadu_si128((const __m128i *)(p + BB + off)));
    const __m512i sh = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    v = _mm512_and_si512(_mm512_srlv_epi64(t, sh), _mm512_set1_epi8(0x0F));
    if (QT == QT_Q4_0) {
        if (!uns) v = _mm512_sub_epi8(v, _mm512_set1_epi8(8));
    } else {
        uint32_t ha, hb = 0;
        memcpy(&ha, p + 2, 4);
        if (two) memcpy(&hb, p + BB + 2, 4);
        const __mmask64 hm = _cvtu64_mask64((uint64_t)ha | ((uint64_t)hb << 32));
        v = _mm512_mask_add_epi8(v, hm, v, _mm512_set1_epi8(16));
        if (!uns) v = _mm512_sub_epi8(v, _mm512_set1_epi8(16));
    }
    if (!two) v = _mm512_maskz_mov_epi64(0x0F, v);
    return v;
}

/* The 16 items' dot-product vectors of a block pair (D[i]: lanes 0-7 block b, 8-15 block b+1, 8 partial
 * sums each) reduced by one transposed merge tree: F0 lane i = item i's sum for block b, F1 for b+1 */
G4_AI void q_tree16(const __m512i *D, __m512i *F0, __m512i *F1) {
    __m512i U[8], T[4], X[2];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) U[u] = g4x_merge(D[2 * u], D[2 * u + 1], 1);
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) T[u] = g4x_merge(U[2 * u], U[2 * u + 1], 2);
    X[0] = g4x_merge(T[0], T[1], 4);
    X[1] = g4x_merge(T[2], T[3], 4);
    /* X[h]: lanes 0-7 items 8h..8h+7 of block b, lanes 8-15 the same items of block b+1 */
    *F0 = _mm512_shuffle_i64x2(X[0], X[1], 0x44);
    *F1 = _mm512_shuffle_i64x2(X[0], X[1], 0xEE);
}

/* One token, 16 rows in the 16 lanes (rows r..r+15, consecutive, wrb bytes apart): for each pair of
 * blocks the 16 rows' dot-product vectors are reduced together by one transposed merge tree, so the
 * per-block float ops and the in-order accumulation run on 16 row lanes (no scalar chain). The
 * weights are in the unsigned domain (q_unpack2 uns = 1) against the signed activations; the
 * correction -bias * sum(x) of a block is the same for every row: one broadcast add per block. */
#ifndef G4X_R16PF
#define G4X_R16PF 1 /* prefetch the next 16-row group into L2 while this one runs (row by row, the same
                       * blocks: A/B single thread from memory, k = 5376 / 640, 0.82-0.87 / 0.95x the time
                       * of sweeping the group's bytes linearly) */
#endif
#ifndef G4X_R16L1
#define G4X_R16L1 8 /* blocks ahead in each row, into L1 */
#endif
#ifndef G4X_R16GS
#define G4X_R16GS 1 /* Q8_0: the 16 rows' scales of a block by one vpgatherdd, not 16 scalar loads and stores
                     * into a stack vector. Zen 5, one thread, A/B in one binary: from memory k = 640 /
                     * 5376 0.94-0.96 / 0.90x the time, two threads 0.97x; in L2 1.32x (so Q4_0 / Q5_0,
                     * compute-bound at one token, keep the scalar form: 1.23-1.38x slower with it) */
#endif
G4_AI void q_rows16(const int QT, const uint8_t *w0, size_t wrb, int nr, const uint8_t *xs, const float *dx,
                    const int32_t *xc, int kc, float *acc16, int next) {
    const int BB = q_block_bytes(QT);
    const int GS = G4X_R16GS && QT == QT_Q8_0 && wrb <= (size_t)INT32_MAX / 16; /* int32 gather offsets */
    const uint8_t *wrow[16];
    for (int i = 0; i < 16; i++) wrow[i] = w0 + (size_t)(i < nr ? i : nr - 1) * wrb;
    __m512 acc = _mm512_loadu_ps(acc16);
    const int np = (kc + 1) / 2;
    int32_t gof[16];
    for (int i = 0; i < 16; i++) gof[i] = (int32_t)(wrow[i] - w0);
    const __m512i gofs = _mm512_loadu_si512(gof);
    for (int j = 0; j < np; j++) {
        const int b = 2 * j, two = b + 1 < kc;
        if (G4X_R16PF && next) /* the same two blocks of the next 16-row group, row by row, into L2 */
            for (int i = 0; i < 16; i++) {
                const char *q = (const char *)wrow[i] + 16 * wrb + (size_t)b * BB;
                _mm_prefetch(q, _MM_HINT_T1);
                _mm_prefetch(q + 64, _MM_HINT_T1);
            }
        const __m512i X = _mm512_load_si512(xs + 64 * j);
        _Alignas(32) uint16_t dwr[2][16];
        __m512i D[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const uint8_t *p = wrow[i] + (size_t)b * BB;
            if (G4X_R16L1 > 0) _mm_prefetch((const char *)p + G4X_R16L1 * BB, _MM_HINT_T0);
            if (!GS) {
                memcpy(&dwr[0][i], p, 2);
                if (two) memcpy(&dwr[1][i], p + BB, 2);
            }
            D[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q_unpack2(QT, p, BB, two, 1), X);
        }
        __m512i F0, F1;
        q_tree16(D, &F0, &F1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            if (h && !two) break;
            const __m512i S = _mm512_add_epi32(h ? F1 : F0, _mm512_set1_epi32(xc[b + h]));
            const __m256i dh = GS ? _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(gofs, w0 + (size_t)(b + h) * BB, 1))
                                         : _mm256_load_si256((const __m256i *)dwr[h]);
            const __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(dh),
                                            _mm512_set1_ps(dx[b + h]));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(S), dd));
        }
    }
    _mm512_storeu_ps(acc16, acc);
}

/* activations of blocks [c0, c0+kc) of one token in block order: signed bytes (zero-padded to an even
 * count of blocks), d_x, and the correction -bias * sum(x) per block */
static void q_prepare1(const uint8_t *x, int64_t c0, int kc, uint8_t *xs, float *dx, int32_t *xc, int bias) {
    const block_q8_0 *xb = (const block_q8_0 *)x + c0;
    for (int b = 0; b < kc; b++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)xb[b].qs);
        _mm256_store_si256((__m256i *)(xs + 32 * b), v);
        dx[b] = g4_fp16_to_fp32(xb[b].d);
        const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
        const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
        xc[b] = -bias * ((int)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128);
    }
    if (kc & 1) _mm256_store_si256((__m256i *)(xs + 32 * kc), _mm256_setzero_si256());
}

/* (with G4X_Q8Q=0) n_tok = 2..G4X_Q8G (Q8_0) or 2..G4X_Q4G (Q4_0 / Q5_0): R = 16/NT rows x NT tokens = up to 16
 * items, lane i = item i (row i/NT, token i%NT). For each pair of blocks the 16 items' dot-product vectors are reduced together, so the per-block
 * float ops (and the in-order accumulation) run on 16 item lanes. Activations: xi[(g16, t)] blocks
 * of 32 biased bytes; dxi[block][lane] = d_x of the lane's token. */
G4_AI void q_group16(const int NT, const int QT, const uint8_t *const *wrow, const uint8_t *xu, const float *dxi,
                     int kcp, int g, int cnt, __m512 *accp, const __m512i rowidx) {
    const int R = 16 / NT, NI = R * NT;
    const int BB = q_block_bytes(QT);
    const __m512i ones80 = _mm512_set1_epi8((char)0x80);
    __m512 acc = *accp;
    _Alignas(32) uint16_t dwr[16][16]; /* [block][row] raw f16 scales */
    for (int i = 0; i < R; i++) /* next 16 blocks of each row: several rows stream at once */
        for (int o = 0; o < 16 * BB; o += 64) _mm_prefetch((const char *)wrow[i] + (size_t)(g + 32) * BB + o, _MM_HINT_T0);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const int b = 2 * j;
        if (b >= cnt) break;
        __m512i D[16];
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            const uint8_t *p = wrow[i] + (size_t)(g + b) * BB;
            const __m512i W = q_unpack2(QT, p, BB, b + 1 < cnt, 0);
            const __m512i C = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones80, W));
            memcpy(&dwr[b][i], p, 2);
            if (b + 1 < cnt) memcpy(&dwr[b + 1][i], p + BB, 2);
#pragma GCC unroll 16
            for (int t = 0; t < NT; t++)
                D[i * NT + t] = _mm512_dpbusd_epi32(C, _mm512_load_si512(xu + ((size_t)t * kcp + g + b) * 32), W);
        }
#pragma GCC unroll 16
        for (int it = NI; it < 16; it++) D[it] = _mm512_setzero_si512();
        __m512i F0, F1;
        q_tree16(D, &F0, &F1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            if (b + h >= cnt) break;
            __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dwr[b + h]));
            if (R > 1) dw = _mm512_permutexvar_ps(rowidx, dw);
            else dw = _mm512_permutexvar_ps(_mm512_setzero_si512(), dw);
            const __m512 dd = _mm512_mul_ps(dw, _mm512_load_ps(dxi + (size_t)(g + b + h) * 16));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(h ? F1 : F0), dd));
        }
    }
    *accp = acc;
}

/* ---- n_tok > G4X_Q8G (Q8_0) or > G4X_Q4G (Q4_0 / Q5_0): lanes = tokens, no horizontal reduction.
 * The activations of a chunk of blocks are transposed once per call: for block b, vector j
 * (j = 0..7) holds dword j (bytes 4j..4j+3) of that block of every token, lane t = token t, so one
 * vpdpbusd with the weight dword j broadcast to every lane adds 4 products to every token's sum,
 * and a chain of 8 gives every token's exact block sum in its own lane. vpdpbusd wants an
 * unsigned operand: the broadcast weights are biased (Q8_0 w ^ 0x80 = w + 128; Q4_0 / Q5_0 their
 * stored values w + 8 / w + 16) and the chain starts at -bias * sum(x) of the lane's token
 * (computed once per call). The float sequence
 * acc = acc + (float)isum * (d_w * d_x) then runs on the token lanes in block order. A tile of
 * rows shares each block's activation vectors from registers. 8 lanes (ymm) for n_tok <= 8,
 * 16 (zmm) above. */
#ifndef G4X_Q8G
#define G4X_Q8G 4 /* Q8_0 with 2..G4X_Q8G tokens takes q_group16 (items = rows x tokens), more q8t */
#endif
#ifndef G4X_Q4G
#define G4X_Q4G 5 /* the same for Q4_0 / Q5_0 */
#endif
#ifndef G4X_QGPF
#define G4X_QGPF 2 /* q_group16's next row tile: 0 not prefetched, 1 into L1, 2 into L2 */
#endif
#define Q8T_BUF (112 * 1024) /* stack budget for one chunk of transposed activations */
#ifndef G4X_Q8TR
#define G4X_Q8TR 8           /* rows per register group */
#endif
#ifndef G4X_Q8TT
#define G4X_Q8TT 64          /* rows per tile (multiple of G4X_Q8TR) */
#endif
#ifndef G4X_Q8CB
#define G4X_Q8CB 16          /* blocks per burst */
#endif
#ifndef G4X_Q8PF
#define G4X_Q8PF G4X_Q8CB /* software prefetch distance in blocks (0: none): the next burst */
#endif

/* per block: 8 vectors of L int32 lanes, then -(sum(x) << SH) (L int32: SH = 7, 3, 4 for the
 * bias 128, 8, 16 of Q8_0 / Q4_0 / Q5_0 weights in the unsigned domain), then d_x (L floats).
 * Tokens are transposed 8 at a time (an 8x8 dword transpose in ymm registers); lanes past n are 0. */
static void q8t_prepare(const uint8_t *x, size_t xrb, int n, const int L, const int BIAS, const int SH, int64_t c0, int kc,
                        int32_t *xt) {
    const __m256i ones = _mm256_set1_epi8(1), k80 = _mm256_set1_epi8((char)0x80);
    for (int b = 0; b < kc; b++) {
        int32_t *d = xt + (size_t)b * 10 * L;
        for (int t0 = 0; t0 < L; t0 += 8) {
            __m256i r[8];
            for (int t = 0; t < 8; t++)
                r[t] = t0 + t < n ? _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)(x + (size_t)(t0 + t) * xrb) + c0 + b)->qs)
                                  : _mm256_setzero_si256();
            __m256i c[8]; /* r[t] dword j -> c[j] lane t */
            g4_tr8x8_epi32(r, c);
            __m256i sum = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                /* BIAS: unsigned x + 128 (lanes past n: 128, i.e. x = 0, which gives 128 * sum(w)) */
                _mm256_store_si256((__m256i *)(d + j * L + t0), BIAS ? _mm256_xor_si256(c[j], k80) : c[j]);
                sum = _mm256_dpbusd_epi32(sum, ones, c[j]);
            }
            _mm256_store_si256((__m256i *)(d + 8 * L + t0), _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, SH)));
            for (int t = 0; t < 8; t++) {
                const float f = t0 + t < n ? g4_fp16_to_fp32(((const block_q8_0 *)(x + (size_t)(t0 + t) * xrb))[c0 + b].d) : 0.0f;
                memcpy(&d[9 * L + t0 + t], &f, 4);
            }
        }
    }
}

typedef int32_t q8t_i32u __attribute__((aligned(1), may_alias));
G4_AI uint32_t q8t_u32(const uint8_t *p) { return (uint32_t) * (const q8t_i32u *)p; }

/* acc + dpbusd(a, broadcast of the 4 signed bytes at p), with the broadcast folded into the
 * instruction ({1to8}): GCC 12 does not fold _mm256_set1_epi32 into vpdpbusd by itself. */
G4_AI __m256i q8t_dpbusd_b(__m256i acc, __m256i a, const uint8_t *p) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const q8t_i32u *)p));
    return acc;
}

/* The 32 weights of a Q4_0 / Q5_0 block in the unsigned domain (their stored 4- / 5-bit values, w + 8 /
 * w + 16), element order: *lo = elements 0-15, *hi = 16-31. */
G4_AI void q4t_wblock(const int QT, const uint8_t *p, __m128i *lo, __m128i *hi) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(p + (QT == QT_Q4_0 ? 2 : 6)));
    __m128i l = _mm_and_si128(raw, m4), h = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    if (QT == QT_Q5_0) { /* bit 4 of element i is bit i of qh */
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        l = _mm_mask_add_epi8(l, (__mmask16)qh, l, _mm_set1_epi8(16));
        h = _mm_mask_add_epi8(h, (__mmask16)(qh >> 16), h, _mm_set1_epi8(16));
    }
    *lo = l;
    *hi = h;
}

/* TR rows x blocks [0, kc) of the chunk, 8 token lanes */
G4_AI void q8t_tile8(const int QT, const int TR, const uint8_t *const *wr, const int32_t *xt, int kc, __m256 *acc) {
    const int BB = q_block_bytes(QT);
    __m256 A[16]; /* local copies: kept in registers (acc may alias the buffers) */
    for (int i = 0; i < TR; i++) A[i] = acc[i];
    for (int b = 0; b < kc; b++) {
        const int32_t *d = xt + (size_t)b * 80;
        __m256i X[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) X[j] = _mm256_load_si256((const __m256i *)(d + 8 * j));
        const __m256i cx = _mm256_load_si256((const __m256i *)(d + 64));
        const __m256 dx = _mm256_load_ps((const float *)(d + 72));
#pragma GCC unroll 16
        for (int i = 0; i < TR; i++) {
            const uint8_t *p = wr[i] + (size_t)b * BB;
            if (G4X_Q8PF > 0) _mm_prefetch((const char *)p + G4X_Q8PF * BB, _MM_HINT_T0);
            /* weight dwords 0-3 / 4-7 in both 128-bit lanes, unsigned; vpshufd broadcasts one */
            __m256i wl, wh;
            if (QT == QT_Q8_0) { /* broadcast from memory, then bias (3-7 % faster than the other order) */
                const __m256i k80 = _mm256_set1_epi8((char)0x80);
                wl = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2))), k80);
                wh = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 18))), k80);
            } else {
                __m128i wlo, whi;
                q4t_wblock(QT, p, &wlo, &whi);
                wl = _mm256_broadcastsi128_si256(wlo);
                wh = _mm256_broadcastsi128_si256(whi);
            }
            __m256i D0 = _mm256_dpbusd_epi32(cx, _mm256_shuffle_epi32(wl, 0x00), X[0]);
            __m256i D1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_shuffle_epi32(wl, 0x55), X[1]);
            D0 = _mm256_dpbusd_epi32(D0, _mm256_shuffle_epi32(wl, 0xAA), X[2]);
            D1 = _mm256_dpbusd_epi32(D1, _mm256_shuffle_epi32(wl, 0xFF), X[3]);
            D0 = _mm256_dpbusd_epi32(D0, _mm256_shuffle_epi32(wh, 0x00), X[4]);
            D1 = _mm256_dpbusd_epi32(D1, _mm256_shuffle_epi32(wh, 0x55), X[5]);
            D0 = _mm256_dpbusd_epi32(D0, _mm256_shuffle_epi32(wh, 0xAA), X[6]);
            D1 = _mm256_dpbusd_epi32(D1, _mm256_shuffle_epi32(wh, 0xFF), X[7]);
            const __m256i D = _mm256_add_epi32(D0, D1);
            uint16_t h;
            memcpy(&h, p, 2);
            const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16((short)h)), dx);
            A[i] = _mm256_add_ps(A[i], _mm256_mul_ps(_mm256_cvtepi32_ps(D), dd));
        }
    }
    for (int i = 0; i < TR; i++) acc[i] = A[i];
}

/* n_tok <= 7: the activations are the unsigned operand (x + 128) and the weight dwords are
 * broadcast straight from memory ({1to8}); lane NT holds x = 0, so it sums 128 * sum(w), the
 * bias of every token lane, which is subtracted before the conversion. */
G4_AI void q8t_tile8b(const int NT, const int TR, const uint8_t *const *wr, const int32_t *xt, int kc, __m256 *acc) {
    const __m256i lb = _mm256_set1_epi32(NT);
    __m256 A[16];
    for (int i = 0; i < TR; i++) A[i] = acc[i];
    for (int b = 0; b < kc; b++) {
        const int32_t *d = xt + (size_t)b * 80;
        __m256i X[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) X[j] = _mm256_load_si256((const __m256i *)(d + 8 * j));
        const __m256 dx = _mm256_load_ps((const float *)(d + 72));
#pragma GCC unroll 16
        for (int i = 0; i < TR; i++) {
            const uint8_t *p = wr[i] + (size_t)b * 34;
            if (G4X_Q8PF > 0) _mm_prefetch((const char *)p + G4X_Q8PF * 34, _MM_HINT_T0);
            __m256i D0 = q8t_dpbusd_b(_mm256_setzero_si256(), X[0], p + 2);
            __m256i D1 = q8t_dpbusd_b(_mm256_setzero_si256(), X[1], p + 6);
            D0 = q8t_dpbusd_b(D0, X[2], p + 10);
            D1 = q8t_dpbusd_b(D1, X[3], p + 14);
            D0 = q8t_dpbusd_b(D0, X[4], p + 18);
            D1 = q8t_dpbusd_b(D1, X[5], p + 22);
            D0 = q8t_dpbusd_b(D0, X[6], p + 26);
            D1 = q8t_dpbusd_b(D1, X[7], p + 30);
            const __m256i Db = _mm256_add_epi32(D0, D1);
            const __m256i D = _mm256_sub_epi32(Db, _mm256_permutevar8x32_epi32(Db, lb));
            uint16_t h;
            memcpy(&h, p, 2);
            const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16((short)h)), dx);
            A[i] = _mm256_add_ps(A[i], _mm256_mul_ps(_mm256_cvtepi32_ps(D), dd));
        }
    }
    for (int i = 0; i < TR; i++) acc[i] = A[i];
}

G4_AI void q8t_tile16(const int QT, const int TR, const uint8_t *const *wr, const int32_t *xt, int kc, __m512 *acc) {
    const int BB = q_block_bytes(QT);
    __m512 A[16]; /* local copies: kept in registers (acc may alias the buffers) */
    for (int i = 0; i < TR; i++) A[i] = acc[i];
    for (int b = 0; b < kc; b++) {
        const int32_t *d = xt + (size_t)b * 160;
        __m512i X[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) X[j] = _mm512_load_si512(d + 16 * j);
        const __m512i cx = _mm512_load_si512(d + 128);
        const __m512 dx = _mm512_load_ps((const float *)(d + 144));
#pragma GCC unroll 16
        for (int i = 0; i < TR; i++) {
            const uint8_t *p = wr[i] + (size_t)b * BB;
            if (G4X_Q8PF > 0) _mm_prefetch((const char *)p + G4X_Q8PF * BB, _MM_HINT_T0);
            __m512i wl, wh;
            if (QT == QT_Q8_0) {
                const __m512i k80 = _mm512_set1_epi8((char)0x80);
                wl = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 2))), k80);
                wh = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 18))), k80);
            } else {
                __m128i wlo, whi;
                q4t_wblock(QT, p, &wlo, &whi);
                wl = _mm512_broadcast_i32x4(wlo);
                wh = _mm512_broadcast_i32x4(whi);
            }
            __m512i D0 = _mm512_dpbusd_epi32(cx, _mm512_shuffle_epi32(wl, 0x00), X[0]);
            __m512i D1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_shuffle_epi32(wl, 0x55), X[1]);
            D0 = _mm512_dpbusd_epi32(D0, _mm512_shuffle_epi32(wl, 0xAA), X[2]);
            D1 = _mm512_dpbusd_epi32(D1, _mm512_shuffle_epi32(wl, 0xFF), X[3]);
            D0 = _mm512_dpbusd_epi32(D0, _mm512_shuffle_epi32(wh, 0x00), X[4]);
            D1 = _mm512_dpbusd_epi32(D1, _mm512_shuffle_epi32(wh, 0x55), X[5]);
            D0 = _mm512_dpbusd_epi32(D0, _mm512_shuffle_epi32(wh, 0xAA), X[6]);
            D1 = _mm512_dpbusd_epi32(D1, _mm512_shuffle_epi32(wh, 0xFF), X[7]);
            const __m512i D = _mm512_add_epi32(D0, D1);
            uint16_t h;
            memcpy(&h, p, 2);
            const __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_set1_epi16((short)h)), dx);
            A[i] = _mm512_add_ps(A[i], _mm512_mul_ps(_mm512_cvtepi32_ps(D), dd));
        }
    }
    for (int i = 0; i < TR; i++) acc[i] = A[i];
}

G4_AI void q8t_gemm(const int NT, const int QT, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,
                    int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
    /* Loop order: a tile of TT rows; blocks in bursts of CB (their activations, 10 * CB vectors, stay
     * in L1 while every row of the tile uses them); within a burst, groups of TR rows whose
     * accumulators live in registers, blocks outermost so each block's activation vectors are
     * loaded once for the TR rows. Each row is read in CB-block (CB * BB byte) runs and the run
     * CB blocks ahead is prefetched. The accumulation order per (row, token) is block order. */
    const int L = NT <= 8 ? 8 : 16, TR = G4X_Q8TR, TT = G4X_Q8TT, CB = G4X_Q8CB;
    const int BB = q_block_bytes(QT);
    const int TB = QT == QT_Q8_0 && NT < 8; /* q8t_tile8b: biased activations, weights from memory */
    const int64_t nb = k / 32;
    int KC = Q8T_BUF / (10 * 4 * L);
    if (KC > nb) KC = (int)nb;
    _Alignas(64) int32_t xt[Q8T_BUF / 4];
    _Alignas(64) float a[TT][16];
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        q8t_prepare(x, xrb, NT, L, TB, __builtin_ctz(q_bias(QT)), c0, kc, xt);
        for (int64_t rt = r0; rt < r1; rt += TT) {
            const int nt = (int)(r1 - rt < TT ? r1 - rt : TT);
            for (int i = 0; i < nt; i++)
                for (int t = 0; t < L; t++) a[i][t] = (c0 > 0 && t < NT) ? y[t * ldy + rt + i] : 0.0f;
            for (int cb = 0; cb < kc; cb += CB) {
                const int cn = kc - cb < CB ? kc - cb : CB;
                const int32_t *xc = xt + (size_t)cb * 10 * L;
                for (int g = 0; g < nt; g += TR) {
                    const int nr = nt - g < TR ? nt - g : TR;
                    const uint8_t *wr[16];
                    for (int i = 0; i < TR; i++)
                        wr[i] = w + (size_t)(rt + g + (i < nr ? i : nr - 1)) * wrb + (size_t)(c0 + cb) * BB;
                    if (L == 8) {
                        __m256 acc[16];
                        for (int i = 0; i < TR; i++) acc[i] = _mm256_load_ps(a[g + (i < nr ? i : nr - 1)]);
                        if (TB) q8t_tile8b(NT, TR, wr, xc, cn, acc);
                        else q8t_tile8(QT, TR, wr, xc, cn, acc);
                        for (int i = 0; i < nr; i++) _mm256_store_ps(a[g + i], acc[i]);
                    } else {
                        __m512 acc[16];
                        for (int i = 0; i < TR; i++) acc[i] = _mm512_load_ps(a[g + (i < nr ? i : nr - 1)]);
                        q8t_tile16(QT, TR, wr, xc, cn, acc);
                        for (int i = 0; i < nr; i++) _mm512_store_ps(a[g + i], acc[i]);
                    }
                }
            }
            for (int i = 0; i < nt; i++)
                for (int t = 0; t < NT; t++) y[t * ldy + rt + i] = a[i][t];
        }
    }
}

/* ---- Q8_0 with 2..G4X_Q8QMAX tokens, Q4_0 / Q5_0 with 2..G4X_Q4QMAX: slot lanes. A vector holds NTL token slots (2 for n_tok = 2, 4
 * for 3-4, 8 for 5-8) of S = 16 / NTL consecutive weight dwords each: a row's block is broadcast S
 * dwords at a time to every token slot (vbroadcasti64x4 / i32x4 / q from memory, then w ^ 0x80 to
 * the unsigned domain) against the activations laid out per slot, so one vpdpbusd per 32 / 16 / 8
 * weight bytes serves every token. Lane t * S + s sums dwords s, s + S, ... of token t's block; R = S
 * rows' vectors are reduced by a merge tree of R - 1 merges (7 for 8 rows, 3 for 4, 1 for 2) to lane
 * t * R + r = row r, token t. The correction -128 * sum(x) of a token's block starts the chain in its
 * slot 0 only, so the tree adds it once. Then (float)S * (d_w * d_x) into acc on 16 (token, row)
 * lanes, in block order. The rows of a group are read as R streams; when rows are whole (one chunk)
 * the next groups are one contiguous region, prefetched by a linear cursor at least G4X_Q8QPD bytes
 * ahead. Zen 5, one thread, A/B in one binary against the items path (2-4 tokens) and q8t_tile8b
 * (5-8), same output bits: k = 5376 from memory (1.2 GiB) 2 / 4 / 5 / 8 tokens 0.61-0.65 / 0.56-0.58 /
 * 0.87 / 0.71x the time, k = 640 (170 MiB) 4 / 8 tokens 0.52 / 0.28x; two threads 0.65 / 0.85 / 0.70x
 * (2 / 4 / 8 tokens); in L2 4 tokens 0.53x, 8 tokens 0.92x, 5-6 tokens 1.01-1.10x. Without the
 * linear prefetch it was 1.2-3.5x slower than the items path from memory. Q4_0 / Q5_0 blocks are
 * unpacked to their stored values (w + 8 / w + 16, unsigned; correction -8 / -16 * sum(x)) and
 * broadcast from the register (vshufi32x4 / i64x2 / vpermq), one block at a time. Against the items
 * path (2-5 tokens) and q8t (6-8), from memory: Q5_0 k = 640 2 / 4 / 5 / 8 tokens 0.90 / 0.60 /
 * 0.78 / 0.43x the time, Q4_0 k = 5376 2 / 4 / 6 / 8 tokens 0.98 / 0.66 / 0.65 / 0.67x; in L2 Q5_0
 * k = 640 2 / 3 / 4 tokens 0.92-0.93 / 0.79-0.80 / 0.69-0.70x, k = 5376 5 / 6 / 8 0.82-0.87x. */
#ifndef G4X_Q8Q
#define G4X_Q8Q 1
#endif
#define Q8Q_BUF (96 * 1024)
#ifndef G4X_Q8QMAX
#define G4X_Q8QMAX 8
#endif
#ifndef G4X_Q4QMAX
#define G4X_Q4QMAX 8 /* Q4_0 / Q5_0 on slot lanes up to this many tokens */
#endif
#ifndef G4X_Q8QPD
#define G4X_Q8QPD 8192 /* whole rows: a linear prefetch cursor this many bytes ahead of the group */
#endif
#ifndef G4X_Q8QH
#define G4X_Q8QH _MM_HINT_T0
#endif
/* Weight vector v (0..NTL/2-1) of a row's block on slot lanes: its dwords v*R .. v*R+R-1 (R = 16 / NTL)
 * in every token slot, in the unsigned domain. Q8_0 is broadcast from memory (p = the block) and
 * biased by ^ 0x80; Q4_0 / Q5_0 from W, the block unpacked to its stored values by q_unpack2. */
G4_AI __m512i q8q_wv(const int QT, const int NTL, const uint8_t *p, const __m512i W, const int v) {
    if (QT == QT_Q8_0) {
        const uint8_t *q = p + 2 + 4 * (16 / NTL) * v;
        __m512i u;
        if (NTL == 8) u = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)q));
        else if (NTL == 4) u = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)q));
        else u = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q));
        return _mm512_xor_si512(u, _mm512_set1_epi8((char)0x80));
    }
    if (NTL == 8) return _mm512_permutexvar_epi64(_mm512_set1_epi64(v), W);
    if (NTL == 4) return v ? _mm512_shuffle_i32x4(W, W, 0x55) : _mm512_shuffle_i32x4(W, W, 0x00);
    return _mm512_shuffle_i64x2(W, W, 0x44);
}

G4_AI void q8q_gemm(const int NT, const int QT, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y, int64_t ldy,
                    int64_t k, int64_t r0, int64_t r1) {
    const int NTL = NT == 2 ? 2 : NT <= 4 ? 4 : 8, R = 16 / NTL, NV = NTL / 2; /* S = R dwords a slot */
    const int64_t nb = k / 32;
    const int BB = q_block_bytes(QT);
    int KC = Q8Q_BUF / ((NV + 2) * 64);
    if (KC > nb) KC = (int)nb;
    _Alignas(64) uint8_t buf[Q8Q_BUF];
    uint8_t *const xq = buf;
    int32_t *const cq = (int32_t *)(buf + (size_t)KC * NV * 64);
    float *const dq = (float *)(buf + (size_t)KC * (NV + 1) * 64);
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        memset(buf, 0, (size_t)kc * NV * 64);
        memset(cq, 0, (size_t)kc * 64);
        memset(dq, 0, (size_t)kc * 64);
        for (int t = 0; t < NT; t++) {
            const block_q8_0 *xb = (const block_q8_0 *)(x + (size_t)t * xrb) + c0;
            for (int b = 0; b < kc; b++) {
                for (int v = 0; v < NV; v++) /* vector v, slot t: dwords v*R .. v*R+R-1 of the block */
                    memcpy(xq + ((size_t)b * NV + v) * 64 + 4 * R * t, xb[b].qs + 4 * R * v, 4 * (size_t)R);
                int sx = 0;
                for (int e = 0; e < 32; e++) sx += xb[b].qs[e];
                cq[(size_t)b * 16 + t * R] = -q_bias(QT) * sx;
                const float d = g4_fp16_to_fp32(xb[b].d);
                for (int r = 0; r < R; r++) dq[(size_t)b * 16 + t * R + r] = d;
            }
        }
        const int whole = kc == nb;
        for (int64_t r = r0; r < r1; r += R) {
            const int nr = (int)(r1 - r < R ? r1 - r : R);
            const uint8_t *wrow[8];
            for (int i = 0; i < R; i++) wrow[i] = w + (size_t)(r + (i < nr ? i : nr - 1)) * wrb + (size_t)c0 * BB;
            _Alignas(64) float a[16];
            for (int l = 0; l < 16; l++) {
                const int t = l / R, i = l % R;
                a[l] = (c0 > 0 && t < NT && i < nr) ? y[t * ldy + r + i] : 0.0f;
            }
            __m512 acc = _mm512_load_ps(a);
            const size_t gb = (size_t)R * wrb; /* whole groups ahead, at least G4X_Q8QPD bytes */
            const char *pfc = (const char *)w + (size_t)r * wrb + gb * ((G4X_Q8QPD + gb - 1) / gb);
            for (int b = 0; b < kc; b++) {
                if (whole) { /* rows r.. are one contiguous region: R * BB bytes consumed per block */
                    const char *lo = pfc + (size_t)b * R * BB;
                    for (const char *q = (const char *)((uintptr_t)lo & ~(uintptr_t)63); q < lo + R * BB; q += 64)
                        _mm_prefetch(q, G4X_Q8QH);
                } else
                    for (int i = 0; i < R; i++) _mm_prefetch((const char *)wrow[i] + (size_t)(b + 16) * BB, G4X_Q8QH);
                const __m512i C = _mm512_load_si512(cq + (size_t)b * 16);
                __m512i D[8];
                uint16_t dh[8];
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) {
                    const uint8_t *p = wrow[i] + (size_t)b * BB;
                    memcpy(&dh[i], p, 2);
                    const __m512i W = QT == QT_Q8_0 ? _mm512_setzero_si512() : q_unpack2(QT, p, BB, 0, 1);
                    __m512i d = C;
#pragma GCC unroll 4
                    for (int v = 0; v < NV; v++)
                        d = _mm512_dpbusd_epi32(d, q8q_wv(QT, NTL, p, W, v), _mm512_load_si512(xq + ((size_t)b * NV + v) * 64));
                    D[i] = d;
                }
                __m512i Sv;
                __m512 dw;
                if (NTL == 8) {
                    Sv = g4x_merge(D[0], D[1], 1);
                    uint32_t h2;
                    memcpy(&h2, dh, 4);
                    dw = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(_mm_cvtph_ps(_mm_cvtsi32_si128((int)h2)))));
                } else if (NTL == 4) {
                    Sv = g4x_merge(g4x_merge(D[0], D[1], 1), g4x_merge(D[2], D[3], 1), 2);
                    uint64_t h4;
                    memcpy(&h4, dh, 8);
                    dw = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h4)));
                } else {
                    const __m512i U0 = g4x_merge(g4x_merge(D[0], D[1], 1), g4x_merge(D[2], D[3], 1), 2);
                    const __m512i U1 = g4x_merge(g4x_merge(D[4], D[5], 1), g4x_merge(D[6], D[7], 1), 2);
                    Sv = g4x_merge(U0, U1, 4);
                    dw = _mm512_broadcast_f32x8(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)));
                }
                const __m512 dd = _mm512_mul_ps(dw, _mm512_load_ps(dq + (size_t)b * 16));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(Sv), dd));
            }
            _mm512_store_ps(a, acc);
            for (int l = 0; l < 16; l++) {
                const int t = l / R, i = l % R;
                if (t < NT && i < nr) y[t * ldy + r + i] = a[l];
            }
        }
    }
}

G4_AI void q_gemm(const int NT, const int QT, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,
                  int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
    const int64_t nb = k / 32;
    int KC = (QBUF / (NT * 32 + 64)) & ~15;
    if (KC > nb) KC = (int)nb;
    const int BB = q_block_bytes(QT);
    if (G4X_Q8Q && NT >= 2 && NT <= (QT == QT_Q8_0 ? G4X_Q8QMAX : G4X_Q4QMAX)) {
        q8q_gemm(NT, QT, w, wrb, x, xrb, y, ldy, k, r0, r1);
        return;
    }
    if (NT > (QT == QT_Q8_0 ? G4X_Q8G : G4X_Q4G)) {
        q8t_gemm(NT, QT, w, wrb, x, xrb, y, ldy, k, r0, r1);
        return;
    }
    _Alignas(64) uint8_t xu[QBUF];
    _Alignas(64) float dxp[QBUF / 32];
    _Alignas(64) int32_t xc[QBUF / 32];
    if (NT == 1) {
        const int bias = q_bias(QT);
        for (int64_t c0 = 0; c0 < nb; c0 += KC) {
            const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
            q_prepare1(x, c0, kc, xu, dxp, xc, bias);
            for (int64_t r = r0; r < r1; r += 16) {
                _Alignas(64) float acc[16];
                const int nr = r1 - r < 16 ? (int)(r1 - r) : 16;
                for (int i = 0; i < 16; i++) acc[i] = (c0 > 0 && i < nr) ? y[r + i] : 0.0f;
                q_rows16(QT, w + (size_t)r * wrb + (size_t)c0 * BB, wrb, nr, xu, dxp, xc, kc, acc, r + 16 < r1);
                for (int i = 0; i < nr; i++) y[r + i] = acc[i];
            }
        }
        return;
    }
    const int R = 16 / NT, NI = R * NT;
    const int TG = G4X_QTG; /* row groups per tile (more rows share the activations in L1, but more memory streams) */
    int rowof[16];
    for (int i = 0; i < 16; i++) rowof[i] = (i < NI ? i : 0) / NT;
    const __m512i rowidx = _mm512_loadu_si512(rowof);
    for (int64_t c0 = 0; c0 < nb; c0 += KC) {
        const int kc = (int)(nb - c0 < KC ? nb - c0 : KC);
        const int kcp = (kc + 15) & ~15;
        q_prepare(x, xrb, NT, c0, kc, kcp, xu, dxp);
        /* dx per item lane, block-major: reuse the tail of dxp's storage is not possible; build in place */
        float *dxi = (float *)(xu + (size_t)NT * kcp * 32); /* fits: NT*kcp*32 + kcp*64 <= QBUF checked below */
        for (int b = 0; b < kcp; b++)
            for (int i = 0; i < 16; i++)
                dxi[b * 16 + i] = i < NI ? dxp[(size_t)(i % NT) * kcp + (b & ~15) + q_lane_of_block(b & 15)] : 0.0f;
        for (int64_t rt = r0; rt < r1; rt += (int64_t)TG * R) {
            const uint8_t *wrow[16][16];
            int nrs[16];
            __m512 acc[16];
            int ng = 0;
            for (int gi = 0; gi < TG; gi++) {
                const int64_t r = rt + (int64_t)gi * R;
                if (r >= r1) break;
                const int nr = (int)(r1 - r < R ? r1 - r : R);
                nrs[gi] = nr;
                for (int i = 0; i < R; i++) wrow[gi][i] = w + (size_t)(r + (i < nr ? i : nr - 1)) * wrb + (size_t)c0 * BB;
                _Alignas(64) float a[16];
                for (int i = 0; i < 16; i++) a[i] = (c0 > 0 && i < NI && i / NT < nr) ? y[(i % NT) * ldy + r + i / NT] : 0.0f;
                acc[gi] = _mm512_load_ps(a);
                ng++;
            }
            const int64_t rn = rt + (int64_t)TG * R; /* the next tile's rows, one region when rows are whole */
            const size_t pstep = ((size_t)TG * R * wrb / ((kc + 15) / 16) + 63) & ~(size_t)63;
            for (int g = 0; g < kc; g += 16) {
                const int cnt = kc - g < 16 ? kc - g : 16;
                if (G4X_QGPF && (size_t)kc * BB == wrb && rn < r1) {
                    const char *q = (const char *)(w + (size_t)rn * wrb) + (size_t)(g / 16) * pstep;
                    const size_t lim = (size_t)(r1 - rn) * wrb, o0 = (size_t)(g / 16) * pstep;
                    for (size_t o = 0; o < pstep && o0 + o < lim; o += 64) {
                        if (G4X_QGPF == 1) _mm_prefetch(q + o, _MM_HINT_T0);
                        else _mm_prefetch(q + o, _MM_HINT_T1);
                    }
                }
                for (int gi = 0; gi < ng; gi++) q_group16(NT, QT, wrow[gi], xu, dxi, kcp, g, cnt, &acc[gi], rowidx);
            }
            for (int gi = 0; gi < ng; gi++) {
                const int64_t r = rt + (int64_t)gi * R;
                _Alignas(64) float a[16];
                _mm512_store_ps(a, acc[gi]);
                for (int i = 0; i < NI; i++)
                    if (i / NT < nrs[gi]) y[(i % NT) * ldy + r + i / NT] = a[i];
            }
        }
    }
}

#define Q_CASES(QT)                                                                                   \
    switch (n_tok) {                                                                                  \
    case 1: q_gemm(1, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 2: q_gemm(2, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 3: q_gemm(3, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 4: q_gemm(4, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 5: q_gemm(5, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 6: q_gemm(6, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 7: q_gemm(7, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 8: q_gemm(8, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 9: q_gemm(9, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 10: q_gemm(10, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 11: q_gemm(11, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 12: q_gemm(12, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 13: q_gemm(13, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 14: q_gemm(14, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    case 15: q_gemm(15, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    default: q_gemm(16, QT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                \
    }

#define Q_ENTRY(NAME, QT)                                                                             \
    static void NAME##_tile(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,     \
                            int64_t ldy, int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {          \
        Q_CASES(QT)                                                                                   \
    }                                                                                                 \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,            \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                     \
        for (int64_t t = 0; t < n_tok; t += 16)                                                       \
            NAME##_tile((const uint8_t *)w, wrb, (const uint8_t *)x + (size_t)t * xrb, xrb,           \
                        y + t * ldy, ldy, n_tok - t < 16 ? n_tok - t : 16, k, r0, r1);                \
    }

Q_ENTRY(g4_gemm_q8_0_q8_0_avx512, QT_Q8_0)
Q_ENTRY(g4_gemm_q4_0_q8_0_avx512, QT_Q4_0)
Q_ENTRY(g4_gemm_q5_0_q8_0_avx512, QT_Q5_0)

/* ---- float weights: 16 lanes, lane l sums w[i]*x[i] for i % 16 == l, then the fixed fold ---- */
enum { FT_F32, FT_F16, FT_BF16 };

G4_AI __m512 f_load(const int FT, const uint8_t *p) {
    if (FT == FT_F32) return _mm512_loadu_ps(p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (FT == FT_F16) return _mm512_cvtph_ps(h); /* NaN payloads only differ by the quiet bit, which
                                                    the first multiply sets anyway in both versions */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

G4_AI float f_fold(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
    return _mm_cvtss_f32(d);
}

G4_AI void f_gemm(const int NT, const int FT, const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,
                  int64_t ldy, int64_t k, int64_t r0, int64_t r1) {
    const int ES = FT == FT_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * wrb;
        __m512 acc[16];
        for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k; i += 16) {
            const __m512 wv = f_load(FT, wr + (size_t)i * ES);
            for (int t = 0; t < NT; t++)
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(wv, _mm512_loadu_ps((const float *)(x + (size_t)t * xrb) + i)));
        }
        for (int t = 0; t < NT; t++) y[t * ldy + r] = f_fold(acc[t]);
    }
}

#define F_CASES(FT)                                                                                   \
    switch (n_tok) {                                                                                  \
    case 1: f_gemm(1, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 2: f_gemm(2, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 3: f_gemm(3, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 4: f_gemm(4, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 5: f_gemm(5, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 6: f_gemm(6, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 7: f_gemm(7, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    case 8: f_gemm(8, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                  \
    default: f_gemm(8, FT, w, wrb, x, xrb, y, ldy, k, r0, r1); break;                                 \
    }

#define F_ENTRY(NAME, FT)                                                                             \
    static void NAME##_tile(const uint8_t *w, size_t wrb, const uint8_t *x, size_t xrb, float *y,     \
                            int64_t ldy, int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {          \
        F_CASES(FT)                                                                                   \
    }                                                                                                 \
    void NAME(const void *w, size_t wrb, const void *x, size_t xrb, float *y, int64_t ldy,            \
              int64_t n_tok, int64_t k, int64_t r0, int64_t r1) {                                     \
        for (int64_t t = 0; t < n_tok; t += 8)                                                        \
            NAME##_tile((const uint8_t *)w, wrb, (const uint8_t *)x + (size_t)t * xrb, xrb,           \
                        y + t * ldy, ldy, n_tok - t < 8 ? n_tok - t : 8, k, r0, r1);                  \
    }

F_ENTRY(g4_gemm_f32_f32_avx512, FT_F32)
F_ENTRY(g4_gemm_f16_f32_avx512, FT_F16)
F_ENTRY(g4_gemm_bf16_f32_avx512, FT_BF16)
