/* Experiment (not used by the engine): Q4_K in an 8-row interleaved layout ("R8"), one token and
 * 2..4-token products, against the row-layout avx2 kernel of this tree, bit-identical outputs.
 * Kept as measured. The engine's version (csrc/avx2/gemm_q4k_r8_avx2.c, G4_TYPE_Q4_K_R8) differs:
 * its row groups go outside the token chunks (gemm_r8 below re-streams every row per 4-token
 * chunk, which only an L2-resident test hides), its 4-token chunk keeps fewer vectors live (this
 * one spills), and it prefetches two superblocks ahead.
 *
 * Layout, per group of 8 rows and superblock (1152 B, the same bytes as 8 row blocks): the 8 d,
 * the 8 dmin, the 12 scale bytes of each row as 3 dwords transposed (a[w][row]), then the codes of
 * each 32-byte group g as 8 vectors of one dword per row (q[g][i][row]). A vector of codes then
 * holds 4 elements of each of the 8 rows (lane = row): one broadcast activation dword per vector,
 * maddubs, 8 int16 partial sums per sub-block (|sum| <= 8 x 2 x 15 x 128 = 30720 < 2^15), one
 * madd by the 8 rows' scales (a byte shuffle of the transposed scale dwords), mins by 4 madds; no
 * horizontal sums. Same integers S and M and the same float ops as the row kernels (acc + (d dx S
 * - dmin dx M)), hence the same bits.
 *
 *   B=$(ls -d build/temp.linux-x86_64-*)      # the static kernel libraries of a setup.py build
 *   cc -O3 -std=gnu11 -ffp-contract=off -mavx2 -mfma -mf16c -mbmi2 -Icsrc bench/experiments/q4k_r8.c \
 *      $B/libg4_avx2.a $B/libg4_ref.a -lm -o /tmp/q4k_r8
 *   taskset -c 0 /tmp/q4k_r8 5376 128 1 1000      # K ROWS NTOK REPS: 128 rows = L2-resident
 *
 * Measured 2026-12-06, AMD EPYC Zen 3 VM (2 vCPUs, AVX2), k = 5376, ns per row x token x 32 elements
 * (min of REPS; both kernels in the same process, alternated):
 *   L2, n=1: row 1.60-1.77, R8 0.70-0.73 (0.41-0.44x); n=2 0.55x; n=4 1.03x; n=8 0.89x
 *   memory (32768 rows, 700 MiB), n=1, one process: 1.63 both (one core's read bandwidth)
 *   memory, two processes on the two CPUs: row 2.20-2.27, R8 1.78-1.90 (0.81-0.84x): R8 reads
 *   ~19.6 GB/s in all, the row layout ~16 GB/s (compute-bound when both cores share the memory)
 * So R8 would lift 2-thread Q4_K decode GEMVs by ~20 % here; for 4 tokens it does not help (the
 * per-token maddubs / int16 adds / broadcasts are the same work as the row kernels' TOK path, so
 * t(4)/t(1) stays ~1.8: Zen 3 has two pipes for vpmaddubsw). What the engine would still need:
 * a fast many-token path on R8 (unpack a group's rows into a row-layout buffer and reuse the
 * TOKX2 kernels), repack at load (new anonymous memory; the NUMA placement modes that re-map file
 * pages), 8-aligned row splits, and a dequant_row for the layout. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "g4_blocks.h"

void g4_gemm_q4_K_q8_K_avx2(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t, int64_t, int64_t);
void g4_quantize_row_q8_K_avx2(const float *, void *, int64_t);

/* R8 block: 8 rows x one superblock */
typedef struct {
    uint16_t d[8], dmin[8];   /* 32 B */
    uint32_t a[3][8];         /* 96 B: dword w of row r's 12 scale bytes at a[w][r] */
    uint32_t q[4][8][8];      /* 1024 B: group g, dword i, row r */
} blk_r8;                     /* 1152 B */

static void repack(const uint8_t *w, size_t wrb, int64_t rows, int64_t nb, blk_r8 *out) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8)
        for (int64_t b = 0; b < nb; b++) {
            blk_r8 *o = &out[(r0 / 8) * nb + b];
            for (int r = 0; r < 8; r++) {
                const block_q4_K *s = (const block_q4_K *)(w + (size_t)(r0 + r) * wrb) + b;
                memcpy(&o->d[r], &s->d, 2);
                memcpy(&o->dmin[r], &s->dmin, 2);
                for (int wd = 0; wd < 3; wd++) memcpy(&o->a[wd][r], s->scales + 4 * wd, 4);
                for (int g = 0; g < 4; g++)
                    for (int i = 0; i < 8; i++) memcpy(&o->q[g][i][r], s->qs + 32 * g + 4 * i, 4);
            }
        }
}

