/* pipeline/pipeline.h — the read/compute pipeline of a streamed context: the one place that plans each layer's reads
 * (what, when, into which slots of the neuron cache) and hands the units whose bytes are present to compute.
 *
 * Words. A *part* is one streamed kind of bytes of an FFN layer (PI2_PART_BUNDLES: each neuron's up and down rows;
 * PI2_PART_GATE: its gate row). A *unit* is what one read fetches and one slot of the neuron cache holds: today a
 * cluster of `cluster` consecutive neurons of a part. A *group* is the compute task a unit feeds: PI2_FFN_GROUP
 * neurons whose partial sum one task computes; it is *ready* when every unit it needs is present. A part is read
 * *whole* when its region of the layer comes in large sequential reads (batches; gate rows a rule needs all of),
 * *ahead* when those reads are submitted before the FFN that needs them (before the layer's attention, or during the
 * previous layer's FFN), and *early* when a single token's units that nearly every token needs are submitted before
 * the layer's attention.
 *
 * Per layer, in this order:
 *   begin_layer(il, n_tok, unit_parts)  before attention: the layer's plan, decided once: the parts the FFN reads
 *                                       unit by unit (unit_parts: it chooses them per token), every other streamed
 *                                       part read whole; whole reads ahead and early reads submitted now
 *   whole(il, view)                     the parts read whole: wait for them, point view's rows at their bytes
 *   need(part, il, idx, n) / next_ready a part's units holding the needed neurons: present ones at once, misses
 *                                       submitted; then the groups whose units have all arrived, as reads land
 *   run(...)                            need + next_ready, with a pool run per batch of ready groups
 *   release(part, il)                   the FFN is done with the part's bytes: a batch's next layer may read into
 *                                       its slots now (the next layer's gate rows, read whole, during this FFN)
 * The FFN finds a unit's rows through pi2_rows (the arena and each cluster's delta); mapped rows are the same with
 * the mapping as base and no deltas, so one compute task serves both.
 *
 * Experts (MoE, the next kind of unit): a part whose units are a layer's experts, each unit the spans of one
 * expert's slices of ffn_{gate,up,down}_exps (contiguous in a plain GGUF: one span per slice), or a converted file's
 * expert: its gate rows' span, then its up/down bundle records whole or only the clusters of 8 records whose neurons
 * a single token's gate opened (pi2_pipeline_expert_clusters, two phases); the router's top-k (or routing ahead's guess, submitted in begin_layer like early
 * reads) is the `need` list, a group is an expert, and next_ready hands each expert to compute as its slices land.
 * Hot experts are the part's resident prefix, the expert cache its slots: the same pipeline, not a second engine.
 * (PI2_PART_EXPERTS below; ffn/moe_stream.c computes them as they land.)
 *
 * Does not: compute (csrc/ffn/), hold the slots or issue the reads (csrc/cache/), choose sizes (the planner). */
#ifndef PI2_PIPELINE_H
#define PI2_PIPELINE_H
#include <stdint.h>

#include "cache/cache.h"
#include "model.h"
#include "threadpool.h"

typedef struct pi2_pipeline pi2_pipeline;

/* Row addressing: the bytes of a row at file offset f of neuron i are at base + (delta ? delta[i / cluster] : 0) + f.
 * Mapped rows: base = the mapping, delta NULL. Streamed rows: base = the part's arena, delta the current layer's
 * per-cluster deltas. */
typedef struct {
    const uint8_t *base;
    const int64_t *delta;
    int32_t cluster;
} pi2_rows;

static inline const uint8_t *pi2_row_at(const pi2_rows *rows, int32_t neuron, int64_t file_offset) {
    return rows->base + (rows->delta ? rows->delta[neuron / rows->cluster] : 0) + file_offset;
}

/* The neuron cache (csrc/cache/) for `params`, and the pipeline over it. Errors as pi2_ctx_set_stream. */
pi2_status pi2_pipeline_create(const pi2_model *m, const pi2_stream_params *params, pi2_pipeline **out);
/* Wait for what is in flight, then free (NULL is fine). */
void pi2_pipeline_free(pi2_pipeline *pl);
void pi2_pipeline_stats(const pi2_pipeline *pl, pi2_cache_stats *out);
/* 1 when `part` streams (PI2_PART_BUNDLES always; PI2_PART_GATE with stream_gate). */
int pi2_pipeline_streams(const pi2_pipeline *pl, int32_t part);
/* 1 when the plan of the layer begun last reads `part` unit by unit (it streams and is not read whole). */
int pi2_pipeline_by_units(const pi2_pipeline *pl, int32_t part);

/* Before layer il's attention for n_tok tokens: its plan (unit_parts: bit p when the FFN reads part p unit by unit),
 * and the reads that can start now. PI2_ERR_IO when a submission fails. */
