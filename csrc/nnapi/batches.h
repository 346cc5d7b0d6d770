/* nnapi/batches.h — the context's hook into the NNAPI delegate for dense prompt-batch products (batches.c). */
#ifndef PI2_NNAPI_BATCHES_H
#define PI2_NNAPI_BATCHES_H
#include "matmul.h"

/* 0: the delegate computed every mm[i].out; 1: not taken (too few tokens, not a delegated group, or a
 * failure now or before): the caller computes on the CPU. */
int pi2_nnapi_batches_matmul(struct pi2_npu *npu, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm);
void pi2_nnapi_batches_free(struct pi2_npu *npu);
/* pi2_ctx_set_nnapi(PI2_NNAPI_BATCHES). */
pi2_status pi2_nnapi_batches_set(pi2_ctx *c, pi2_nnapi *d, int32_t min_batch);
/* Bytes of the attached weight copies; products the delegate computed, and those handed back to the CPU. */
size_t pi2_nnapi_batches_bytes(const pi2_ctx *c);
int64_t pi2_nnapi_batches_runs(const pi2_ctx *c, int64_t *fallbacks);

#endif
