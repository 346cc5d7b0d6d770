/* ffn/gate_rows.h — one token's gate rows of a list of neurons and its active set from them (gate_rows.c): the one
 * single-token step of the two predictor rules (PI2_FFN_PREDICTED_GATE: the list is the predicted set P, filtered
 * by the threshold; PI2_FFN_PWRI_PREDICTOR: the list is the active set). */
#ifndef PI2_FFN_GATE_ROWS_H
#define PI2_FFN_GATE_ROWS_H
#include <stdint.h>

#include "model.h"
#include "pi2.h"

/* gate[k] = gate row list[k] · x for the n ascending neurons of one token's list, x = c->xn[0] quantized into xq
 * (the gate's activation format); from the mapping, or through the read pipeline when the gate rows stream (each
 * group of the list computed as soon as its reads land). With a trace hook, c->gate = those values, 0 elsewhere.
 * PI2_ERR_IO: a streamed gate read failed. */
pi2_status pi2_ffn_gate_rows(pi2_ctx *c, const pi2_layer *L, int32_t il, const int32_t *list, int32_t n, float *gate,
                             uint8_t *xq);

/* One token of a predictor rule: pi2_ffn_gate_rows of the list, then act[k] = act(gate[k]) (act may be gate); with a
 * threshold, the active set (c->ffn_idx, c->ffn_n_active[0]) is the list's neurons with |act| > *threshold, else the
 * list is already the active set; c->ffn_score[i] = act of each active neuron i. PI2_ERR_IO as pi2_ffn_gate_rows. */
pi2_status pi2_ffn_one_token(pi2_ctx *c, const pi2_layer *L, int32_t il, const int32_t *list, int32_t n,
                             const float *threshold, float *gate, float *act, uint8_t *xq);

#endif
