/* moe_neurons.c — the profile of a ReLU-family expert's neurons for `pi2 convert`: how often each neuron of each
 * expert opens (gate > 0) for the rows routed to it, counted into the caller's buffer while it asks for it.
 * Also how many clusters (runs of `cluster` neurons in the file's order, the unit a streamed expert would read) each
 * routed row opens: on a converted file, what reading only open clusters would cost.
 * Does: pi2_ctx_count_expert_neurons (the API) and pi2_moe_count_neurons (moe.c calls it once a layer's gate rows of
 *       mapped experts are computed, before the activation overwrites them).
 * Does not: order neurons or write anything (pi2/convert/moe.py). moe_stream.c counts a streamed layer chunk by chunk. */
#include "ffn/moe.h"
#include "internal.h"

pi2_status pi2_ctx_count_expert_neurons(pi2_ctx *c, int64_t *counts, int64_t *clusters, int32_t cluster) {
    if (!c) return pi2_set_error(PI2_ERR_INVALID, "NULL context");
    if (!c->moe || !c->m->hp.n_expert) return pi2_set_error(PI2_ERR_INVALID, "the model has no experts to profile");
    if (clusters && (cluster < 1 || cluster > c->m->hp.n_ff_exp))
        return pi2_set_error(PI2_ERR_INVALID, "cluster of %d neurons", (int)cluster);
    c->moe->neuron_counts = counts;
    c->moe->cluster_counts = clusters;
    c->moe->cluster = cluster;
    return PI2_OK;
}

void pi2_moe_count_neurons(pi2_ctx *c, int32_t il) {
    struct pi2_moe *moe = c->moe;
    const int64_t F = c->m->hp.n_ff_exp;
    for (int32_t a = 0; a < moe->n_active; a++) {
        const int32_t e = moe->active[a];
        int64_t *cnt = moe->neuron_counts ? moe->neuron_counts + ((size_t)il * (size_t)moe->X + (size_t)e) * (size_t)F : NULL;
        for (int32_t s = moe->start[e]; s < moe->start[e + 1]; s++) {
            const float *g = moe->gate + (size_t)moe->list[s] * (size_t)F;
            if (cnt)
                for (int64_t r = 0; r < F; r++) cnt[r] += g[r] > 0.0f;
            if (moe->cluster_counts)   /* clusters of consecutive neurons (the file's order) with an open one */
                for (int64_t r0 = 0; r0 < F; r0 += moe->cluster) {
                    const int64_t r1 = r0 + moe->cluster < F ? r0 + moe->cluster : F;
                    int open = 0;
                    for (int64_t r = r0; r < r1 && !open; r++) open = g[r] > 0.0f;
                    moe->cluster_counts[il] += open;
                }
        }
    }
}
