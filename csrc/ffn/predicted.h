/* ffn/predicted.h — the PI2_FFN_PREDICTED_GATE rule of the sparse FFN (ffn/predicted.c), called by context.c,
 * forward.c and ffn/sparse.c. */
#ifndef PI2_FFN_PREDICT_H
#define PI2_FFN_PREDICT_H
#include <stdint.h>

#include "model.h"
#include "pi2.h"

struct pi2_ffn_pred;

/* Check p (rule PI2_FFN_PREDICTED_GATE) against the model, size the context's predictor buffers (once) and copy the
 * cuts. PI2_ERR_INVALID: a bad kind, input or NULL cuts, a layer without the kind's tensors; PI2_ERR_NOMEM. */
pi2_status pi2_ffn_pred_set(pi2_ctx *c, const pi2_ffn_params *p);
void pi2_ffn_pred_free(struct pi2_ffn_pred *pred);
/* Bytes the rule's buffers take in a context of params p (n_batch capped at n_ctx); 0 for a model without a
 * pi2-made predictor (pi2_ctx_query). */
size_t pi2_ffn_pred_bytes(const pi2_model *m, const pi2_ctx_params *p);

/* forward.c, after attn_norm: keep c->xn [n][n_embd] when the predictor reads the layer's input. */
void pi2_ffn_pred_note_input(pi2_ctx *c, int32_t n);

/* P of each of the n tokens of layer il from its predictor; for one token also the gate rows of P only (from the
 * neuron cache when the gate rows stream) and the active set: c->ffn_idx / ffn_n_active[0] / ffn_score[active] as
 * select_task leaves them (*done = 1); for a batch *done = 0: the caller computes every gate row and calls
 * pi2_ffn_pred_select per token. PI2_ERR_IO: a streamed gate read failed. */
pi2_status pi2_ffn_predict(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n, int *done);

/* |P| of layer il summed over the tokens since pi2_ctx_set_ffn (0 under other rules). */
int64_t pi2_ffn_pred_count(const pi2_ctx *c, int32_t il);

/* Token t of a batch: its active neurons P ∩ {|s_i| > t_L} (s = act(gate)) into idx, ascending; their count. */
int32_t pi2_ffn_pred_select(const pi2_ctx *c, int32_t il, int32_t t, const float *s, int32_t *idx);

#endif