pi2_status pi2_pipeline_begin_layer(pi2_pipeline *pl, int32_t il, int32_t n_tok, uint32_t unit_parts);
/* The parts layer il reads whole (by its plan): make them present and point view's rows at them. */
pi2_status pi2_pipeline_whole(pi2_pipeline *pl, int32_t il, pi2_layer *view);
/* The FFN is done with layer il's bytes of `part`. */
pi2_status pi2_pipeline_release(pi2_pipeline *pl, int32_t part, int32_t il);

/* Make present the units of `part` of layer il holding the n ascending neurons idx: present ones at once, misses
 * submitted. ready[g] = 1 for each group g of PI2_FFN_GROUP neurons whose units are all present now. */
pi2_status pi2_pipeline_need(pi2_pipeline *pl, int32_t part, int32_t il, const int32_t *idx, int32_t n,
                             uint8_t *ready);
/* Wait for the part's next reads and list the groups whose units have now all arrived (*n_groups; 0 when every
 * read has been reaped). PI2_ERR_IO: a failed or short read (the layer's reads are drained first). */
pi2_status pi2_pipeline_next_ready(pi2_pipeline *pl, int32_t part, int32_t *groups, int32_t *n_groups);
/* need + next_ready over the groups with entries (group_start[g] < group_start[g + 1]): fn(arg, task, thread) for
 * each, task indexing pi2_pipeline_groups(pl), those present at once while the misses are read, then each group as
 * soon as its reads land. */
pi2_status pi2_pipeline_run(pi2_pipeline *pl, pi2_pool *pool, int32_t part, int32_t il, const int32_t *idx, int32_t n,
                            const int32_t *group_start, pi2_task_fn fn, void *arg);
const int32_t *pi2_pipeline_groups(const pi2_pipeline *pl);
/* Where the current layer's units of `part` are (after need). */
pi2_rows pi2_pipeline_rows(const pi2_pipeline *pl, int32_t part);

/* Experts (PI2_PART_EXPERTS, a MoE file; pipeline/experts.c). need(PI2_PART_EXPERTS, il, experts, n, ready): the n
 * distinct experts of layer il (at most pi2_pipeline_expert_room cold ones) made present: resident hot ones and
 * cached ones at once (ready[e] = 1), misses read into the least recently used slots (three reads each: the spans of
 * its gate, up and down slices); next_ready lists the experts whose three reads have landed. Then: */
/* Cold expert slots in the LRU (learned hot ones pinned out of it are not): the most experts neither resident nor
 * pinned that one need may name. Read it again before each need: pinning shrinks it. */
int32_t pi2_pipeline_expert_room(const pi2_pipeline *pl);
/* [n_expert] where slice w (0 gate, 1 up, 2 down) of each expert named by the last need of the layer is. */
const uint8_t *const *pi2_pipeline_expert_rows(const pi2_pipeline *pl, int32_t w);
/* Routing ahead: read the guessed experts of layer il (one token's top-k, before its routing) into slots now;
 * need then takes those it names as misses already on their way. Skipped while reads are in flight or when the
 * guesses could crowd out the token's own misses (2n > the expert slots). PI2_ERR_IO when a submission fails. */
pi2_status pi2_pipeline_experts_ahead(pi2_pipeline *pl, int32_t il, const int32_t *experts, int32_t n);
/* 1 when the pipeline streams experts and was asked to route ahead. */
int pi2_pipeline_experts_ahead_on(const pi2_pipeline *pl);
/* A converted file's experts (up/down bundles): on = read a miss's gate rows first and its bundle clusters only when
 * asked (pi2_pipeline_expert_clusters: a single token under the relu rule); off = gate rows and every cluster.
 * Applies to the needs and guesses that follow. */
void pi2_pipeline_experts_partial(pi2_pipeline *pl, int on);
int pi2_pipeline_experts_partial_on(const pi2_pipeline *pl);
/* Partial reads, once expert e of layer il (named by the layer's need, its gate rows landed) has computed its gate:
 * read the clusters with want[c] != 0 that its slot lacks (adjacent ones in one 4 KiB-aligned read); *ready = 1
 * when it lacks none (else next_ready lists e when they land). PI2_ERR_IO when a submission fails. */
pi2_status pi2_pipeline_expert_clusters(pi2_pipeline *pl, int32_t il, int32_t e, const uint8_t *want, int *ready);
/* A streamed MoE layer's step of n_tok tokens routed rows[e] (token, slot) rows to each expert e of experts[0..n): counted
 * (statistics) and learned (the expert cache's learned hot experts, cache/experts_learn.c). Before its need. */
void pi2_pipeline_expert_step(pi2_pipeline *pl, int32_t il, int32_t n_tok, const int32_t *experts,
                              const int32_t *rows, int32_t n);

#endif
