/* context.h — the evaluation context (internal): KV cache, scratch buffers, pool, trace hook.
 * Created by context.c, used by forward.c. Buffer shapes are given per field; B is n_batch. */
#ifndef PI2_CONTEXT_H
#define PI2_CONTEXT_H
#include <stdatomic.h>

#include "internal.h"
#include "matmul.h"
#include "model.h"
#include "threadpool.h"

struct pi2_ctx {
    const pi2_model *m;
    pi2_ctx_params p;
    pi2_pool *pool;
    pi2_matmul_env mm;           /* pool, impl and the quantized-activation scratch */
    const pi2_type_traits *embd; /* traits of token_embd's type (to_float) */
    int32_t n_past;              /* positions 0..n_past-1 of the cache are valid */
    _Atomic int32_t abort;       /* set by pi2_abort; checked per layer */
    _Atomic int32_t busy;        /* a decode is running (a second concurrent one is refused) */
    pi2_trace_fn trace;
    void *trace_user;
    pi2_fp16 *k_cache;           /* F16 keys: [n_layer][n_head_kv * head_dim][k_ld] (transposed) halves, positions
                                    0..n_past-1 of each row used; quantized keys: k_blocks, the same buffer
                                    (kv_quant.c) */
    int32_t k_ld;                /* F16 keys: halves from one row of k_cache to the next, at most pi2_kv_k_ld(n_ctx);
                                    grows with the positions in use (kv_rows.c) */
    uint8_t *k_blocks;           /* Q8_0 keys: [n_layer][n_ctx][k_cell_bytes], rotated by k_rot; NULL for F16 */
    const pi2_type_traits *kt;   /* the Q8_0 keys' traits (quantize_act, vec_dot, to_float) */
    size_t k_cell_bytes;         /* bytes of one cell's keys in k_blocks */
    int32_t k_rot;               /* Hadamard size of the query/key rotation, 0: none (pi2_kv_rot_size) */
    uint8_t *v_blocks;           /* quantized values (flash attention): [n_layer][n_ctx][v_cell_bytes] in the v_cache
                                    buffer; NULL for F16 values (halves in v_cache) */
    const pi2_type_traits *vt;   /* their traits (to_float) */
    size_t v_cell_bytes;         /* bytes of one cell's values in v_blocks */
    int32_t v_rot;               /* Hadamard size of the value/output rotation (64 for a quantized V whose head_dim_v
                                    64 divides, as llama.cpp's attn_rot_v), 0: none */
    pi2_fp16 *v_cache;           /* [n_layer][n_ctx][n_head_kv * head_dim_v] F16 values (halves) */
    size_t kv_mapped[2];         /* k_cache's and v_cache's mappings (kv_mem.c) */
    float *x;                    /* [B][n_embd] residual stream */
    float *xn;                   /* [B][n_embd] normed block input */
    float *q;                    /* [B][n_head * head_dim] */
    float *k;                    /* [B][n_head_kv * head_dim] */
    float *v;                    /* [B][n_head_kv * head_dim_v] */
    float *att;                  /* [B][n_head * head_dim_v] attention before attn_output */
    float *o;                    /* [B][n_embd] output of attn_output or ffn_down */
    float *gate, *up;            /* [B][n_ff] */
    float *rope;                 /* [2][B][n_rot] cos/sin pairs per position: [0] rope_base, [1] local */
    float *scores;               /* [n_threads][n_ctx] attention weights */
    float *qf;                   /* [n_threads][head_dim] a query head rounded to F16 */
    float *acc;                  /* [n_threads][attention accumulators] (pi2_attn_acc_floats) */
    /* the sparse FFN (ffn/sparse.c); buffers allocated by pi2_ctx_set_ffn */
    pi2_ffn_params ffn;          /* rule; ffn.thresholds points to ffn_thresholds */
    float *ffn_thresholds;       /* [n_layer] */
    float *ffn_score;            /* [B][n_ff] act(gate), the score of the rules */
    int32_t *ffn_idx;            /* [B][n_ff] active neurons of each token, ascending */
    int32_t *ffn_n_active;       /* [B] */
    uint8_t *ffn_xq;             /* [B][row of up's activation format] */
    int32_t *ffn_group_start;    /* [n_ff/GROUP + 2] one token's active list split by neuron group */
    float *ffn_part;             /* [n_ff/GROUP + 1][n_embd] one token's partial sums per group */
    struct pi2_pipeline *pipeline; /* the read pipeline over the neuron cache when streamed (pi2_ctx_set_stream) */
    struct pi2_ffn_pred *ffn_pred; /* PI2_FFN_PREDICTED_GATE's parameters and buffers (ffn/predicted.c), or NULL */
    struct pi2_ffn_pwri *ffn_pwri; /* PI2_FFN_PWRI_PREDICTOR's buffers (ffn/pwri.c), or NULL */
    int64_t ffn_tokens;          /* statistics since pi2_ctx_set_ffn */
    int64_t *ffn_active;         /* [n_layer] */
    struct pi2_moe *moe;         /* the MoE family's buffers (ffn/moe.c), or NULL for the other architectures */
    struct pi2_nnapi_hot *nnapi_hot; /* a single token's hot prefix on NNAPI (nnapi/hot_ffn.c), or NULL: CPU only */
};

#endif
