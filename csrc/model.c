/* model.c — pi2_model_load / pi2_model_free: map a model file and check its tensor descriptors.
 * Does: validate hyper-parameters; mmap the file (or a split model's parts, in one range) read-only, or read it
 *       into memory (no_mmap); check every descriptor (role, layer,
 *       duplicates, type, shape against the hyper-parameters, byte size, alignment, bounds against
 *       the file size) before making a view of it; require every tensor the architecture reads (the
 *       predictors are optional: fc1 and fc2, pi2-made or PowerInfer's, come together, of matching width).
 * Does not: parse GGUF (Python describes the tensors) or compute.
 * Past 400 lines since split models and no_mmap: mapping and checking are one load; the mapping functions
 * (read_file, map_file, map_parts) are the part to move out if it grows again. */
#define _GNU_SOURCE
#include "model.h"
#include "internal.h"
#include "io/io.h"
#include "kernels/lowbit.h"
#include "ops.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *ROLE_NAMES[PI2_TENSOR_COUNT] = {
    "token_embd", "output_norm", "output", "rope_freqs", "attn_norm", "attn_q", "attn_k", "attn_v",
    "attn_output", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm", "attn_k_norm",
    "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm", "ffn_down_rows",
    "ffn_gate_pred", "fc1", "fc2", "ffn_down_scale", "ffn_down_colscale", "attn_output.bias", "ffn_gate_inp",
    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
    "ffn_gate_inp_shexp", "ffn_down_rows_exps", "ffn_down_scale_exps", "ffn_down_colscale_exps"};

static int per_layer(int32_t role) { return role >= PI2_TENSOR_ATTN_NORM; }

static int is_expert(int32_t role) {
    return (role >= PI2_TENSOR_FFN_GATE_EXPS && role <= PI2_TENSOR_FFN_DOWN_EXPS) || role >= PI2_TENSOR_FFN_DOWN_ROWS_EXPS;
}

/* The ggml shape (ne0, ne1) a role must have (0: any, the low-rank predictor's rank), and whether the
 * architecture reads it at all. */
