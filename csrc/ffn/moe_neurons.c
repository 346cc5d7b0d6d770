/* moe_neurons.c — the profile of a ReLU-family expert's neurons for `pi2 convert`: how often each neuron of each
 * expert opens (gate > 0) for the rows routed to it, counted into the caller's buffer while it asks for it.
 * Does: pi2_ctx_count_expert_neurons (the API) and pi2_moe_count_neurons (moe.c calls it once a layer's gate rows of
 *       mapped experts are computed, before the activation overwrites them).
 * Does not: order neurons or write anything (pi2/convert/moe.py); streamed experts are not counted. */
#include "ffn/moe.h"
#include "internal.h"

pi2_status pi2_ctx_count_expert_neurons(pi2_ctx *c, int64_t *counts) {
    if (!c) return pi2_set_error(PI2_ERR_INVALID, "NULL context");
    if (!c->moe || !c->m->hp.n_expert) return pi2_set_error(PI2_ERR_INVALID, "the model has no experts to profile");
    c->moe->neuron_counts = counts;
    return PI2_OK;
}

void pi2_moe_count_neurons(pi2_ctx *c, int32_t il) {
    struct pi2_moe *moe = c->moe;
    const int64_t F = c->m->hp.n_ff_exp;
    for (int32_t a = 0; a < moe->n_active; a++) {
        const int32_t e = moe->active[a];
        int64_t *cnt = moe->neuron_counts + ((size_t)il * (size_t)moe->X + (size_t)e) * (size_t)F;
        for (int32_t s = moe->start[e]; s < moe->start[e + 1]; s++) {
            const float *g = moe->gate + (size_t)moe->list[s] * (size_t)F;
            for (int64_t r = 0; r < F; r++) cnt[r] += g[r] > 0.0f;
        }
    }
}
