/* model.c — pi2_model_load / pi2_model_free: map a model file and make views of its checked tensors.
 * Does: validate hyper-parameters; map the file or a split model's parts (model_map.c); check every descriptor
 *       (model_check.c: role, layer, type, shape against the hyper-parameters, byte size, alignment, bounds against
 *       the file size) and refuse duplicates before making a view of it; require every tensor the architecture reads
 *       (the predictors are optional: fc1 and fc2, pi2-made or PowerInfer's, come together, of matching width);
 *       copy the per-layer flags; build the GELU table.
 * Does not: parse GGUF (Python describes the tensors) or compute. */
#define _GNU_SOURCE
#include "model.h"
#include "internal.h"
#include "io/io.h"
#include "kernels/lowbit.h"
#include "ops.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static pi2_weight weight_view(const pi2_model *m, const pi2_tensor_desc *d) {
    const pi2_type_traits *t = pi2_traits(d->type, PI2_IMPL_REF);
    const int32_t bits = pi2_lowbit_bits(d->type);
    const size_t row = bits ? pi2_lowbit_row_bytes(bits, d->ne[0]) : (size_t)(d->ne[0] / t->block_size) * (size_t)t->type_size;
    return (pi2_weight){m->map + d->offset, d->type, d->ne[0], d->ne[1], d->row_stride ? (size_t)d->row_stride : row, NULL};
}

static void place(pi2_model *m, const pi2_tensor_desc *d) {
    const float *f = (const float *)(m->map + d->offset);
    pi2_layer *L = model_per_layer(d->role) ? &m->layers[d->layer] : NULL;
    switch (d->role) {
    case PI2_TENSOR_TOKEN_EMBD: m->token_embd = weight_view(m, d); break;
    case PI2_TENSOR_OUTPUT: m->output = weight_view(m, d); break;
    case PI2_TENSOR_OUTPUT_NORM: m->output_norm = f; break;
    case PI2_TENSOR_ROPE_FREQS: m->rope_freqs = f; break;
    case PI2_TENSOR_ATTN_NORM: L->attn_norm = f; break;
    case PI2_TENSOR_ATTN_Q: L->q = weight_view(m, d); break;
    case PI2_TENSOR_ATTN_K: L->k = weight_view(m, d); break;
    case PI2_TENSOR_ATTN_V: L->v = weight_view(m, d); break;
    case PI2_TENSOR_ATTN_OUTPUT: L->o = weight_view(m, d); break;
    case PI2_TENSOR_ATTN_Q_BIAS: L->q_bias = f; break;
    case PI2_TENSOR_ATTN_K_BIAS: L->k_bias = f; break;
    case PI2_TENSOR_ATTN_V_BIAS: L->v_bias = f; break;
    case PI2_TENSOR_ATTN_Q_NORM: L->q_norm = f; break;
    case PI2_TENSOR_ATTN_K_NORM: L->k_norm = f; break;
    case PI2_TENSOR_POST_ATTN_NORM: L->post_attn_norm = f; break;
    case PI2_TENSOR_FFN_NORM: L->ffn_norm = f; break;
    case PI2_TENSOR_FFN_GATE: L->gate = weight_view(m, d); break;
    case PI2_TENSOR_FFN_UP: L->up = weight_view(m, d); break;
    case PI2_TENSOR_FFN_DOWN: L->down = weight_view(m, d); break;
    case PI2_TENSOR_POST_FFW_NORM: L->post_ffw_norm = f; break;
    case PI2_TENSOR_FFN_DOWN_ROWS: L->down_rows = weight_view(m, d); break;
    case PI2_TENSOR_FFN_GATE_PRED: L->gate_pred = weight_view(m, d); break;
    case PI2_TENSOR_FFN_PRED_FC1: L->fc1 = weight_view(m, d); break;
    case PI2_TENSOR_FFN_PRED_FC2: L->fc2 = weight_view(m, d); break;
    case PI2_TENSOR_FFN_DOWN_SCALE: L->down_scale = f; break;
    case PI2_TENSOR_FFN_DOWN_COLSCALE: L->down_colscale = f; break;
    case PI2_TENSOR_ATTN_OUTPUT_BIAS: L->o_bias = f; break;
    case PI2_TENSOR_FFN_GATE_INP: L->router = weight_view(m, d); break;
    case PI2_TENSOR_FFN_GATE_EXPS: L->gate_exps = weight_view(m, d); break;
    case PI2_TENSOR_FFN_DOWN_ROWS_EXPS: L->down_rows_exps = weight_view(m, d); break;
    case PI2_TENSOR_FFN_DOWN_SCALE_EXPS: L->down_scale_exps = f; break;
    case PI2_TENSOR_FFN_DOWN_COLSCALE_EXPS: L->down_colscale_exps = f; break;
    case PI2_TENSOR_FFN_UP_EXPS: L->up_exps = weight_view(m, d); break;
    case PI2_TENSOR_FFN_DOWN_EXPS: L->down_exps = weight_view(m, d); break;
    case PI2_TENSOR_FFN_GATE_SHEXP: L->gate_sh = weight_view(m, d); break;
    case PI2_TENSOR_FFN_UP_SHEXP: L->up_sh = weight_view(m, d); break;
    case PI2_TENSOR_FFN_DOWN_SHEXP: L->down_sh = weight_view(m, d); break;
    case PI2_TENSOR_FFN_GATE_INP_SHEXP: L->gate_inp_sh = f; break;
    }
}

