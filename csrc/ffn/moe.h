/* moe.h — the FFN of the Mixture-of-Experts family (PI2_ARCH_MOE) and its products (internal).
 * moe.c: the router's logits, the experts grouped by expert, the shared expert, and the dense SwiGLU FFN of qwen3;
 * moe_route.c: routing (gating, top-k with libstdc++'s tie order, weights, rows grouped by expert); moe_mm.c: every product of such a model in the kernel ggml
 * picks for its type and batch (pi2/reference/moe_matmul.py). docs/moe.md is the specification. */
#ifndef PI2_FFN_MOE_H
#define PI2_FFN_MOE_H
#include <stddef.h>

#include "context.h"

/* A context's MoE buffers; B = n_batch, k = experts per token, X = experts, F = the widest FFN (expert, shared or
 * dense), W = the widest product input. A row id is t·k + j: token t's j-th expert (slot j). */
struct pi2_moe {
    int32_t k, X;
    float *logits;       /* [B][X] router logits (smallthinker: computed before attention) */
    float *probs;        /* [B][X] */
    int32_t *sel;        /* [B][k] the selected experts, best first */
    float *wts;          /* [B][k] their weights */
    int32_t *count;      /* [X] rows routed to each expert in this step */
    int32_t *start;      /* [X + 1] where each expert's rows begin in list */
    int32_t *list;       /* [B·k] row ids grouped by expert (ascending), in scan order within one */
    int32_t *active;     /* [X] the experts with rows, ascending */
    int32_t n_active;
    float *gate, *up;    /* [B·k][F] */
    float *down;         /* [B·k][n_embd] */
    float *sh;           /* [B][n_embd] the shared expert's output */
    float *shg;          /* [B] qwen2moe's shared-expert gate logit */
    uint8_t *xa;         /* activations in the weights' formats: the last pi2_moe_prep's rows, xa_row bytes apart */
    int64_t *routed;     /* [n_layer][X] rows routed to each expert since the context was made */
    size_t xa_row;
    /* streamed experts (ffn/moe_stream.c): while a layer's experts are computed from the expert cache, the bytes of
     * expert e of stream_w[i] are at stream_rows[i][e] (file layout); stream_w[i] NULL otherwise */
    const pi2_weight *stream_w[3];
    const uint8_t *const *stream_rows[3];
    struct pi2_moe_stream *stream;   /* its scratch, made on first use */
    int64_t *neuron_counts;          /* [n_layer][X][n_ff_exp] open-neuron counts (moe_neurons.c), or NULL */
    int64_t *cluster_counts;         /* [n_layer] open clusters of `cluster` neurons summed over rows, or NULL */
    int32_t cluster;
};

/* Where expert e's rows of w are, and in which layout: the expert cache's copy while it streams (file layout), else
 * w's x8 copy from moe_pack.c (*x8 = 1; Q4_0, Q4_K, Q6_K or Q8_0) or the mapping (file layout: n_out rows of row_bytes). The one place an
 * expert's bytes are found: each expert is read in the layout its pointer has; streamed experts are never repacked. */
static inline const uint8_t *pi2_moe_expert_rows(const struct pi2_moe *moe, const pi2_weight *w, int32_t e, int *x8) {
    *x8 = 0;
    for (int i = 0; i < 3; i++)
        if (moe->stream_w[i] == w) return moe->stream_rows[i][e];
    *x8 = w->packed != NULL;
    return (w->packed ? w->packed : w->data) + (size_t)e * (size_t)w->n_out * w->row_bytes;
}

/* Bytes of the buffers a context of params p on m needs (0 unless m is PI2_ARCH_MOE). */
size_t pi2_moe_bytes(const pi2_model *m, const pi2_ctx_params *p);
/* Make them (*out NULL and PI2_OK when m is not PI2_ARCH_MOE). PI2_ERR_NOMEM. */
pi2_status pi2_moe_new(const pi2_model *m, const pi2_ctx_params *p, struct pi2_moe **out);
void pi2_moe_free(struct pi2_moe *moe);

/* mm[i].out = mm[i].w · x for n_tok rows, each product in ggml's kernel for its type and batch: F32/F16 by
 * ggml_vec_dot (one row) or tinyBLAS, Q4_0 (rows % 8 == 0) by the repacked GEMV, the others by pi2_matmul. */
void pi2_moe_matmul(pi2_ctx *c, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm);

/* out[il·n_expert + e] = rows routed to expert e of layer il (zeros when the model has no experts). */
void pi2_moe_routed(const pi2_ctx *c, int64_t *out);

/* smallthinker: the router's logits of the layer input x (n rows), before attention. */
void pi2_moe_router_early(pi2_ctx *c, const pi2_layer *L, int32_t il, const float *x, int32_t n);
/* The last layer keeps rows first.. of n (the outputs): the early logits follow. */
void pi2_moe_keep_rows(pi2_ctx *c, int32_t first, int32_t n);

