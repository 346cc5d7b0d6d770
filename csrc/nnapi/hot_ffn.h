/* nnapi/hot_ffn.h — the sparse FFN's hook into the NNAPI delegate for a single token's hot prefix (nnapi/hot_ffn.c).
 * Called by ffn/sparse.c in this order: start (before the gate rows), take_hot (after the active set),
 * finish (after the CPU's cold neurons). */
#ifndef PI2_NNAPI_HOT_FFN_H
#define PI2_NNAPI_HOT_FFN_H
#include "context.h"

/* Start layer il's hot-prefix graph on c->xn[0]; 1 when started (the caller must then call take_hot and
 * finish), 0 when the layer is the CPU's alone (no graph, or the graph failed now or before). */
int pi2_nnapi_hot_start(pi2_ctx *c, int32_t il);
/* Drop the started layer's hot neurons from the token's active list (ffn_idx, ffn_n_active[0]), kept aside. */
void pi2_nnapi_hot_take_hot(pi2_ctx *c);
/* Wait for the run. s is the CPU part's status. Returns 0: c->o holds the CPU part plus the graph's
 * output (or s was an error: c->o is left to the caller); 1: the run failed, the active list is
 * restored and the caller computes the layer again on the CPU. */
int pi2_nnapi_hot_finish(pi2_ctx *c, pi2_status s);
void pi2_nnapi_hot_free(struct pi2_nnapi_hot *f);
/* pi2_ctx_set_nnapi(PI2_NNAPI_HOT). */
pi2_status pi2_nnapi_hot_set(pi2_ctx *c, pi2_nnapi *d, const int32_t *n_hot);
/* Bytes the attached hot prefix holds now; layer-tokens it computed, and those the CPU computed after a failure. */
size_t pi2_nnapi_hot_bytes(const pi2_ctx *c);
int64_t pi2_nnapi_hot_runs(const pi2_ctx *c, int64_t *fallbacks);

#endif