static int expected(const pi2_model_params *p, int32_t role, int64_t *ne0, int64_t *ne1) {
    const int64_t E = p->n_embd, q = (int64_t)p->n_head * p->head_dim, k = (int64_t)p->n_head_kv * p->head_dim;
    const int64_t v = (int64_t)p->n_head_kv * p->head_dim_v, o = (int64_t)p->n_head * p->head_dim_v;
    const int moe = p->arch == PI2_ARCH_MOE, experts = moe && p->n_expert > 0;
    *ne1 = 1;
    switch (role) {
    case PI2_TENSOR_ATTN_OUTPUT_BIAS: *ne0 = E; return moe;
    case PI2_TENSOR_FFN_GATE_INP: *ne0 = E; *ne1 = p->n_expert; return experts;
    case PI2_TENSOR_FFN_GATE_EXPS: case PI2_TENSOR_FFN_UP_EXPS: *ne0 = E; *ne1 = p->n_ff_exp; return experts;
    case PI2_TENSOR_FFN_DOWN_EXPS: *ne0 = p->n_ff_exp; *ne1 = E; return experts;
    case PI2_TENSOR_FFN_DOWN_ROWS_EXPS: *ne0 = E; *ne1 = p->n_ff_exp; return experts;
    case PI2_TENSOR_FFN_DOWN_SCALE_EXPS: *ne0 = p->n_ff_exp; return experts;
    case PI2_TENSOR_FFN_DOWN_COLSCALE_EXPS: *ne0 = E; return experts;
    case PI2_TENSOR_FFN_GATE_SHEXP: case PI2_TENSOR_FFN_UP_SHEXP: *ne0 = E; *ne1 = p->n_ff_shexp; return experts && p->n_ff_shexp;
    case PI2_TENSOR_FFN_DOWN_SHEXP: *ne0 = p->n_ff_shexp; *ne1 = E; return experts && p->n_ff_shexp;
    case PI2_TENSOR_FFN_GATE_INP_SHEXP: *ne0 = E; return experts && p->n_ff_shexp && p->shexp_gate;
    case PI2_TENSOR_ATTN_Q_NORM: *ne0 = p->qk_norm_full ? q : p->head_dim; return p->qk_norm || p->qk_norm_full;
    case PI2_TENSOR_ATTN_K_NORM: *ne0 = p->qk_norm_full ? k : p->head_dim; return p->qk_norm || p->qk_norm_full;
    case PI2_TENSOR_FFN_GATE: case PI2_TENSOR_FFN_UP: case PI2_TENSOR_FFN_DOWN:
        if (experts) return 0;
        break;
    default: break;
    }
    switch (role) {
    case PI2_TENSOR_TOKEN_EMBD: case PI2_TENSOR_OUTPUT: *ne0 = E; *ne1 = p->n_vocab; return 1;
    case PI2_TENSOR_OUTPUT_NORM: case PI2_TENSOR_ATTN_NORM: case PI2_TENSOR_FFN_NORM: *ne0 = E; return 1;
    case PI2_TENSOR_ROPE_FREQS: *ne0 = p->n_rot / 2; return 1;
    case PI2_TENSOR_ATTN_Q: *ne0 = E; *ne1 = q; return 1;
    case PI2_TENSOR_ATTN_K: *ne0 = E; *ne1 = k; return 1;
    case PI2_TENSOR_ATTN_V: *ne0 = E; *ne1 = v; return 1;
    case PI2_TENSOR_ATTN_OUTPUT: *ne0 = o; *ne1 = E; return 1;
    case PI2_TENSOR_ATTN_Q_BIAS: *ne0 = q; return p->qkv_bias;
    case PI2_TENSOR_ATTN_K_BIAS: *ne0 = k; return p->qkv_bias;
    case PI2_TENSOR_ATTN_V_BIAS: *ne0 = v; return p->qkv_bias;
    case PI2_TENSOR_ATTN_Q_NORM: case PI2_TENSOR_ATTN_K_NORM: *ne0 = p->head_dim; return p->qk_norm;
    case PI2_TENSOR_POST_ATTN_NORM: case PI2_TENSOR_POST_FFW_NORM: *ne0 = E; return p->post_norms;
    case PI2_TENSOR_FFN_GATE: case PI2_TENSOR_FFN_UP: *ne0 = E; *ne1 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_DOWN: *ne0 = p->n_ff; *ne1 = E; return 1;
    case PI2_TENSOR_FFN_DOWN_ROWS: case PI2_TENSOR_FFN_GATE_PRED: *ne0 = E; *ne1 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_PRED_FC1: *ne0 = E; *ne1 = 0; return 1;
    case PI2_TENSOR_FFN_PRED_FC2: *ne0 = 0; *ne1 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_DOWN_SCALE: *ne0 = p->n_ff; return 1;
    case PI2_TENSOR_FFN_DOWN_COLSCALE: *ne0 = E; return 1;
    }
    return 0;
}

static int is_vector(int32_t role) {
    return role == PI2_TENSOR_OUTPUT_NORM || role == PI2_TENSOR_ROPE_FREQS || role == PI2_TENSOR_ATTN_NORM ||
           (role >= PI2_TENSOR_ATTN_Q_BIAS && role <= PI2_TENSOR_POST_ATTN_NORM) ||
           role == PI2_TENSOR_FFN_NORM || role == PI2_TENSOR_POST_FFW_NORM || role == PI2_TENSOR_FFN_DOWN_SCALE ||
           role == PI2_TENSOR_FFN_DOWN_COLSCALE || role == PI2_TENSOR_ATTN_OUTPUT_BIAS ||
           role == PI2_TENSOR_FFN_GATE_INP_SHEXP || role == PI2_TENSOR_FFN_DOWN_SCALE_EXPS ||
           role == PI2_TENSOR_FFN_DOWN_COLSCALE_EXPS;
}