#define AI static inline __attribute__((always_inline))
/* per-row-lane int16 pair [v, v] of byte j (0..3) of each dword */
AI __m256i bsel(__m256i v, int j) {
    const __m256i c = _mm256_setr_epi8(j, -1, j, -1, 4 + j, -1, 4 + j, -1, 8 + j, -1, 8 + j, -1, 12 + j, -1, 12 + j, -1,
                                       j, -1, j, -1, 4 + j, -1, 4 + j, -1, 8 + j, -1, 8 + j, -1, 12 + j, -1, 12 + j, -1);
    return _mm256_shuffle_epi8(v, c);
}
/* per-row-lane int16 pair [byte j, byte j+1] */
AI __m256i bpair(__m256i v, int j) {
    const __m256i c = _mm256_setr_epi8(j, -1, j + 1, -1, 4 + j, -1, 5 + j, -1, 8 + j, -1, 9 + j, -1, 12 + j, -1, 13 + j, -1,
                                       j, -1, j + 1, -1, 4 + j, -1, 5 + j, -1, 8 + j, -1, 9 + j, -1, 12 + j, -1, 13 + j, -1);
    return _mm256_shuffle_epi8(v, c);
}

/* NT tokens (1..4), 8 rows: y[t*ldy + r0 + lane] */
AI void r8_rows(const blk_r8 *B, int64_t nb, const block_q8_K *const *xt, float *y, int64_t ldy, const int NT) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3f = _mm256_set1_epi8(0x3f), m03 = _mm256_set1_epi8(0x03);
    __m256 acc[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const blk_r8 *k = &B[b];
        const __m256i A0 = _mm256_loadu_si256((const __m256i *)k->a[0]), A1 = _mm256_loadu_si256((const __m256i *)k->a[1]),
                      A2 = _mm256_loadu_si256((const __m256i *)k->a[2]);
        const __m256i sc_lo = _mm256_and_si256(A0, m3f), mn_lo = _mm256_and_si256(A1, m3f);
        const __m256i sc_hi = _mm256_or_si256(_mm256_and_si256(A2, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(A0, 6), m03), 4));
        const __m256i mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A2, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(A1, 6), m03), 4));
        __m256i S[4], M[4];
        for (int t = 0; t < NT; t++) S[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
            __m256i lo16[4], hi16[4];
            for (int t = 0; t < NT; t++) lo16[t] = hi16[t] = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)k->q[g][i]);
                const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                for (int t = 0; t < NT; t++) {
                    int32_t xl, xh;
                    memcpy(&xl, xt[t][b].qs + 64 * g + 4 * i, 4);
                    memcpy(&xh, xt[t][b].qs + 64 * g + 32 + 4 * i, 4);
                    lo16[t] = _mm256_add_epi16(lo16[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
                    hi16[t] = _mm256_add_epi16(hi16[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
                }
            }
            const __m256i sv = g < 2 ? sc_lo : sc_hi;
            const __m256i s0 = bsel(sv, (2 * g) & 3), s1 = bsel(sv, (2 * g + 1) & 3);
            for (int t = 0; t < NT; t++)
                S[t] = _mm256_add_epi32(S[t], _mm256_add_epi32(_mm256_madd_epi16(lo16[t], s0), _mm256_madd_epi16(hi16[t], s1)));
        }
        /* mins: sum_j m_j (bsums[2j] + bsums[2j+1]) */
        for (int t = 0; t < NT; t++) {
            const __m256i b8 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xt[t][b].bsums), _mm256_set1_epi16(1));
            const __m256i P = _mm256_packs_epi32(b8, b8);
            __m256i m = _mm256_madd_epi16(bpair(mn_lo, 0), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(0)));
            m = _mm256_add_epi32(m, _mm256_madd_epi16(bpair(mn_lo, 2), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(1))));
            m = _mm256_add_epi32(m, _mm256_madd_epi16(bpair(mn_hi, 0), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(4))));
            m = _mm256_add_epi32(m, _mm256_madd_epi16(bpair(mn_hi, 2), _mm256_permutevar8x32_epi32(P, _mm256_set1_epi32(5))));
            M[t] = m;
        }
        const __m256 df = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)k->d));
        const __m256 mf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)k->dmin));
        for (int t = 0; t < NT; t++) {
            const __m256 dx = _mm256_set1_ps(xt[t][b].d);
            const __m256 dd = _mm256_mul_ps(df, dx), dn = _mm256_mul_ps(mf, dx);
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(S[t])), _mm256_mul_ps(dn, _mm256_cvtepi32_ps(M[t]))));
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
}