pi2_status pi2_model_load(const char *path, const pi2_model_params *params, const pi2_tensor_desc *tensors,
                          int32_t n_tensors, pi2_model **out) {
    const uint64_t base0 = 0;
    return pi2_model_load_parts(path ? &path : NULL, &base0, 1, params, tensors, n_tensors, out);
}

pi2_status pi2_model_load_parts(const char *const *paths, const uint64_t *bases, int32_t n_parts,
                                const pi2_model_params *params, const pi2_tensor_desc *tensors, int32_t n_tensors,
                                pi2_model **out) {
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    *out = NULL;
    if (!paths || !paths[0] || !bases || n_parts < 1 || !params || (!tensors && n_tensors) || n_tensors < 0)
        return pi2_set_error(PI2_ERR_INVALID, "NULL path, params or tensors");
    pi2_status s = model_check_params(params);
    if (s) return s;
    pi2_model *m = calloc(1, sizeof *m);
    if (m) m->map_guard = -1;
    const size_t n_seen = (size_t)PI2_TENSOR_COUNT * ((size_t)params->n_layer + 1);
    uint8_t *seen = calloc(n_seen, 1);
    if (!m || !seen || !(m->layers = calloc((size_t)params->n_layer, sizeof *m->layers))) {
        free(seen);
        if (m) free(m->layers);
        free(m);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the model");
    }
    m->hp = *params;
    m->hp.layer_flags = NULL;   /* read into the layers below */
    if ((s = model_map_parts(m, paths, bases, n_parts, params->no_mmap))) goto fail;
    for (int32_t i = 0; i < n_tensors; i++) {
        const pi2_tensor_desc *d = &tensors[i];
        if ((s = model_check_desc(m, d, i))) goto fail;
        uint8_t *once = &seen[(size_t)(d->layer + 1) * PI2_TENSOR_COUNT + (size_t)d->role];
        if (*once) { s = pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) is described twice", MODEL_ROLE_NAMES[d->role], (int)d->layer); goto fail; }
        *once = 1;
        place(m, d);
    }
    if ((s = model_check_present(params, seen))) goto fail;
    for (int32_t il = 0; il < params->n_layer; il++) {
        pi2_layer *L = &m->layers[il];
        if ((s = model_check_layer(L, il))) goto fail;
        if (params->layer_flags) {   /* per-layer flags (smallthinker), copied here: the caller's array may go */
            const uint8_t f = params->layer_flags[il];
            L->swa = params->sliding_window > 0 && (f & PI2_LAYER_SWA);
            L->nope = (f & PI2_LAYER_NOPE) != 0;
            L->rope_local = (f & PI2_LAYER_ROPE_LOCAL) && params->rope_base_local > 0;
        } else {
            L->swa = params->sliding_window > 0 && params->swa_period > 0 && il % params->swa_period != params->swa_period - 1;
            L->rope_local = L->swa && params->rope_base_local > 0;
        }
    }
    if (params->ffn_act == PI2_ACT_GELU) {
        if (!(m->gelu_table = malloc(65536 * sizeof *m->gelu_table))) { s = pi2_set_error(PI2_ERR_NOMEM, "out of memory"); goto fail; }
        pi2_gelu_table(m->gelu_table);
    }
    free(seen);
    *out = m;
    return PI2_OK;
fail:
    free(seen);
    pi2_model_free(m);
    return s;
}

void pi2_model_free(pi2_model *m) {
    if (!m) return;
    io_map_guard_remove(m->map_guard);
    for (int32_t k = 1; k < m->n_parts && m->part_guards; k++) io_map_guard_remove(m->part_guards[k - 1]);
    free(m->part_guards);
    if (m->map) munmap((void *)m->map, m->map_size);
    free(m->gelu_table);
    free(m->packs[0]);
    free(m->packs[1]);
    free(m->moe_pack);
    free(m->down_pack);
    free(m->layers);
    free(m);
}