static pi2_status check_params(const pi2_model_params *p) {
    const int32_t dims[] = {p->n_vocab, p->n_embd, p->n_layer, p->n_ff, p->n_head, p->n_head_kv,
                            p->head_dim, p->head_dim_v, p->n_rot};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] <= 0 || dims[i] > (1 << 24))
            return pi2_set_error(PI2_ERR_INVALID, "hyper-parameter %zu out of range: %d", i, (int)dims[i]);
    if (p->arch < PI2_ARCH_LLAMA || p->arch > PI2_ARCH_MOE)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "unknown architecture id %d", (int)p->arch);
    if (p->ffn_act < PI2_ACT_SILU || p->ffn_act > PI2_ACT_DRELU)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "unknown FFN activation id %d", (int)p->ffn_act);
    if (p->n_head % p->n_head_kv || p->n_rot % 2 || p->n_rot > p->head_dim || p->n_layer > 65536 ||
        p->head_dim > 4096 || p->head_dim_v > 4096 || p->sliding_window < 0 || p->swa_period < 0)
        return pi2_set_error(PI2_ERR_INVALID, "inconsistent attention hyper-parameters");
    if (!(p->rms_eps > 0 && isfinite(p->rms_eps) && p->rope_base > 0 && isfinite(p->rope_base) &&
          p->rope_freq_scale > 0 && isfinite(p->attn_scale) && isfinite(p->embd_scale) && p->logit_softcap >= 0))
        return pi2_set_error(PI2_ERR_INVALID, "a float hyper-parameter is out of range");
    if (p->arch == PI2_ARCH_MOE) {
        if (p->n_expert < 0 || p->n_expert > 1024 || (p->n_expert && (p->n_expert_used < 1 || p->n_expert_used > p->n_expert ||
            p->n_ff_exp < 1 || p->n_ff_exp > (1 << 24) || p->n_ff_shexp < 0 || p->n_ff_shexp > (1 << 24))))
            return pi2_set_error(PI2_ERR_INVALID, "bad expert hyper-parameters: %d experts, %d used, width %d",
                                 (int)p->n_expert, (int)p->n_expert_used, (int)p->n_ff_exp);
        if (p->n_expert && (p->expert_gating < PI2_GATING_SOFTMAX || p->expert_gating > PI2_GATING_SQRT_SOFTPLUS))
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "unknown expert gating function %d", (int)p->expert_gating);
        if (p->expert_act != PI2_ACT_SILU && p->expert_act != PI2_ACT_RELU)
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "expert activation %d is not SwiGLU or ReGLU", (int)p->expert_act);
        if (!isfinite(p->residual_scale) || !isfinite(p->logit_scale) || !isfinite(p->expert_weights_scale))
            return pi2_set_error(PI2_ERR_INVALID, "a float hyper-parameter is out of range");
    }
    return PI2_OK;
}

