/* ffn/sparse.h — the sparse FFN of one layer (ffn/sparse.c), called by forward.c. */
#ifndef PI2_FFN_SPARSE_H
#define PI2_FFN_SPARSE_H
#include <stdint.h>

#include "model.h"
#include "pi2.h"

/* c->o[t] = the FFN of c->xn[t] for t < n (before any post-FFN norm), by the context's rule
 * (pi2_ctx_set_ffn); uses the gate, up and ffn_* buffers as scratch. PI2_ERR_IO and friends: a streamed
 * context's bundles could not be read. */
pi2_status pi2_ffn_sparse(pi2_ctx *c, const pi2_layer *L, int32_t il, int32_t n);
/* The parts (bit PI2_PART_*) the FFN of n tokens of layer L reads unit by unit, choosing them per token: the
 * bundles when one token makes one pass over its active neurons' bundles, the gate rows when one token's predicted
 * set chooses them. The read pipeline reads every other streamed part whole (pi2_pipeline_begin_layer). */
uint32_t pi2_ffn_unit_parts(const pi2_ctx *c, const pi2_layer *L, int32_t n);
/* One token's n ascending neurons idx, by groups of PI2_FFN_GROUP: c->ffn_group_start[g] = where group g's
 * entries of idx start (g <= the group count, which it returns). */
int32_t pi2_ffn_group_starts(pi2_ctx *c, const int32_t *idx, int32_t n);

#endif
