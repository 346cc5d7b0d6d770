/* matmul.h — y = W·x for mapped weight matrices, over the type-traits table and the pool.
 * Does: quantize each activation row once per format, then compute every output element with one
 *       vec_dot call, output rows split into tasks of whole rows (bit-identical for any thread count).
 * Does not: own weights (model.c maps them) or allocate (the caller gives the scratch). */
#ifndef PI2_MATMUL_H
#define PI2_MATMUL_H
#include <stddef.h>
#include <stdint.h>

#include "threadpool.h"

typedef struct {
    const uint8_t *data;   /* n_out rows of row_bytes, in the mapped file */
    int32_t type;          /* ggml type id */
    int64_t n_in, n_out;   /* values per row, rows */
    size_t row_bytes;
    const uint8_t *packed; /* the same rows in the x8 layout (kernels/pack.h), or NULL; used where the table has
                              the type's vec_dot_pack (dense products), the mapped rows everywhere else */
} pi2_weight;

/* One product of a group sharing the input: out [n_tok][w->n_out]. */
typedef struct {
    const pi2_weight *w;
    float *out;
} pi2_mm;

typedef struct {
    pi2_pool *pool;
    int32_t impl;          /* pi2_impl */
    uint8_t *xq;           /* scratch for quantized activations (pi2_matmul_scratch bytes) */
    struct pi2_npu *npu;   /* the NNAPI delegate's prompt-batch graphs (npu.c), or NULL: CPU only */
    /* npu's product (pi2_nnapi_batches_matmul, set with npu so matmul.c links without the delegate): 0 when done */
    int (*npu_matmul)(struct pi2_npu *npu, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm);
    /* 1: every token in vec_dot's order, as a one-token product computes it (never ggml's batch kernels): the
     * rows of a multi-context step (pi2_decode_multi) then equal separate decodes bit for bit */
    int32_t single_order;
} pi2_matmul_env;

/* Scratch bytes pi2_matmul needs for this group at n_tok tokens. */
size_t pi2_matmul_scratch(const pi2_mm *mm, int32_t n_mm, int32_t n_tok, int32_t impl);

/* mm[i].out[t][r] = row r of mm[i].w · x[t], for t < n_tok; x is [n_tok][n_in] (all w share n_in).
 * Weights whose vec_dot_type is the same share one quantized copy of x. */
void pi2_matmul(const pi2_matmul_env *env, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm);

/* out[k] = row idx[k] of w · xq for k in [k0, k1), each in vec_dot's order (the four-row kernel on four
 * consecutive rows); row i is at base + i·w->row_bytes (w->data for mapped rows; the rows must be contiguous
 * from idx[k0] to idx[k1 - 1]). xq: one token's input in w's vec_dot_type. */
void pi2_dot_row_list(const pi2_weight *w, int32_t impl, const uint8_t *base, const int32_t *idx, int32_t k0,
                      int32_t k1, float *out, const void *xq);

#endif