static void gemm_r8(const blk_r8 *B, int64_t nb, const uint8_t *x, size_t xrb, float *y, int64_t ldy, int64_t nt, int64_t rows) {
    for (int64_t t0 = 0; t0 < nt; t0 += 4) {
        const int n = nt - t0 < 4 ? (int)(nt - t0) : 4;
        const block_q8_K *xt[4];
        for (int t = 0; t < n; t++) xt[t] = (const block_q8_K *)(x + (t0 + t) * xrb);
        for (int64_t r0 = 0; r0 < rows; r0 += 8) {
            const blk_r8 *G = B + (r0 / 8) * nb;
            float *yy = y + t0 * ldy + r0;
            switch (n) {
            case 1: r8_rows(G, nb, xt, yy, ldy, 1); break;
            case 2: r8_rows(G, nb, xt, yy, ldy, 2); break;
            case 3: r8_rows(G, nb, xt, yy, ldy, 3); break;
            default: r8_rows(G, nb, xt, yy, ldy, 4); break;
            }
        }
    }
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)(rs >> 16); }

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s K ROWS NTOK [REPS]  (K a multiple of 256, ROWS of 8)\n", argv[0]);
        return 2;
    }
    const int64_t k = atoll(argv[1]), rows = atoll(argv[2]), nt = atoll(argv[3]);
    const int reps = argc > 4 ? atoi(argv[4]) : 200;
    const int64_t nb = k / 256;
    if (k <= 0 || k % 256 || rows <= 0 || rows % 8 || nt <= 0 || reps <= 0) {
        fprintf(stderr, "K must be a positive multiple of 256, ROWS of 8; NTOK, REPS positive\n");
        return 2;
    }
    const size_t wrb = nb * 144, xrb = nb * 292;
    uint8_t *w = aligned_alloc(64, wrb * rows);
    for (size_t i = 0; i < wrb * rows; i++) w[i] = rnd();
    for (int64_t r = 0; r < rows; r++) for (int64_t b = 0; b < nb; b++) { uint16_t h = 0x2c00 + (rnd() & 0x3ff); memcpy(w + r * wrb + b * 144, &h, 2); h = 0x2c00 + (rnd() & 0x3ff); memcpy(w + r * wrb + b * 144 + 2, &h, 2); }
    uint8_t *x = aligned_alloc(64, xrb * nt + 64);
    float *xf = malloc(4 * k);
    for (int64_t t = 0; t < nt; t++) { for (int64_t i = 0; i < k; i++) xf[i] = ((int)(rnd() % 2001) - 1000) * 1e-3f; g4_quantize_row_q8_K_avx2(xf, x + t * xrb, k); }
    blk_r8 *B = aligned_alloc(64, sizeof(blk_r8) * (rows / 8) * nb);
    repack(w, wrb, rows, nb, B);
    float *y0 = malloc(4 * rows * nt), *y1 = malloc(4 * rows * nt);
    double b0 = 1e9, b1 = 1e9;
    for (int rep = 0; rep < reps; rep++) {
        double t = now(); g4_gemm_q4_K_q8_K_avx2(w, wrb, x, xrb, y0, rows, nt, k, 0, rows); t = now() - t; if (t < b0) b0 = t;
        t = now(); gemm_r8(B, nb, x, xrb, y1, rows, nt, rows); t = now() - t; if (t < b1) b1 = t;
    }
    int same = !memcmp(y0, y1, 4 * rows * nt);
    const double blocks = (double)rows * nt * (k / 32.0);
    printf("k=%lld rows=%lld nt=%lld: row-layout %.4f ns, R8 %.4f ns per row-token-32block; R8/row %.3f; %s\n", (long long)k, (long long)rows, (long long)nt,
           b0 * 1e9 / blocks, b1 * 1e9 / blocks, b1 / b0, same ? "bit-identical" : "DIFFERENT");
    if (!same) for (int i = 0; i < 4; i++) printf("  %g %g\n", y0[i], y1[i]);
    return 0;
}