/* Check one descriptor against the file and the hyper-parameters. */
static pi2_status check_desc(const pi2_model *m, const pi2_tensor_desc *d, int32_t i) {
    const pi2_model_params *p = &m->hp;
    if (d->role < 0 || d->role >= PI2_TENSOR_COUNT)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor descriptor %d has unknown role %d", (int)i, (int)d->role);
    const char *name = ROLE_NAMES[d->role];
    if (per_layer(d->role) ? (d->layer < 0 || d->layer >= p->n_layer) : d->layer != -1)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s has layer %d (n_layer %d)", name, (int)d->layer, (int)p->n_layer);
    int64_t ne0, ne1;
    if (!expected(p, d->role, &ne0, &ne1))
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) is not read by this architecture", name, (int)d->layer);
    if ((ne0 ? d->ne[0] != ne0 : d->ne[0] < 1 || d->ne[0] > p->n_ff) ||
        (ne1 ? d->ne[1] != ne1 : d->ne[1] < 1 || d->ne[1] > p->n_ff) ||
        d->ne[2] != (is_expert(d->role) ? p->n_expert : 1) || d->ne[3] != 1)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                             name, (int)d->layer, (long long)d->ne[0], (long long)d->ne[1], (long long)d->ne[2],
                             (long long)d->ne[3], (long long)ne0, (long long)ne1);
    ne0 = d->ne[0];
    ne1 = d->ne[1] * d->ne[2];   /* an expert tensor: n_expert runs of rows */
    uint64_t row;
    if (d->role == PI2_TENSOR_FFN_GATE_PRED) {   /* pi2's low-bit rows, times Q8_0 activations */
        if (!pi2_lowbit_bits(d->type))
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "tensor %s (layer %d) has type %d, not a low-bit gate copy",
                                 name, (int)d->layer, (int)d->type);
        if (ne0 % QK8_0)
            return pi2_set_error(PI2_ERR_FORMAT, "tensor %s rows of %lld values are not whole blocks of %d",
                                 name, (long long)ne0, QK8_0);
        row = pi2_lowbit_row_bytes(pi2_lowbit_bits(d->type), ne0);
    } else {
        const pi2_type_traits *t = pi2_traits(d->type, PI2_IMPL_REF);
        const int rows_only = (d->role == PI2_TENSOR_FFN_DOWN_ROWS || d->role == PI2_TENSOR_FFN_DOWN_ROWS_EXPS) &&
                              d->type == PI2_T_I8;   /* summed, never dotted */
        if (is_vector(d->role) ? d->type != PI2_T_F32 : (!t || !(rows_only ? t->axpy_group != NULL : t->vec_dot != NULL)))
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "tensor %s (layer %d) has ggml type %d, which pi2 cannot compute with",
                                 name, (int)d->layer, (int)d->type);
        const pi2_type_traits *a = rows_only ? t : pi2_traits(t->vec_dot_type, PI2_IMPL_REF);
        if (ne0 % t->block_size || ne0 % a->block_size)
            return pi2_set_error(PI2_ERR_FORMAT, "tensor %s rows of %lld values are not whole %s blocks",
                                 name, (long long)ne0, ne0 % t->block_size ? t->name : a->name);
        row = (uint64_t)(ne0 / t->block_size) * (uint64_t)t->type_size;
    }
    if (d->row_stride && (d->row_stride < row || d->row_stride % 4 || d->row_stride > m->map_size))
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) has a row stride of %llu bytes for rows of %llu",
                             name, (int)d->layer, (unsigned long long)d->row_stride, (unsigned long long)row);
    const uint64_t need = d->row_stride ? (uint64_t)(ne1 - 1) * d->row_stride + row : (uint64_t)ne1 * row;
    if (d->nbytes != need)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) has %llu bytes, its shape and type need %llu",
                             name, (int)d->layer, (unsigned long long)d->nbytes, (unsigned long long)need);
    if (d->offset > m->map_size || d->nbytes > m->map_size - d->offset)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) at offset %llu + %llu bytes runs past the end of "
                             "the file (%zu bytes)", name, (int)d->layer, (unsigned long long)d->offset,
                             (unsigned long long)d->nbytes, m->map_size);
    const unsigned align = d->type == PI2_T_F32 ? 4 : 2;
    if (d->offset % align)
        return pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) at offset %llu is not %u-byte aligned",
                             name, (int)d->layer, (unsigned long long)d->offset, align);
    return PI2_OK;
}

static pi2_weight weight_view(const pi2_model *m, const pi2_tensor_desc *d) {
    const pi2_type_traits *t = pi2_traits(d->type, PI2_IMPL_REF);
    const int32_t bits = pi2_lowbit_bits(d->type);
    const size_t row = bits ? pi2_lowbit_row_bytes(bits, d->ne[0]) : (size_t)(d->ne[0] / t->block_size) * (size_t)t->type_size;
    return (pi2_weight){m->map + d->offset, d->type, d->ne[0], d->ne[1], d->row_stride ? (size_t)d->row_stride : row, NULL};
}

static void place(pi2_model *m, const pi2_tensor_desc *d) {
    const float *f = (const float *)(m->map + d->offset);
    pi2_layer *L = per_layer(d->role) ? &m->layers[d->layer] : NULL;
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

#define PART_ALIGN 65536u         /* a split model's part bases: a page multiple on every kernel pi2 runs on */

/* The file's bytes in anonymous memory, read-only once read (no_mmap). */
static pi2_status read_file(pi2_model *m, int fd, size_t size, const char *path) {
    uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return pi2_set_error(PI2_ERR_NOMEM, "out of memory reading %s (%zu bytes)", path, size);
    for (size_t off = 0; off < size;) {
        const size_t want = size - off < ((size_t)8 << 20) ? size - off : ((size_t)8 << 20);
        const ssize_t got = pread(fd, p + off, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            const int e = got < 0 ? errno : 0;
            munmap(p, size);
            return pi2_set_io_error(e, path, "cannot read %s: %s", path, e ? strerror(e) : "the file is shorter than it was");
        }
        off += (size_t)got;
    }
    mprotect(p, size, PROT_READ);
    m->map = p;
    m->map_size = size;
    m->in_memory = 1;
    return PI2_OK;
}

static pi2_status map_file(pi2_model *m, const char *path, int no_mmap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pi2_set_io_error(errno, path, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    pi2_status s = PI2_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        s = pi2_set_io_error(0, path, "%s is not a readable, non-empty regular file", path);
    } else if (no_mmap) {
        s = read_file(m, fd, (size_t)st.st_size, path);
    } else {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) s = pi2_set_io_error(errno, path, "cannot map %s: %s", path, strerror(errno));
        else { m->map = p; m->map_size = (size_t)st.st_size; m->map_guard = io_map_guard_add(p, m->map_size, path, fd); }
    }
    close(fd);
    return s;
}

