/* ffn/select.h — the active set of a token (ffn/select.c), used by ffn/sparse.c. */
#ifndef PI2_FFN_SELECT_H
#define PI2_FFN_SELECT_H
#include <stdint.h>

#include "pi2.h"

/* Token t of layer il: c->ffn_score[t] = its scores, c->ffn_idx[t] its active neurons (ascending) and
 * c->ffn_n_active[t] their count, from c->gate[t] (and c->up[t] when the rule scores with up), by c->ffn. The
 * top-k rule reorders c->gate[t] (not needed after the scores). */
void pi2_ffn_select(pi2_ctx *c, int32_t il, int32_t t);

#endif
