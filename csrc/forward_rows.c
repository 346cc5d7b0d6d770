/* forward_rows.c — the per-row work the forward steps share (forward.h): pool tasks of whole rows, RMS norms,
 * the embedding, RoPE tables and rotation, KV cache stores, the FFN activation, attention's cache views.
 * Does not: run a step (forward.c, decode_multi.c) or compute a matrix product (matmul.c). */
#include "forward.h"
#include "kv_quant.h"

static void rows_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    const int64_t r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    for (int64_t r = r0; r < r1; r++) j->row(j, r);
}

void for_rows(pi2_ctx *c, int32_t n_tok, rows_job j, int64_t n_rows) {
    const int64_t n_tasks = n_tok > 1 ? 8 * (int64_t)pi2_pool_n_threads(c->pool) : 1;
    j.c = c;
    j.n_rows = n_rows;
    j.rows_per_task = (n_rows + n_tasks - 1) / n_tasks;
    pi2_pool_run(c->pool, rows_task, &j, (int32_t)((n_rows + j.rows_per_task - 1) / j.rows_per_task));
}

static void norm_row(const rows_job *j, int64_t r) {
    pi2_rms_norm(j->y + r * j->n, j->x + r * j->n, j->w, j->n, j->c->m->hp.rms_eps);
}

void norm_rows(pi2_ctx *c, int32_t n_tok, float *y, const float *x, const float *w, int64_t n_rows, int64_t n) {
    for_rows(c, n_tok, (rows_job){.row = norm_row, .y = y, .x = x, .w = w, .n = n}, n_rows);
}

void embed(pi2_ctx *c, const int32_t *tokens, int32_t n) {
    const pi2_weight *e = &c->m->token_embd;
    for (int32_t t = 0; t < n; t++)
        c->embd->to_float(e->data + (size_t)tokens[t] * e->row_bytes, c->x + (size_t)t * e->n_in, e->n_in);
    if (c->m->hp.embd_scale != 1.0f) scale(c->x, (int64_t)n * e->n_in, c->m->hp.embd_scale);
}

void rope_table_row(pi2_ctx *c, int32_t t, int32_t pos) {
    const pi2_model_params *hp = &c->m->hp;
    float *local = c->rope + (size_t)c->p.n_batch * hp->n_rot;
    pi2_rope_cache(c->rope + (size_t)t * hp->n_rot, pos, hp->n_rot, hp->rope_base, hp->rope_freq_scale, c->m->rope_freqs);
    if (hp->rope_base_local > 0)
        pi2_rope_cache(local + (size_t)t * hp->n_rot, pos, hp->n_rot, hp->rope_base_local, hp->rope_freq_scale,
                       c->m->rope_freqs);
}

void rope_tables(pi2_ctx *c, int32_t pos0, int32_t n) {
    for (int32_t t = 0; t < n; t++) rope_table_row(c, t, pos0 + t);
}

/* Token t's query and key heads rotated in place. */
void rope_row(const rows_job *j, int64_t t) {
    const pi2_model_params *hp = &j->c->m->hp;
    const int32_t nb = j->c->p.n_batch;
    const float *cs = j->c->rope + ((size_t)j->L->rope_local * nb + (size_t)t) * hp->n_rot;
    pi2_rope(j->c->q + (size_t)t * hp->n_head * hp->head_dim, hp->n_head, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
    pi2_rope(j->c->k + (size_t)t * hp->n_head_kv * hp->head_dim, hp->n_head_kv, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
}

/* One token's k and v at cell pos of layer il of c's cache: V rounded to F16 (halves, nearest even as ggml's
 * fp32-to-fp16); K the same, transposed, or quantized (kv_quant.c). */
void store_kv(pi2_ctx *c, int32_t il, size_t pos, const float *kr, const float *vr) {
    const pi2_model_params *hp = &c->m->hp;
    const size_t kd = (size_t)hp->n_head_kv * hp->head_dim, vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    const size_t n_ctx = (size_t)c->p.n_ctx, ld = (size_t)c->k_ld;
    if (c->k_blocks) pi2_kv_store_k(c, il, pos, kr);
    else {
        pi2_fp16 *k = c->k_cache + (size_t)il * kd * ld + pos;
        for (size_t i = 0; i < kd; i++) k[i * ld] = pi2_f32_to_fp16(kr[i]);
    }
    if (c->v_blocks) {
        pi2_kv_store_v(c, il, pos, vr);
        return;
    }
    pi2_fp16 *v = c->v_cache + ((size_t)il * n_ctx + pos) * vd;
    for (size_t i = 0; i < vd; i++) v[i] = pi2_f32_to_fp16(vr[i]);
}

/* Token t's k and v at position n_past + t of layer j->il. */
void store_kv_row(const rows_job *j, int64_t t) {
    pi2_ctx *c = j->c;
    const pi2_model_params *hp = &c->m->hp;
    const size_t kd = (size_t)hp->n_head_kv * hp->head_dim, vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    store_kv(c, j->il, (size_t)c->n_past + (size_t)t, c->k + t * kd, c->v + t * vd);
}

/* Token t's FFN activation: gate = act(gate) * up. */
void activate_row(const rows_job *j, int64_t t) {
    const pi2_ctx *c = j->c;
    const int64_t n_ff = c->m->hp.n_ff;
    pi2_ffn_activate(c->gate + t * n_ff, c->up + t * n_ff, n_ff, c->m->hp.ffn_act, c->m->gelu_table);
}

/* Flash attention and a quantized V cache of context c's layer il into a. */
static void set_flash(const pi2_ctx *c, int32_t il, pi2_attn *a) {
    a->flash = c->p.flash_attn;
    if (c->v_blocks) {
        a->vq = c->v_blocks + (size_t)il * c->p.n_ctx * c->v_cell_bytes;
        a->v_cell_bytes = c->v_cell_bytes;
        a->vt = c->vt;
    }
}

pi2_attn attn_over(const pi2_ctx *c, const pi2_ctx *d, const pi2_layer *L, int32_t il, const float *q, float *out,
                   int32_t n_tok, int32_t pos0) {
    const pi2_model_params *hp = &c->m->hp;
    const size_t cells = (size_t)il * d->p.n_ctx * hp->n_head_kv, rows = (size_t)il * hp->n_head_kv * hp->head_dim;
    pi2_attn a = {
        .q = q, .k = d->k_cache + rows * (size_t)d->k_ld, .v = d->v_cache + cells * hp->head_dim_v,
        .out = out, .scores = c->scores, .qf = c->qf, .acc = c->acc, .n_tok = n_tok, .pos0 = pos0, .n_ctx = d->p.n_ctx,
        .k_ld = d->k_ld,
        .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .head_dim_v = hp->head_dim_v,
        .window = L->swa ? hp->sliding_window : 0, .scale = hp->q_prescale ? 1.0f : hp->attn_scale};
    if (d->k_blocks) {
        a.kq = d->k_blocks + (size_t)il * d->p.n_ctx * d->k_cell_bytes;
        a.k_cell_bytes = d->k_cell_bytes;
        a.kt = d->kt;
    }
    set_flash(d, il, &a);
    return a;
}
