/* test_api.c — the test entry points of pi2_test.h that are more than an internal function under its own name:
 *       attention and the matrix product with flat arguments and their scratch allocated here, and the slot LRU
 *       behind an opaque handle with its state dumped. Including ops.h, matmul.h and slots.h beside pi2_test.h
 *       makes the compiler check that pi2_test.h's declarations of internal functions agree with theirs.
 * Does not: run in production (pi2/ never calls these). */
#include "pi2_test.h"

#include "cache/slots.h"
#include "internal.h"
#include "kv_quant.h"
#include "matmul.h"
#include "ops.h"
#include "threadpool.h"

#include <stdlib.h>

pi2_status pi2_test_attention(pi2_pool *pool, const float *q, const float *k, const float *v, float *out,
                              int32_t n_tok, int32_t pos0, int32_t n_ctx, int32_t n_head, int32_t n_head_kv,
                              int32_t head_dim, int32_t head_dim_v, int32_t window, float scale) {
    const size_t threads = (size_t)pi2_pool_n_threads(pool);
    float *scores = malloc(threads * PI2_ATTN_ROWS * (size_t)n_ctx * sizeof(float));
    float *qf = malloc(threads * PI2_ATTN_ROWS * (size_t)head_dim * sizeof(float));
    float *acc = malloc(threads * (size_t)pi2_attn_acc_floats(head_dim, head_dim_v) * sizeof(float));
    const size_t rows = (size_t)n_head_kv * head_dim, ld = (size_t)pi2_kv_k_ld(n_ctx);
    const size_t nv = (size_t)n_ctx * n_head_kv * head_dim_v;
    pi2_fp16 *kh = calloc(rows * ld, sizeof *kh), *vh = malloc(nv * sizeof *vh);   /* the cache's halves */
    pi2_status s = PI2_OK;
    if (scores && qf && acc && kh && vh) {
        for (size_t r = 0; r < rows; r++)   /* rows of the context's leading dimension, as the cache has them */
            for (size_t j = 0; j < (size_t)n_ctx; j++) kh[r * ld + j] = pi2_f32_to_fp16(k[r * (size_t)n_ctx + j]);
        for (size_t i = 0; i < nv; i++) vh[i] = pi2_f32_to_fp16(v[i]);
        pi2_attn a = {.q = q, .k = kh, .v = vh, .out = out, .scores = scores, .qf = qf, .acc = acc, .n_tok = n_tok,
                      .pos0 = pos0, .n_ctx = n_ctx, .k_ld = (int32_t)ld, .n_head = n_head, .n_head_kv = n_head_kv,
                      .head_dim = head_dim, .head_dim_v = head_dim_v, .window = window, .scale = scale,
                      .rows = PI2_ATTN_ROWS};
        pi2_attention(pool, &a);
    } else {
        s = pi2_set_error(PI2_ERR_NOMEM, "out of memory for attention scratch");
    }
    free(scores);
    free(qf);
    free(acc);
    free(kh);
    free(vh);
    return s;
}

pi2_status pi2_test_matmul(pi2_pool *pool, const void *w, int32_t type, int64_t n_in, int64_t n_out, size_t row_bytes,
                           const float *x, int32_t n_tok, float *out, int32_t impl) {
    return pi2_test_matmul_packed(pool, w, NULL, type, n_in, n_out, row_bytes, x, n_tok, out, impl);
}

pi2_status pi2_test_matmul_packed(pi2_pool *pool, const void *w, const void *packed, int32_t type, int64_t n_in,
                                  int64_t n_out, size_t row_bytes, const float *x, int32_t n_tok, float *out, int32_t impl) {
    const pi2_weight weight = {.data = w, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = row_bytes,
                               .packed = packed};
    const pi2_mm mm = {&weight, out};
    const size_t need = pi2_matmul_scratch(&mm, 1, n_tok, impl);
    uint8_t *scratch = malloc(need ? need : 1);
    if (!scratch) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for matmul scratch");
    const pi2_matmul_env env = {.pool = pool, .impl = impl, .xq = scratch};
    pi2_matmul(&env, x, n_tok, &mm, 1);
    free(scratch);
    return PI2_OK;
}

struct pi2_test_slots {
    pi2_slots slots;
};

pi2_status pi2_test_slots_new(int32_t n_slots, int32_t n_layer, int32_t n_cl, pi2_test_slots **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    const pi2_status s = pi2_slots_init(&(*out)->slots, n_slots, n_layer, n_cl);
    if (s) {
        free(*out);
        *out = NULL;
    }
    return s;
}

void pi2_test_slots_free(pi2_test_slots *p) {
    if (!p) return;
    pi2_slots_free(&p->slots);
    free(p);
}

int32_t pi2_test_slots_find(pi2_test_slots *p, int32_t il, int32_t cl) { return pi2_slots_find(&p->slots, il, cl); }
int32_t pi2_test_slots_take(pi2_test_slots *p, int32_t il, int32_t cl) { return pi2_slots_take(&p->slots, il, cl); }
void pi2_test_slots_forget(pi2_test_slots *p, int32_t s) { pi2_slots_forget(&p->slots, s); }
void pi2_test_slots_clear(pi2_test_slots *p) { pi2_slots_clear(&p->slots); }
void pi2_test_slots_pin(pi2_test_slots *p, int32_t s) { pi2_slots_pin(&p->slots, s); }
void pi2_test_slots_unpin(pi2_test_slots *p, int32_t s) { pi2_slots_unpin(&p->slots, s); }
int32_t pi2_test_slots_check(const pi2_test_slots *p) { return pi2_slots_check(&p->slots); }
void pi2_test_slots_poke(pi2_test_slots *p, int32_t k, int32_t s) { p->slots.slot_of[k] = s; }

int32_t pi2_test_slots_state(const pi2_test_slots *p, int32_t *order, int32_t *tail, int32_t *layer, int32_t *cl,
                             int32_t *slot_of) {
    const pi2_slots *sl = &p->slots;
    int32_t n = 0;
    for (int32_t i = sl->head; i >= 0 && n < sl->n_slots; i = sl->next[i]) order[n++] = i;   /* unpinned ones */
    *tail = sl->tail;
    for (int32_t i = 0; i < sl->n_slots; i++) {
        layer[i] = sl->s_layer[i];
        cl[i] = sl->s_cl[i];
    }
    for (int32_t i = 0; i < sl->n_layer * sl->n_cl; i++) slot_of[i] = sl->slot_of[i];
    return n;
}
