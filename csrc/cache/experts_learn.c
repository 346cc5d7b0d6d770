/* cache/experts_learn.c — hot experts learned while running (experts.h): with no routing profile (or around its
 *       resident experts), or under a byte cap (whose evictions weigh them: experts_held.c), the rows routed to each
 *       expert are counted and halved every PI2_EXPERT_HALF_LIFE tokens;
 *       at each step the most routed cold experts are wanted, and the slots holding them are pinned, so the expert
 *       cache keeps them whatever the LRU's order (an LRU shared by all layers forgets an expert after fewer tokens
 *       than it takes to come back). The rest of the slots stay an LRU.
 * Does not: read (csrc/pipeline/experts.c reads a wanted expert when a token needs it) or compute. Which experts are
 *       pinned changes only bytes read, never results.
 * Invariants: pinned slots <= n_learn <= n_slots - k; only a wanted expert's slot is pinned after a step begins. */
#include "cache/experts.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    float score;
    int32_t key;
} ranked;

static int by_score(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

pi2_status pi2_expert_learn_init(pi2_expert_cache *ec, int32_t k, int32_t on) {
    const size_t N = (size_t)ec->n_layer * (size_t)ec->n_expert;
    const int32_t keep = 2 * k > k + 1 ? 2 * k : k + 1;   /* LRU slots left: misses of a step and guesses */
    int64_t fit = ec->slots.n_slots;   /* under a cap: the whole experts it holds */
    if (ec->cap && ec->cap / (int64_t)ec->slot_bytes < fit) fit = ec->cap / (int64_t)ec->slot_bytes;
    ec->n_learn = on && fit > keep ? (int32_t)(fit - keep) : 0;
    if (!ec->n_learn && !ec->cap) return PI2_OK;
    ec->score = calloc(N, sizeof *ec->score);   /* counted under a cap too: experts_held.c evicts the least routed */
    if (!ec->n_learn) return ec->score ? PI2_OK : pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert cache");
    ec->want = calloc(N, 1);
    ec->order = malloc(N * sizeof(ranked));
    if (!ec->score || !ec->want || !ec->order)
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the expert cache");
    return PI2_OK;
}

void pi2_expert_learn_rows(pi2_expert_cache *ec, int32_t il, const int32_t *experts, const int32_t *rows, int32_t n) {
    if (!ec->score) return;
    float *score = ec->score + (size_t)il * ec->n_expert;
    for (int32_t i = 0; i < n; i++) score[experts[i]] += (float)rows[experts[i]];
}

void pi2_expert_learn_step(pi2_expert_cache *ec, int32_t n_tok) {
    if (!ec->score) return;
    const int32_t X = ec->n_expert, N = ec->n_layer * X;
    const int64_t before = ec->learn_tokens;
    ec->learn_tokens += n_tok;
    if (ec->learn_tokens / PI2_EXPERT_HALF_LIFE != before / PI2_EXPERT_HALF_LIFE)
        for (int32_t i = 0; i < N; i++) ec->score[i] *= 0.5f;
    if (!ec->n_learn) return;
    ranked *order = ec->order;
    int32_t n = 0;
    for (int32_t i = 0; i < N; i++)
        if (ec->score[i] > 0 && ec->hot_of[i] < 0) order[n++] = (ranked){ec->score[i], i};
    qsort(order, (size_t)n, sizeof *order, by_score);
    memset(ec->want, 0, (size_t)N);
    for (int32_t i = 0; i < n && i < ec->n_learn; i++) ec->want[order[i].key] = 1;
    pi2_slots *slots = &ec->slots;
    for (int32_t s = 0; s < slots->n_slots; s++)   /* the experts no longer wanted back to the LRU's tail */
        if (slots->pinned[s] && !ec->want[(size_t)slots->s_layer[s] * X + slots->s_cl[s]]) pi2_slots_unpin(slots, s);
    for (int32_t s = 0; s < slots->n_slots; s++)   /* the wanted ones the LRU still holds */
        if (!slots->pinned[s] && slots->s_layer[s] >= 0) pi2_expert_learn_use(ec, s, slots->s_layer[s], slots->s_cl[s]);
}