/* c->o[t] = the FFN of c->xn[t] for t < n: routed experts (+ the shared expert), or qwen3's dense SwiGLU. Errors only
 * when the experts stream (PI2_ERR_IO, PI2_ERR_NOMEM, PI2_ERR_INVALID). */
pi2_status pi2_moe_ffn(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n);

/* moe_route.c: moe->probs, sel and wts of tokens 0..n from moe->logits (moe_routing.route): the gating, the top
 * n_expert_used experts in std::sort's descending order, their weights (normalised, scaled). */
void pi2_moe_route(const pi2_model_params *hp, struct pi2_moe *moe, int32_t n);
/* moe->count, start, list and active from sel of n tokens: mul_mat_id's grouping, experts ascending, rows in scan
 * order. */
void pi2_moe_group_rows(struct pi2_moe *moe, int32_t n);
/* The experts pi2_moe_route would select from one row of router logits (its gating, then the same stable descending
 * order, ties included), into sel[0..k); probs, idx: scratch of n_expert. */
void pi2_moe_select(const pi2_model_params *hp, const float *logits, float *probs, int32_t *idx, int32_t *sel);

/* moe_stream.c: the expert products of layer il (gate and up, the activation, down into moe->gate/up/down) with the
 * experts read through the context's pipeline, in chunks of at most its expert slots, each expert's gate and up
 * computed as soon as its reads land: the same bits as the mapped products. */
pi2_status pi2_moe_stream_experts(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n);
void pi2_moe_stream_free(struct pi2_moe_stream *st);
/* Routing ahead for one token (when the context streams experts and asked for it): guess layer il's experts and
 * read the ones not present now. x: the hidden state to apply layer il's router to (weighted by its ffn_norm; the
 * previous layer's output), or NULL for the logits pi2_moe_router_early just computed (smallthinker). */
pi2_status pi2_moe_stream_ahead(pi2_ctx *c, const pi2_layer *L, int32_t il, const float *x);

/* Expert products (ggml_mul_mat_id): for each active expert e and each row id i of its rows, out[i][r] = row r of
 * expert e of w · the activation of i (xa row i / k when by_token, else row i), n_w tensors alike (gate and up). */
void pi2_moe_experts(pi2_ctx *c, const pi2_weight *const *w, float *const *out, int32_t n_w, int32_t by_token);
/* xa row r = row r of x (n_rows rows of n values) in the format products with `type` read; xa_row = its bytes. */
/* Bytes of one such row (64-byte multiple): floats for F32 and F16 weights, else vec_dot_type blocks. */
size_t pi2_moe_act_bytes(int32_t type, int64_t n);
void pi2_moe_prep(pi2_ctx *c, int32_t type, const float *x, int32_t n_rows, int64_t n);

/* The in-memory Q4_0, Q4_K, Q6_K and Q8_0 experts of m copied into the x8 layout (moe_pack.c; a no-op when m has none, they are
 * done, or this CPU / table impl has no packed kernel for them); their bytes go into m->packed_bytes. PI2_ERR_NOMEM. */
pi2_status pi2_moe_repack(pi2_model *m, int32_t impl);

/* moe_relu.c: under the FFN rule PI2_FFN_RELU, a single token's ReLU experts whose up rows can be computed one neuron
 * at a time (Q4_0, F32, F16): gate for every row routed to an expert, up only for the neurons some routed row has
 * gate > 0 for (the others are never read by the activation), into moe->gate / moe->up; the dense products' bits. A
 * batch's experts are computed whole (n > 1: the union of its tokens' open neurons is nearly every row, and the
 * dense kernels pass over an expert's rows once for four tokens). */
int pi2_moe_relu_ok(const pi2_ctx *c, const pi2_layer *L, int32_t n);
void pi2_moe_relu_gate_up(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n);
/* The up rows alone, for the active experts whose gate rows moe->gate already holds (a streamed converted file's two
 * phases: gate, then the clusters its open neurons are in, then these); counts ffn_active, not ffn_tokens. */
void pi2_moe_relu_up(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n);

/* moe_down_rows.c: moe->down[i] = expert sel[i]'s down rows summed over h = moe->gate[i] (after the activation), for
 * the n·k rows of a converted file's layer (down_rows_exps). */
void pi2_moe_down_rows(pi2_ctx *c, const pi2_layer *L, int32_t n);
/* The same for the rows routed to experts[0..n_experts) only (a streamed layer's chunk); ids: scratch of n·k. */
void pi2_moe_down_rows_of(pi2_ctx *c, const pi2_layer *L, const int32_t *experts, int32_t n_experts, int32_t *ids);

/* moe_neurons.c: neuron_counts[il][e][r] += the rows routed to e whose gate row r is > 0 (moe->gate as computed). */
void pi2_moe_count_neurons(pi2_ctx *c, int32_t il);

/* ReGLU / SwiGLU as ggml computes them on a row of n: ggml_v_silu 16 at a time, libm expf for the n % 16 tail. */
void pi2_moe_activate(float *g, const float *u, int64_t n, int32_t act);

#endif
