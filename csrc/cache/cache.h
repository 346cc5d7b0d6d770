/* cache.h — the neuron cache of a streamed context (cache.c, cache_read.c), used by context.c, ffn_sparse.c
 * (the bundles) and ffn_predict.c (the gate rows of a predicted set).
 * Each part (bundles, gate rows) of a layer lives in its part's arena: a resident hot prefix per layer, then
 * cold cluster slots (LRU). A row of neuron i of layer il at file offset f is at arena + delta(cluster of i) + f
 * while its cluster is present; the bundles' arena offsets stay below 2 GiB so they fit the int32 index of
 * axpy_group. One part's cluster reads, or one layer's whole-region reads, are in flight at a time. */
#ifndef PI2_CACHE_H
#define PI2_CACHE_H
#include <stdint.h>

#include "model.h"
#include "pi2.h"

typedef struct pi2_cache pi2_cache;

enum { PI2_PART_BUNDLES = 0, PI2_PART_GATE = 1 };

/* Open the file, size the arenas, read every hot prefix (PI2_ERR_IO, PI2_ERR_NOMEM, PI2_ERR_INVALID,
 * PI2_ERR_UNSUPPORTED: a layout the cache cannot stream). */
pi2_status pi2_cache_create(const pi2_model *m, const pi2_stream_params *p, pi2_cache **out);
void pi2_cache_free(pi2_cache *k);
/* 1 when the gate rows stream too (part PI2_PART_GATE exists). */
int pi2_cache_streams_gate(const pi2_cache *k);

/* Make present the clusters of `part` of layer il holding the n ascending neurons idx: hot and cached ones at
 * once, misses submitted. ready[g] (per group of PI2_FFN_GROUP) = 1 when every needed cluster of group g is
 * present now, 0 when it waits on a read. */
pi2_status pi2_cache_begin(pi2_cache *k, int32_t part, int32_t il, const int32_t *idx, int32_t n, uint8_t *ready);
/* Before layer il's attention, for one token: submit the reads of the bundle clusters the layer's early count
 * names (after its hot prefix, not cached), which nearly every token needs; the layer's begin then waits on them
 * like on its own misses, and reaps the unneeded ones with the rest. PI2_ERR_IO when the submission fails. */
pi2_status pi2_cache_early(pi2_cache *k, int32_t il);
/* Wait for the part's next reads and list the groups whose clusters have now all arrived (*n_groups; 0 when
 * every read has been reaped). PI2_ERR_IO: a failed or short read (the layer's reads are drained first). */
pi2_status pi2_cache_next(pi2_cache *k, int32_t part, int32_t *groups, int32_t *n_groups);
/* The part's arena and, after begin, the offset to add to a file offset inside cluster cl. */
const uint8_t *pi2_cache_arena(const pi2_cache *k, int32_t part);
int64_t pi2_cache_delta(const pi2_cache *k, int32_t part, int32_t cl);
int32_t pi2_cache_cluster(const pi2_cache *k);
/* Submit the reads of layer il's whole region of each part in `parts` (bit p: part p) that is not resident or
 * already on its way, into the part's slots (forgetting the cached clusters; nothing may read them until
 * pi2_cache_load_layer). PI2_ERR_IO when the submission fails, PI2_ERR_INVALID when a region does not fit. */
pi2_status pi2_cache_ahead(pi2_cache *k, int32_t il, uint32_t parts);
/* Make layer il's whole region of `part` present (waiting for its reads ahead, or reading it now with large
 * sequential reads) and point view->up / view->down_rows (bundles) or view->gate (gate rows) at it. */
pi2_status pi2_cache_load_layer(pi2_cache *k, int32_t part, int32_t il, pi2_layer *view);
void pi2_cache_get_stats(const pi2_cache *k, pi2_cache_stats *out);

#endif