/* The parts of a split model, each at its base inside one reserved range (PROT_NONE between parts). */
static pi2_status map_parts(pi2_model *m, const char *const *paths, const uint64_t *bases, int32_t n, int no_mmap) {
    if (n == 1) {
        if (bases[0] != 0) return pi2_set_error(PI2_ERR_INVALID, "the first part's base must be 0");
        m->n_parts = 1;
        return map_file(m, paths[0], no_mmap);
    }
    if (no_mmap) return pi2_set_error(PI2_ERR_UNSUPPORTED, "--no-mmap does not read split models yet: merge the parts or drop --no-mmap");
    int *fds = malloc((size_t)n * sizeof *fds);
    uint64_t *sizes = calloc((size_t)n, sizeof *sizes);   /* zeroed: -O3 cannot see every part is stat-ed first */
    if (!fds || !sizes || !(m->part_guards = malloc((size_t)(n - 1) * sizeof *m->part_guards))) {
        free(fds); free(sizes);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the model's parts");
    }
    for (int32_t k = 0; k < n - 1; k++) m->part_guards[k] = -1;
    pi2_status s = PI2_OK;
    int32_t opened = 0;
    for (; opened < n && !s; opened++) {
        const char *path = paths[opened];
        struct stat st;
        if (!path) { s = pi2_set_error(PI2_ERR_INVALID, "NULL part path"); break; }
        if ((fds[opened] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            s = pi2_set_io_error(errno, path, "cannot open %s: %s", path, strerror(errno));
            break;
        }
        if (fstat(fds[opened], &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
            s = pi2_set_io_error(0, path, "%s is not a readable, non-empty regular file", path);
        sizes[opened] = (uint64_t)st.st_size;
    }
    for (int32_t k = 0; k < n && !s; k++)
        if ((k == 0 && bases[0] != 0) || bases[k] % PART_ALIGN || (k && bases[k] < bases[k - 1] + sizes[k - 1]) ||
            bases[k] > (uint64_t)SIZE_MAX - sizes[k])
            s = pi2_set_error(PI2_ERR_INVALID, "part %d's base %llu is not aligned or overlaps the part before",
                              (int)k, (unsigned long long)bases[k]);
    if (!s) {
        const size_t span = (size_t)(bases[n - 1] + sizes[n - 1]);
        uint8_t *base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) {
            s = pi2_set_error(PI2_ERR_NOMEM, "cannot reserve %zu bytes of addresses for the model's parts", span);
        } else {
            m->map = base;
            m->map_size = span;
            m->n_parts = n;
            for (int32_t k = 0; k < n && !s; k++) {
                void *p = mmap(base + bases[k], (size_t)sizes[k], PROT_READ, MAP_SHARED | MAP_FIXED, fds[k], 0);
                if (p == MAP_FAILED) {
                    s = pi2_set_io_error(errno, paths[k], "cannot map %s: %s", paths[k], strerror(errno));
                    break;
                }
                const int g = io_map_guard_add(p, (size_t)sizes[k], paths[k], fds[k]);
                if (k == 0) m->map_guard = g;
                else m->part_guards[k - 1] = g;
            }
        }
    }
    for (int32_t k = 0; k < opened && k < n; k++)
        if (fds[k] >= 0) close(fds[k]);
    free(fds);
    free(sizes);
    return s;
}

pi2_status model_check_maps(const pi2_model *m) {
    pi2_status s = io_map_guard_check(m->map_guard);
    for (int32_t k = 1; k < m->n_parts && !s; k++) s = io_map_guard_check(m->part_guards[k - 1]);
    return s;
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
    pi2_status s = check_params(params);
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
    if ((s = map_parts(m, paths, bases, n_parts, params->no_mmap))) goto fail;
    for (int32_t i = 0; i < n_tensors; i++) {
        const pi2_tensor_desc *d = &tensors[i];
        if ((s = check_desc(m, d, i))) goto fail;
        uint8_t *once = &seen[(size_t)(d->layer + 1) * PI2_TENSOR_COUNT + (size_t)d->role];
        if (*once) { s = pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) is described twice", ROLE_NAMES[d->role], (int)d->layer); goto fail; }
        *once = 1;
        place(m, d);
    }
    for (int32_t layer = -1; layer < params->n_layer; layer++)
        for (int32_t role = 0; role < PI2_TENSOR_COUNT; role++) {
            int64_t ne0, ne1;
            if (per_layer(role) != (layer >= 0) || role == PI2_TENSOR_ROPE_FREQS || role == PI2_TENSOR_FFN_DOWN_ROWS ||
                (role >= PI2_TENSOR_FFN_GATE_PRED && role <= PI2_TENSOR_ATTN_OUTPUT_BIAS) ||
                role >= PI2_TENSOR_FFN_DOWN_ROWS_EXPS || !expected(params, role, &ne0, &ne1)) continue;
            const uint8_t *row = &seen[(size_t)(layer + 1) * PI2_TENSOR_COUNT];
            if (role == PI2_TENSOR_FFN_DOWN_EXPS && row[PI2_TENSOR_FFN_DOWN_ROWS_EXPS]) {
                if (row[role]) {
                    s = pi2_set_error(PI2_ERR_FORMAT, "layer %d has both ffn_down_exps and ffn_down_rows_exps", (int)layer);
                    goto fail;
                }
                continue;
            }
            if (role == PI2_TENSOR_FFN_DOWN && row[PI2_TENSOR_FFN_DOWN] && row[PI2_TENSOR_FFN_DOWN_ROWS]) {
                s = pi2_set_error(PI2_ERR_FORMAT, "layer %d has both ffn_down and ffn_down_rows", (int)layer);
                goto fail;
            }
            if (!row[role] && !(role == PI2_TENSOR_FFN_DOWN && row[PI2_TENSOR_FFN_DOWN_ROWS])) {
                s = pi2_set_error(PI2_ERR_FORMAT, "tensor %s (layer %d) is missing", ROLE_NAMES[role], (int)layer);
                goto fail;
            }
        }
    for (int32_t il = 0; il < params->n_layer; il++) {
        pi2_layer *L = &m->layers[il];
        const int i8 = L->down_rows.data && L->down_rows.type == PI2_T_I8;
        if (i8 != (L->down_scale != NULL) || i8 != (L->down_colscale != NULL)) {
            s = pi2_set_error(PI2_ERR_FORMAT, i8 ? "layer %d's int8 ffn_down_rows need ffn_down_scale and ffn_down_colscale"
                                                 : "layer %d has ffn_down_scale/colscale without int8 ffn_down_rows", (int)il);
            goto fail;
        }
        const int i8x = L->down_rows_exps.data && L->down_rows_exps.type == PI2_T_I8;
        if (i8x != (L->down_scale_exps != NULL) || i8x != (L->down_colscale_exps != NULL)) {
            s = pi2_set_error(PI2_ERR_FORMAT, "layer %d: int8 ffn_down_rows_exps go with ffn_down_scale_exps and "
                              "ffn_down_colscale_exps, and only they", (int)il);
            goto fail;
        }
        if (!L->fc1.data != !L->fc2.data || (L->fc1.data && L->fc1.n_out != L->fc2.n_in)) {
            s = pi2_set_error(PI2_ERR_FORMAT, "layer %d: a predictor needs fc1 [r][n_embd] and fc2 [n_ff][r]",
                              (int)il);
            goto fail;
        }
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
