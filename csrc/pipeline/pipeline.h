/* ffn_groups.h — one token's neurons by groups, and tasks per group as the neuron cache fills them (ffn_groups.c),
 * used by ffn_sparse.c and ffn_predict.c. */
#ifndef PI2_FFN_GROUPS_H
#define PI2_FFN_GROUPS_H
#include <stdint.h>

#include "pi2.h"
#include "threadpool.h"

/* One token's n ascending neurons idx, by groups of PI2_FFN_GROUP: c->ffn_group_start[g] = where group g's
 * entries of idx start (g <= the group count, which it returns). */
int32_t pi2_ffn_group_starts(pi2_ctx *c, const int32_t *idx, int32_t n);

/* After pi2_ffn_group_starts: run fn (task = an index into c->ffn_task_group) over every group with entries in
 * idx as the clusters of `part` of the neuron cache it needs become present: those present at once while the
 * misses are read, then each group as soon as its reads land. PI2_ERR_IO: a read failed. */
pi2_status pi2_ffn_stream_groups(pi2_ctx *c, int32_t part, int32_t il, const int32_t *idx, int32_t n,
                                 pi2_task_fn fn, void *arg);

#endif
