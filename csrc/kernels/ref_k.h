/* ref_k.h — scalar reference Q4_K and Q6_K × Q8_K kernels in llama.cpp's x86 float order, the C twins
 * of pi2/qdot.py (dot_q4_k_repack, dot_q6_k_vec, dot_q6_k_tiled). Included once, by ref.c.
 * Does: the exact integer sums each order converts to float (per 64 values, per 256-block, per SIMD
 *       lane), then the same float multiplies, FMAs and horizontal sums as the x86 kernels.
 * Does not: choose between the single-token and the batch order (matmul.c does, by traits.h's
 *       batch rule). Every FMA is fmaf: one rounding, as vfmadd. */
#include <math.h>

/* Q4_K block i: isb[k] = Σ sc·Σ code·q8 over sub-blocks 2k, 2k+1; msb[k] = Σ mn·(bsum pair) likewise. */
static void q4_K_block_sums(const blk_q4_K *x, const blk_q8_K *y, int32_t isb[4], int32_t msb[4]) {
    for (int k = 0; k < 4; k++) {
        isb[k] = msb[k] = 0;
        for (int j = 2 * k; j < 2 * k + 2; j++) {
            uint8_t sc, mn;
            pi2_k4_scale_min(j, x->scales, &sc, &mn);
            const uint8_t *q = x->qs + 32 * k;
            int dot = 0;
            for (int l = 0; l < 32; l++) dot += ((j & 1) ? q[l] >> 4 : q[l] & 0xF) * y->qs[32 * j + l];
            isb[k] += sc * dot;
            msb[k] += mn * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
        }
    }
}

/* The repacked GEMV order (single tokens, and the last n_tok mod 4 tokens of a batch): per 256-block
 * acc = fma(isum, d_y·d_x, acc), accm = fma(msum, d_y·dmin_x, accm); result acc − accm. */
static void q4_K_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_K *x = w; const blk_q8_K *y = xq;
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t isb[4], msb[4];
        q4_K_block_sums(&x[i], &y[i], isb, msb);
        const float dd = y[i].d * pi2_fp16_to_f32(x[i].d), dm = y[i].d * pi2_fp16_to_f32(x[i].dmin);
        acc = fmaf((float)(isb[0] + isb[1] + isb[2] + isb[3]), dd, acc);
        accm = fmaf((float)(msb[0] + msb[1] + msb[2] + msb[3]), dm, accm);
    }
    *s = acc - accm;
}

/* The repacked GEMM order (tokens in whole groups of 4): the same FMAs once per 64 values. */
static void q4_K_gemm_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q4_K *x = w; const blk_q8_K *y = xq;
    float acc = 0, accm = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t isb[4], msb[4];
        q4_K_block_sums(&x[i], &y[i], isb, msb);
        const float dd = y[i].d * pi2_fp16_to_f32(x[i].d), dm = y[i].d * pi2_fp16_to_f32(x[i].dmin);
        for (int k = 0; k < 4; k++) {
            acc = fmaf((float)isb[k], dd, acc);
            accm = fmaf((float)msb[k], dm, accm);
        }
    }
    *s = acc - accm;
}

/* Q6_K value v of a block as its unsigned 6-bit code (value = code − 32). */
static inline int q6_K_code(const blk_q6_K *x, int v) {
    const int h = v / 128, k = (v / 32) % 4, l = v % 32;
    const int lo = x->ql[64 * h + l + ((k & 1) ? 32 : 0)];
    return ((k < 2 ? lo & 0xF : lo >> 4) | (((x->qh[32 * h + l] >> (2 * k)) & 3) << 4));
}

/* vec_dot_q6_K_q8_K's order (fewer than 8 tokens): int lane m = Σ scale·code·q8 over the values whose
 * index mod 32 is in [4m, 4m+4), minus 32·Σ scale·bsum of 32-value chunk m; per block
 * lane_f = fma(lane, d_y·d_x, lane_f); then hsum_float_8. */
static void q6_K_vec_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    float acc[8] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t lane[8] = {0};
        for (int v = 0; v < QK_K; v++)
            lane[(v % 32) / 4] += x[i].scales[v / 16] * q6_K_code(&x[i], v) * y[i].qs[v];
        for (int m = 0; m < 8; m++)
            lane[m] -= 32 * (y[i].bsums[2 * m] * x[i].scales[2 * m] + y[i].bsums[2 * m + 1] * x[i].scales[2 * m + 1]);
        const float dd = y[i].d * pi2_fp16_to_f32(x[i].d);
        for (int m = 0; m < 8; m++) acc[m] = fmaf((float)lane[m], dd, acc[m]);
    }
    float r[4];
    for (int m = 0; m < 4; m++) r[m] = acc[m + 4] + acc[m];
    *s = (r[0] + r[2]) + (r[1] + r[3]);
}

/* The tiled kernel's order (batches of 8 or more tokens): per block the exact Σ scale·(code − 32)·q8
 * as float, times d_x, then acc = fma(that, d_y, acc). */
static void q6_K_tiled_dot(int64_t n, float *s, const void *w, const void *xq) {
    const blk_q6_K *x = w; const blk_q8_K *y = xq;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t isum = 0;
        for (int v = 0; v < QK_K; v++) isum += x[i].scales[v / 16] * (q6_K_code(&x[i], v) - 32) * y[i].qs[v];
        acc = fmaf((float)isum * pi2_fp16_to_f32(x[i].d), y[i].d, acc);
    }
    *s = acc;
}
