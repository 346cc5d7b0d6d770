/* ffn/gate_rows.h — one token's gate rows of a list of neurons (gate_rows.c): the gate step the two predictor rules
 * share (PI2_FFN_PREDICTED_GATE: the predicted set P; PI2_FFN_PWRI_PREDICTOR: the active set). */
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

#endif
