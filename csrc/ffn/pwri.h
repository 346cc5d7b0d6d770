/* ffn/pwri.h — the PI2_FFN_PWRI_PREDICTOR rule of the sparse FFN (ffn/pwri.c): PowerInfer's own predictor, called
 * by context.c and ffn/sparse.c. */
#ifndef PI2_FFN_PWRI_H
#define PI2_FFN_PWRI_H
#include <stdint.h>

#include "model.h"
#include "pi2.h"

struct pi2_ffn_pwri;

/* Check p (rule PI2_FFN_PWRI_PREDICTOR) against the model and size the context's predictor buffers (once).
 * PI2_ERR_INVALID: score_up, NULL thresholds, a layer without fc1/fc2; PI2_ERR_NOMEM. */
pi2_status pi2_ffn_pwri_set(pi2_ctx *c, const pi2_ffn_params *p);
void pi2_ffn_pwri_free(struct pi2_ffn_pwri *pw);

/* The active sets of the n tokens of layer il from the predictor on c->x (the residual before ffn_norm), into
 * c->ffn_idx / ffn_n_active (c->up is scratch). One token: also the gate rows of its active neurons only and
 * ffn_score[active] = their act(gate), as select_task leaves them (*done = 1). A batch: *done = 0, and the caller computes
 * every gate and up row and act(gate) (its select_task keeps the active sets). */
pi2_status pi2_ffn_pwri(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n, int *done);

#endif
