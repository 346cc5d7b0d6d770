/* ffn_sparse.h — the sparse FFN of one layer (ffn_sparse.c), called by forward.c. */
#ifndef PI2_FFN_SPARSE_H
#define PI2_FFN_SPARSE_H
#include <stdint.h>

#include "pi2.h"
#include "model.h"

/* c->o[t] = the FFN of c->xn[t] for t < n (before any post-FFN norm), by the context's rule
 * (pi2_ctx_set_ffn); uses the gate, up and ffn_* buffers as scratch. PI2_ERR_IO and friends: a streamed
 * context's bundles could not be read. */
pi2_status pi2_ffn_sparse(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n);
/* Before layer il's attention, in a streamed context: the reads of the regions pi2_ffn_sparse will load whole
 * (a batch's bundles and streamed gate rows; a single token's streamed gate rows under rules that need them all)
 * are submitted (pi2_cache_ahead), or, for one token over bundles, those of the clusters nearly every token needs
 * (pi2_cache_early); they land while attention computes. */
pi2_status pi2_ffn_sparse_early(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n);

#endif
