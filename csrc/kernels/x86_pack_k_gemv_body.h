/* x86_pack_k_gemv_body.h — Q4_K's packed one-token order (q4_K_dot_pack's, vec_dot's) on up to four tokens per
 * pass over an 8-row group, each token's sums its own: the products ggml's repacked mul_mat_id computes with one
 * GEMV per token, the group's scales decoded once for the four (ffn/moe_mm.c, an expert's rows of a batch).
 * Included by x86.c after x86_pack_k_body.h, once per target (X86_TARGET, X86_FN). */

/* s[t·s_stride + r] = row r of the group · token t (xq + t·x_stride bytes), r < 8, t < n_tok ≤ 4; each bit for bit
 * q4_K_dot_pack's (twin: q4_K_vec_dot in ref_k.h, per row and token). */
static X86_TARGET void X86_FN(q4_K_dot_pack_n)(int64_t n, float *s, size_t s_stride, const void *grp, const void *xq,
                                               size_t x_stride, int32_t n_tok) {
    switch (n_tok) {
    case 4: X86_FN(q4_K_pack_rows)(n, s, s_stride, grp, xq, x_stride, 4, 0); break;
    case 3: X86_FN(q4_K_pack_rows)(n, s, s_stride, grp, xq, x_stride, 3, 0); break;
    case 2: X86_FN(q4_K_pack_rows)(n, s, s_stride, grp, xq, x_stride, 2, 0); break;
    default: X86_FN(q4_K_pack_rows)(n, s, s_stride, grp, xq, x_stride, 1, 0); break;
    }
}
