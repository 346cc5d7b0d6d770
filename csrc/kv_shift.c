/* kv_shift.c — llama.cpp's context shift of a context's KV cache (pi2_decode calls it when the context is full and
 * ctx_shift is on): drop a span of positions, move the later ones down and rotate their keys to match.
 * Does not: decide when or how much to shift (pi2_decode, with llama-completion's rule). */
#include "forward.h"
#include "kv_quant.h"

#include <string.h>

/* llama.cpp's context shift (llama_memory_seq_rm + llama_memory_seq_add) with the cache kept in position order:
 * positions n_keep .. n_keep+n_discard-1 are dropped and the later ones move down by n_discard, each key rotated by
 * RoPE at position -n_discard (its F16 value rotated in float and rounded to F16 again, as ggml_rope_ext on the F16
 * cache). pi2/reference/forward.py (ReferenceContext.shift) is the specification. */
void kv_shift(pi2_ctx *c, int32_t n_keep, int32_t n_discard) {
    const pi2_model_params *hp = &c->m->hp;
    const size_t C = (size_t)c->p.n_ctx, ld = (size_t)c->k_ld, kd = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t vd = (size_t)hp->n_head_kv * hp->head_dim_v;
    const int32_t m = c->n_past - n_keep - n_discard;
    float *cs = c->rope, *row = c->k;     /* scratch: the rope tables and one token's keys (rebuilt every step) */
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const int local = c->m->layers[il].rope_local && hp->rope_base_local > 0;
        pi2_rope_cache(cs, -n_discard, hp->n_rot, local ? hp->rope_base_local : hp->rope_base, hp->rope_freq_scale,
                       c->m->rope_freqs);
        pi2_fp16 *K = c->k_cache + (size_t)il * kd * ld, *V = c->v_cache + (size_t)il * C * vd;
        if (c->k_blocks) pi2_kv_shift_k(c, il, n_keep, n_discard, m, cs, row);   /* through floats (kv_quant.c) */
        for (int32_t t = 0; t < m; t++) {
            const size_t from = (size_t)(n_keep + n_discard + t), to = (size_t)(n_keep + t);
            if (!c->k_blocks) {
                for (size_t i = 0; i < kd; i++) row[i] = pi2_fp16_to_f32(K[i * ld + from]);
                pi2_rope(row, hp->n_head_kv, hp->head_dim, hp->n_rot, cs, hp->rope_neox);
                for (size_t i = 0; i < kd; i++) K[i * ld + to] = pi2_f32_to_fp16(row[i]);
            }
            if (c->v_blocks) {
                uint8_t *VB = c->v_blocks + (size_t)il * C * c->v_cell_bytes;
                memmove(VB + to * c->v_cell_bytes, VB + from * c->v_cell_bytes, c->v_cell_bytes);
            } else {
                memmove(V + to * vd, V + from * vd, vd * sizeof *V);
            }
        }
    }
    c->n_past -= n_discard;
}
